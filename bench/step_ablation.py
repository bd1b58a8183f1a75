"""Wall-clock cost of op families inside the real train step, by ablation.

    python bench/step_ablation.py [--cases tiny-2k baseline-shaped-4k] [--rounds 8]

Three versions of the jitted train step (fp32, one micro-batch, a case of bench/common.py) are compiled in
one process and timed interleaved (A B C A B C ..., median of rounds): the full step; the step with the
attention core replaced by `q + repeat(k + v)` (the projections, QK-norm and RoPE stay live); the step
with Muon + Adam replaced by plain SGD. Cost of a family = full minus the ablated step. Unlike timing
an op alone, this includes what XLA fuses around it and the memory it keeps for the backward.
The process applies the trainer's allocator setting first (frontier_jax.host). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frontier_jax.host import tune_allocator  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from bench.common import CASES, FP32, STEP_CASES, random_batch  # noqa: E402
from bench.jax_vs_torch import jax_runner  # noqa: E402  (the same step as jax_vs_torch)
from frontier_jax import ops  # noqa: E402


def _cheap_attention(q_BTHK, k_BTGK, v_BTGK):
    return q_BTHK + jnp.repeat(k_BTGK + v_BTGK, q_BTHK.shape[2] // k_BTGK.shape[2], axis=2)


def _sgd(lr: float = 0.01) -> optax.GradientTransformationExtraArgs:
    inner = optax.sgd(lr)
    return optax.GradientTransformationExtraArgs(inner.init, lambda u, s, p=None, **extra: inner.update(u, s, p))


def build(cfg, variant: str, x_BT, y_BT):
    """jax_vs_torch's step runner for `variant` (full | no_attention | sgd_optimizer), compiled and warm."""
    saved = ops.causal_attention
    if variant == "no_attention":
        ops.causal_attention = _cheap_attention  # read at trace time only
    try:
        run = jax_runner(cfg, x_BT, y_BT, _sgd() if variant == "sgd_optimizer" else None)
        run(2)
    finally:
        ops.causal_attention = saved
    return lambda: run(1)


def ablate(name: str, rounds: int) -> None:
    case = CASES[name]
    cfg = case.load(*FP32)
    x, y = random_batch(case, cfg.model.vocab_size)
    variants = ("full", "no_attention", "sgd_optimizer")
    runs = {v: build(cfg, v, x, y) for v in variants}
    times = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            t0 = time.perf_counter()
            runs[v]()
            times[v].append(time.perf_counter() - t0)
    ms = {v: 1e3 * statistics.median(t) for v, t in times.items()}
    full = ms["full"]
    print(f"\n== {case.describe(cfg)}, fp32, {rounds} interleaved rounds (median ms)")
    print(f"  full train step                  {full:10.1f} ms")
    print(f"  attention core fwd+bwd           {full - ms['no_attention']:10.1f} ms ({(full - ms['no_attention']) / full:.0%})")
    print(f"  optimizer (Muon NS + Adam)       {full - ms['sgd_optimizer']:10.1f} ms ({(full - ms['sgd_optimizer']) / full:.0%})")
    rest = ms["no_attention"] + ms["sgd_optimizer"] - full
    print(f"  rest of the model                {rest:10.1f} ms ({rest / full:.0%})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=STEP_CASES)
    p.add_argument("--rounds", type=int, default=8)
    a = p.parse_args(argv)
    info = tune_allocator("auto")  # as the trainer, before the backend starts
    print(f"jax {jax.__version__} ({jax.default_backend()}), allocator {info['allocator']}")
    for name in a.cases:
        ablate(name, a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
