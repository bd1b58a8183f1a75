"""Emulated `nki.isa.nc_stream_shuffle` (VectorE): cross-partition moves within each 32-partition quadrant.

aws-neuron-sdk nki/api/nki/isa/__init__.py, nc_stream_shuffle: dst partition i of each quadrant copies src
partition shuffle_mask[i] of the same quadrant (255: dst partition left unmodified); dst and src have the same
dtype and elements per partition; with num_active_partitions = ceil(max(src, dst partitions) / 32) * 32 the
start partitions must be 0 (96 / 128 active), 0 / 64 (64) or 0 / 32 / 64 / 96 (32) (rule partition.start).
"""

from __future__ import annotations

from kernels_nki.emulator import machine as _m
from kernels_nki.emulator.machine import rule
from kernels_nki.emulator.operands import _per_partition, _tile

_STARTS = {32: (0, 32, 64, 96), 64: (0, 64), 96: (0,), 128: (0,)}


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    _tile(dst, "nc_stream_shuffle dst"), _tile(src, "nc_stream_shuffle src")
    mask = [int(x) for x in shuffle_mask]
    if len(mask) != 32 or any(not (0 <= x < 32 or x == 255) for x in mask):
        _m.fail(f"nc_stream_shuffle: shuffle_mask must be 32 partitions of a quadrant (or 255), got {mask}",
                _m.NkiEmulatorError)
    (ps, fs), (pd, fd) = _per_partition(src), _per_partition(dst)
    if dst.dtype != src.dtype or fs != fd:
        rule("alu.no_broadcast", f"nc_stream_shuffle src {src.shape} {src.dtype} -> dst {dst.shape} {dst.dtype}")
    active = -(-max(ps, pd) // 32) * 32
    for t, what in ((src, "src"), (dst, "dst")):
        if t.pstart not in _STARTS[active]:
            rule("partition.start", f"nc_stream_shuffle {what} starts at partition {t.pstart} with {active} active "
                 f"partitions (allowed {_STARTS[active]})")
    m = _m.current()
    m.count_engine("vector", dst, op="nc_stream_shuffle", reads=(src,), writes=(dst,))
    if not m.compute:
        return
    s = src.data.reshape(ps, fs)
    out = dst.data.reshape(pd, fd).copy()
    for j in range(pd):
        k = mask[j % 32]
        if k == 255:
            continue
        i = (j // 32) * 32 + k
        if i >= ps:
            _m.fail(f"nc_stream_shuffle: dst partition {j} reads src partition {i} of {ps}", _m.NkiEmulatorError)
        out[j] = s[i]
    dst.data[...] = out.astype(dst.dtype).reshape(dst.shape)
