"""Run plumbing shared by the training loop and the entry points: the run log, signal handling, the
run directory, and evaluation batches padded to a fixed shape (so evaluation compiles once).
"""

from __future__ import annotations

from frontier_jax.errors import BadInput

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
