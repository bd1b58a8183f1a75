"""Token shard format (as the baseline, modded-nanogpt and llm.c): read, write, list.

A shard is 256 little-endian int32 header words (1,024 bytes) -- word 0 the magic 20240520, word 1
the version 1, word 2 the token count N -- followed by N little-endian uint16 token ids. The file
size must be exactly 1024 + 2*N. Readers return a read-only `np.memmap`, so a shard costs no memory
until its tokens are touched. Every problem raises `DataError` whose message starts with the path.
"""

from __future__ import annotations

from frontier_jax.errors import BadInput

from pathlib import Path

import numpy as np

from frontier_jax.data.files import UnsafeFile, atomic_write, atomic_write_text, check_regular  # noqa: F401 - atomic_write_text: the one text writer

MAGIC = 20240520
VERSION = 1
HEADER_WORDS = 256
HEADER_BYTES = HEADER_WORDS * 4
_MAX_TOKEN = np.iinfo(np.uint16).max


class DataError(BadInput):
    """Bad data or tokenizer input; the message starts with the offending file or directory."""


def _read_header(path: Path) -> int:
    """Validate the header of `path` against its size and return the declared token count."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except FileNotFoundError:
        raise DataError(f"{path}: no such shard file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a shard file") from None
    if len(raw) < HEADER_BYTES:
        raise DataError(f"{path}: file has {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(raw, dtype="<i4")
    if int(header[0]) != MAGIC:
        raise DataError(f"{path}: bad magic {int(header[0])} (expected {MAGIC})")
    if int(header[1]) != VERSION:
        raise DataError(f"{path}: unsupported version {int(header[1])} (expected {VERSION})")
    count = int(header[2])
    if count < 0:
        raise DataError(f"{path}: negative token count {count} in header")
    expected = HEADER_BYTES + 2 * count
    if size != expected:
        raise DataError(f"{path}: file size {size} does not match header token count {count} (expected {expected} bytes)")
    return count


def shard_token_count(path) -> int:
    """The token count declared in the header of `path` (header and size validated, tokens not read)."""
    return _read_header(Path(path))


def read_shard(path) -> np.ndarray:
    """A read-only memmap (uint16, little-endian) of the tokens of `path`, after validating the header."""
    path = Path(path)
    count = _read_header(path)
    if count == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(count,))


def write_shard(path, tokens: np.ndarray) -> None:
    """Write `tokens` (any integer array of ids in [0, 65535]) to `path` atomically."""
    path = Path(path)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise DataError(f"{path}: tokens must be a 1-D array, got shape {tokens.shape}")
    if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
        raise DataError(f"{path}: tokens must be integers, got dtype {tokens.dtype}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > _MAX_TOKEN):
        raise DataError(
            f"{path}: token ids must lie in [0, {_MAX_TOKEN}], got range [{int(tokens.min())}, {int(tokens.max())}]"
        )
    if tokens.size > np.iinfo(np.int32).max:
        raise DataError(f"{path}: {tokens.size} tokens do not fit the int32 header count")
    header = np.zeros(HEADER_WORDS, dtype="<i4")
    header[:3] = (MAGIC, VERSION, tokens.size)
    body = tokens.astype("<u2", copy=False)
    atomic_write(path, [header.tobytes(), body.tobytes()])


def list_shards(data_dir, pattern: str) -> list[Path]:
    """The files in `data_dir` matching the glob `pattern`, sorted by name; DataError if none, or when a
    match is not a readable regular file (a dangling symlink, a symlink loop, a directory, a device): a
    shard that cannot be read is an error, never a split scored on the shards that remain."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: data directory does not exist")
    files = sorted(data_dir.glob(pattern))
    if not files:
        raise DataError(f"{data_dir}: no files matching {pattern!r}")
    for f in files:
        try:
            check_regular(f, f"matches the shard pattern {pattern!r} but")
        except UnsafeFile as e:
            raise DataError(str(e)) from None
    return files
