"""Emulated NeuronCore state: tensors and their views, on-chip memory budgets, work counters, the target.

One `Machine` exists per emulated kernel call (held in a thread-local, so `jax.pure_callback` threads
do not share one) and carries its target (`trn1` = NeuronCore-v2, `trn2` = NeuronCore-v3; limits in
`rules.TARGET_SPECS`) and its reading of AWS's documents (`rules.READINGS`: "any" or "strict"). Tensors
are NumPy views plus the buffer they live in and, on chip, the partition they start at. Every limit is a row
of `rules.RULES` (AWS sources there) checked through `rule()`. Live on-chip memory is what the kernel can still reach: an allocation is released when its last
Python reference (the tile or a view of it) dies, so a tile re-allocated in a loop is counted twice
for a moment, as double buffering on the hardware would.

In count-only mode (`compute=False`) every instruction is issued, checked and counted, but the
arithmetic is skipped: tensors are zero-stride NumPy views that cost no memory.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref

import ml_dtypes
import numpy as np

from kernels_nki.emulator import rules as _rules
from kernels_nki.emulator import trace as _trace
from kernels_nki.emulator.trace import layout as _layout
from kernels_nki.emulator.errors import NkiEmulatorError, NkiLimitError, NkiRuleError, fail, kernel_location
from kernels_nki.emulator.errors import reinterpret as _reinterpret

__all__ = ["NkiEmulatorError", "NkiLimitError", "NkiRuleError", "fail", "kernel_location"]

PMAX = 128  # partitions (nl.tile_size.pmax)
MIN_II = 64  # ISA docs: an engine instruction costs max(MIN_II, N) cycles, MIN_II roughly 64
FREE_AXES_MAX = 4  # arch guide: up to four-dimensional access pattern along the free axes
FREE_AXIS_MAX = 65535  # uint16 size per free axis
ON_CHIP = ("sbuf", "psum")
HBM = ("hbm", "shared_hbm", "private_hbm")
# trn1 values kept for callers (cost model, report); the running target's are in Machine.spec
SBUF_PARTITION_BYTES = _rules.TARGET_SPECS["trn1"].sbuf_partition_bytes
PSUM_BANKS = _rules.TARGET_SPECS["trn1"].psum_banks
PSUM_BANK_BYTES = _rules.TARGET_SPECS["trn1"].psum_bank_bytes


class Buffer(str):
    """An nl buffer object (nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, nl.private_hbm); compares as its name."""

    def __repr__(self):
        return f"nl.{str(self)}"


def rule(rule_id: str, detail: str, location: str | None = None) -> None:
    """Raise the rule's NkiRuleError at the kernel's line (or `location`) if it applies to the running target
    and reading."""
    machine = getattr(_local, "machine", None)
    if machine is None:
        _rules.violate(rule_id, detail, "trn1", location)
    else:
        _rules.violate(rule_id, detail, machine.target, location, machine.reading)


def as_dtype(dtype) -> np.dtype:
    if isinstance(dtype, np.dtype):
        return dtype
    if dtype is None:
        fail("dtype is required", NkiEmulatorError)
    if getattr(dtype, "__name__", None) == "bfloat16" or str(dtype) == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def is_float(dtype) -> bool:
    """NumPy floats and ml_dtypes' (bf16, fp8: kind 'V' without fields; the packed x4 names have a field)."""
    dtype = np.dtype(dtype)
    return np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16 or (dtype.kind == "V" and not dtype.names)


