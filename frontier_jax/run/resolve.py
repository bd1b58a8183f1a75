"""Run resolution: the entry points' options -> (config, run directory, resume, demo), as keywords.

Both CLIs call `resolve_run` with their parsed options (`python -m frontier_jax.train` with all of
them, `python -m baseline_torch.train` with the ones it has). It writes nothing but the demo's data:
with none of config, data and resume it prepares the embedded demo corpus (frontier_jax.data.demo)
and trains configs/tiny.py on it. Nothing here imports JAX.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

from frontier_jax.config import Config, apply_overrides, load_config, load_run_config
from frontier_jax.run.curves import CONFIGS
from frontier_jax.run.rundir import CONFIG, RunError


class ResolvedRun(NamedTuple):
    config: Config
    out_dir: Path
    resume: bool
    demo: bool


def resolve_run(*, config: str | None = None, data: str | None = None, tokenizer: str | None = None,
                budget: float | None = None, seed: int | None = None, kernels: str | None = None,
                sets: list[str] | tuple[str, ...] = (), out: str | None = None, resume: str | None = None,
                out_tag: str = "") -> ResolvedRun:
    """The run the options name: `config` (a configs/*.py file; default configs/tiny.py, or the run's own
    config.json with `resume`), then `data`, `tokenizer`, `budget`, `seed`, `kernels` and the `sets`
    (KEY=VALUE overrides) applied in that order; the run directory is `resume`, else `out`, else
    runs/<config name><out_tag>-<time>."""
    demo = not (config or data or resume)
    if resume:
        if out and Path(out).absolute() != Path(resume).absolute():
            raise RunError(f"--out {out}: --resume continues the run in place ({resume}); drop --out")
        run_json = Path(resume) / CONFIG
        if not run_json.is_file():
            raise RunError(f"{run_json}: not a run directory (no config.json)")
        cfg = load_config(config) if config else load_run_config(run_json)
    else:
        cfg = load_config(config or CONFIGS / "tiny.py")
    sets = list(sets)
    if data:
        sets.append(f"data.data_dir={str(Path(data).absolute())!r}")
    if tokenizer:
        tok = tokenizer if tokenizer == "bytes" else str(Path(tokenizer).absolute())
        sets.append(f"data.tokenizer={tok!r}")
    if budget is not None:
        sets.append(f"train.budget_seconds={budget!r}")
    if seed is not None:
        sets.append(f"train.seed={seed}")
    if kernels:
        sets.append(f"train.kernels={kernels!r}")
    if demo:
        from frontier_jax.data.demo import prepare_demo

        print("DEMO: no --config/--data given; preparing a small offline corpus from the Python standard "
              "library's documentation and training configs/tiny.py on it.", flush=True)
        data_dir, tok = prepare_demo(Path("runs") / "demo-data")
        sets = [f"data.data_dir={str(Path(data_dir).absolute())!r}",
                f"data.tokenizer={str(Path(tok).absolute())!r}"] + sets
    cfg = apply_overrides(cfg, sets)
    if resume:
        out_dir = Path(resume)
    else:
        out_dir = Path(out) if out else Path("runs") / f"{cfg.name}{out_tag}-{time.strftime('%Y%m%d-%H%M%S')}"
    return ResolvedRun(cfg, out_dir, bool(resume), demo)
