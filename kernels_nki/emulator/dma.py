"""Emulated `nki.isa` DMA instructions (dma_copy, dma_compute): HBM <-> SBUF, casts, indirect gather/scatter."""

from __future__ import annotations

import numpy as np

from kernels_nki.emulator import machine as _m
from kernels_nki.emulator.optable import add
from kernels_nki.emulator.machine import rule
from kernels_nki.emulator.operands import _read, _tile, _write


class oob_mode:
    error = "error"
    skip = "skip"


class dge_mode:
    unknown = "unknown"
    none = "none"
    swdge = "swdge"
    hwdge = "hwdge"


def _dma_side(t, what: str):
    if isinstance(t, _m.AccessPattern):
        return t
    if not isinstance(t, _m.Tensor):
        _m.fail(f"{what} must be a tensor, got {type(t).__name__}", _m.NkiEmulatorError)
    if t.buffer not in ("sbuf",) + _m.HBM:
        rule("dma.buffers", f"{what} is in {t.buffer}")
    return _tile(t, what, ("sbuf",) + _m.HBM, "dma.buffers", engine_access=False)


def _run(t) -> int:
    """Contiguous elements per DMA buffer on this side: an indirect access pattern's gathered rows are
    contiguous only past the indirect axis (its pattern's trailing [1, n] pairs)."""
    if not isinstance(t, _m.AccessPattern):
        return t.contiguous_elements()
    return _m.contiguous_run([(n, stride) for stride, n in t.pattern[1:]])


def _buffer_bytes(dst, src) -> int:
    """Bytes per DMA buffer: a buffer is contiguous on both sides (arch guide, "Data movement between HBM
    and SBUF using DMAs": "Data within a DMA buffer must be continuous in the memory address map")."""
    return min(_run(dst), _run(src)) * src.dtype.itemsize


def _indirect(t, dge) -> bool:
    if not isinstance(t, _m.AccessPattern):
        return False
    rule("dma.indirect", "a DMA with .ap(vector_offset=...)")
    if dge not in (dge_mode.unknown, dge_mode.swdge):
        rule("dma.indirect_dge", f"indirect DMA with dge_mode={dge}")
    return True


def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=None,
             name=None, **removed):
    """dst = src between HBM and SBUF (not PSUM); equal element counts (row-major order); a dtype change
    casts through float32 in the DMA engine. Either side may be an indirect `.ap(vector_offset=)`."""
    if removed:
        gone = set(removed) & {"dst_rmw_op", "unique_indices"}
        if gone:
            rule("dma.removed_args", f"dma_copy({', '.join(sorted(gone))}=...)")
        raise TypeError(f"dma_copy() got unexpected keyword arguments {sorted(removed)}")
    dst, src = _dma_side(dst, "dma_copy dst"), _dma_side(src, "dma_copy src")
    if dge_mode == "hwdge":
        rule("dma.hwdge", "dma_copy(dge_mode=hwdge)")
        if dst.dtype != src.dtype:
            rule("dma.hwdge_dtype", f"{src.dtype} -> {dst.dtype}")
    ind_dst, ind_src = _indirect(dst, dge_mode), _indirect(src, dge_mode)
    if ind_dst and ind_src:
        _m.fail("dma_copy: at most one side may be indirect", _m.NkiEmulatorError)
    if dst.size != src.size:
        rule("dma.elements", f"{src.shape} ({src.size} elements) -> {dst.shape} ({dst.size} elements)")
    m = _m.current()
    m.count_dma(src.size * src.dtype.itemsize, _buffer_bytes(dst, src), dst=dst,
                srcs=(src,) + ((src.vector_offset,) if ind_src else ()) + ((dst.vector_offset,) if ind_dst else ()))
    if not m.compute:
        return
    value = src.base.data.reshape(-1)[src.flat_index()] if ind_src else src.data
    value = np.asarray(value)
    if value.dtype != dst.dtype:
        value = value.astype(np.float32).astype(dst.dtype)
    if ind_dst:
        if not dst.base.data.flags.c_contiguous:
            _m.fail("dma_copy: scatter into a non-contiguous HBM tensor", _m.NkiEmulatorError)
        dst.base.data.reshape(-1)[dst.flat_index()] = value.reshape(dst.shape)
    else:
        dst.data[...] = value.reshape(dst.shape)


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None):
    """dst = srcs[0] + srcs[1] + ... in the DMA engine (fp32). With an indirect dst (a scatter RMW): exactly two
    sources, one of them the same access pattern as dst, the other SBUF data, and indices unique."""
    srcs = list(srcs)
    if reduce_op is not add or any(float(s) != 1.0 for s in (scales or ())) or not unique_indices:
        rule("dma_compute.args", f"reduce_op={reduce_op!r}, scales={scales}, unique_indices={unique_indices}")
    dst = _dma_side(dst, "dma_compute dst")
    srcs = [_dma_side(s, "dma_compute src") for s in srcs]
    for s in srcs:
        _indirect(s, dge_mode.unknown)
        if s.size != dst.size:
            rule("dma.elements", f"dma_compute src {s.shape} vs dst {dst.shape}")
    m = _m.current()
    m.count_dma(sum(s.size * s.dtype.itemsize for s in srcs), min(_buffer_bytes(dst, s) for s in srcs), dst=dst,
                srcs=tuple(srcs), op="dma_compute")
    if isinstance(dst, _m.AccessPattern):
        _indirect(dst, dge_mode.unknown)
        data = [s for s in srcs if not isinstance(s, _m.AccessPattern)]
        if len(srcs) != 2 or len(data) != 1 or data[0].buffer != "sbuf":
            rule("dma_compute.args", "a scatter read-modify-write takes dst's access pattern and one SBUF source")
        if not m.compute:
            return
        idx = dst.flat_index()
        rows = dst.vector_offset.data.reshape(-1)
        if len(np.unique(rows)) != len(rows):
            rule("dma_compute.args", "scatter indices repeat (unique_indices=True is required and promised)")
        flat = dst.base.data.reshape(-1)
        flat[idx] = (flat[idx].astype(np.float32) + _read(data[0]).reshape(dst.shape)).astype(flat.dtype)
        return
    if not m.compute:
        return
    total = sum((s.base.data.reshape(-1)[s.flat_index()] if isinstance(s, _m.AccessPattern) else s.data)
                .astype(np.float32).reshape(dst.shape) for s in srcs)
    _write(dst, total)
