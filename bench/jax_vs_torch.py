"""Training-step throughput: JAX (jit) vs PyTorch eager vs torch.compile, same config, batch and dtype.

    python -m bench.jax_vs_torch            # cases tiny-2k and baseline-shaped-4k (bench/common.py)
    python -m bench.jax_vs_torch --quick    # tiny-2k only, fewer repetitions

Every implementation runs the full training step (forward, backward, Muon + Adam update) in float32
(NS in float32 too) on the same token batch, each in its own worker process (spawned one after the
other, so compilations never overlap, and so one framework's idle thread pool never spins on the cores
while the other is timed). Warm-up steps (compilation included) are excluded; then the implementations
are timed interleaved (J E C J E C ...), `--reps` rounds of `--steps` steps each, the worker timing
only its own steps, and the median round gives tokens/s. Prints tokens/s per implementation and the
ratio JAX / best PyTorch. The JAX worker applies the trainer's allocator setting (`train.allocator`,
frontier_jax.run.host: "auto" = reuse on CPU); the PyTorch workers keep glibc's defaults unless
`--torch-allocator` says otherwise. A benchmark, not a test: on a CPU shared with other work the numbers move;
compare the ratios printed side by side, and rerun.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

from bench.common import CASES, FP32, STEP_CASES, Case, random_batch
from frontier_jax import optim as jax_optim
from frontier_jax.model import build
from frontier_jax.steps import make_train_step


def jax_runner(cfg, x_BT, y_BT, tx=None):
    """run(n): n fp32 train steps on (x, y); `tx` defaults to the config's Muon + Adam."""
    model = build(cfg, jnp.float32)
    graphdef, params = nnx.split(model)
    tx = tx or jax_optim.build_optimizer(cfg.optim)
    state = {"params": params, "opt": tx.init(params)}
    step = make_train_step(graphdef, tx)
    x, y = jnp.asarray(x_BT[None]), jnp.asarray(y_BT[None])
    one, mom = jnp.float32(1.0), jnp.float32(0.9)

    def run(n: int) -> None:
        for _ in range(n):
            state["params"], state["opt"], m = step(state["params"], state["opt"], x, y, one, mom, None)
        jax.block_until_ready(m["loss"])

    return run


def torch_runner(cfg, x_BT, y_BT, compiled: bool):
    import torch

    from baseline_torch.model import GPT as TorchGPT
    from baseline_torch.optim import Optimizers

    torch.manual_seed(0)
    model = TorchGPT(cfg.model, torch.float32)
    forward = torch.compile(model, dynamic=False, fullgraph=True) if compiled else model
    opt = Optimizers(model, cfg.optim)
    x, y = torch.from_numpy(x_BT).long(), torch.from_numpy(y_BT).long()

    def run(n: int) -> None:
        for _ in range(n):
            forward(x, y).mean().backward()
            opt.step(1.0, 0.9)
            opt.zero_grad()

    return run


def _worker(impl: str, cfg, x_BT, y_BT, warmup: int, threads: int | None, allocator: str, torch_allocator: str,
            conn) -> None:
    """One implementation in its own process: build, warm up, then run `n` steps per request."""
    from frontier_jax.run.host import tune_allocator

    tune_allocator(allocator if impl == "jax" else torch_allocator)  # before any backend starts
    if impl.startswith("torch") and threads:
        import torch

        torch.set_num_threads(threads)
    makers = {"jax": lambda: jax_runner(cfg, x_BT, y_BT), "torch-eager": lambda: torch_runner(cfg, x_BT, y_BT, False),
              "torch-compile": lambda: torch_runner(cfg, x_BT, y_BT, True)}
    t0 = time.perf_counter()
    run = makers[impl]()
    run(warmup)  # compilation and first-touch excluded
    conn.send(time.perf_counter() - t0)
    while (n := conn.recv()) is not None:
        t0 = time.perf_counter()
        run(n)
        conn.send(time.perf_counter() - t0)


def bench_case(case: Case, cfg, reps: int, steps: int, warmup: int, impls: list[str],
               threads: int | None = None, allocator: str = "auto",
               torch_allocator: str = "system") -> dict:
    import multiprocessing as mp

    x, y = random_batch(case, cfg.model.vocab_size)
    ctx = mp.get_context("spawn")
    workers, setup_s = {}, {}
    try:
        for impl in impls:  # one at a time: no compilation overlaps another
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(impl, cfg, x, y, warmup, threads, allocator, torch_allocator, child), daemon=True)
            proc.start()
            workers[impl] = (proc, parent)
            setup_s[impl] = parent.recv()
        times = {impl: [] for impl in impls}
        for _ in range(reps):  # interleaved rounds
            for impl in impls:
                workers[impl][1].send(steps)
                times[impl].append(workers[impl][1].recv())
    finally:
        for proc, conn in workers.values():
            if proc.is_alive():
                conn.send(None)
                proc.join(30)
    tokens = case.tokens * steps
    tok_s = {impl: tokens / statistics.median(ts) for impl, ts in times.items()}
    spread = {impl: (tokens / max(ts), tokens / min(ts)) for impl, ts in times.items()}
    print(f"\n== {case.describe(cfg)}, fp32, {reps} interleaved rounds of {steps} step(s), warm-up {warmup}, "
          f"allocator: jax {allocator}, torch {torch_allocator}")
    for impl in impls:
        lo, hi = spread[impl]
        print(f"  {impl:14s} {tok_s[impl]:>10,.0f} tokens/s  (range {lo:,.0f} .. {hi:,.0f}; "
              f"setup+warm-up {setup_s[impl]:.1f} s)")
    torch_impls = [i for i in impls if i.startswith("torch")]
    if "jax" in impls and torch_impls:
        best = max(torch_impls, key=lambda i: tok_s[i])
        print(f"  ratio JAX / best PyTorch ({best}): {tok_s['jax'] / tok_s[best]:.2f}x")
    return tok_s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny-2k only, 3 rounds")
    p.add_argument("--cases", nargs="+", choices=sorted(CASES),
                   help=f"default: {' '.join(STEP_CASES)} ({STEP_CASES[0]} only with --quick)")
    p.add_argument("--reps", type=int, help="interleaved rounds (default 5; 3 with --quick)")
    p.add_argument("--steps", type=int, help="steps per implementation per round (default 8 for the tiny model, 1 "
                   "for the baseline shape); longer rounds dilute the cost of switching processes")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--allocator", choices=("auto", "reuse", "system"), default="auto",
                   help="the JAX worker's glibc allocator setting (frontier_jax.run.host; default auto, as the trainer)")
    p.add_argument("--torch-allocator", choices=("auto", "reuse", "system"), default="system",
                   help="the PyTorch workers' setting (default system: PyTorch as its users run it)")
    a = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: PyTorch is not installed (pip install -e .[torch])", file=sys.stderr)
        return 2
    cases = a.cases or (STEP_CASES[:1] if a.quick else STEP_CASES)
    reps = a.reps or (3 if a.quick else 5)
    impls = ["jax", "torch-eager"] + ([] if a.no_compile else ["torch-compile"])
    print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"({a.threads or torch.get_num_threads()} threads); one worker process per implementation")
    for name in cases:
        case = CASES[name]
        cfg = case.load(*FP32)
        steps = a.steps or (8 if case.config == "tiny.py" else 1)
        bench_case(case, cfg, reps, steps, warmup=2, impls=impls, threads=a.threads, allocator=a.allocator,
                   torch_allocator=a.torch_allocator)
    return 0


if __name__ == "__main__":
    sys.exit(main())
