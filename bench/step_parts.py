"""Forward+backward and optimizer update timed separately: JAX (AOT-compiled) vs torch.compile.

    python -m bench.step_parts [--cases tiny-2k baseline-shaped-4k] [--reps 5] [--impls jax torch-compile]

Says which half of the train step a JAX-vs-PyTorch gap is in. Same cases (bench/common.py) and fp32
policy as bench/jax_vs_torch.py; each implementation runs in its own spawned process (one after the other, so one
framework's thread pool never spins while the other is timed), after two warm-up steps. JAX: the
jitted value_and_grad of the mean loss, then the jitted Muon + Adam update (as the trainer's step,
without the parameter write-back). PyTorch: forward+backward of the compiled module, then the
optimizers' step + zero_grad. Prints median and best of `--reps` per half. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.common import CASES, FP32, STEP_CASES, random_batch


def _jax_halves(cfg, x_BT, y_BT):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from frontier_jax import optim
    from frontier_jax.model import build

    graphdef, params = nnx.split(build(cfg, jnp.float32))
    tx = optim.build_optimizer(cfg.optim)
    opt_state = tx.init(params)
    x, y = jnp.asarray(x_BT), jnp.asarray(y_BT)
    fb = jax.jit(jax.value_and_grad(lambda p: jnp.mean(nnx.merge(graphdef, p)(x, y)))).lower(params).compile()
    _, grads = fb(params)
    update = jax.jit(lambda g, s, p: tx.update(g, s, p, lr_scale=jnp.float32(1.0), momentum=jnp.float32(0.9)))
    update = update.lower(grads, opt_state, params).compile()
    return (lambda: jax.block_until_ready(fb(params)),
            lambda: jax.block_until_ready(update(grads, opt_state, params)))


def _torch_halves(cfg, x_BT, y_BT):
    import torch

    from baseline_torch.model import GPT
    from baseline_torch.optim import Optimizers

    torch.manual_seed(0)
    model = GPT(cfg.model, torch.float32)
    forward = torch.compile(model, dynamic=False, fullgraph=True)
    opt = Optimizers(model, cfg.optim)
    x, y = torch.from_numpy(x_BT).long(), torch.from_numpy(y_BT).long()

    def update():
        opt.step(1.0, 0.9)
        opt.zero_grad()

    return (lambda: forward(x, y).mean().backward()), update


def _worker(impl, cfg, x_BT, y_BT, reps, conn):
    from frontier_jax.run.host import tune_allocator

    tune_allocator("auto" if impl == "jax" else "system")  # as bench/jax_vs_torch.py
    fb, update = (_jax_halves if impl == "jax" else _torch_halves)(cfg, x_BT, y_BT)
    for _ in range(2):  # warm-up (compilation included)
        fb()
        update()
    times = {"forward+backward": [], "optimizer": []}
    for _ in range(reps):
        for name, fn in (("forward+backward", fb), ("optimizer", update)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    conn.send(times)


def main(argv=None) -> int:
    import multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=STEP_CASES)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--impls", nargs="+", choices=("jax", "torch-compile"), default=["jax", "torch-compile"])
    a = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    for name in a.cases:
        case = CASES[name]
        cfg = case.load(*FP32)
        x, y = random_batch(case, cfg.model.vocab_size)
        print(f"== {case.describe(cfg)}, fp32, {a.reps} timed repetitions (median / best, ms)")
        for impl in a.impls:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(impl, cfg, x, y, a.reps, child))
            proc.start()
            times = parent.recv()
            proc.join()
            print("  " + f"{impl:14s}" + "  ".join(
                f"{k} {1e3 * statistics.median(v):,.0f} / {1e3 * min(v):,.0f}" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
