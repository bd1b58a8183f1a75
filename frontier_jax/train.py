"""python -m frontier_jax.train: parse arguments -> config -> trainer.run(). Nothing else.

With no arguments it runs the embedded demo: a small corpus prepared offline from the Python
standard library's bundled documentation, `configs/tiny.py`, a val bpb at the end. Expected failures
map to one line and an exit code through `frontier_jax.errors.exit_on_error`.
"""

from __future__ import annotations

import argparse
import sys

from frontier_jax.config import KERNEL_MODES
from frontier_jax.errors import ArgumentParser, exit_on_error, int_in
from frontier_jax.run.resolve import ResolvedRun, resolve_run

DESCRIPTION = """Train a small language model for a time budget and report its validation bits per byte.
With no arguments: a demo on a small offline corpus (configs/tiny.py)."""

EPILOG = """exit codes: 0 done, 2 bad input (one line naming the file or setting), 3 the loss became
non-finite, 130 interrupted (SIGINT/SIGTERM: a resumable checkpoint is saved after the current step).
examples:
  python -m frontier_jax.train --config configs/baseline.py --data data/sp1024 --tokenizer sp1024.model
  python -m frontier_jax.train --resume runs/baseline-20250101-120000 --budget 1200"""


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m frontier_jax.train", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="PATH", help="a configs/*.py file (default: configs/tiny.py for the demo, "
                                                    "or the run's own config with --resume)")
    p.add_argument("--data", metavar="DIR", help="directory of *_train_*.bin / *_val_*.bin shards")
    p.add_argument("--tokenizer", metavar="PATH", help="SentencePiece .model that made the shards, or 'bytes'")
    p.add_argument("--budget", type=float, metavar="SECONDS", help="training time budget (train.budget_seconds)")
    p.add_argument("--out", metavar="DIR", help="run directory to create (default runs/<config>-<time>)")
    p.add_argument("--seed", type=int, metavar="N", help="initialisation seed (train.seed)")
    p.add_argument("--kernels", choices=KERNEL_MODES,
                   help="NKI kernels: auto (where available), reference (pure JAX), strict (fail if any is missing)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value, e.g. model.num_layers=4 (repeatable)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its newest intact checkpoint "
                                                   "(a finished run: raise train.max_steps or --budget)")
    g = p.add_argument_group("multi-host (jax.distributed)")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0's coordinator")
    g.add_argument("--num-processes", type=int_in(1), metavar="N", help="number of processes in the job")
    g.add_argument("--process-id", type=int_in(0), metavar="I", help="this process's index, 0 .. N-1")
    g.add_argument("--distributed-auto", action="store_true",
                   help="let jax.distributed detect the cluster (Slurm, Kubernetes, ...)")
    return p


def parse_args(argv):
    return build_parser().parse_args(argv)


def resolve(args) -> ResolvedRun:
    """(config, out_dir, resume, demo) of the parsed options (frontier_jax.run.resolve)."""
    return resolve_run(config=args.config, data=args.data, tokenizer=args.tokenizer, budget=args.budget,
                       seed=args.seed, kernels=args.kernels, sets=args.set, out=args.out, resume=args.resume)


DEMO_EPILOGUE = """
This was a DEMO on a tiny corpus (Python docs, a few hundred thousand tokens): the bpb above says the
pipeline works, not how good the model is. To train on the competition's data:
  python -m frontier_jax.data.prepare --input docs.jsonl --out data/sp1024 --tokenizer fineweb_1024_bpe.model
  python -m frontier_jax.train --config configs/baseline.py --data data/sp1024 --tokenizer fineweb_1024_bpe.model
or point --data at the competition's fineweb10B_sp1024 shards directly (see docs/training.md).
"""


def main(argv=None) -> int:
    """Exit code (0, 3 or 130); bad input exits 2 through `exit_on_error` (SystemExit)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with exit_on_error():
        return _main(args)


def _main(args) -> int:
    from frontier_jax import trainer
    from frontier_jax.parallel import initialize
    from frontier_jax.run import host
    from frontier_jax.run.endings import ending
    from frontier_jax.run.progress import final_lines

    cfg, out, resume, demo = resolve(args)
    host.tune_allocator(cfg.train.allocator)  # before any JAX backend exists
    initialize(args.coordinator, args.num_processes, args.process_id,
               cfg.parallel.heartbeat_timeout_seconds, auto=args.distributed_auto)
    summary = trainer.run(cfg, out, resume=resume)
    import jax

    main_process = jax.process_index() == 0
    end = ending(summary["stop_reason"], resume)
    if end.results:
        if main_process:
            for line in final_lines(summary):
                print(line)
        if demo:
            print(DEMO_EPILOGUE)
    line = end.line(summary, out, checkpoints=True)
    if main_process and line:
        print(line, file=sys.stderr if end.to_stderr else sys.stdout)
    return end.exit_code


if __name__ == "__main__":
    sys.exit(main())
