"""Training token stream (resumable, per-process slices) and validation windows.

Training follows the baseline: shards are read in name order, sequentially, wrapping around to the
first shard after the last; no shuffling. Each step takes one contiguous chunk from the stream and
each process uses its own slice of it (`TrainLoader`), so the data position is just (shard, offset)
and a checkpoint stores it as a small JSON dict.

Validation follows the baseline too: all val shards concatenated, truncated to a whole number of
`seq_len` windows (+1 token for the last target), scored as non-overlapping windows. `val_batches`
is the one validation batcher (training's periodic and final validation, `evaluate`, the PyTorch
baseline): fixed-shape masked batches, non-overlapping or, with `stride`, sliding windows in which
every target is still scored exactly once but with a longer context.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from frontier_jax.data.shards import DataError, read_shard, shard_token_count


class TokenStream:
    """Sequential reader over `files`, wrapping around; shards are memmapped lazily, one at a time."""

    def __init__(self, files: list[Path]):
        self.files = [Path(f) for f in files]
        if not self.files:
            raise DataError("<train>: token stream needs at least one shard file")
        self._shard = 0
        self._offset = 0
        self._tokens: np.ndarray | None = None

    def _current(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = read_shard(self.files[self._shard])
        return self._tokens

    def _advance(self) -> None:
        self._shard = (self._shard + 1) % len(self.files)
        self._offset = 0
        self._tokens = None

    def take(self, n: int) -> np.ndarray:
        """The next `n` tokens as int32 (spanning shards and wrapping around as needed)."""
        if n < 0:
            raise ValueError(f"TokenStream.take: n must be >= 0, got {n}")
        out = np.empty(n, dtype=np.int32)
        filled, empty_in_a_row = 0, 0
        while filled < n:
            tokens = self._current()
            avail = tokens.shape[0] - self._offset
            if avail <= 0:
                empty_in_a_row += 1
                if empty_in_a_row > len(self.files):
                    raise DataError(f"{self.files[0].parent}: all {len(self.files)} train shards are empty")
                self._advance()
                continue
            empty_in_a_row = 0
            k = min(n - filled, avail)
            out[filled : filled + k] = tokens[self._offset : self._offset + k]
            filled += k
            self._offset += k
        return out

    def state(self) -> dict:
        return {"shard": self._shard, "offset": self._offset}

    def restore(self, state: dict) -> None:
        shard, offset = int(state["shard"]), int(state["offset"])
        if not 0 <= shard < len(self.files):
            raise DataError(f"{self.files[0].parent}: saved stream position names shard {shard}, only {len(self.files)} exist")
        count = shard_token_count(self.files[shard])
        if not 0 <= offset <= count:
            raise DataError(f"{self.files[shard]}: saved stream offset {offset} is outside the shard's {count} tokens")
        self._shard, self._offset, self._tokens = shard, offset, None


class TrainLoader:
    """The baseline's token loader: each micro-batch takes one chunk of global tokens + 1 from the stream.

    Process p of P uses rows [p*R, (p+1)*R) of the global batch (R = global_seqs / P): x from
    chunk[p*R*T : (p+1)*R*T], y shifted by one. With P = 1 this is exactly the baseline's loader at
    world size 1; with P > 1 every process sees the rows a single process would have (so multi-process
    runs reproduce single-process losses), unlike the baseline's multi-GPU loader, which gives each
    rank its own +1 token and so a slightly different split.
    """

    def __init__(self, files: list[Path], seq_len: int, process_index: int = 0, process_count: int = 1):
        if seq_len <= 0:
            raise ValueError(f"TrainLoader: seq_len must be positive, got {seq_len}")
        if not 0 <= process_index < process_count:
            raise ValueError(f"TrainLoader: process_index {process_index} not in [0, {process_count})")
        self.stream = TokenStream(files)
        self.files = self.stream.files
        self.seq_len = seq_len
        self.process_index = process_index
        self.process_count = process_count
        self._consumed = 0

    def next_batch(self, global_seqs: int) -> tuple[np.ndarray, np.ndarray]:
        """(x, y), int32 [global_seqs / process_count, seq_len] each, with y the next-token targets of x."""
        if global_seqs <= 0 or global_seqs % self.process_count:
            raise ValueError(f"TrainLoader: global_seqs {global_seqs} is not a positive multiple of process_count {self.process_count}")
        global_tokens = global_seqs * self.seq_len
        local_tokens = global_tokens // self.process_count
        chunk = self.stream.take(global_tokens + 1)
        self._consumed += global_tokens + 1
        lo = self.process_index * local_tokens
        x, y = chunk[lo : lo + local_tokens], chunk[lo + 1 : lo + local_tokens + 1]
        return x.reshape(-1, self.seq_len), y.reshape(-1, self.seq_len)

    def position_tokens(self) -> int:
        """Tokens taken from the stream since the start (all processes together)."""
        return self._consumed

    def state(self) -> dict:
        return {**self.stream.state(), "position_tokens": self._consumed}

    def restore(self, state: dict) -> None:
        self.stream.restore(state)
        self._consumed = int(state.get("position_tokens", 0))


def load_val_tokens(files: list[Path], seq_len: int) -> np.ndarray:
    """All val shards concatenated (int32), truncated to whole `seq_len` windows plus one token."""
    files = [Path(f) for f in files]
    if not files:
        raise DataError("<val>: no validation shard files given")
    tokens = np.concatenate([np.asarray(read_shard(f), dtype=np.int32) for f in files])
    if tokens.shape[0] < seq_len + 1:
        where = files[0] if len(files) == 1 else files[0].parent
        raise DataError(f"{where}: val split has {tokens.shape[0]} tokens, fewer than one window of {seq_len + 1}")
    usable = ((tokens.shape[0] - 1) // seq_len) * seq_len
    return tokens[: usable + 1]


def window_starts(n_tokens: int, seq_len: int, stride: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(start_W, score_from_W) int64 of the evaluation windows over a stream of `n_tokens` tokens.

    Window w is x = tokens[s : s+T], y = tokens[s+1 : s+T+1] with s = start_W[w]; only targets
    y[score_from_W[w]:] are scored. stride None: the baseline's non-overlapping windows, s = w*T, all
    targets scored, a tail shorter than a window dropped. stride in [1, T]: sliding windows. Window 0
    starts at 0 and scores all its targets; window k starts at k*stride and scores its last `stride`
    targets (each with at least T - stride + 1 tokens of context); if targets remain after the last
    full step, one final window ends exactly at the last token and scores only the not-yet-scored
    tail. Every target is scored exactly once.
    """
    if stride is None:
        n = max(n_tokens - 1, 0) // seq_len
        return np.arange(n, dtype=np.int64) * seq_len, np.zeros(n, np.int64)
    if not 0 < stride <= seq_len:
        raise ValueError(f"sliding windows: stride must be in [1, seq_len={seq_len}], got {stride}")
    if n_tokens < seq_len + 1:
        raise ValueError(f"sliding windows: {n_tokens} tokens are fewer than one window of {seq_len + 1}")
    steps = (n_tokens - 1 - seq_len) // stride
    starts = np.arange(steps + 1, dtype=np.int64) * stride
    score_from = np.full(steps + 1, seq_len - stride, np.int64)
    score_from[0] = 0
    scored_to = int(starts[-1]) + seq_len  # targets tokens[1 .. scored_to] are scored
    if scored_to < n_tokens - 1:
        last = n_tokens - 1 - seq_len
        starts, score_from = np.append(starts, last), np.append(score_from, scored_to - last)
    return starts, score_from


