"""The run directory: its file names, preparing it, the run log, signals, metrics, summary, reading it back.

It imports no JAX (numpy, and matplotlib for the plot), so both trainers write the same layout:

    config.json    the resolved config (frontier_jax.config.to_dict)
    env.json       versions, git hash, devices, resolved dtypes, host allocator
    kernels.json   the kernel table (JAX trainer)
    train.log      everything the run printed
    metrics.jsonl  one JSON object per train step (kind=train) or validation (kind=val)
    summary.json   the run policy's summary (frontier_jax.run_policy); summary.txt the same as a table
    curves.png     train loss and val bpb against training time and tokens
    checkpoints/   orbax checkpoints, one directory per step (JAX trainer)
    weights.npz    the weights in the interop format (PyTorch baseline)

Every file is written to a temporary name and renamed into place; the metrics log is appended line
by line and flushed, so an interrupted run keeps every line it finished.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from frontier_jax.config import Config, from_dict
from frontier_jax.data.shards import DataError, atomic_write_text  # noqa: F401 - the one atomic text writer
from frontier_jax.errors import BadInput

CONFIG = "config.json"
ENV = "env.json"
KERNELS = "kernels.json"
LOG = "train.log"
METRICS = "metrics.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_TXT = "summary.txt"
CURVES = "curves.png"
CHECKPOINTS = "checkpoints"
WEIGHTS = "weights.npz"



class RunError(BadInput):
    """A run that cannot start or continue (message names the file/setting and the problem)."""


# ----------------------------------------------------------------------------- preparing, log, signals


def prepare_run_dir(out_dir: Path, resume: bool) -> Path:
    """Create `out_dir` (or check it), refuse an existing run unless resuming; RunError if not writable."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write_probe.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunError(f"{out_dir}: output directory is not writable ({e.strerror or e})") from None
    if not resume and (out_dir / METRICS).exists():
        raise RunError(f"{out_dir}: already holds a run; use --resume {out_dir} or another --out")
    return out_dir


class RunLog:
    """Prints and appends to <run>/train.log."""

    def __init__(self, path: Path | None, echo: bool = True, enabled: bool = True):
        self._f = open(path, "a") if path and enabled else None
        self.echo = echo and enabled

    def __call__(self, msg: str = "") -> None:
        if self.echo:
            print(msg, flush=True)
        if self._f:
            self._f.write(msg + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f:
            self._f.close()


class Signals:
    """SIGINT/SIGTERM set a flag checked between steps; a second SIGINT aborts immediately."""

    def __init__(self):
        self.received: str | None = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread: no handlers
                pass
        return self

    def _handle(self, signum, frame):
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ----------------------------------------------------------------------------- writing


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def git_hash() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if out.returncode:
        return "unknown"
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def environment(packages: tuple[str, ...]) -> dict:
    """Python, platform, the given packages' versions (None when absent) and the git hash, for env.json."""
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": sys.version.split()[0], "platform": platform.platform(), "versions": versions, "git": git_hash()}


class MetricsLog:
    """Append-only JSONL sink (one object per line)."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        self.rows: list[dict] = []
        self._f = open(self.path, "a") if enabled else None

    def log(self, **row) -> None:
        self.rows.append(row)
        if self._f:
            self._f.write(json.dumps(row, default=float) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def summary_rows(summary: dict) -> list[tuple[str, str]]:
    def f(key, fmt="{}"):
        v = summary.get(key)
        return "-" if v is None else fmt.format(v)

    return [
        ("config", f"{summary.get('config_name')} ({summary.get('config_hash')})"),
        ("steps", f("steps")),
        ("tokens", f("tokens", "{:,}")),
        ("train time", f("train_seconds", "{:.1f} s")),
        ("tokens/s", f("tokens_per_second", "{:,.0f}")),
        ("matmul peak", f("matmul_peak_flops", "{:.3g} FLOP/s")),
        ("MFU", f("mfu", "{:.1%}")),
        ("final train loss", f("final_train_loss", "{:.4f}")),
        ("val loss", f("val_loss", "{:.4f}")),
        ("val bpb", f("val_bpb", "{:.4f}")),
        ("stopped by", f("stop_reason")),
    ]


def write_summary(run_dir: Path, summary: dict, write: bool = True) -> str:
    """summary.json, summary.txt and curves.png (from the whole metrics.jsonl, resumed parts included);
    returns the summary table. write=False (not the main process): only the table."""
    table = format_table(summary_rows(summary))
    if write:
        run_dir = Path(run_dir)
        write_json(run_dir / SUMMARY_JSON, summary)
        atomic_write_text(run_dir / SUMMARY_TXT, table + "\n")
        plot_run(read_metrics(run_dir), run_dir / CURVES)
    return table


def plot_run(rows: list[dict], path: Path) -> None:
    """PNG: train loss and val bpb against wall-clock time and against tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if r.get("kind") == "train"]
    val = [r for r in rows if r.get("kind") == "val"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for col, xkey, xlabel in ((0, "train_seconds", "training time (s)"), (1, "tokens", "tokens")):
        ax = axes[0][col]
        ax.plot([r[xkey] for r in train], [r["loss"] for r in train], lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("train loss (nats/token)")
        ax = axes[1][col]
        ax.plot([r[xkey] for r in val], [r["bpb"] for r in val], "o-")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("val bits/byte")
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- reading


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of <run>/metrics.jsonl ([] when there is none)."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_config(run_dir) -> Config:
    """The resolved config of a run directory; DataError (one line) when it is not a run or unreadable."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG
    if not path.is_file():
        raise DataError(f"{run_dir}: not a run directory (no {CONFIG})")
    try:
        return from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise DataError(f"{path}: unreadable run config ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def read_env(run_dir) -> dict:
    """<run>/env.json ({} when absent); DataError when unreadable."""
    path = Path(run_dir) / ENV
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: unreadable ({e})") from None


# ----------------------------------------------------------------------------- weights.npz (interop format)


class WeightsError(DataError):
    """An npz that cannot be read, or does not fit the model."""


def save_npz(path, sd: dict[str, np.ndarray], meta: dict | None = None) -> None:
    """Write `sd` as float32 arrays plus `__dtypes__` (and `__meta__`) JSON entries, atomically.

    Keys are the PyTorch baseline's state_dict names; float32 holds bf16 values exactly, and the
    original dtype of each key is recorded so `load_npz` restores it."""
    path = Path(path)
    dtypes = {k: str(v.dtype) for k, v in sd.items()}
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in sd.items()}
    arrays["__dtypes__"] = np.array(json.dumps(dtypes, sort_keys=True))
    arrays["__meta__"] = np.array(json.dumps(meta or {}, sort_keys=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    try:
        np.savez(tmp, **arrays)
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16 and friends
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def load_npz(path) -> tuple[dict[str, np.ndarray], dict]:
    """(state_dict with the recorded dtypes restored, meta); WeightsError (one line) when unreadable."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an npz archive")
            raw = {k: z[k] for k in z.files}
        dtypes = json.loads(str(raw.pop("__dtypes__"))) if "__dtypes__" in raw else {}
        meta = json.loads(str(raw.pop("__meta__"))) if "__meta__" in raw else {}
        sd = {k: (v.astype(_dtype(dtypes[k])) if dtypes.get(k) else v) for k, v in raw.items()}
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such npz file") from None
    except (OSError, ValueError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as e:
        raise WeightsError(f"{path}: not a readable npz ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    return sd, meta