@dataclasses.dataclass
class Counters:
    """Work issued by one or more kernel calls. `*_issued` includes padding; `*_useful` does not.

    TensorE: MACs. issued = 128 x 128 x N per nc_matmul (the whole PE array streams N moving columns
    whatever K and M are; a row-tiled matmul: row tile size x 128 x N); useful = K x M x N; transposes
    and 0/1-stationary matmuls (is_stationary_onezero: a mask or a selection) and recomputations (an nc_matmul
    named 'recompute...': the same product again, in another layout) are issued with zero useful MACs. Vector/Scalar/GpSimd: lane-elements. issued = 128 lanes x
    max(MIN_II, free size) per instruction (2 x free size for a two-input VectorE instruction); useful = partitions x free size. DMA: bytes moved and transfers issued,
    and the contiguous buffers they are made of, with the bytes moved in buffers below the DMA bandwidth guide's
    256 B and 2 KiB marks (payload sizes the cost model's peak rate does not hold for: `Machine.count_dma`).
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
    dma_buffers: int = 0  # contiguous DMA buffers (one descriptor each): see `Machine.count_dma`
    dma_bytes_under_256: int = 0  # bytes moved in buffers < 256 B ("severely overhead-bound")
    dma_bytes_under_2k: int = 0  # bytes moved in buffers < 2 KiB (below the "minimum recommended")
    sbuf_peak_bytes: int = 0  # per partition
    psum_peak_banks: int = 0
    sbuf_spill_peak_bytes: int = 0  # per partition: live automatically allocated SBUF beyond the target's capacity

    def __add__(self, other: Counters) -> Counters:
        out = {}
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            out[f.name] = max(a, b) if f.name.endswith("_peak_bytes") or f.name.endswith("_peak_banks") else a + b
        return Counters(**out)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Allocation:
    """Owns the on-chip bytes of one nl.ndarray; freed when the last tile/view referencing it dies.

    `storage` is the whole allocation (what `.ap()` addresses); PSUM also tracks, per element, whether a
    matmul has written it (the first matmul write overwrites, later ones accumulate), and under the strict
    reading `matmul_groups`, the same in count-only mode too (`isa._inference`)."""

    __slots__ = ("__weakref__", "buffer", "storage", "psum_matmul_written", "matmul_groups", "serial")

    def __init__(self, buffer: str, storage=None):
        self.buffer, self.storage = buffer, storage
        self.psum_matmul_written = self.matmul_groups = None
        self.serial = next(_trace.SERIALS)  # names the allocation in an instruction trace (`trace.region`)


class Tensor:
    """A tile (SBUF/PSUM) or an HBM tensor. Dimension 0 of an on-chip tile is the partition dim, which
    starts at partition `pstart` of the allocation."""

    __slots__ = ("data", "buffer", "alloc", "machine", "mask", "pstart", "layout", "traced_region")

    def __init__(self, data: np.ndarray, buffer: str, alloc: _Allocation, machine: Machine, mask=None, pstart=0,
                 layout=None):
        self.data, self.buffer, self.alloc, self.machine, self.mask = data, buffer, alloc, machine, mask
        self.pstart = pstart
        self.traced_region = None  # trace.region's answer, once asked (a view's place never changes)
        self.layout = _layout(data.shape) if layout is None else layout

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def on_chip(self) -> bool:
        return self.buffer in ON_CHIP

    def __repr__(self):
        return f"Tensor({self.buffer}, {self.shape}, {self.dtype})"

    def _view(self, data, mask, pstart, layout) -> Tensor:
        return Tensor(data, self.buffer, self.alloc, self.machine, mask, pstart, layout)

    def contiguous_elements(self) -> int:
        """The longest run of elements this view reads or writes contiguously in memory: over all dims in
        HBM, within one partition on chip (a DMA buffer never spans partitions)."""
        return contiguous_run(list(zip(self.layout.shape, self.layout.strides))[1 if self.on_chip else 0:])

    def __getitem__(self, index) -> Tensor:
        norm, pstep, p0 = _normalise_index(index, self.shape, self.on_chip)
        if self.on_chip and pstep != 1:
            rule("partition.no_stride", f"partition-axis step {pstep} on {self!r}")
        data = self.data[norm]
        mask = self.mask[norm] if self.mask is not None else None
        layout = self.layout[norm]
        if self.on_chip and data.ndim < 2:  # on-chip views stay at least 2-D (the last free dim kept at 1)
            data = data.reshape(data.shape + (1,) * (2 - data.ndim))
            mask = mask.reshape(data.shape) if mask is not None else None
            layout = layout.reshape(data.shape)
        return self._view(data, mask, self.pstart + p0, layout)

    def __setitem__(self, index, value):
        fail("item assignment on a tensor is not NKI: write through an instruction's dst", NkiEmulatorError)

    def reshape(self, shape) -> Tensor:
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if math.prod(shape) != self.size:
            rule("view.reshape", f"cannot reshape {self.shape} to {shape} (element counts differ)")
        if self.on_chip and shape[0] != self.shape[0]:
            rule("view.reshape", f"on-chip reshape {self.shape} -> {shape} changes the partition dim")
        try:  # the layout decides, in count-only mode too: a reshape that would need a copy is not a view
            layout = self.layout.reshape(shape, copy=False)
        except ValueError:
            rule("view.reshape", f"the layout of {self!r} (a non-contiguous view) cannot be reshaped to {shape}")
            layout = _layout(shape)
        data = self.data.reshape(shape)
        mask = self.mask.reshape(shape) if self.mask is not None else None
        return self._view(data, mask, self.pstart, layout)

    def __bool__(self):
        fail("a tensor has no truth value inside a kernel (no data-dependent Python control flow)", NkiEmulatorError)

    def ap(self, pattern, offset=0, vector_offset=None, indirect_dim=0, scalar_offset=None, dtype=None):
        """An explicit access pattern over the tensor's storage: [stride, count] pairs in elements, the first
        pair the partition axis on chip. With vector_offset (an SBUF int [count0, 1] tile, read when the DMA
        runs) index i0 is replaced by vector_offset[i0]: indirect DMA (gather as src, scatter as dst)."""
        pattern = [(int(s), int(n)) for s, n in pattern]
        if not pattern or any(n <= 0 for _, n in pattern):
            rule("view.ap", f"bad pattern {pattern}")
        if scalar_offset is not None or indirect_dim not in (0, None):
            fail(".ap(): scalar_offset and indirect_dim != 0 are not emulated", NkiEmulatorError)
        storage = self.alloc.storage
        if dtype is not None and as_dtype(dtype) != self.dtype:  # reinterpret the storage's bytes (NkiTensor.ap)
            storage = _reinterpret(storage, as_dtype(dtype), self.on_chip)
            if vector_offset is not None or self.alloc.psum_matmul_written is not None:
                fail(f".ap(dtype={dtype}): a reinterpreting indirect or PSUM view is not emulated", NkiEmulatorError)
        if vector_offset is not None:
            return AccessPattern(self, pattern, offset, vector_offset)
        if self.on_chip:
            free = math.prod(storage.shape[1:])
            if pattern[0][0] != free:
                rule("view.ap", f"partition stride {pattern[0][0]} must equal the storage's free size {free}")
        shape = tuple(n for _, n in pattern)
        hi = int(offset) + sum(s * (n - 1) for s, n in pattern if s > 0)
        lo = int(offset) + sum(s * (n - 1) for s, n in pattern if s < 0)
        if lo < 0 or hi >= storage.size:
            rule("view.ap", f"pattern {pattern} at offset {offset} reaches outside {storage.size} elements")
        layout = _layout(shape, tuple(s for s, _ in pattern), int(offset))
        if not self.machine.compute:
            return self._view(np.broadcast_to(np.zeros((), self.dtype), shape), None, 0, layout)
        item = storage.itemsize
        flat = storage.reshape(-1)
        data = np.lib.stride_tricks.as_strided(flat[int(offset):], shape, tuple(s * item for s, _ in pattern))
        mask = None
        if self.alloc.psum_matmul_written is not None:
            m = self.alloc.psum_matmul_written.reshape(-1)
            mask = np.lib.stride_tricks.as_strided(m[int(offset):], shape, tuple(s * m.itemsize for s, _ in pattern))
        pstart = int(offset) // max(1, math.prod(storage.shape[1:])) if self.on_chip else 0
        return self._view(data, mask, pstart, layout)


def contiguous_run(dims) -> int:
    """Elements contiguous in memory at the end of (size, element stride) dims, innermost last."""
    run = 1
    for n, stride in reversed(dims):
        if n == 1:
            continue
        if stride != run:
            break
        run *= n
    return run




class AccessPattern:
    """`tensor.ap(pattern, offset, vector_offset=idx)`: an indirect (gather/scatter) HBM access for DMA.
    Element (i0, i1, ...) is the base's flat offset + pattern[0][0] * idx[i0] + sum_k>0 pattern[k][0] * i_k."""

    def __init__(self, base: Tensor, pattern, offset, vector_offset):
        if base.buffer not in HBM:
            rule("engine.hbm", "an indirect .ap(vector_offset=) addresses an HBM tensor")
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
        self.size = math.prod(self.shape)

    def flat_index(self) -> np.ndarray:
        """Flat element offsets into the base array (compute mode only); bounds-checked."""
        idx = np.full(self.shape, self.offset, dtype=np.int64)
        for axis, (stride, n) in enumerate(self.pattern):
            steps = self.vector_offset.data.reshape(-1).astype(np.int64) if axis == 0 else np.arange(n, dtype=np.int64)
            idx += stride * steps.reshape((n,) + (1,) * (self.ndim - axis - 1))
        size = self.base.data.size
        if idx.min() < 0 or idx.max() >= size:
            fail(f"indirect DMA out of bounds: offsets [{idx.min()}, {idx.max()}] for {size} elements "
                 "(oob_mode.error)")
        return idx