def sliding_windows(tokens: np.ndarray, seq_len: int, stride: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """The windows of `window_starts(len(tokens), seq_len, stride)` one at a time: (x, y, score_from)."""
    tokens = np.asarray(tokens)
    for s, f in zip(*window_starts(tokens.shape[0], seq_len, stride)):
        yield tokens[s : s + seq_len].astype(np.int32), tokens[s + 1 : s + seq_len + 1].astype(np.int32), int(f)


def val_batches(tokens: np.ndarray, seq_len: int, batch_seqs: int, process_index: int = 0, process_count: int = 1,
                stride: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The one validation batcher: (x, y, mask) int32 [batch_seqs / process_count, seq_len] of this process.

    Windows from `window_starts` (non-overlapping by default, sliding with `stride`); mask[b, t] = 1
    where target t of row b is scored. The W windows are dealt to processes contiguously (process p
    gets [p*W//P, (p+1)*W//P): every window is scored by exactly one process); every process yields
    the same number of batches of one fixed shape, short ones padded with mask-0 rows, so evaluation
    compiles once and runs in lockstep across processes.
    """
    tokens = np.asarray(tokens)
    return window_batches(tokens, *window_starts(tokens.shape[0], seq_len, stride), seq_len, batch_seqs,
                          process_index, process_count)


def window_batches(tokens: np.ndarray, starts: np.ndarray, score_from: np.ndarray, seq_len: int, batch_seqs: int,
                   process_index: int = 0,
                   process_count: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`val_batches` of given windows (start_W, score_from_W, e.g. a subset of `window_starts`' in order: the
    windows of one test-time-training chunk): (x, y, mask) of this process, fixed shape, short batches padded
    with mask-0 rows, the windows dealt to processes contiguously."""
    if batch_seqs <= 0 or batch_seqs % process_count:
        raise ValueError(f"val_batches: batch_seqs {batch_seqs} is not a positive multiple of process_count {process_count}")
    if not 0 <= process_index < process_count:
        raise ValueError(f"val_batches: process_index {process_index} not in [0, {process_count})")
    return _window_batches(np.asarray(tokens), starts, score_from, seq_len, batch_seqs, process_index, process_count)


def _window_batches(tokens, starts, score_from, seq_len, batch_seqs, process_index, process_count):
    local, w = batch_seqs // process_count, starts.shape[0]
    lo, hi = process_index * w // process_count, (process_index + 1) * w // process_count
    t_T = np.arange(seq_len, dtype=np.int64)
    for first in range(0, -(-w // process_count), local):
        a, b = min(lo + first, hi), min(lo + first + local, hi)
        idx_BT = starts[a:b, None] + t_T[None, :]
        x, y = tokens[idx_BT].astype(np.int32), tokens[idx_BT + 1].astype(np.int32)
        mask = (t_T[None, :] >= score_from[a:b, None]).astype(np.int32)
        pad = ((0, local - (b - a)), (0, 0))
        yield np.pad(x, pad), np.pad(y, pad), np.pad(mask, pad)
