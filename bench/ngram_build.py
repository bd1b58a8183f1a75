"""Builder throughput (tokens/s per process, all orders together) and table bytes per order.

    python -m bench.ngram_build [--tokens 20000000] [--log2-size 20] [--chunk 1048576] [--process]
    python -m bench.ngram_build --compare OLD_tables.py [--rounds 2]   # before/after, interleaved
    python -m bench.ngram_build --trainer [--config configs/tiny.py]    # step time with/without builder

Synthetic tokens: Zipf-like ids in [0, 1024) with 2% of the stream copied from earlier segments
(near-duplicate documents). Without --process the tables are fed in this process (the builder's
inner loop); with --process the same tokens go through a real `NgramBuilder` child process reading
shards (spawn start, reading and snapshot writing included). `interleaved_step_times` is for the
trainer: it alternates blocks of training steps with and without a running builder (--trainer runs
it on a real jitted train step of --config with the n-gram bias on, random tokens, CPU or device).
--compare loads NgramTables from another tables.py (e.g. `git show HEAD~1:frontier_jax/ngram/tables.py`)
and alternates it with the current one on the same tokens, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import sys
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


def bench_in_process(cfg: NgramConfig, tokens: np.ndarray, chunk: int, module=T, mode: str = "in_process",
                     warm_tokens: int = 0) -> dict:
    """Feed `tokens` to fresh tables; the first warm_tokens (filling the tables) are not timed."""
    tables = module.NgramTables.from_config(cfg, chunk_tokens=chunk)
    tables.consume(tokens[:warm_tokens])
    tokens = tokens[warm_tokens:]
    t0, c0 = time.perf_counter(), time.process_time()
    tables.consume(tokens)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = tables.stats()
    return {
        "mode": mode,
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


def interleaved_step_times(step_fn, make_builder, steps_per_block: int = 20, blocks: int = 6, warm_s: float = 4.0,
                           after_start=None) -> dict:
    """Median step seconds without and with a running builder, alternating blocks in one run.

    step_fn() runs one training step and blocks until it is done; make_builder() returns an
    unstarted NgramBuilder (started `warm_s` before each 'with' block, so the process start and its
    imports are not timed, and stopped after it; a block where it had already finished is reported)."""
    times = {"without": [], "with": []}
    builder_finished_early = 0
    for i in range(blocks):
        mode = "with" if i % 2 else "without"
        builder = make_builder().start() if mode == "with" else None
        if builder is not None:
            if after_start is not None:
                after_start(builder)
            time.sleep(warm_s)
        try:
            for _ in range(steps_per_block):
                t0 = time.perf_counter()
                step_fn()
                times[mode].append(time.perf_counter() - t0)
        finally:
            if builder is not None:
                builder_finished_early += not builder.alive()
                builder.stop()
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {**{f"median_step_s_{k}": v for k, v in med.items()}, "slowdown": med["with"] / med["without"] - 1.0,
            "steps_per_side": len(times["with"]), "builder_finished_early_blocks": builder_finished_early}


def load_tables_module(path):
    """NgramTables from another tables.py file (for before/after comparisons)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ngram_tables_compare", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def compare(cfg: NgramConfig, tokens: np.ndarray, chunk: int, old_path: str, rounds: int, warm_tokens: int = 0) -> dict:
    """Alternate the old and the current NgramTables on the same tokens; medians per side."""
    old = load_tables_module(old_path)
    runs = {"before": [], "after": []}
    for _ in range(rounds):
        for name, mod in (("before", old), ("after", T)):
            r = bench_in_process(cfg, tokens, chunk, mod, name, warm_tokens)
            runs[name].append(r)
            print(json.dumps({k: r[k] for k in ("mode", "tokens", "seconds", "cpu_seconds", "tokens_per_s", "tokens_per_cpu_s", "occupied_per_order")}))
    med = {k: {m: float(np.median([r[m] for r in v])) for m in ("tokens_per_s", "tokens_per_cpu_s")} for k, v in runs.items()}
    return {"warm_tokens_untimed": warm_tokens, "median": med, "speedup_wall": med["after"]["tokens_per_s"] / med["before"]["tokens_per_s"],
            "speedup_cpu": med["after"]["tokens_per_cpu_s"] / med["before"]["tokens_per_cpu_s"]}


