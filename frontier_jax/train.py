"""python -m frontier_jax.train: parse arguments -> config -> loop.run(). Nothing else.

With no arguments it runs the embedded demo: a small corpus prepared offline from the Python
standard library's bundled documentation, `configs/tiny.py`, a val bpb at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from frontier_jax.config import ConfigError, apply_overrides, from_dict, load_config
from frontier_jax.data.shards import DataError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
EXIT_BAD_INPUT, EXIT_NONFINITE, EXIT_INTERRUPTED = 2, 3, 130


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m frontier_jax.train", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="a configs/*.py file (default: configs/tiny.py for the demo, "
                                     "or the run's own config with --resume)")
    p.add_argument("--data", help="directory of *_train_*.bin / *_val_*.bin shards")
    p.add_argument("--tokenizer", help="SentencePiece .model matching the shards, or 'bytes'")
    p.add_argument("--budget", type=float, help="training budget in seconds (train.budget_seconds)")
    p.add_argument("--out", help="run directory (default runs/<config>-<time>)")
    p.add_argument("--seed", type=int)
    p.add_argument("--kernels", choices=("auto", "reference", "strict"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. model.num_layers=4")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint")
    g = p.add_argument_group("multi-host (jax.distributed)")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0's coordinator")
    g.add_argument("--num-processes", type=int)
    g.add_argument("--process-id", type=int)
    g.add_argument("--distributed-auto", action="store_true",
                   help="let jax.distributed detect the cluster (Slurm, Kubernetes, ...)")
    return p.parse_args(argv)


def resolve(args):
    """(config, out_dir, resume, demo) from the parsed arguments."""
    demo = not (args.config or args.data or args.resume)
    if args.resume:
        run_json = Path(args.resume) / "config.json"
        if not run_json.is_file():
            raise DataError(f"{run_json}: not a run directory (no config.json)")
        import json

        cfg = load_config(args.config) if args.config else from_dict(json.loads(run_json.read_text()))
    else:
        cfg = load_config(args.config or CONFIGS / "tiny.py")
    sets = list(args.set)
    if args.data:
        sets.append(f"data.data_dir={args.data!r}")
    if args.tokenizer:
        sets.append(f"data.tokenizer={args.tokenizer!r}")
    if args.budget is not None:
        sets.append(f"train.budget_seconds={args.budget!r}")
    if args.seed is not None:
        sets.append(f"train.seed={args.seed}")
    if args.kernels:
        sets.append(f"train.kernels={args.kernels!r}")
    if demo:
        from frontier_jax.data.demo import prepare_demo

        print("DEMO: no --config/--data given; preparing a small offline corpus from the Python standard "
              "library's documentation and training configs/tiny.py on it.", flush=True)
        data_dir, tok = prepare_demo(Path("runs") / "demo-data")
        sets = [f"data.data_dir={str(data_dir)!r}", f"data.tokenizer={str(tok)!r}"] + sets
    cfg = apply_overrides(cfg, sets)
    if args.resume:
        out = Path(args.resume)
    else:
        out = Path(args.out) if args.out else Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return cfg, out, bool(args.resume), demo


DEMO_EPILOGUE = """
This was a DEMO on a tiny corpus (Python docs, a few hundred thousand tokens): the bpb above says the
pipeline works, not how good the model is. To train on the competition's data:
  python -m frontier_jax.data.prepare --input docs.jsonl --out data/sp1024 --tokenizer fineweb_1024_bpe.model
  python -m frontier_jax.train --config configs/baseline.py --data data/sp1024 --tokenizer fineweb_1024_bpe.model
or point --data at the competition's fineweb10B_sp1024 shards directly (see README).
"""


def main(argv=None) -> int:
    from frontier_jax import host, loop
    from frontier_jax.checkpoint import CheckpointError
    from frontier_jax.ops import KernelUnavailableError
    from frontier_jax.ngram.runtime import NgramBuilderFailed
    from frontier_jax.parallel import initialize

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg, out, resume, demo = resolve(args)
        host.tune_allocator(cfg.train.allocator)  # before any JAX backend exists
        initialize(args.coordinator, args.num_processes, args.process_id,
                   cfg.parallel.heartbeat_timeout_seconds, auto=args.distributed_auto)
        summary = loop.run(cfg, out, resume=resume)
    except (ConfigError, DataError, CheckpointError, loop.RunError, KernelUnavailableError, NgramBuilderFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    import jax

    main_process = jax.process_index() == 0
    if summary.get("val_bpb") is not None and main_process:
        print(f"val_bpb: {summary['val_bpb']:.6f}")
    if demo:
        print(DEMO_EPILOGUE)
    if summary["stop_reason"] == "non-finite loss":
        return EXIT_NONFINITE
    if summary["stop_reason"].startswith("signal"):
        if main_process:
            print(f"interrupted: checkpoint saved; continue with: python -m frontier_jax.train --resume {out}")
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
