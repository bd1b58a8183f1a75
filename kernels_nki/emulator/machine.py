"""Emulated NeuronCore-v2 (trn1) state: tensors, on-chip memory budgets, work counters, error locations.

One `Machine` exists per emulated kernel call (held in a thread-local, so `jax.pure_callback` threads
do not share one). Tensors are NumPy arrays plus the buffer they live in. Limits come from
../shared/specs/nki.md section 3 (SBUF 192 KiB and PSUM 8 x 2 KiB per partition, partition dim <= 128).
Live on-chip memory is what the kernel can still reach: an allocation is released when its last
Python reference (the tile or a view of it) dies, so a tile re-allocated in a loop is counted twice
for a moment, as double buffering on the hardware would.

In count-only mode (`compute=False`) every instruction is issued, checked and counted, but the
arithmetic is skipped: tensors are zero-stride NumPy views that cost no memory.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import weakref

import math

import ml_dtypes
import numpy as np

PMAX = 128  # partitions (nl.tile_size.pmax)
SBUF_PARTITION_BYTES = 192 * 1024
PSUM_BANKS = 8
PSUM_BANK_BYTES = 2048
FREE_MAX_SBUF = 64 * 1024  # VectorE/ScalarE free-size limit per operand (elements)
MIN_II = 64  # ISA docs: an engine instruction costs max(MIN_II, N) cycles, MIN_II roughly 64
ON_CHIP = ("sbuf", "psum")
HBM = ("hbm", "shared_hbm", "private_hbm")

_EMULATOR_DIR = os.path.dirname(os.path.abspath(__file__))


class NkiEmulatorError(RuntimeError):
    """A kernel did something the emulator (or the NKI API) does not allow."""


class NkiLimitError(NkiEmulatorError):
    """A NeuronCore-v2 hardware limit was violated."""


def kernel_location() -> str:
    """file:line of the innermost frame outside the emulator package (the kernel source line)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _EMULATOR_DIR:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def fail(message: str, cls: type[NkiEmulatorError] = NkiLimitError):
    raise cls(f"{kernel_location()}: {message}")


def as_dtype(dtype) -> np.dtype:
    if isinstance(dtype, np.dtype):
        return dtype
    if dtype is None:
        fail("dtype is required", NkiEmulatorError)
    if getattr(dtype, "__name__", None) == "bfloat16" or str(dtype) == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


@dataclasses.dataclass
class Counters:
    """Work issued by one or more kernel calls. `*_issued` includes padding; `*_useful` does not.

    TensorE: MACs. issued = 128 x 128 x N per nc_matmul (the whole PE array streams N moving columns
    whatever K and M are); useful = K x M x N; transposes are issued with zero useful MACs.
    Vector/Scalar/GpSimd: lane-elements. issued = 128 lanes x max(MIN_II, free size) per
    instruction; useful = partitions x free size. DMA: bytes moved and transfers issued.
    """

    pe_instructions: int = 0
    pe_macs_issued: int = 0
    pe_macs_issued_fp32: int = 0  # the part of pe_macs_issued that ran at the fp32 (1/4) rate
    pe_macs_useful: int = 0
    vector_instructions: int = 0
    vector_elems_issued: int = 0
    vector_elems_useful: int = 0
    scalar_instructions: int = 0
    scalar_elems_issued: int = 0
    scalar_elems_useful: int = 0
    gpsimd_instructions: int = 0
    gpsimd_elems_issued: int = 0
    gpsimd_elems_useful: int = 0
    dma_transfers: int = 0
    dma_bytes: int = 0
    sbuf_peak_bytes: int = 0  # per partition
    psum_peak_banks: int = 0

    def __add__(self, other: Counters) -> Counters:
        out = {}
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            out[f.name] = max(a, b) if f.name.endswith("_peak_bytes") or f.name.endswith("_peak_banks") else a + b
        return Counters(**out)

    def scaled(self, k: int) -> Counters:
        """The counters of k identical calls (peaks unchanged)."""
        return Counters(**{f.name: getattr(self, f.name) * (1 if "_peak_" in f.name else k) for f in dataclasses.fields(self)})

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Allocation:
    """Owns the on-chip bytes of one nl.ndarray; freed when the last tile/view referencing it dies."""

    __slots__ = ("__weakref__", "buffer", "psum_matmul_written")

    def __init__(self, buffer: str):
        self.buffer = buffer
        self.psum_matmul_written = None  # PSUM only: per-element "already written by nc_matmul" mask


