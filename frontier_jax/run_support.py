"""Run plumbing shared by the training loop and the entry points: the run log, signal handling, the
run directory (one owner, by lock; metrics cut back on resume), and evaluation batches padded to a
fixed shape (so evaluation compiles once).
"""

from __future__ import annotations

from frontier_jax.errors import BadInput

import dataclasses
import fcntl
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np


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
    """(x, y, mask) int32 [batch_seqs / process_count, seq_len] for this process.

    The W non-overlapping windows are dealt to processes contiguously; every process yields the same
    number of batches (short ones padded with mask 0), as evaluation runs in lockstep across processes.
    """
    if batch_seqs % process_count:
        raise ValueError(f"val batch of {batch_seqs} sequences cannot be split over {process_count} processes")
    local = batch_seqs // process_count
    n = (tokens.shape[0] - 1) // seq_len
    x_all = tokens[: n * seq_len].reshape(n, seq_len)
    y_all = tokens[1 : n * seq_len + 1].reshape(n, seq_len)
    lo, hi = process_index * n // process_count, (process_index + 1) * n // process_count
    per_process = -(-n // process_count)
    for start in range(0, per_process, local):
        a, b = min(lo + start, hi), min(lo + start + local, hi)
        x, y = x_all[a:b].astype(np.int32), y_all[a:b].astype(np.int32)
        mask = np.ones_like(x)
        pad = ((0, local - x.shape[0]), (0, 0))
        yield np.pad(x, pad), np.pad(y, pad), np.pad(mask, pad)


@dataclasses.dataclass
class RunData:
    tokenizer: object
    tables: object  # ByteTables of the exact bpb rule
    train_files: list
    val_tokens: np.ndarray


def load_run_data(cfg) -> RunData:
    """Tokenizer, byte tables, train shards and val tokens of a config, every check done up front:
    a missing/empty directory, a tokenizer that does not match model.vocab_size, a bad shard header
    (all of them now, not when the stream first reaches one hours later), a val split under one window."""
    from frontier_jax.data.shards import DataError, list_shards, shard_token_count
    from frontier_jax.data.stream import load_val_tokens
    from frontier_jax.data.tokenizer import check_vocab, load_tokenizer

    if not cfg.data.data_dir:
        raise DataError("<data>: no data directory given (--data DIR or data.data_dir)")
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    check_vocab(tokenizer, cfg.model.vocab_size, "model.vocab_size")
    train_files = list_shards(cfg.data.data_dir, cfg.data.train_pattern)
    for f in train_files:
        shard_token_count(f)
    val_tokens = load_val_tokens(list_shards(cfg.data.data_dir, cfg.data.val_pattern), cfg.train.seq_len)
    return RunData(tokenizer, tokenizer.byte_tables(cfg.model.vocab_size), train_files, val_tokens)


def step_batch(loader, seqs_per_step: int, accum: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One step's rows of this process as [accum, rows / accum, T]: a single chunk of tokens_per_step + 1
    tokens, so the data never depends on how a step is split into devices and micro-batches (and the
    JAX and PyTorch trainers read exactly the same tokens)."""
    x, y = loader.next_batch(seqs_per_step)
    shape = (accum, x.shape[0] // accum, seq_len)
    return x.reshape(shape), y.reshape(shape)
