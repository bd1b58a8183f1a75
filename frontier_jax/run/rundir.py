"""The run directory: its file names, preparing it, the run log, signals, metrics, summary, reading it back
(a run's start-up lifecycle: frontier_jax.run.startup; run resolution from the entry points' options:
frontier_jax.run.resolve).

It imports no JAX (numpy, and matplotlib for the plot), so both trainers write the same layout:

    config.json    the resolved config (frontier_jax.config.to_dict)
    env.json       versions, git hash, devices, resolved dtypes, host allocator
    kernels.json   the kernel table (JAX trainer)
    train.log      everything the run printed
    metrics.jsonl  one JSON object per train step (kind=train), validation (kind=val; the final one
                   final=true), round-trip validation (kind=roundtrip), sliding-window one (kind=sliding) or
                   test-time training pass (kind=ttt)
    final_steps.json  the final pipeline's stages done so far (frontier_jax.run.final; a resume runs the rest)
    summary.json   the run policy's summary (frontier_jax.run.driver); summary.txt the same as a table
    curves.png     train loss and val bpb (periodic subset, final full split, round trip; frontier_jax.run.curves)
    final_model.int8.ptz  the baseline's int8 + zlib artifact (eval.artifact int8_zlib), or
    final_model.int6.ptz  record 2026-03-23's int6 + lzma one (int6_lzma; frontier_jax.interop.artifact)
    code.json      the project's source files the run imported, each with its bytes and sha256 (what the
                   contests count as code and the submission check scans: frontier_jax.contest.codebytes)
    ttt.jsonl      test-time training, when a run has it: its score and train events in the order they
                   happened (the contract: frontier_jax.submission.evidence)
    checkpoints/   orbax checkpoints, one directory per step (JAX trainer)
    weights.npz    the weights in the interop format (PyTorch baseline)

Every file is written to a temporary name and renamed into place; the metrics log is appended line
by line and flushed, so an interrupted run keeps every line it finished. No file is written through a
symlink (`frontier_jax.data.files`: renames, and O_NOFOLLOW for the log, the metrics and the lock), so a run
directory that arrives with `.lock` or `train.log` linked to a file elsewhere cannot make a run overwrite it.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


from frontier_jax.run import curves
from frontier_jax.run.roundtrip import FORMAT_LABELS
from frontier_jax.config import TTT_LINE, Config, load_run_config
from frontier_jax.data import files
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
FINAL_STEPS = "final_steps.json"
WEIGHTS = "weights.npz"



class RunError(BadInput):
    """A run that cannot start or continue (message names the file/setting and the problem)."""


# ----------------------------------------------------------------------------- preparing, log, signals


class RunLog:
    """Prints and appends to <run>/train.log; lines logged before the run directory exists (`attach`) are
    kept and written when it does, so nothing is written before the inputs are checked."""

    def __init__(self, path: Path | None = None, echo: bool = True, enabled: bool = True):
        self.enabled = enabled
        self.echo = echo and enabled
        self._f = None
        self._pending: list[str] = []
        if path:
            self.attach(path)

    def attach(self, path: Path) -> None:
        if not self.enabled:
            return
        self._f = files.open_append(path, "the run log")
        self._f.write("".join(m + "\n" for m in self._pending))
        self._f.flush()
        self._pending = []

    def __call__(self, msg: str = "") -> None:
        if self.echo:
            print(msg, flush=True)
        if self._f:
            self._f.write(msg + "\n")
            self._f.flush()
        elif self.enabled:
            self._pending.append(msg)

    def file(self, msg: str) -> None:
        """To train.log only (progress lines while a progress bar holds the terminal)."""
        echo, self.echo = self.echo, False
        try:
            self(msg)
        finally:
            self.echo = echo

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None


class RunDirLock:
    """One process owns a run directory: an exclusive `flock` on `<run>/.lock`, held until `release` or the
    process's death (the kernel drops it, so a SIGKILLed run does not block its own `--resume`)."""

    NAME = ".lock"

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / self.NAME
        self._fd = files.open_lock(self.path, "the run directory's lock file")
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise RunError(f"{run_dir}: another process (pid {holder}) is running in this directory "
                           f"({self.path} is locked); wait for it to end or choose another --out") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


