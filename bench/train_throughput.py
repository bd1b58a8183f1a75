"""Throughput of the jitted train step: tokens/s and MFU, cases tiny-8k and baseline-shaped-8k (bench/common.py).

    python -m bench.train_throughput [--quick] [--reps N] [--dtype float32|bfloat16] [--cases ...]

MFU = tokens/s x ModelConfig.flops_per_token (frontier_jax.config) / matmul peak measured on this device in
the same dtype (frontier_jax.parallel.measure_matmul_peak). Compilation and one warm-up step are
excluded; each repetition is one full optimizer step (one micro-batch), timed to completion.
Synthetic random tokens: the step's cost does not depend on the data. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from bench.common import CASES, PROFILE_CASES, Case, random_batch
from frontier_jax import optim, parallel
from frontier_jax.policies.dtypes import resolve as resolve_dtypes
from frontier_jax.run.host import tune_allocator
from frontier_jax.model import build
from frontier_jax.steps import make_train_step


def bench(case: Case, cfg, dtype, reps: int, peak: float) -> dict:
    from flax import nnx

    tx = optim.build_optimizer(cfg.optim, resolve_dtypes(cfg, jax.default_backend()).muon_ns)
    model = build(cfg, dtype)
    graphdef, params = nnx.split(model)
    opt_state = tx.init(params)
    step = make_train_step(graphdef, tx)
    x, y = (a[None] for a in random_batch(case, cfg.model.vocab_size))  # one micro-batch
    one, mom = jnp.float32(1.0), jnp.float32(0.9)
    t0 = time.perf_counter()
    params, opt_state, m = step(params, opt_state, x, y, one, mom, None)  # compile + warm-up
    jax.block_until_ready((params, m))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        params, opt_state, m = step(params, opt_state, x, y, one, mom, None)
        jax.block_until_ready((params, m))
        times.append(time.perf_counter() - t0)
    fpt, n = cfg.model.flops_per_token(case.seq_len), case.tokens
    med, best = statistics.median(times), min(times)
    return {"compile_s": compile_s, "step_s_median": med, "step_s_min": best,
            "tok_s_median": n / med, "tok_s_best": n / best,
            "mfu_median": n / med * fpt / peak, "mfu_best": n / best * fpt / peak,
            "flops_per_token": fpt, "loss": float(m["loss"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 repetitions and a smaller peak probe")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype (default: the platform policy)")
    ap.add_argument("--cases", nargs="+", choices=sorted(CASES), default=PROFILE_CASES)
    args = ap.parse_args(argv)
    reps = 3 if args.quick else args.reps
    tune_allocator("auto")  # as the trainer (frontier_jax.run.host), before the backend starts
    base = CASES["baseline-shaped-8k"].load()
    dtype = jnp.dtype(args.dtype) if args.dtype else jnp.dtype(resolve_dtypes(base, jax.default_backend()).compute)
    peak = parallel.measure_matmul_peak(dtype, n=1024 if args.quick else 2048)
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), compute dtype {dtype}, "
          f"measured matmul peak {peak / 1e9:.1f} GFLOP/s; {reps} timed steps after compile+warm-up")
    for name in args.cases:
        case = CASES[name]
        cfg = case.load()
        r = bench(case, cfg, dtype, reps, peak)
        print(f"{case.describe(cfg)}: {r['tok_s_median']:,.0f} tok/s median ({r['tok_s_best']:,.0f} best), "
              f"MFU {r['mfu_median']:.1%} median ({r['mfu_best']:.1%} best), step {r['step_s_median'] * 1e3:.0f} ms, "
              f"compile {r['compile_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