def _normalise_index(index, shape, on_chip: bool):
    """NumPy basic indexing (ints, slices with steps, Ellipsis, nl.ds), bounds-checked (NumPy would clip a
    slice silently). On chip an integer on the partition axis keeps it at size 1.
    Returns (index, partition step, first partition)."""
    if not isinstance(index, tuple):
        index = (index,)
    if any(ix is Ellipsis for ix in index):
        at = next(i for i, ix in enumerate(index) if ix is Ellipsis)
        index = index[:at] + (slice(None),) * (len(shape) - len(index) + 1) + index[at + 1:]
    if len(index) > len(shape):
        fail(f"index {index} has more axes than the tensor shape {shape}", NkiEmulatorError)
    out, pstep, p0 = [], 1, 0
    for axis, (ix, dim) in enumerate(zip(index, shape)):
        if isinstance(ix, slice):
            step = 1 if ix.step is None else int(ix.step)
            if step <= 0:
                fail(f"axis {axis}: slice step {step} must be positive", NkiEmulatorError)
            start = 0 if ix.start is None else int(ix.start)
            stop = dim if ix.stop is None else int(ix.stop)
            start, stop = start + dim if start < 0 else start, stop + dim if stop < 0 else stop
            if not (0 <= start <= stop <= dim):
                fail(f"axis {axis}: slice [{start}:{stop}] is out of bounds for size {dim}", NkiEmulatorError)
            if start == stop:
                rule("tensor.zero_size", f"axis {axis}: empty slice [{start}:{stop}]")
            out.append(slice(start, stop, step))
            if axis == 0:
                pstep, p0 = step, start
        elif isinstance(ix, (int, np.integer)):
            i = int(ix) + dim if int(ix) < 0 else int(ix)
            if not 0 <= i < dim:
                fail(f"axis {axis}: index {int(ix)} is out of bounds for size {dim}", NkiEmulatorError)
            out.append(slice(i, i + 1) if (axis == 0 and on_chip) else i)
            if axis == 0:
                p0 = i
        else:
            fail(f"axis {axis}: unsupported index {ix!r} (use slices, nl.ds or ints)", NkiEmulatorError)
    return tuple(out), pstep, p0


