"""Builder throughput (tokens/s per process, all orders together) and table bytes per order.

    python bench/ngram_build.py [--tokens 20000000] [--log2-size 20] [--chunk 1048576] [--process]

Synthetic tokens: Zipf-like ids in [0, 1024) with 2% of the stream copied from earlier segments
(near-duplicate documents). Without --process the tables are fed in this process (the builder's
inner loop); with --process the same tokens go through a real `NgramBuilder` child process reading
shards (spawn start, reading and snapshot writing included). `interleaved_step_times` is for the
trainer: it alternates blocks of training steps with and without a running builder.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from frontier_jax.config import NgramConfig
from frontier_jax.ngram import tables as T


def synthetic_tokens(n: int, seed: int = 0, vocab: int = 1024, repeat_fraction: float = 0.02, seg: int = 2000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = ((rng.zipf(1.2, n) - 1) % vocab).astype(np.uint16)
    for _ in range(int(n * repeat_fraction / seg)):
        dst = int(rng.integers(seg, n - seg))
        src = int(rng.integers(0, dst - seg + 1))
        x[dst : dst + seg] = x[src : src + seg]
    return x


def bench_in_process(cfg: NgramConfig, tokens: np.ndarray, chunk: int) -> dict:
    tables = T.NgramTables.from_config(cfg, chunk_tokens=chunk)
    t0, c0 = time.perf_counter(), time.process_time()
    tables.consume(tokens)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = tables.stats()
    return {
        "mode": "in_process",
        "tokens": int(tokens.size),
        "seconds": round(dt, 2),
        "cpu_seconds": round(cpu, 2),
        "tokens_per_s": round(tokens.size / dt),
        "tokens_per_cpu_s": round(tokens.size / cpu),
        **st,
    }


def bench_process(cfg: NgramConfig, tokens: np.ndarray, chunk: int) -> dict:
    from frontier_jax.data.shards import write_shard
    from frontier_jax.ngram.builder import NgramBuilder

    with tempfile.TemporaryDirectory() as d:
        shard = Path(d) / "bench_train_000000.bin"
        write_shard(shard, tokens)
        t0 = time.perf_counter()
        with NgramBuilder(replace(cfg, snapshot_every_tokens=10**12), [shard], Path(d) / "out", chunk_tokens=chunk) as b:
            b.wait()
            dt = time.perf_counter() - t0
            err = b.error()
    return {"mode": "builder_process", "tokens": int(tokens.size), "seconds": round(dt, 2), "tokens_per_s": round(tokens.size / dt), "error": err}


def interleaved_step_times(step_fn, make_builder, steps_per_block: int = 20, blocks: int = 6) -> dict:
    """Median step seconds without and with a running builder, alternating blocks in one run.

    step_fn() runs one training step and blocks until it is done; make_builder() returns an
    unstarted NgramBuilder (it is started for the 'with' blocks and stopped after each)."""
    times = {"without": [], "with": []}
    for i in range(blocks):
        mode = "with" if i % 2 else "without"
        builder = make_builder().start() if mode == "with" else None
        try:
            for _ in range(steps_per_block):
                t0 = time.perf_counter()
                step_fn()
                times[mode].append(time.perf_counter() - t0)
        finally:
            if builder is not None:
                builder.stop()
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {**{f"median_step_s_{k}": v for k, v in med.items()}, "slowdown": med["with"] / med["without"] - 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--log2-size", type=int, default=20)
    ap.add_argument("--min-order", type=int, default=2)
    ap.add_argument("--max-order", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=1 << 20)
    ap.add_argument("--process", action="store_true", help="also run through a real builder process")
    args = ap.parse_args()
    cfg = NgramConfig(enabled=True, min_order=args.min_order, max_order=args.max_order, table_log2_size=args.log2_size, builder_niceness=0)
    tokens = synthetic_tokens(args.tokens)
    print(json.dumps(bench_in_process(cfg, tokens, args.chunk)))
    if args.process:
        print(json.dumps(bench_process(cfg, tokens, args.chunk)))


if __name__ == "__main__":
    main()
