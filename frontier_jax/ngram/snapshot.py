"""Published n-gram snapshots: immutable directories snap_<version> written through a temporary
directory renamed into place, with the rows memory-mapped read-only on load.

A snapshot holds rows_OK4.npy (uint32 [orders, buckets, 4]: fingerprint, top token, top count, total),
unigram_V.npy (uint64 counts of the training tokens the tables saw) and header.json (format, orders,
table size, the hash constants, tokens consumed, the shards and ranges read, table statistics).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from frontier_jax.ngram.tables import MUL_A, MUL_B, SEED_A, SEED_B, NgramTables, fingerprint_bits

FORMAT = "frontier_jax.ngram.tables"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Snapshot:
    """An immutable published table set: rows [O, K, 4] uint32, unigram counts [65536], JSON header."""

    path: Path
    header: dict
    rows_OK4: np.ndarray
    unigram_V: np.ndarray

    @property
    def min_order(self) -> int:
        return int(self.header["min_order"])

    @property
    def version(self) -> int:
        return int(self.header["snapshot"])


SNAP_PREFIX = "snap_"
TMP_PREFIX = ".tmp_snap_"


def snapshot_name(version: int) -> str:
    return f"{SNAP_PREFIX}{version:06d}"


def write_snapshot(tables: NgramTables, out_dir: Path, version: int, complete: bool, extra: dict | None = None) -> Path:
    """Write tables to out_dir/snap_<version> through a temporary directory renamed into place."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / snapshot_name(version)
    if final.exists():
        raise FileExistsError(f"{final}: snapshot version {version} already published")
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=TMP_PREFIX))
    try:
        np.save(tmp / "rows_OK4.npy", tables.rows_OK4)
        np.save(tmp / "unigram_V.npy", tables.unigram_V)
        header = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "snapshot": version,
            "complete": complete,
            "min_order": tables.min_order,
            "max_order": tables.max_order,
            "table_log2_size": tables.log2_size,
            "fingerprint_bits": fingerprint_bits(tables.log2_size),
            "hash": {"seed_a": SEED_A, "seed_b": SEED_B, "mul_a": MUL_A, "mul_b": MUL_B, "shift": 15},
            "chunk_tokens": tables.chunk_tokens,
            "tokens_consumed": tables.tokens_consumed,
            "sources": list(tables.sources),
            "stats": tables.stats(),
            **(extra or {}),
        }
        (tmp / "header.json").write_text(json.dumps(header, indent=1))
        os.chmod(tmp, 0o755)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_snapshot(path) -> Snapshot:
    """Open a published snapshot (arrays memory-mapped read-only); ValueError on a foreign format."""
    path = Path(path)
    try:
        header = json.loads((path / "header.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no header.json (not a published n-gram snapshot)") from None
    if header.get("format") != FORMAT or header.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format {header.get('format')} v{header.get('format_version')}, expected {FORMAT} v{FORMAT_VERSION}")
    rows = np.load(path / "rows_OK4.npy", mmap_mode="r")
    unigram = np.load(path / "unigram_V.npy", mmap_mode="r")
    return Snapshot(path, header, rows, unigram)


def list_snapshots(out_dir) -> list[tuple[int, Path]]:
    """Published snapshots in out_dir as (version, path), oldest first."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    found = []
    for p in out_dir.iterdir():
        if p.name.startswith(SNAP_PREFIX) and p.name[len(SNAP_PREFIX) :].isdigit() and (p / "header.json").exists():
            found.append((int(p.name[len(SNAP_PREFIX) :]), p))
    return sorted(found)