def check_writable(out_dir: Path) -> None:
    """Refuse an output directory that cannot be created or written (one line)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out_dir, prefix=".write_probe.")  # O_EXCL: never through a symlink
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise RunError(f"{out_dir}: output directory is not writable ({e.strerror or e})") from None


def holds_run(out_dir: Path) -> bool:
    """A directory holds a run when it has metrics, a checkpoint or weights (a trained run, or one that
    `interop import` made: config.json, env.json, checkpoints/0); a config.json alone (a start that
    stopped before training) is not one."""
    out_dir = Path(out_dir)
    ckpts = out_dir / CHECKPOINTS
    return ((out_dir / METRICS).exists() or (out_dir / WEIGHTS).exists()
            or (ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir())))


def prepare_run_dir(out_dir: Path, resume: bool) -> Path:
    out_dir = Path(out_dir)
    check_writable(out_dir)
    if not resume and holds_run(out_dir):
        raise RunError(f"{out_dir}: already holds a run; use --resume {out_dir} or another --out")
    return out_dir


def claim_run_dir(out_dir: Path, resume: bool, take_lock: bool = True) -> tuple[RunDirLock | None, bool]:
    """(lock, created) for a run directory, taken before anything is written to it: created (and
    checked writable) unless resuming, locked, then checked under the lock that a new run does not land
    on an existing one. `created`: the directory did not exist before (removed again by `abandon`)."""
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    if resume and created:
        raise RunError(f"{out_dir}: not a run directory (it does not exist)")
    check_writable(out_dir)
    try:
        lock = RunDirLock(out_dir) if take_lock else None
    except RunError:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    if not resume and holds_run(out_dir):
        if lock:
            lock.release()
        raise RunError(f"{out_dir}: already holds a run; use --resume {out_dir} or another --out")
    return lock, created


def truncate_metrics(path: Path, step: int) -> int:
    """Drop the rows of steps after `step` (logged after the checkpoint a resume restores, e.g. before a
    SIGKILL) and any torn last line; returns how many rows were dropped. Rewritten atomically."""
    if not os.path.lexists(path):
        return 0
    keep, dropped = [], 0
    for line in files.read_regular(path, "the metrics log", follow=False).decode("utf-8", "replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            dropped += bool(line.strip())
            continue
        if not _metrics_row(row):
            dropped += 1
        elif row.get("step", 0) > step:
            dropped += 1
        else:
            keep.append(line)
    if dropped:
        atomic_write_text(path, "".join(r + "\n" for r in keep))
    return dropped


class Signals:
    """SIGINT/SIGTERM/SIGHUP (a closed terminal) set a flag that the run checks between steps (and between
    its start-up phases).

    The first signal prints what will happen (`stopping`, set by the run for its current phase); later
    ones are ignored with a line until that is done (SIGKILL still ends the process at once), except before
    training starts: there nothing is to be saved, so a second signal runs `discard` (set by the start-up: a
    run directory it created is removed) and ends the process at once (exit 128 + its number) instead of
    waiting for a warm-up step, which on a slow device can take minutes. With
    `interrupt` set (the final validation, after the last checkpoint is saved) a signal also raises
    KeyboardInterrupt, so the run stops at once instead of finishing the evaluation."""

    HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    BEFORE_TRAINING = "stopping before training starts; nothing to save"

    def __init__(self):
        self.received: str | None = None
        self.stopping = self.BEFORE_TRAINING
        self.discard = None  # what a second signal before training runs before it exits (a new run directory removed)
        self.interrupt = False
        self._old = {}

    def __enter__(self):
        for sig in self.HANDLED:
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread: no handlers
                pass
        return self

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received and not self.interrupt and self.stopping == self.BEFORE_TRAINING:
            os.write(2, f"{name} again: exiting before training starts (nothing to save)\n".encode())
            if self.discard is not None:
                self.discard()
            os._exit(128 + signum)
        if self.received:
            msg = f"{name} again: still {self.stopping} (SIGKILL would end it without that)"
        else:
            self.received, msg = name, f"{name}: {self.stopping}"
        os.write(2, (msg + "\n").encode())  # not print: a handler may run in the middle of a print
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt(name)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ----------------------------------------------------------------------------- writing


def _finite(obj):
    """`obj` with every non-finite float (a diverged run's loss) as None: strict JSON (null), never a bare NaN
    that other JSON readers refuse."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def write_json(path: Path, obj) -> None:
    """`obj` as strict JSON (non-finite numbers as null), written by rename."""
    text = json.dumps(_finite(obj), indent=2, sort_keys=True, default=str, allow_nan=False)
    atomic_write_text(path, text + "\n")


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
        self._f = files.open_append(self.path, "the metrics log") if enabled else None

    def log(self, **row) -> None:
        self.rows.append(row)
        if self._f:
            try:
                self._f.write(json.dumps(row, default=float) + "\n")
                self._f.flush()
            except OSError as e:  # a full disk: name the file (the write itself names none)
                raise OSError(e.errno, e.strerror, str(self.path)) from None

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

    sub, fmt = summary.get("submission_bytes"), summary.get("artifact_format", "int8_zlib")
    label = FORMAT_LABELS.get(fmt, fmt)
    size = "-" if sub is None else (f"{sub:,} bytes = {summary['artifact_bytes']:,} {label} model + "
                                    f"{summary['code_bytes']:,} code")
    line = (summary.get("score") or {}).get("line", "")
    sliding, ttt = line.endswith("_sliding_window"), line == TTT_LINE  # else the round trip scores

    def scored(stage_is_score: bool) -> str:
        return f": the score under the rules profile {summary.get('rules_profile') or '-'}" if stage_is_score else ""

    return [
        ("run directory", f("run_dir")),
        ("config", f"{summary.get('config_name')} ({summary.get('config_hash')})"),
        ("steps", f("steps")),
        ("tokens", f("tokens", "{:,}")),
        ("train time", f("train_seconds", "{:.1f} s")),
        ("tokens/s", f("tokens_per_second", "{:,.0f}")),
        ("matmul peak", f("matmul_peak_flops", "{:.3g} FLOP/s") + (f" ({summary['peak_source']})"
                                                                    if summary.get("peak_source") else "")),
        ("MFU", f("mfu", "{:.1%}")),
        ("final train loss", f("final_train_loss", "{:.4f}")),
        ("val loss", f("val_loss", "{:.4f}")),
        ("val bpb", f("val_bpb", "{:.4f}") + " (full val split, trained weights)"),
        ("round-trip val bpb", f("roundtrip_val_bpb", "{:.4f}") + f" ({label} artifact{scored(not (sliding or ttt))})"),
        *([("sliding val bpb", f("sliding_val_bpb", "{:.4f}") + f" (stride {summary.get('sliding_stride')}, {label} "
                                                                f"artifact{scored(sliding)})")]
          if summary.get("sliding_val_bpb") is not None else []),
        *([("TTT val bpb", f("ttt_val_bpb", "{:.4f}") + f" (score-first test-time training from the {label} artifact"
                                                        f"{scored(ttt)}; a full val split pass: about "
                                                        f"{f('ttt_estimate_full_val_seconds', '{:.0f}')} s on "
                                                        f"{f('ttt_hardware')})")]
          if summary.get("ttt_val_bpb") is not None else []),
        ("submission size", size),
        ("rules", "-" if not summary.get("rules_profile") else
         f"{summary.get('rules_line') or summary['rules_profile']} (every rule: python -m frontier_jax.submission "
         f"check {summary.get('run_dir', 'RUN')})"),
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
        changed = curves.run_overrides(run_dir, summary.get("config_name"))
        curves.plot_run(read_metrics(run_dir), run_dir / CURVES,
                        f"{run_dir.name}: {summary.get('config_name')} ({summary.get('implementation', 'jax')})"
                        + (f"; {', '.join(changed)}" if changed else ""))
    return table


# ----------------------------------------------------------------------------- reading


def _metrics_row(row) -> bool:
    """A metrics row as the runs write them: an object with a string kind and an integer step."""
    return (isinstance(row, dict) and isinstance(row.get("kind"), str) and isinstance(row.get("step"), int)
            and not isinstance(row.get("step"), bool))


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of <run>/metrics.jsonl ([] when there is none); DataError naming the file and line for a
    line that is not a metrics row (a torn last line, as a killed run leaves it, is skipped)."""
    path = Path(run_dir) / METRICS
    if not os.path.lexists(path):
        return []
    lines = files.read_regular(path, "the metrics log", follow=False).decode("utf-8", "replace").splitlines()
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                continue
            raise DataError(f"{path}:{i}: not a JSON line") from None
        if not _metrics_row(row):
            raise DataError(f"{path}:{i}: not a metrics row (an object with a string kind and an integer step)")
        rows.append(row)
    return rows


def read_config(run_dir) -> Config:
    """The resolved config of a run directory; one line (DataError / ConfigError) when it is not a run
    or its config.json is unreadable."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).is_file():
        raise DataError(f"{run_dir}: not a run directory (no {CONFIG})")
    return load_run_config(run_dir / CONFIG)


def read_json_object(path: Path, what: str, schema: dict | None = None) -> dict:
    """A JSON object file of a run, checked against `schema` (`frontier_jax.data.files.check_schema`; default:
    any object); one line naming the file when unreadable (a truncated write), not a regular file or of
    another shape."""
    return files.read_json(path, schema or {}, what)


def read_env(run_dir) -> dict:
    """<run>/env.json ({} when absent); DataError (one line) when unreadable."""
    path = Path(run_dir) / ENV
    if not path.is_file():
        return {}
    return read_json_object(path, "run environment")


# ----------------------------------------------------------------------------- the final steps of a run


def write_final_steps(run_dir, step: int, records: dict) -> None:
    """<run>/final_steps.json: the final pipeline's stages done for checkpoint `step` (frontier_jax.run.final)."""
    write_json(Path(run_dir) / FINAL_STEPS, {"step": step, "stages": records})


_SUMS = {"nll_sum_nats": float, "tokens": int, "bytes": int, "eval_seconds": float}
# the TTT stage's record beside its sums: the estimated seconds of a TTT pass over the full FineWeb val split at the
# run's measured speed, on the hardware named (frontier_jax.ttt)
TTT_RECORD = {"estimate_full_val_seconds": float, "hardware": str}
FINAL_STEPS_SCHEMA = {"step": int, "stages": {
    "val?": _SUMS, "roundtrip?": _SUMS, "sliding?": _SUMS, "ttt?": {**_SUMS, **TTT_RECORD},
    "artifact?": {"artifact_format": str, "artifact": str, "artifact_bytes": int, "code_bytes": int,
                  "submission_bytes": int}}}
FINAL_STAGES = ("val", "artifact", "roundtrip", "sliding", "ttt")  # frontier_jax.run.final.STAGES


def read_final_steps(run_dir, step: int) -> dict:
    """The final stages recorded for checkpoint `step` ({} when none, or recorded for another step); DataError
    (one line naming the file) when it is not what `write_final_steps` writes (`FINAL_STEPS_SCHEMA`, sums that
    score something)."""
    path = Path(run_dir) / FINAL_STEPS
    if not os.path.lexists(path):
        return {}
    obj = read_json_object(path, "record of the final steps", FINAL_STEPS_SCHEMA)
    if obj["step"] != step:
        return {}
    stages = {k: v for k, v in obj["stages"].items() if k in FINAL_STAGES}
    for stage, fields in stages.items():
        if stage != "artifact" and not (math.isfinite(fields["nll_sum_nats"]) and fields["tokens"] > 0 and
                                        fields["bytes"] > 0):
            raise DataError(f"{path}: stage {stage} scores nothing (its sums: {fields})")
    return stages


def finished(run_dir) -> bool:
    """Whether a run's final steps completed: its summary.json exists and says so (`final_complete`)."""
    path = Path(run_dir) / SUMMARY_JSON
    return path.is_file() and read_json_object(path, "run summary").get("final_complete") is True
