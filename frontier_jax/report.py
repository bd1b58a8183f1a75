"""Run-directory outputs: JSONL metrics, run metadata, summary table, PNG plot, matmul peak / MFU.

Every file is written to a temporary name and renamed into place; the metrics log is appended line by
line and flushed, so an interrupted run keeps every line it finished.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from frontier_jax.data.shards import atomic_write_text

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "sentencepiece", "ml_dtypes")


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


def environment() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": versions,
        "git": git_hash(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
    }


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


def measure_matmul_peak(dtype=jnp.float32, n: int | None = None, reps: int = 5) -> float:
    """FLOP/s of an n^3 matmul on the default device, best of `reps` (the MFU denominator).

    n defaults to 2048 on CPU and 8192 on accelerators (2048^3 is far too small to fill a GPU: on an
    H200 it measured 117 TFLOP/s in bf16, a sixth of the device's rate). Measured once per process for
    each (backend, dtype, n, reps): a process that trains several times (the test session: about 3 s a
    probe on two loaded cores) reuses the first measurement.
    """
    backend = jax.default_backend()
    if n is None:
        n = 2048 if backend == "cpu" else 8192
    return _matmul_peak(backend, jnp.dtype(dtype), n, reps)


@functools.cache
def _matmul_peak(backend: str, dtype: jnp.dtype, n: int, reps: int) -> float:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


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


def bpb(nll_nats: float, n_bytes: int) -> float:
    return float(nll_nats / np.log(2.0) / max(n_bytes, 1))