class Tensor:
    """A tile (SBUF/PSUM) or an HBM tensor. Dimension 0 of an on-chip tile is the partition dim."""

    __slots__ = ("data", "buffer", "alloc", "machine", "mask")

    def __init__(self, data: np.ndarray, buffer: str, alloc: _Allocation, machine: Machine, mask=None):
        self.data, self.buffer, self.alloc, self.machine, self.mask = data, buffer, alloc, machine, mask

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def __repr__(self):
        return f"Tensor({self.buffer}, {self.shape}, {self.dtype})"

    def __getitem__(self, index) -> Tensor:
        norm = _normalise_index(index, self.shape)
        mask = self.mask[norm] if self.mask is not None else None
        return Tensor(self.data[norm], self.buffer, self.alloc, self.machine, mask)

    def __setitem__(self, index, value):
        fail("item assignment on a tensor is not NKI: write through an instruction's dst", NkiEmulatorError)

    def reshape(self, shape) -> Tensor:
        shape = tuple(int(s) for s in shape)
        if self.buffer not in HBM:
            fail(f"reshape of an on-chip {self.buffer} tile is not supported by the emulator", NkiEmulatorError)
        if math.prod(shape) != self.data.size:
            fail(f"cannot reshape {self.shape} to {shape}", NkiEmulatorError)
        if self.machine.compute and not self.data.flags.c_contiguous:
            fail("reshape of a non-contiguous HBM view", NkiEmulatorError)
        return Tensor(self.data.reshape(shape), self.buffer, self.alloc, self.machine)

    def __bool__(self):
        fail("a tensor has no truth value inside a kernel (no data-dependent Python control flow)", NkiEmulatorError)

    def ap(self, pattern, offset=0, vector_offset=None, indirect_dim=0) -> AccessPattern:
        """An HBM access pattern for nisa.dma_copy (gather/scatter when vector_offset is given)."""
        return AccessPattern(self, pattern, offset, vector_offset, indirect_dim)


class AccessPattern:
    """`hbm_tensor.ap(pattern, offset, vector_offset=, indirect_dim=0)`: element (i0, i1, ...) of the view
    is the base tensor's flat element offset + sum_k pattern[k][0] * i_k, in elements; pattern pairs are
    [stride, count], the first pair the partition axis. With vector_offset (an SBUF int32 [count0, 1]
    tile, read when the DMA runs) the index i0 is replaced by vector_offset[i0] (indirect DMA: a row
    gather as a source, a row scatter as a destination). Only HBM bases, only indirect_dim 0.
    """

    def __init__(self, base: Tensor, pattern, offset, vector_offset, indirect_dim):
        if not isinstance(base, Tensor) or base.buffer not in HBM:
            fail(".ap() access patterns are for HBM tensors", NkiEmulatorError)
        pattern = [(int(s), int(n)) for s, n in pattern]
        if not pattern or any(n <= 0 for _, n in pattern):
            fail(f".ap(): bad pattern {pattern}", NkiEmulatorError)
        if indirect_dim != 0:
            fail(".ap(): the emulator supports indirect_dim=0 only", NkiEmulatorError)
        if vector_offset is not None:
            if not isinstance(vector_offset, Tensor) or vector_offset.buffer != "sbuf":
                fail(".ap(): vector_offset must be an SBUF tile", NkiEmulatorError)
            if vector_offset.shape[0] != pattern[0][1] or math.prod(vector_offset.shape[1:]) != 1:
                fail(f".ap(): vector_offset {vector_offset.shape} must be [{pattern[0][1]}, 1]", NkiEmulatorError)
            if not np.issubdtype(vector_offset.dtype, np.integer):
                fail(f".ap(): vector_offset must hold integers, got {vector_offset.dtype}", NkiEmulatorError)
        self.base, self.pattern, self.offset, self.vector_offset = base, pattern, int(offset), vector_offset
        self.buffer, self.machine = base.buffer, base.machine
        self.shape = tuple(n for _, n in pattern)
        self.dtype = base.dtype
        self.ndim = len(self.shape)

    def flat_index(self) -> np.ndarray:
        """Flat element offsets into the base array (compute mode only); bounds-checked."""
        idx = np.full(self.shape, self.offset, dtype=np.int64)
        for axis, (stride, n) in enumerate(self.pattern):
            if axis == 0 and self.vector_offset is not None:
                steps = self.vector_offset.data.reshape(-1).astype(np.int64)
            else:
                steps = np.arange(n, dtype=np.int64)
            idx += stride * steps.reshape((n,) + (1,) * (self.ndim - axis - 1))
        size = self.base.data.size
        if idx.min() < 0 or idx.max() >= size:
            fail(f"indirect DMA out of bounds: offsets [{idx.min()}, {idx.max()}] for {size} elements "
                 "(oob_mode.error)")
        return idx


