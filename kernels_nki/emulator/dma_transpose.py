"""Emulated `nki.isa.dma_transpose`: a transpose by the DMA engines, HBM or SBUF -> SBUF.

aws-neuron-sdk nki/api/nki/isa/__init__.py, dma_transpose: the permutation is (1, 0) for a 2-D source,
(2, 1, 0) for 3-D, (3, 1, 2, 0) for 4-D (`axes` may name it); `dst.shape` matches the transposed source
exactly, rank included (release-notes NKI 0.4.0 Breaking Changes); dst in SBUF, src in HBM or SBUF, same
dtype. dge_mode hwdge needs NeuronCore-v3 (rule dma.hwdge) and an indirect source (`.ap(vector_offset=)`) is
NeuronCore-v3+ ("TRN2+ only"; rule dma.indirect, as for dma_copy). The direct transpose carries no
NeuronCore-version note; AWS's nki-library attention_cte, whose tests run on trn1, calls it on SBUF tiles, so
it runs on both targets (rule dma_transpose.args). Counted as one DMA of the source's bytes, in buffers of
one element (a transpose moves no two neighbours together).
"""

from __future__ import annotations

import numpy as np

from kernels_nki.emulator import machine as _m
from kernels_nki.emulator.dma import _dma_side, dge_mode, oob_mode
from kernels_nki.emulator.machine import rule

_PERMS = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error, name=None):
    if isinstance(src, _m.AccessPattern) or isinstance(dst, _m.AccessPattern):
        rule("dma.indirect", "dma_transpose with an indirect access pattern")
        _m.fail("dma_transpose: an indirect source is not emulated", _m.NkiEmulatorError)
    dst, src = _dma_side(dst, "dma_transpose dst"), _dma_side(src, "dma_transpose src")
    if dge_mode == "hwdge":
        rule("dma.hwdge", "dma_transpose(dge_mode=hwdge)")
    perm = tuple(axes) if axes is not None else _PERMS.get(src.ndim)
    if perm not in _PERMS.values() or len(perm) != src.ndim:
        rule("dma_transpose.args", f"axes {axes} for a {src.ndim}-D source (supported: {sorted(_PERMS.values())})")
    want = tuple(src.shape[a] for a in perm)
    if dst.buffer != "sbuf" or dst.shape != want or dst.dtype != src.dtype:
        rule("dma_transpose.args", f"src {src.shape} {src.dtype} ({src.buffer}) -> dst {dst.shape} {dst.dtype} "
             f"({dst.buffer}); the transpose is {want} {src.dtype} in SBUF")
    m = _m.current()
    m.count_dma(src.size * src.dtype.itemsize, src.dtype.itemsize, dst=dst, srcs=(src,), op="dma_transpose")
    if m.compute:
        dst.data[...] = np.transpose(src.data, perm)
