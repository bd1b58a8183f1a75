"""Split integrity at start-up: train and val are different files and share (almost) no documents.

Files: every train and val shard is resolved to the file it is (`stat` follows symlinks: device and
inode, so a symlink, a hard link or a `data.train_pattern` that also matches the val shards are all
the same file) and a file in both splits is refused. The n-gram builder reads a subset of the train
shards, so it is covered too.

Documents: a document is the run of tokens after each BOS (prepare writes BOS before every document;
so do the competition's shards). A val document whose exact token sequence also occurs as a train
document is a duplicate; the share is the duplicated val documents' tokens over all val document
tokens, reported in the start-up line and refused above `data.max_val_duplicate_share`. The pass is
vectorised: each document gets a cheap 64-bit key (its length, first and last four tokens, mixed);
only train documents whose key is also a val document's key are hashed in full (BLAKE2b over their
tokens) and compared with the val documents of that key, so clean data costs one scan for BOS per
shard. Each train shard's result is cached in `<data_dir>/.split_check.json`, keyed by the shard's
size, mtime, ctime and inode and by a digest of the val documents' keys, so later starts only `stat`
the shards (docs/training.md gives the measured cost on the competition's shard sizes).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from frontier_jax.data.shards import DataError, atomic_write_text, read_shard

CACHE = ".split_check.json"
_MIX = np.uint64(0x9E3779B97F4A7C15)


def file_key(st: os.stat_result) -> list[int]:
    """A shard's identity for the caches: size, mtime, ctime (changes on any write, even with mtime
    restored), inode."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def check_distinct_files(train_files: list[Path], val_files: list[Path]) -> None:
    """DataError when a train shard is the same file as a val shard (symlink, hard link, same path)."""
    val = {}
    for f in val_files:
        st = os.stat(f)
        val[(st.st_dev, st.st_ino)] = f
    for f in train_files:
        st = os.stat(f)
        same = val.get((st.st_dev, st.st_ino))
        if same is not None:
            if Path(f).absolute() == Path(same).absolute():
                how = "the same path"
            elif Path(f).resolve() == Path(same).resolve():
                how = "a symlink to it"
            else:
                how = "a hard link to it"
            raise DataError(f"{f}: train shard is the val shard {same} ({how}): training on the val split would "
                            "score it as held out (check data.train_pattern / data.val_pattern)")


def _documents(tokens: np.ndarray, bos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the non-empty documents of a shard: the runs after each BOS (and before the first)."""
    b = np.flatnonzero(tokens == bos_id)
    starts = np.concatenate([[0], b + 1])
    ends = np.concatenate([b, [tokens.shape[0]]])
    keep = ends > starts
    return starts[keep], ends[keep]


def _keys(tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A cheap uint64 key per document: length, first four and last four tokens, mixed."""
    with np.errstate(over="ignore"):
        k = (ends - starts).astype(np.uint64) * _MIX
        last = ends - 1
        for j in range(4):
            for idx in (np.minimum(starts + j, last), np.maximum(last - j, starts)):
                k = (k ^ tokens[idx].astype(np.uint64)) * _MIX
                k ^= k >> np.uint64(29)
    return k


def _full_hash(tokens: np.ndarray, start: int, end: int) -> str:
    return hashlib.blake2b(np.ascontiguousarray(tokens[start:end]).tobytes(), digest_size=16).hexdigest()


class _Val:
    """The val documents, their keys, and full hashes computed on demand."""

    def __init__(self, val_files: list[Path], bos_id: int):
        self.tokens = np.concatenate([np.asarray(read_shard(f)) for f in val_files])
        self.starts, self.ends = _documents(self.tokens, bos_id)
        self.keys = _keys(self.tokens, self.starts, self.ends)
        order = np.argsort(self.keys, kind="stable")
        self.sorted_keys, self.order = self.keys[order], order
        self.total_tokens = int((self.ends - self.starts).sum())
        self.digest = hashlib.blake2b(self.keys.tobytes() + (self.ends - self.starts).tobytes(),
                                      digest_size=16).hexdigest()
        self._hashes: dict[int, str] = {}

    def hashes_with_key(self, key) -> dict[str, int]:
        """{full hash: tokens} of the val documents with this cheap key."""
        lo = int(np.searchsorted(self.sorted_keys, key, side="left"))
        hi = int(np.searchsorted(self.sorted_keys, key, side="right"))
        out = {}
        for i in self.order[lo:hi].tolist():
            if i not in self._hashes:
                self._hashes[i] = _full_hash(self.tokens, int(self.starts[i]), int(self.ends[i]))
            out[self._hashes[i]] = int(self.ends[i] - self.starts[i])
        return out


def _shard_duplicates(path: Path, val: _Val, bos_id: int) -> dict[str, int]:
    """{full hash: tokens} of the val documents that also occur as documents of the train shard `path`."""
    tokens = read_shard(path)
    starts, ends = _documents(tokens, bos_id)
    keys = _keys(tokens, starts, ends)
    found = {}
    for i in np.flatnonzero(np.isin(keys, val.sorted_keys)).tolist():
        candidates = val.hashes_with_key(keys[i])
        h = _full_hash(tokens, int(starts[i]), int(ends[i]))
        if h in candidates:
            found[h] = candidates[h]
    return found


def check_duplicates(data_dir: Path, train_files: list[Path], val_files: list[Path], bos_id: int,
                     max_share: float) -> tuple[float, int, int]:
    """(share of val document tokens duplicated in train, train shards read, val documents); DataError
    above `max_share`, naming the first train shard with duplicates."""
    cache_path = Path(data_dir) / CACHE
    try:
        cache = json.loads(cache_path.read_text(encoding="utf-8"))
        cache = cache if isinstance(cache, dict) and isinstance(cache.get("shards"), dict) else {}
    except (OSError, ValueError):
        cache = {}
    val_key = [[f.name, *file_key(f.stat())] for f in val_files]
    val, digest = None, cache.get("val_digest") if cache.get("val") == val_key else None
    if digest is None:
        val = _Val(val_files, bos_id)
        digest = val.digest
        cache = {"val": val_key, "val_digest": digest, "val_tokens": val.total_tokens,
                 "val_documents": int(val.starts.size), "shards": {}}
    shards, dup, first, read = cache["shards"], {}, None, 0
    for f in train_files:
        key = [*file_key(f.stat()), digest]
        hit = shards.get(f.name)
        if isinstance(hit, dict) and hit.get("key") == key and isinstance(hit.get("dup"), dict):
            found = hit["dup"]
        else:
            if val is None:
                val = _Val(val_files, bos_id)
            found, read = _shard_duplicates(f, val, bos_id), read + 1
            shards[f.name] = {"key": key, "dup": found}
        if found and first is None:
            first = f
        dup.update(found)
    total = int(cache.get("val_tokens") or 1)
    share = sum(dup.values()) / max(total, 1)
    if read:
        try:
            atomic_write_text(cache_path, json.dumps(cache, sort_keys=True) + "\n")
        except OSError:
            pass  # a read-only data directory: checked again next time
    if share > max_share:
        raise DataError(f"{first}: {len(dup)} val documents ({share:.2%} of the val split's document tokens) also "
                        f"occur in the train split (first in this shard); over data.max_val_duplicate_share="
                        f"{max_share:g}: val would not be held out")
    return share, read, int(cache.get("val_documents", 0))
