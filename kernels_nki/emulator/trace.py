"""The instruction trace of an emulated kernel call: every instruction, in program order, with its engine
(or, for a DMA, its queue and the DMA engines it occupies), its work in the units the cost model prices,
and the tiles it reads and writes.

`loader.record(kernel, *specs, target=..., **constants) -> Trace` runs the kernel in count-only mode (no
arithmetic, full shapes) with the trace on; `emulator.run` / `count` leave it off. The schedule
(`schedule.py`) prices and orders the trace; `Trace.counters` are the same work counters `count` returns.
Program order is the order the kernel issues its instructions in: the data dependencies are read from it,
the schedule's in-order reading keeps it, its central reading does not (the compiler may reorder).
Beside the instructions a trace carries what the scheduler needs besides them: the explicit scheduling edges
(`edges`: `nl.no_reorder` blocks, `kernel.with_schedule`, `NkiInstruction.depends_on`; `scheduling.py`), the
on-chip allocations' sizes (`allocations`) and the target's capacities (`capacity`).

A region is (allocation serial, first row, row end, first column, column end, row size R, first element,
element end) within one allocation, element offsets in the flat allocation: on chip a row is a partition;
in HBM R is the first stride past a gap in the view (a column block of a row-major tensor, one head of
[B, T, H, K]: a box of rows x columns), else the tensor's row. Two regions of one allocation conflict when
both their row and column ranges overlap (same R), or else their element ranges.

DMA engines (aws-neuron-sdk `nki/get-started/about/nki-dma-overview.rst`, "Performance Considerations":
"each DMA engine is typically responsible for moving data for eight SBUF partitions (128 partitions / 16 DMA
engines)"; Example 1: four partitions use one engine): a DMA with an SBUF side occupies engines
p0 // 8 .. (p1 - 1) // 8 of its SBUF partitions [p0, p1), an HBM-to-HBM DMA all 16. Its queue (in-order
within a queue, same page, "DMA Queues") is its direction: HBM -> SBUF loads, SBUF -> HBM stores, and the rest.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

DMA_ENGINES = 16  # per NeuronCore (nki-dma-overview.rst, "DMA Queues"; trainium_inferentia2_arch.rst)
PARTITIONS_PER_DMA_ENGINE = 8  # nki-dma-overview.rst, "Performance Considerations"
ON_CHIP = ("sbuf", "psum")
SERIALS = itertools.count()  # allocation serials (machine._Allocation.serial)
_LAYOUT_BYTE = np.zeros(1, np.uint8)
LAYOUT_BASE = _LAYOUT_BYTE.ctypes.data


def layout(shape, strides=None, offset: int = 0) -> np.ndarray:
    """A stand-in array (1-byte items over a byte never read) carrying a view's layout: its strides are element
    strides, its address minus LAYOUT_BASE its first element's offset in the allocation. Indexed and reshaped
    with a tensor's data (machine.Tensor.layout), it keeps the real layout in count-only mode too, where the
    data are zero-stride, and gives `region` the view's place in its allocation."""
    shape = tuple(int(n) for n in shape)
    if strides is None:
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    iface = {"data": (LAYOUT_BASE + int(offset), True), "shape": shape, "strides": tuple(int(s) for s in strides),
             "typestr": "|u1", "version": 3}
    return np.asarray(_Layout(iface))


class _Layout:
    def __init__(self, iface):
        self.__array_interface__ = iface


class Instr:
    """One traced instruction. engine: tensor | vector | scalar | gpsimd | dma. cycles: the engine cycles the
    counters charge it (Vector/Scalar/GpSimd: max(MIN_II, inputs x N) + accumulator passes; TensorE: moving
    columns x the tile's share of the array, fp32 not yet applied); free: elements per partition;
    DMA: nbytes, buffer (contiguous bytes per buffer), engines (first, last + 1), queue."""

    __slots__ = ("engine", "op", "cycles", "free", "partitions", "reads", "writes", "psum", "sbuf", "fp32",
                 "stationary", "stationary_free", "nbytes", "buffer", "engines", "queue")

    def __init__(self, engine, op, reads, writes):
        self.engine, self.op, self.reads, self.writes = engine, op, reads, writes
        self.cycles = self.free = self.partitions = self.nbytes = self.buffer = self.stationary_free = 0
        self.psum = self.sbuf = self.fp32 = False
        self.stationary, self.engines, self.queue = None, None, None

    @property
    def stream(self) -> str:
        """The in-order instruction stream it belongs to: its engine's, or its DMA queue."""
        return f"dma.{self.queue}" if self.engine == "dma" else self.engine


class Order:
    """Issue bookkeeping of one kernel call (machine.Machine.order), kept in compute mode too: every instruction's
    index in program order (its index in the trace when one is recorded), the explicit scheduling edges
    (consumer index, producer index) and the instructions issued under each `name=`."""

    __slots__ = ("issued", "depth", "last_in_block", "edges", "names", "nesting")

    def __init__(self):
        self.issued = 0
        self.depth = 0  # nl.no_reorder blocks entered
        self.last_in_block = None
        self.edges = []
        self.names = {}  # name -> [(first index, stop index)] per instruction call that passed it
        self.nesting = 0  # instruction calls running (an nki.isa call made by another one is part of it)

    def issue(self) -> int:
        """The next instruction's index; inside a no_reorder block it depends on the block's previous one
        (aws-neuron-sdk nki/guides/how-to-scheduling-apis.rst: "dependency edges ... between every pair of
        instructions"; a chain carries every pair's order)."""
        i = self.issued
        self.issued += 1
        if self.depth:
            if self.last_in_block is not None:
                self.edges.append((i, self.last_in_block))
            self.last_in_block = i
        return i