class Machine:
    """Counters, live on-chip memory and ScalarE reduce registers of one emulated kernel call on `target`."""

    def __init__(self, compute: bool = True, target: str = "trn1", trace: bool = False, reading: str = "any"):
        self.compute = compute
        self.target = target
        self.reading = _rules.check_reading(reading)
        self.trace = [] if trace else None  # trace.Instr per instruction, in program order (loader.record)
        self.order = _trace.Order()  # issue indices and explicit scheduling edges (scheduling.py)
        self.allocations = {}  # traced calls: on-chip allocation serial -> (buffer, bytes per partition | banks)
        self.spec = _rules.spec(target)
        self.counters = Counters()
        self.sbuf_live = 0
        self.psum_live_banks = 0
        self.scalar_reduce_regs = np.full((PMAX,), np.nan, dtype=np.float32)

    # ---------------------------------------------------------------- allocation

    def allocate(self, shape, dtype, buffer, fill=None, address=None) -> Tensor:
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        dtype = as_dtype(dtype)
        if not isinstance(buffer, Buffer):
            rule("buffer.object", f"buffer {buffer!r} is not an nl buffer object")
        if buffer not in ON_CHIP + HBM:
            fail(f"unknown buffer {buffer!r}", NkiEmulatorError)
        if any(s <= 0 for s in shape):
            rule("tensor.zero_size", f"shape {shape} has a non-positive dimension")
        alloc = _Allocation(buffer)
        if buffer in ON_CHIP:
            if address is not None:
                self._check_address(shape, dtype, buffer, address)
            self._reserve(shape, dtype, buffer, alloc, direct=address is not None)
        if fill is None:  # fresh memory: NaN for floats so uninitialised reads show
            fill = np.nan if is_float(dtype) else np.iinfo(dtype).min if dtype.kind in "iu" else 0
        if self.compute:
            data = np.full(shape, fill, dtype=dtype)
        else:
            data = np.broadcast_to(np.zeros((), dtype=dtype), shape)
        alloc.storage = data
        mask = None
        if buffer == "psum":
            alloc.psum_matmul_written = np.zeros(shape, dtype=bool) if self.compute else np.broadcast_to(np.zeros((), bool), shape)
            mask = alloc.psum_matmul_written
        return Tensor(data, buffer, alloc, self, mask)

    def wrap_hbm(self, array: np.ndarray, buffer: str = "hbm") -> Tensor:
        if array.ndim and 0 in array.shape:
            rule("tensor.zero_size", f"kernel input of shape {array.shape}")
        return Tensor(array, Buffer(buffer), _Allocation(buffer, array), self)

    def _check_address(self, shape, dtype, buffer, address):
        """A direct `address=(partition, byte offset)` lies inside its memory, in PSUM at a bank (sbuf.capacity)."""
        part, free = (int(a) for a in address)
        per_partition = math.prod(shape[1:]) * dtype.itemsize
        size = self.spec.sbuf_partition_bytes if buffer == "sbuf" else self.spec.psum_banks * self.spec.psum_bank_bytes
        if part < 0 or part + shape[0] > PMAX or free < 0 or free + per_partition > size:
            rule("sbuf.capacity", f"{buffer} tile {shape} {dtype} at address {tuple(address)} reaches outside "
                 f"{PMAX} partitions x {size} B on {self.target}")
        if buffer == "psum" and free % self.spec.psum_bank_bytes:
            rule("sbuf.capacity", f"PSUM tile at address {tuple(address)} does not start at a 2 KiB bank")

    def _reserve(self, shape, dtype, buffer, alloc, direct=False):
        if len(shape) < 1 or shape[0] > PMAX:
            rule("partition.max", f"{buffer} tile {shape}: partition dimension {shape[0]} exceeds {PMAX}")
        per_partition = math.prod(shape[1:]) * dtype.itemsize
        spec = self.spec
        if buffer == "sbuf" and direct:  # placed by the kernel (checked by its address), not by the allocator
            return
        if self.trace is not None:  # what the schedule's capacity constraint counts (schedule.py)
            self.allocations[alloc.serial] = (buffer, per_partition if buffer == "sbuf"
                                              else -(-per_partition // spec.psum_bank_bytes))
        if buffer == "sbuf":  # beyond the capacity the compiler spills (rule sbuf.capacity's reading): counted
            self.sbuf_live += per_partition
            self.counters.sbuf_peak_bytes = max(self.counters.sbuf_peak_bytes, self.sbuf_live)
            self.counters.sbuf_spill_peak_bytes = max(self.counters.sbuf_spill_peak_bytes,
                                                      self.sbuf_live - spec.sbuf_partition_bytes)
            weakref.finalize(alloc, self._release_sbuf, per_partition)
        else:
            banks = -(-per_partition // spec.psum_bank_bytes)
            if self.psum_live_banks + banks > spec.psum_banks and not direct:
                rule("psum.capacity", f"PSUM overflow: allocating {banks} bank(s) ({per_partition} B/partition) with "
                     f"{self.psum_live_banks} of {spec.psum_banks} banks of {spec.psum_bank_bytes} B live")
            self.psum_live_banks += banks
            self.counters.psum_peak_banks = max(self.counters.psum_peak_banks, self.psum_live_banks)
            weakref.finalize(alloc, self._release_psum, banks)

    def _release_sbuf(self, n: int):
        self.sbuf_live -= n

    def _release_psum(self, banks: int):
        self.psum_live_banks -= banks

    # ---------------------------------------------------------------- counting

    def count_engine(self, engine: str, tile: Tensor, extra_instructions: int = 0, inputs: int = 1, op: str = "",
                     reads=(), writes=None):
        """One Vector/Scalar/GpSimd instruction over `tile` (partition dim first).

        `inputs=2` (a VectorE instruction reading two tensors, e.g. tensor_tensor) costs ~2N cycles
        (aws-neuron-sdk `nki/guides/architecture/trainium_inferentia2_arch.rst`, "Vector Engine /
        Performance Consideration", Cost Model: "If there are two input tiles, the instruction can
        execute in roughly 2N cycles"); ScalarE reads at most one tensor (same guide, "Scalar Engine"). `reads`
        / `writes`: the tiles it reads and writes (for the trace; writes default to `tile`)."""
        partitions = tile.shape[0] if tile.ndim else 1
        free = math.prod(tile.shape[1:]) if tile.ndim > 1 else 1
        c = self.counters
        per_input = inputs if engine == "vector" else 1
        issued = PMAX * (max(MIN_II, per_input * free) + extra_instructions * MIN_II)
        setattr(c, f"{engine}_instructions", getattr(c, f"{engine}_instructions") + 1)
        setattr(c, f"{engine}_elems_issued", getattr(c, f"{engine}_elems_issued") + issued)
        setattr(c, f"{engine}_elems_useful", getattr(c, f"{engine}_elems_useful") + partitions * free)
        self.order.issue()
        if self.trace is not None:
            self.trace.append(_trace.engine(engine, op, issued // PMAX, free, partitions, reads,
                                            (tile,) if writes is None else writes))

    def count_dma(self, nbytes: int, buffer_bytes: int | None = None, dst=None, srcs=(), op: str = "dma_copy"):
        """One DMA of `nbytes` in contiguous buffers of `buffer_bytes` (the whole transfer when None); the bytes
        in buffers below AWS's 256 B / 2 KiB marks (`nki/deep-dives/nki-dma-bandwidth-guide.rst`, "Bandwidth vs.
        Payload Size") counted apart. `dst` / `srcs`: its two sides (for the trace)."""
        nbytes = int(nbytes)
        size = nbytes if buffer_bytes is None else max(1, min(int(buffer_bytes), nbytes))
        c = self.counters
        c.dma_transfers += 1
        c.dma_bytes += nbytes
        c.dma_buffers += -(-nbytes // size) if nbytes else 0
        c.dma_bytes_under_256 += nbytes if size < 256 else 0
        c.dma_bytes_under_2k += nbytes if size < 2048 else 0
        self.order.issue()
        if self.trace is not None:
            self.trace.append(_trace.dma(op, nbytes, size, dst, srcs))

    def count_matmul(self, k: int, m: int, n: int, fp32: bool, useful: bool = True, rows: int = PMAX,
                     cols: int = PMAX, op: str = "nc_matmul", stationary=None, reads=(), writes=()):
        """One nc_matmul. `rows` x `cols`: the PE tile it occupies: 128 x 128, or the row / column tile sizes
        in tiling mode, where matmuls on different tiles run in parallel (aws-neuron-sdk
        `nki/api/nki/isa/__init__.py`, `nc_matmul`, "Tiling mode": "allow multiple nc_matmul instructions
        with a stationary tile size smaller than [128, 128] to run in parallel"; row and column tiles of 64
        on NeuronCore-v2), so a 64-row tile is charged 64 x 128 x N and a 64 x 64 tile 64 x 64 x N."""
        c = self.counters
        issued = rows * cols * n
        c.pe_instructions += 1
        c.pe_macs_issued += issued
        c.pe_macs_issued_fp32 += issued if fp32 else 0
        c.pe_macs_useful += k * m * n if useful else 0
        self.order.issue()
        if self.trace is not None:
            self.trace.append(_trace.matmul(op, n, rows * cols / (PMAX * PMAX), fp32, m, stationary, reads, writes))


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
