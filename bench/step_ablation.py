"""Wall-clock cost of op families inside the real train step, by ablation.

    python -m bench.step_ablation [--cases tiny-2k baseline-shaped-4k] [--rounds 8]

Three versions of the jitted train step (fp32, one micro-batch, a case of bench/common.py) are compiled in
one process and timed interleaved (A B C A B C ..., median of rounds): the full step; the step with the
attention op the model calls (`ops.qk_attention`: QK-norm, RoPE, gain and causal GQA attention) replaced by
`q + repeat(k + v)` (same shape; the projections stay live); the step
with Muon + Adam replaced by plain SGD. Cost of a family = full minus the ablated step. Unlike timing
an op alone, this includes what XLA fuses around it and the memory it keeps for the backward.
The process applies the trainer's allocator setting first (frontier_jax.run.host). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

from frontier_jax.run.host import tune_allocator

import jax
import jax.numpy as jnp
import optax

from bench.common import CASES, FP32, STEP_CASES, random_batch
from bench.jax_vs_torch import jax_runner  # the same step as jax_vs_torch
from frontier_jax import ops, optim


def _cheap_attention(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, gain_H, *, xsa: bool = False):
    """A same-shape stand-in for `ops.qk_attention` (what `model.Block` calls)."""
    return q_BTHK + jnp.repeat(k_BTGK + v_BTGK, q_BTHK.shape[2] // k_BTGK.shape[2], axis=2)


def _sgd(lr: float = 0.01) -> optim.Optimizer:
    """Plain SGD with the trainer's optimizer interface (frontier_jax.optim.Optimizer)."""
    inner = optax.sgd(lr)
    update = lambda u, s, p=None, **extra: inner.update(u, s, p)

    def apply(grads, state, params, **extra):
        updates, state = inner.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return optim.Optimizer(inner.init, update, apply)


VARIANTS = ("full", "no_attention", "sgd_optimizer")


@contextlib.contextmanager
def ablated(variant: str):
    """While tracing: `ops.qk_attention` replaced by the stand-in for "no_attention" (the model reads it at trace time)."""
    saved = ops.qk_attention
    if variant == "no_attention":
        ops.qk_attention = _cheap_attention
    try:
        yield _sgd() if variant == "sgd_optimizer" else None
    finally:
        ops.qk_attention = saved


def build(cfg, variant: str, x_BT, y_BT):
    """jax_vs_torch's step runner for `variant` (one of VARIANTS), compiled and warm."""
    with ablated(variant) as tx:
        run = jax_runner(cfg, x_BT, y_BT, tx)
        run(2)
    return lambda: run(1)


def ablate(name: str, rounds: int) -> dict:
    case = CASES[name]
    cfg = case.load(*FP32)
    x, y = random_batch(case, cfg.model.vocab_size)
    variants = VARIANTS
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
    return ms


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