def bench_trainer(config_path: str, builder_tokens: int, steps_per_block: int, blocks: int, pin: bool = False) -> dict:
    """Interleaved train-step times of `config_path` (n-gram bias on) without / with a builder process.

    pin: the trainer on CPU 0 and the builder on CPU 1 (Linux affinity), i.e. the builder has its own core."""
    import os

    if pin:
        os.sched_setaffinity(0, {0})
    import jax
    import jax.numpy as jnp

    from frontier_jax import optim
    from frontier_jax.config import load_config
    from frontier_jax.data.shards import write_shard
    from frontier_jax.policies.dtypes import resolve as resolve_dtypes
    from frontier_jax.policies.geometry import micro_batch_candidates
    from frontier_jax.ngram.bias import empty_tables
    from frontier_jax.ngram.builder import NgramBuilder
    from frontier_jax.ngram.runtime import bias_fn
    from frontier_jax.trainer import init_state
    from frontier_jax.parallel import make_data_parallel
    from frontier_jax.steps import make_train_step

    cfg = load_config(config_path)
    ng = replace(cfg.ngram, enabled=True, builder_niceness=cfg.ngram.builder_niceness)
    cfg = replace(cfg, ngram=ng)
    t = cfg.train
    dp = make_data_parallel(0, False)
    dtypes = resolve_dtypes(cfg, jax.default_backend())
    tx = optim.build_optimizer(cfg.optim, dtypes.muon_ns)
    graphdef, params, opt_state, shardings = init_state(cfg, tx, dtypes.compute, dp)
    step = make_train_step(graphdef, tx, bias_fn, mesh=dp.mesh, state_specs=dp.state_specs(opt_state))
    per_device = t.tokens_per_step // t.seq_len // dp.num_devices
    rows = min(per_device, t.micro_batch_seqs or micro_batch_candidates(per_device)[0]) * dp.num_devices
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, cfg.model.vocab_size, (1, rows, t.seq_len)), jnp.int32)
    y = jnp.roll(x, -1, axis=-1)
    tables = jax.device_put(empty_tables(ng), dp.replicated)
    state = {"p": params, "o": opt_state}

    def step_fn():
        state["p"], state["o"], m = step(state["p"], state["o"], x, y, jnp.float32(1.0), jnp.float32(0.95), tables)
        jax.block_until_ready(m)

    for _ in range(3):
        step_fn()  # compile + warm
    with tempfile.TemporaryDirectory() as d:
        shard = Path(d) / "bench_train_000000.bin"
        write_shard(shard, synthetic_tokens(builder_tokens, seed=1))

        def make_builder():
            return NgramBuilder(replace(ng, snapshot_every_tokens=10**12), [shard], Path(d) / "out")

        pin_builder = (lambda b: os.sched_setaffinity(b.pid, {1})) if pin else None
        out = interleaved_step_times(step_fn, make_builder, steps_per_block, blocks, after_start=pin_builder)
    return {"config": config_path, "step_rows": rows, "seq_len": t.seq_len, "backend": jax.default_backend(),
            "builder_niceness": ng.builder_niceness, "ngram_orders": f"{ng.min_order}..{ng.max_order}",
            "table_log2_size": ng.table_log2_size, "pinned": pin, "cpus": os.cpu_count(),
            "loadavg_1m": os.getloadavg()[0], **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--log2-size", type=int, default=20)
    ap.add_argument("--min-order", type=int, default=2)
    ap.add_argument("--max-order", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=1 << 20)
    ap.add_argument("--process", action="store_true", help="also run through a real builder process")
    ap.add_argument("--compare", help="a tables.py to compare against (before/after, interleaved)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm-tokens", type=int, default=0, help="untimed tokens first (steady state once tables are full)")
    ap.add_argument("--trainer", action="store_true", help="step time with / without a running builder")
    ap.add_argument("--config", default="configs/tiny.py")
    ap.add_argument("--pin", action="store_true", help="--trainer: trainer on CPU 0, builder on CPU 1")
    ap.add_argument("--steps-per-block", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=6)
    args = ap.parse_args()
    if args.trainer:
        print(json.dumps(bench_trainer(args.config, args.tokens, args.steps_per_block, args.blocks, args.pin)))
        return
    cfg = NgramConfig(enabled=True, min_order=args.min_order, max_order=args.max_order, table_log2_size=args.log2_size, builder_niceness=0)
    tokens = synthetic_tokens(args.tokens)
    if args.compare:
        print(json.dumps(compare(cfg, tokens, args.chunk, args.compare, args.rounds, args.warm_tokens)))
        return
    print(json.dumps(bench_in_process(cfg, tokens, args.chunk)))
    if args.process:
        print(json.dumps(bench_process(cfg, tokens, args.chunk)))


if __name__ == "__main__":
    main()
