"""The step's estimated peak memory (frontier_jax.neuron.memory's live-buffer walk) against XLA's own memory
analysis of the compiled CPU train step.

    python -m bench.memory_estimate [--cases tiny/32 tiny/8 baseline/8 baseline/64 frontier14/8 baseline-bf16/8]

Each case is a config and `train.micro_batch_seqs` on one CPU device: the train step the trainer builds is
traced (the walk) and compiled (`jax.jit(...).lower(...).compile().memory_analysis()`: arguments + outputs -
aliased + temporaries, the bytes XLA allocates). Prints both, their ratio and the estimate (walk x MARGIN),
which must bound XLA's figure. Compiling the baseline takes ~20 s a case on two cores. A benchmark, not a test.
"""

from __future__ import annotations

import argparse

CONFIGS = {"tiny": ("tiny.py", []), "baseline": ("baseline.py", []), "frontier14": ("frontier14.py", []),
           "baseline-bf16": ("baseline.py", ["model.compute_dtype='bfloat16'"])}
DEFAULT = ["tiny/32", "tiny/8", "baseline/8", "baseline/64", "frontier14/8", "baseline-bf16/8"]


def xla_bytes(cfg, micro_seqs: int) -> int:
    """What XLA allocates for the trainer's train step of `cfg` on one CPU device (compiled, not run)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from frontier_jax import optim
    from frontier_jax.model import build
    from frontier_jax.ngram import bias as ngram_bias, runtime as ngram_runtime
    from frontier_jax.parallel import make_data_parallel
    from frontier_jax.policies import dtypes as dtype_policy
    from frontier_jax.policies.geometry import split_batch
    from frontier_jax.steps import make_train_step

    t = cfg.train
    dp = make_data_parallel(1, False)
    dtypes = dtype_policy.resolve(cfg, jax.default_backend())
    tx = optim.build_optimizer(cfg.optim, dtypes.muon_ns)
    global_micro, accum = split_batch(t.tokens_per_step // t.seq_len, micro_seqs, 1)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: build(cfg, dtypes.compute)))
    placed = lambda tree: jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=dp.replicated), tree)
    params = placed(params)
    opt_state = placed(jax.eval_shape(tx.init, params))
    bias_fn, aux = None, None
    if cfg.ngram.enabled:
        bias_fn, aux = ngram_runtime.bias_fn, placed(ngram_bias.empty_tables(cfg.ngram))
    step = make_train_step(graphdef, tx, bias_fn, mesh=dp.mesh, head_dim=cfg.model.head_dim)
    tok = jax.ShapeDtypeStruct((accum, global_micro, t.seq_len), jnp.int32, sharding=dp.batch_sharding(3, 1))
    f32 = jax.ShapeDtypeStruct((), jnp.float32, sharding=dp.replicated)
    ma = step.jitted.lower(params, opt_state, tok, tok, f32, f32, aux).compile().memory_analysis()
    return ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes


def walk_bytes(cfg, micro_seqs: int) -> int:
    import jax

    from frontier_jax import optim
    from frontier_jax.neuron import memory, program
    from frontier_jax.policies import dtypes as dtype_policy

    dtypes = dtype_policy.resolve(cfg, jax.default_backend())
    steps = program.StepPrograms(cfg, 1, dtypes, optim.build_optimizer(cfg.optim, dtypes.muon_ns))
    return memory.peak_bytes(steps.train(micro_seqs))


def main(argv=None) -> None:
    from bench.common import REPO
    from frontier_jax.config import apply_overrides, load_config
    from frontier_jax.neuron import memory

    p = argparse.ArgumentParser(prog="python -m bench.memory_estimate", description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=DEFAULT, metavar="CONFIG/MICRO",
                   help=f"config name ({', '.join(CONFIGS)}) / sequences per micro-batch")
    a = p.parse_args(argv)
    print(f"| case | walk GiB | XLA GiB | XLA / walk | estimate (walk x {memory.MARGIN}) GiB | bounds XLA |")
    print("|---|---|---|---|---|---|")
    for case in a.cases:
        name, micro = case.split("/")
        path, overrides = CONFIGS[name]
        cfg = apply_overrides(load_config(REPO / "configs" / path), overrides + [f"train.micro_batch_seqs={micro}"])
        walk, xla = walk_bytes(cfg, int(micro)), xla_bytes(cfg, int(micro))
        est = memory.MARGIN * walk
        print(f"| {case} | {walk / memory.GiB:.2f} | {xla / memory.GiB:.2f} | {xla / walk:.2f} | "
              f"{est / memory.GiB:.2f} | {'yes' if est >= xla else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
