"""Run plumbing shared by the training loop and the entry points: the run log, signal handling, the
run directory (one owner, by lock; metrics cut back on resume), and evaluation batches padded to a
fixed shape (so evaluation compiles once).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np

from frontier_jax.errors import BadInput


class RunError(BadInput):
    """A run that cannot start or continue (message names the file/setting and the problem)."""


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
        self._f = open(path, "a")
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
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
        probe = out_dir / f".write_probe.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunError(f"{out_dir}: output directory is not writable ({e.strerror or e})") from None


def prepare_run_dir(out_dir: Path, resume: bool) -> Path:
    out_dir = Path(out_dir)
    check_writable(out_dir)
    if not resume and (out_dir / "metrics.jsonl").exists():
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
    if not resume and (out_dir / "metrics.jsonl").exists():
        if lock:
            lock.release()
        raise RunError(f"{out_dir}: already holds a run; use --resume {out_dir} or another --out")
    return lock, created


def truncate_metrics(path: Path, step: int) -> int:
    """Drop the rows of steps after `step` (logged after the checkpoint a resume restores, e.g. before a
    SIGKILL) and any torn last line; returns how many rows were dropped. Rewritten atomically."""
    from frontier_jax.report import atomic_write_text

    if not path.is_file():
        return 0
    keep, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            dropped += bool(line.strip())
            continue
        if row.get("step", 0) > step:
            dropped += 1
        else:
            keep.append(line)
    if dropped:
        atomic_write_text(path, "".join(r + "\n" for r in keep))
    return dropped


def finished_summary(out_dir: Path, meta: dict, train_cfg) -> dict:
    """What `--resume` of a finished run returns (its summary, stop_reason "already finished", a note)."""
    path = out_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    limit = "max_steps" if meta["step"] >= train_cfg.max_steps else "budget_seconds"
    return {**summary, "stop_reason": "already finished", "steps": meta["step"], "run_dir": str(out_dir),
            "note": f"{out_dir}: already finished at step {meta['step']} (train.{limit} reached); nothing to do: "
                    "raise train.max_steps or --budget to continue"}


def stopped_before_training(out_dir: Path, resume: bool, signals, step, created: bool) -> dict:
    """A signal before the first step: nothing trained, nothing to save; a new run directory is removed."""
    if created:
        shutil.rmtree(out_dir, ignore_errors=True)
    return {"stop_reason": f"signal {signals.received} before training", "steps": step or 0, "run_dir": str(out_dir),
            "checkpoint_step": step if resume else None}


class Signals:
    """SIGINT/SIGTERM set a flag that the run checks between steps (and between its start-up phases).

    The first signal prints what will happen (`stopping`, set by the run for its current phase); later
    ones are ignored with a line until that is done (SIGKILL still ends the process at once)."""

    def __init__(self):
        self.received: str | None = None
        self.stopping = "stopping before training starts; nothing to save"
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread: no handlers
                pass
        return self

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received:
            msg = f"{name} again: still {self.stopping} (SIGKILL would end it without that)"
        else:
            self.received, msg = name, f"{name}: {self.stopping}"
        os.write(2, (msg + "\n").encode())  # not print: a handler may run in the middle of a print

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def padded_val_batches(tokens: np.ndarray, seq_len: int, batch_seqs: int, process_index: int = 0,
                       process_count: int = 1):
    """(x, y, mask) of this process's non-overlapping windows: `frontier_jax.data.stream.val_batches`."""
    from frontier_jax.data.stream import val_batches

    return val_batches(tokens, seq_len, batch_seqs, process_index, process_count)


def load_run_data(cfg):
    """Tokenizer, byte tables, train shards and val tokens of a config, every check done up front
    (`frontier_jax.data.dataset.load_dataset`: directory, vocabulary, shard headers, manifest and
    tokenizer provenance, token ids, val length); the result's `provenance` is one line for the log."""
    from frontier_jax.data.dataset import load_dataset

    d = cfg.data
    return load_dataset(d.data_dir, d.tokenizer, cfg.model.vocab_size, cfg.train.seq_len, d.train_pattern, d.val_pattern)


def step_batch(loader, seqs_per_step: int, accum: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One step's rows of this process as [accum, rows / accum, T]: a single chunk of tokens_per_step + 1
    tokens, so the data never depends on how a step is split into devices and micro-batches (and the
    JAX and PyTorch trainers read exactly the same tokens)."""
    x, y = loader.next_batch(seqs_per_step)
    shape = (accum, x.shape[0] // accum, seq_len)
    return x.reshape(shape), y.reshape(shape)