def _normalise_index(index, shape) -> tuple:
    """Basic indexing only, bounds-checked (NumPy would silently clip an out-of-range slice)."""
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) > len(shape):
        fail(f"index {index} has more axes than the tensor shape {shape}", NkiEmulatorError)
    out = []
    for axis, (ix, dim) in enumerate(zip(index, shape)):
        if isinstance(ix, slice):
            start = 0 if ix.start is None else int(ix.start)
            stop = dim if ix.stop is None else int(ix.stop)
            if ix.step not in (None, 1):
                fail(f"axis {axis}: strided slice {ix} is not supported", NkiEmulatorError)
            if not (0 <= start <= stop <= dim):
                fail(f"axis {axis}: slice [{start}:{stop}] is out of bounds for size {dim}", NkiEmulatorError)
            if start == stop:
                fail(f"axis {axis}: empty slice [{start}:{stop}]", NkiEmulatorError)
            out.append(slice(start, stop))
        elif isinstance(ix, (int, np.integer)):
            if not 0 <= int(ix) < dim:
                fail(f"axis {axis}: index {int(ix)} is out of bounds for size {dim}", NkiEmulatorError)
            out.append(int(ix))
        else:
            fail(f"axis {axis}: unsupported index {ix!r} (use slices, nl.ds or ints)", NkiEmulatorError)
    return tuple(out)