@dataclasses.dataclass
class Trace:
    instrs: list
    counters: object  # machine.Counters of the same call
    target: str
    edges: list = dataclasses.field(default_factory=list)  # (consumer, producer) explicit scheduling edges
    allocations: dict = dataclasses.field(default_factory=dict)  # serial -> ("sbuf", bytes per partition) | ("psum", banks)
    capacity: dict = dataclasses.field(default_factory=dict)  # "sbuf": bytes per partition, "psum": banks
    _graph: object = dataclasses.field(default=None, repr=False, compare=False)  # depgraph.graph, once computed

    def __len__(self):
        return len(self.instrs)


def region(t):
    """The region a Tensor view (or an indirect AccessPattern: its whole base) covers; None for a number.
    A view's region is computed once (kept on it: a view's place in its allocation never changes)."""
    if t is None or not hasattr(t, "buffer"):
        return None
    r = getattr(t, "traced_region", None)
    if r is None:
        r = t.traced_region = _region(t)
    return r


def _region(t):
    lay = getattr(t, "layout", None)
    if lay is None:  # AccessPattern: the whole HBM tensor
        size = t.base.size
        return (t.base.alloc.serial, 0, 1, 0, size, size, 0, size)
    off = lay.ctypes.data - LAYOUT_BASE
    shape, strides = lay.shape, lay.strides
    if t.buffer in ON_CHIP:
        row = math.prod(t.alloc.storage.shape[1:]) or 1
        p0, f0 = divmod(off, row)
        inner = 0
        for n, st in zip(shape[1:], strides[1:]):
            if n > 1 and st > 0:
                inner += (n - 1) * st
        p1 = p0 + (shape[0] if shape else 1)
        return (t.alloc.serial, p0, p1, f0, f0 + inner + 1, row, off, (p1 - 1) * row + f0 + inner + 1)
    # HBM: rows of R elements, R the first stride past a gap in the view (so a column block of a row-major
    # tensor, or one head of [B, T, H, K], is a box of rows x columns), else the tensor's row
    dims = sorted((st, n) for n, st in zip(shape, strides) if n > 1 and st > 0)
    ext, row = 0, 0
    for st, n in dims:
        if row == 0 and st > ext + 1:
            row = st
        if row == 0:
            ext += (n - 1) * st
    if row == 0:
        row = math.prod(t.alloc.storage.shape[1:]) or 1
    hi = off + sum((n - 1) * st for st, n in dims)
    r0, f0 = divmod(off, row)
    return (t.alloc.serial, r0, hi // row + 1, f0, f0 + ext + 1, row, off, hi + 1)


def _regions(tiles) -> tuple:
    return tuple(r for r in (region(t) for t in tiles) if r is not None)


def _buffers(tiles) -> set:
    return {t.buffer for t in tiles if t is not None and hasattr(t, "buffer")}


def engine(name: str, op: str, cycles: int, free: int, partitions: int, reads, writes) -> Instr:
    ins = Instr(name, op, _regions(reads), _regions(writes))
    ins.cycles, ins.free, ins.partitions = int(cycles), int(free), int(partitions)
    bufs = _buffers(tuple(reads) + tuple(writes))
    ins.psum, ins.sbuf = "psum" in bufs, "sbuf" in bufs
    return ins


def matmul(op: str, n: int, share: float, fp32: bool, stationary_free: int, stationary, reads, writes) -> Instr:
    ins = Instr("tensor", op, _regions(reads), _regions(writes))
    ins.cycles, ins.free, ins.fp32 = n * share, int(n), bool(fp32)
    ins.stationary, ins.stationary_free = region(stationary), int(stationary_free)
    return ins


def dma(op: str, nbytes: int, buffer_bytes: int, dst, srcs) -> Instr:
    srcs = tuple(srcs)
    ins = Instr("dma", op, _regions(srcs), _regions((dst,)))
    ins.nbytes, ins.buffer = int(nbytes), int(buffer_bytes)
    chip = [t for t in (dst,) + srcs if t is not None and getattr(t, "buffer", None) == "sbuf"]
    if chip:
        lo = min(t.pstart for t in chip)
        hi = max(t.pstart + (t.shape[0] if t.ndim else 1) for t in chip)
        ins.engines = (lo // PARTITIONS_PER_DMA_ENGINE, (hi - 1) // PARTITIONS_PER_DMA_ENGINE + 1)
    else:
        ins.engines = (0, DMA_ENGINES)
    on_dst = dst is not None and getattr(dst, "buffer", None) == "sbuf"
    on_src = any(getattr(t, "buffer", None) == "sbuf" for t in srcs)
    ins.queue = "load" if on_dst and not on_src else "store" if on_src and not on_dst else "other"
    return ins
