"""Emulated `nki.isa.nc_n_gather` (GpSimd): per-partition gather along the flattened free axis.

aws-neuron-sdk nki/api/nki/isa/__init__.py, nc_n_gather: for every partition, the free dimensions of
`data` are flattened and `dst[p, j] = data_flat[p, indices[p, j]]`; data, indices and dst in SBUF
(GpSimd cannot access PSUM), indices uint32, dst in data's dtype, equal partition sizes (<= 128), dst
with as many elements per partition as indices, index values in [0, elements per partition of data).
The document gives no cycle count (the trn1 arch guide, "GpSimd Engine / Cost Model", has no rule of
thumb for GpSimd; nc_n_gather "corresponds to n groups of instructions, n = ceil(elems_per_partition /
512)"): the emulator charges GpSimd one pass over `data`'s free size (ASSUMED, the conservative reading
of "n groups" of 512 elements each).
"""

from __future__ import annotations

import numpy as np

from kernels_nki.emulator import machine as _m
from kernels_nki.emulator.machine import rule
from kernels_nki.emulator.operands import _per_partition, _tile


def nc_n_gather(dst, data, indices, name=None):
    """dst[p, j] = data[p, :].flatten()[indices[p, j]] on GpSimd."""
    for t, what in ((dst, "dst"), (data, "data"), (indices, "indices")):
        _tile(t, f"nc_n_gather {what}", ("sbuf",), "gpsimd.psum")
    p, f = _per_partition(data)
    if indices.dtype != np.uint32:
        rule("gather.args", f"indices dtype {indices.dtype} (must be uint32)")
    if dst.dtype != data.dtype:
        rule("gather.args", f"dst dtype {dst.dtype} differs from data dtype {data.dtype}")
    if indices.shape[0] != p or dst.shape[0] != p or _per_partition(dst)[1] != _per_partition(indices)[1]:
        rule("gather.args", f"data {data.shape}, indices {indices.shape}, dst {dst.shape}")
    m = _m.current()
    m.count_engine("gpsimd", data, op="nc_n_gather", reads=(data, indices), writes=(dst,))
    if not m.compute:
        return
    idx = indices.data.reshape(p, -1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= f):
        rule("gather.args", f"index values in [{idx.min()}, {idx.max()}] outside [0, {f})")
    dst.data[...] = np.take_along_axis(data.data.reshape(p, f), idx, axis=1).reshape(dst.shape)