class Machine:
    """Counters, live on-chip memory and ScalarE reduce registers of one emulated kernel call."""

    def __init__(self, compute: bool = True):
        self.compute = compute
        self.counters = Counters()
        self.sbuf_live = 0
        self.psum_live_banks = 0
        self.scalar_reduce_regs = np.full((PMAX,), np.nan, dtype=np.float32)

    # ---------------------------------------------------------------- allocation

    def allocate(self, shape, dtype, buffer: str, fill=None) -> Tensor:
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        dtype = as_dtype(dtype)
        if buffer not in ON_CHIP + HBM:
            fail(f"unknown buffer {buffer!r}", NkiEmulatorError)
        if any(s <= 0 for s in shape):
            fail(f"shape {shape} has a non-positive dimension", NkiEmulatorError)
        alloc = _Allocation(buffer)
        if buffer in ON_CHIP:
            self._reserve(shape, dtype, buffer, alloc)
        if fill is None:  # fresh memory: NaN for floats so uninitialised reads show
            fill = np.nan if np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16 else np.iinfo(dtype).min
        if self.compute:
            data = np.full(shape, fill, dtype=dtype)
        else:
            data = np.broadcast_to(np.zeros((), dtype=dtype), shape)
        mask = None
        if buffer == "psum":
            alloc.psum_matmul_written = np.zeros(shape, dtype=bool) if self.compute else np.broadcast_to(np.zeros((), bool), shape)
            mask = alloc.psum_matmul_written
        return Tensor(data, buffer, alloc, self, mask)

    def wrap_hbm(self, array: np.ndarray, buffer: str = "hbm") -> Tensor:
        return Tensor(array, buffer, _Allocation(buffer), self)

    def _reserve(self, shape, dtype, buffer, alloc):
        if len(shape) < 1 or shape[0] > PMAX:
            fail(f"{buffer} tile {shape}: partition dimension {shape[0]} exceeds {PMAX}")
        per_partition = math.prod(shape[1:]) * dtype.itemsize
        if buffer == "sbuf":
            if self.sbuf_live + per_partition > SBUF_PARTITION_BYTES:
                fail(f"SBUF overflow: allocating {per_partition} B/partition with {self.sbuf_live} B live "
                     f"exceeds {SBUF_PARTITION_BYTES} B per partition")
            self.sbuf_live += per_partition
            self.counters.sbuf_peak_bytes = max(self.counters.sbuf_peak_bytes, self.sbuf_live)
            weakref.finalize(alloc, self._release_sbuf, per_partition)
        else:
            banks = -(-per_partition // PSUM_BANK_BYTES)
            if self.psum_live_banks + banks > PSUM_BANKS:
                fail(f"PSUM overflow: allocating {banks} bank(s) ({per_partition} B/partition) with "
                     f"{self.psum_live_banks} of {PSUM_BANKS} banks of {PSUM_BANK_BYTES} B live")
            self.psum_live_banks += banks
            self.counters.psum_peak_banks = max(self.counters.psum_peak_banks, self.psum_live_banks)
            weakref.finalize(alloc, self._release_psum, banks)

    def _release_sbuf(self, n: int):
        self.sbuf_live -= n

    def _release_psum(self, banks: int):
        self.psum_live_banks -= banks

    # ---------------------------------------------------------------- counting

    def count_engine(self, engine: str, tile: Tensor, extra_instructions: int = 0):
        """One Vector/Scalar/GpSimd instruction over `tile` (partition dim first)."""
        partitions = tile.shape[0] if tile.ndim else 1
        free = math.prod(tile.shape[1:]) if tile.ndim > 1 else 1
        c = self.counters
        issued = PMAX * (max(MIN_II, free) + extra_instructions * MIN_II)
        setattr(c, f"{engine}_instructions", getattr(c, f"{engine}_instructions") + 1)
        setattr(c, f"{engine}_elems_issued", getattr(c, f"{engine}_elems_issued") + issued)
        setattr(c, f"{engine}_elems_useful", getattr(c, f"{engine}_elems_useful") + partitions * free)

    def count_dma(self, nbytes: int):
        self.counters.dma_transfers += 1
        self.counters.dma_bytes += int(nbytes)

    def count_matmul(self, k: int, m: int, n: int, fp32: bool, useful: bool = True):
        c = self.counters
        issued = PMAX * PMAX * n
        c.pe_instructions += 1
        c.pe_macs_issued += issued
        c.pe_macs_issued_fp32 += issued if fp32 else 0
        c.pe_macs_useful += k * m * n if useful else 0


_local = threading.local()


def current() -> Machine:
    machine = getattr(_local, "machine", None)
    if machine is None:
        fail("NKI emulator call outside an emulated kernel (call the @nki.jit kernel)", NkiEmulatorError)
    return machine


class running:
    """Context manager making `machine` the current one on this thread."""

    def __init__(self, machine: Machine):
        self.machine = machine

    def __enter__(self) -> Machine:
        self.prev = getattr(_local, "machine", None)
        _local.machine = self.machine
        return self.machine

    def __exit__(self, *exc):
        _local.machine = self.prev
        return False
