"""Run plumbing shared by the training loop and the entry points: the run log, signal handling, the
run directory, and evaluation batches padded to a fixed shape (so evaluation compiles once).
"""

from __future__ import annotations

from frontier_jax.errors import BadInput

import dataclasses
import os
import signal
from pathlib import Path

import numpy as np


class RunError(BadInput):
    """A run that cannot start or continue (message names the file/setting and the problem)."""


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


def prepare_run_dir(out_dir: Path, resume: bool) -> Path:
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write_probe.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunError(f"{out_dir}: output directory is not writable ({e.strerror or e})") from None
    if not resume and (out_dir / "metrics.jsonl").exists():
        raise RunError(f"{out_dir}: already holds a run; use --resume {out_dir} or another --out")
    return out_dir


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
