"""Emulated `nki.isa` top-8 search instructions: max8, nc_find_index8, nc_match_replace8.

aws-neuron-sdk nki/api/nki/isa/__init__.py: max8 writes the 8 largest values of each partition in descending
order ([P, 8], read as fp32, 8 to 16,384 elements per partition); nc_find_index8 writes, per partition, the
index of the first occurrence of each of 8 values (uint16/uint32; an absent value gives all ones, NKI 0.6.0;
duplicate values advance through successive occurrences); nc_match_replace8 replaces the first occurrence of
each of 8 values by `imm` (duplicates processed from the last value down) and may write the matched indices.
None of them carries a NeuronCore-version note. The document names no engine for max8 / nc_find_index8; they
and nc_match_replace8 ("using the Vector engine") are counted as one VectorE pass over the data.
"""

from __future__ import annotations

import numpy as np

from kernels_nki.emulator import machine as _m
from kernels_nki.emulator.operands import _per_partition, _read, _tile, _write

_MIN, _MAX = 8, 16384


def _data(t, what):
    _tile(t, what)
    p, n = _per_partition(t)
    if not _MIN <= n <= _MAX:
        _m.fail(f"{what}: {n} elements per partition (8 to 16,384)", _m.NkiEmulatorError)
    return p, n


def _eights(t, p, what):
    _tile(t, what)
    if _per_partition(t) != (p, 8):
        _m.fail(f"{what} {t.shape}: must hold 8 elements on each of {p} partitions", _m.NkiEmulatorError)


def max8(dst, src, name=None):
    p, _ = _data(src, "max8 src")
    _eights(dst, p, "max8 dst")
    m = _m.current()
    m.count_engine("vector", src, op="max8", reads=(src,), writes=(dst,))
    if m.compute:
        _write(dst, -np.sort(-_read(src).reshape(p, -1), axis=1)[:, :8])


def _match(data, vals, reverse: bool):
    """Per partition: the position of each val's match (first unused occurrence), -1 when absent."""
    p = data.shape[0]
    out = np.full((p, 8), -1, dtype=np.int64)
    order = range(7, -1, -1) if reverse else range(8)
    for r in range(p):
        used = set()
        for j in order:
            hits = np.flatnonzero(data[r] == vals[r, j])
            free = [h for h in hits if h not in used]
            if free:
                out[r, j] = free[0]
                used.add(free[0])
    return out


def nc_find_index8(dst, data, vals, name=None):
    p, _ = _data(data, "nc_find_index8 data")
    _eights(vals, p, "nc_find_index8 vals")
    _eights(dst, p, "nc_find_index8 dst")
    if dst.dtype not in (np.uint16, np.uint32):
        _m.fail(f"nc_find_index8 dst dtype {dst.dtype} (uint16 or uint32)", _m.NkiEmulatorError)
    m = _m.current()
    m.count_engine("vector", data, op="nc_find_index8", reads=(data, vals), writes=(dst,))
    if m.compute:
        idx = _match(_read(data).reshape(p, -1), _read(vals).reshape(p, 8), reverse=False)
        ones = np.iinfo(dst.dtype).max
        dst.data[...] = np.where(idx < 0, ones, idx).astype(dst.dtype).reshape(dst.shape)


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    p, _ = _data(data, "nc_match_replace8 data")
    _eights(vals, p, "nc_match_replace8 vals")
    _tile(dst, "nc_match_replace8 dst")
    if dst_idx is not None:
        _eights(dst_idx, p, "nc_match_replace8 dst_idx")
    m = _m.current()
    m.count_engine("vector", data, op="nc_match_replace8", reads=(data, vals), writes=(dst, dst_idx))
    if not m.compute:
        return
    flat = _read(data).reshape(p, -1).copy()
    idx = _match(flat, _read(vals).reshape(p, 8), reverse=True)
    rows = np.repeat(np.arange(p)[:, None], 8, axis=1)
    hit = idx >= 0
    flat[rows[hit], idx[hit]] = np.float32(imm)
    _write(dst, flat.reshape(dst.shape) if dst.size == flat.size else flat)
    if dst_idx is not None:
        dst_idx.data[...] = np.where(hit, idx, np.iinfo(np.uint32).max).astype(dst_idx.dtype).reshape(dst_idx.shape)
