"""An instruction schedule of one kernel call on a NeuronCore: the trace (`trace.py`) priced at AWS's documented
costs and ordered as the engines run it. `cost.py`'s busiest-engine figure stays beside it as the lower bound.

Order. Each compute engine runs its instructions in program order, one at a time (each engine has its own
sequencer and instruction stream: aws-neuron-sdk `nki/guides/architecture/trainium_inferentia2_arch.rst`,
"NeuronCore-v2 Compute Engines"); an instruction starts when its engine is free and its inputs are ready:
read-after-write, write-after-read and write-after-write through overlapping tile regions (the compiler's
semaphores, same section). DMA: 16 engines, each processing one transfer at a time (arch guide, "Data
movement between HBM and SBUF using DMAs"; a dma_copy is one transfer per DMA engine it spans, same section:
"16 DMA transfers (one per DMA engine)" for a [128, 512] load), transfers within a queue in order
(`nki/get-started/about/nki-dma-overview.rst`, "DMA Queues"). Shared ports: VectorE and GpSimdE cannot access
SBUF in parallel, VectorE and ScalarE cannot access PSUM in parallel (arch guide, "Data Movement" and
"Accessing SBUF/PSUM ... Performance Consideration"): such instructions hold the port for their duration.
The scheduler is a list scheduler: of the streams' next instructions whose inputs are scheduled, the one that
can start first runs first.

Costs (engine cycles; clocks and widths in `cost.TARGETS`):
- Vector/Scalar/GpSimd: the counters' max(MIN_II, N) (2N for two VectorE inputs) plus, for VectorE and
  ScalarE, the static instruction overhead of 100 engine cycles for back-to-back instructions with N << 128
  or depending on the previous instruction's output (arch guide, "Vector Engine / Performance
  Consideration"; ScalarE: "all the performance notes discussed for Vector Engine ... are applicable",
  "Scalar Engine / Performance Consideration"). A ScalarE instruction reading the previous ScalarE
  instruction's output issues no sooner than 264 ScalarE cycles after it (`nki/deep-dives/nki_perf_guide.rst`,
  Opt #5a: 189 ns = 264 cycles on NC-v2 for one element per partition, dependent; charged as max(264,
  cost + 100)). Tensor access overhead (~60 cycles per access, "engines can typically hide some of this":
  arch guide, "Accessing SBUF/PSUM", Performance Consideration): bracketed, below.
- TensorE: max(64, share x N) cycles per matmul, share the PE tile's part of the array (MM_INIT_LATENCY =
  64 cycles per instruction: arch guide, "Tensor Engine / Performance Consideration"; perf guide Opt #7),
  fp32 4x; a matmul whose stationary differs from the previous one's loads it (LoadStationary, in the
  background of the previous matmul, up to 4x faster than a MultiplyMoving of the same free size: arch
  guide, same section; LS_II ~ 128 / 4 = 32 cycles, perf guide Opt #7): charged max(MM, M / 4), which the
  64-cycle floor always covers for bf16.
- DMA: per engine, its share of the bytes at 17 B/ns (trn1) / 23 B/ns (trn2) per engine
  (`nki/deep-dives/nki-dma-bandwidth-guide.rst`, table) times the relative throughput of its buffer size
  read off the DMA overview's figure (PAYLOAD_CURVE); every transfer has the ~1300 ns fixed cost of descriptor
  setup, synchronization and semaphore-to-start (bandwidth guide, "Why Large Contiguous DMA Payloads Are
  Required"): charged as latency before the transfer starts (the DMA overview's Example 1 shows one 32 KiB
  transfer as a 1416 ns bar, the data time at peak, with the fixed cost outside it) or, at the high end,
  on the engine.

Unpublished, bracketed (`ASSUMPTIONS`, low / central / high; the estimate reports the range):
- GpSimd throughput ("there is no rule-of-thumb", arch guide, "GpSimd Engine"): 128 elements per cycle (the
  lanes) / a quarter of that (the only published comparison: GpSimd rsqrt has 4x lower throughput than
  ScalarE, `nki/api/nki.api.shared.rst`, "NKI Engine Selection").
- trn1 descriptor generation: host-precomputed descriptors cost the engines nothing (`nki/deep-dives/
  nki-dge.rst`, "Modes") / every DMA's descriptors generated on GpSimd (swdge, "consumes GpSimd cycles",
  same page; no figure published: the hardware DGE's ~600 ns per DMA instruction, same page, is taken).
- "N << 128": N <= 32 / N < 64 / N < 128; tensor access overhead hidden / charged 60 cycles per instruction;
  the DMA fixed cost as latency / on the engine.
- The payload curve, measured on an unstated generation and setup, applied per DMA buffer: at the low end
  every buffer moves at the table's peak (the lower bound on DMA time; the tutorial profiles in
  bench/README.md, "Cost model calibration", sit between the two readings).
Cross-engine semaphore latency beyond the DMA's fixed cost is not published and not charged.
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from kernels_nki.emulator import cost
from kernels_nki.emulator.trace import DMA_ENGINES, Instr, Trace

# relative DMA throughput by bytes per partition at 128 partitions, read off the plot in nki-dma-overview.rst,
# "Performance Considerations" (figure nki-dma-intro-1.jpg; y axis unlabelled: each point's height over the
# 32 KiB point's, pixel reading; generation not stated). Interpolated in log2(bytes); below 32 B proportional to
# the bytes (a fixed time per buffer), above 32 KiB 1.
PAYLOAD_CURVE = ((32, 0.014), (64, 0.026), (128, 0.050), (256, 0.103), (512, 0.209), (1024, 0.424),
                 (2048, 0.813), (4096, 0.966), (8192, 0.983), (16384, 0.990), (32768, 1.0))
DMA_FIXED_S = 1300e-9  # nki-dma-bandwidth-guide.rst, "Why Large Contiguous DMA Payloads Are Required"
STATIC_OVERHEAD_CYCLES = 100  # arch guide, "Vector Engine / Performance Consideration"; perf guide Opt #5a
SCALAR_DEPENDENT_II_CYCLES = 264  # perf guide Opt #5a (189 ns on NC-v2)
ACCESS_OVERHEAD_CYCLES = 60  # arch guide, "Accessing SBUF/PSUM tensors", Performance Consideration
LS_SPEEDUP = 4  # arch guide, "Tensor Engine", Fast LoadStationary: "up to 4x"
HWDGE_S = 600e-9  # nki-dge.rst, hwdge: "approximately 600 ns to execute" per DMA instruction


@dataclasses.dataclass(frozen=True)
class Assumptions:
    name: str
    gpsimd_elems_per_cycle: int
    swdge_s: float  # GpSimd time per DMA instruction for descriptor generation
    small_free: int  # N below which a Vector/Scalar instruction pays the static overhead
    access_overhead_cycles: int
    dma_fixed_on_engine: bool
    payload_curve: bool  # DMA rate by buffer size (PAYLOAD_CURVE), or the table's peak for every buffer


ASSUMPTIONS = {
    "low": Assumptions("low", 128, 0.0, 33, 0, False, False),
    "central": Assumptions("central", 128, 0.0, 64, 0, False, True),
    "high": Assumptions("high", 32, HWDGE_S, 128, ACCESS_OVERHEAD_CYCLES, True, True),
}
LANES = ("tensor", "vector", "scalar", "gpsimd")
_RES = {name: i for i, name in enumerate(LANES + ("sbuf_vg", "psum_vs"))}
_DMA0 = len(_RES)


def payload_share(buffer_bytes: int) -> float:
    """Relative DMA throughput of `buffer_bytes`-byte buffers (PAYLOAD_CURVE)."""
    (b0, s0), (bn, _) = PAYLOAD_CURVE[0], PAYLOAD_CURVE[-1]
    if buffer_bytes >= bn:
        return 1.0
    if buffer_bytes <= b0:
        return s0 * max(buffer_bytes, 1) / b0
    for (lo, a), (hi, b) in zip(PAYLOAD_CURVE, PAYLOAD_CURVE[1:]):
        if buffer_bytes <= hi:
            w = (math.log2(buffer_bytes) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
            return a + w * (b - a)
    return 1.0


@dataclasses.dataclass
class Schedule:
    instrs: list
    start: list
    end: list
    wait: list  # idle time on its stream before it started (inputs or a shared resource)
    makespan_s: float
    assumptions: str
    target: str

    def busy_s(self) -> dict:
        """Busy seconds per lane: compute engines, and `dma` (any DMA engine busy: the union)."""
        out = {e: 0.0 for e in LANES}
        spans = []
        for ins, s, e in zip(self.instrs, self.start, self.end):
            if ins.engine == "dma":
                spans.append((s, e))
            elif ins.engine in out:
                out[ins.engine] += e - s
        out["dma"] = _union(spans)
        return out

    def active_share(self) -> dict:
        return {k: v / self.makespan_s if self.makespan_s else 0.0 for k, v in self.busy_s().items()}


def _union(spans) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            total += (cur_e - cur_s) if cur_e is not None else 0.0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


def _overlap(e, r) -> bool:
    if e[5] != r[5]:
        return e[6] < r[7] and r[6] < e[7]
    return e[1] < r[2] and r[1] < e[2] and e[3] < r[4] and r[3] < e[4]


def _contains(r, e) -> bool:
    if e[5] != r[5]:  # a bounding box in other rows: kept (pruning is safe only within one row size)
        return False
    return r[1] <= e[1] and e[2] <= r[2] and r[3] <= e[3] and e[4] <= r[4]


def dependencies(instrs) -> tuple[list, list]:
    """(deps, raw) per instruction: indices of the earlier instructions it must wait for (RAW, WAR, WAW through
    overlapping regions), and its RAW producers."""
    writes, reads = {}, {}  # serial -> [(region, index)]
    deps, raws = [], []
    for i, ins in enumerate(instrs):
        raw, war = set(), set()
        for r in ins.reads:
            for e, j in writes.get(r[0], ()):
                if _overlap(e, r):
                    raw.add(j)
        for r in ins.writes:
            for table in (writes, reads):
                for e, j in table.get(r[0], ()):
                    if _overlap(e, r):
                        war.add(j)
        war.discard(i)
        for r in ins.reads:
            reads.setdefault(r[0], []).append((r, i))
        for r in ins.writes:
            for table in (writes, reads):
                lst = table.get(r[0])
                if lst:
                    table[r[0]] = [(e, j) for e, j in lst if not _contains(r, e)]  # superseded: i waits for them
            writes.setdefault(r[0], []).append((r, i))
        deps.append(raw | war)
        raws.append(raw)
    return deps, raws


def _price(ins: Instr, dependent: bool, t: cost.Target, a: Assumptions, last_stationary) -> tuple[float, list]:
    """(seconds, resource ids) of one instruction."""
    e = ins.engine
    if e == "dma":
        lo, hi = ins.engines
        per_engine = ins.nbytes / (hi - lo)
        rate = t.dma_bytes_per_s / DMA_ENGINES * (payload_share(ins.buffer or ins.nbytes) if a.payload_curve else 1.0)
        return per_engine / rate + (DMA_FIXED_S if a.dma_fixed_on_engine else 0.0), \
            list(range(_DMA0 + lo, _DMA0 + hi))
    if e == "tensor":
        f = t.tensor_fp32_cost if ins.fp32 else 1.0
        cyc = max(ins.cycles * f, t.mm_init_cycles)
        if ins.stationary != last_stationary:
            cyc = max(cyc, ins.stationary_free / LS_SPEEDUP * f)
        return cyc / t.tensor_hz, [_RES["tensor"]]
    cyc = float(ins.cycles) + a.access_overhead_cycles
    if e in ("vector", "scalar"):
        if e == "scalar" and dependent:
            cyc = max(SCALAR_DEPENDENT_II_CYCLES, cyc + STATIC_OVERHEAD_CYCLES)
        elif dependent or ins.free < a.small_free:
            cyc += STATIC_OVERHEAD_CYCLES
    res = [_RES[e]]
    if e == "vector":
        res += ([_RES["sbuf_vg"]] if ins.sbuf else []) + ([_RES["psum_vs"]] if ins.psum else [])
        return cyc / t.vector_elems_per_cycle * cost.PE / t.vector_hz, res
    if e == "scalar":
        return cyc / t.scalar_hz, res + ([_RES["psum_vs"]] if ins.psum else [])
    return cyc * cost.PE / a.gpsimd_elems_per_cycle / t.gpsimd_hz, res + [_RES["sbuf_vg"]]


def schedule(trace: Trace | list, assumptions: str = "central", target: str | None = None) -> Schedule:
    """Schedule a trace (or a list of Instr) on `target` (default: the trace's) under ASSUMPTIONS[assumptions]."""
    a = ASSUMPTIONS[assumptions]
    target = target or getattr(trace, "target", cost.DEFAULT_TARGET)
    t = cost.target(target)
    instrs = trace.instrs if isinstance(trace, Trace) else trace
    n = len(instrs)
    cached = getattr(trace, "_deps", None)
    deps, raws = cached if cached is not None else dependencies(instrs)
    if isinstance(trace, Trace):
        trace._deps = deps, raws
    streams, pos, prev = {}, [0] * n, [None] * n
    for i, ins in enumerate(instrs):
        lst = streams.setdefault(ins.stream, [])
        prev[i] = lst[-1] if lst else None
        pos[i] = len(lst)
        lst.append(i)
    dur, res = [0.0] * n, [None] * n
    last_stat = None
    for i, ins in enumerate(instrs):
        dur[i], res[i] = _price(ins, prev[i] is not None and prev[i] in raws[i], t, a, last_stat)
        if ins.engine == "tensor":
            last_stat = ins.stationary
    users = [[] for _ in range(n)]
    remaining = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready = [0.0] * n
    free = [0.0] * (_DMA0 + DMA_ENGINES)
    avail = {s: 0.0 for s in streams}  # a stream's next instruction may start from here
    head = {s: 0 for s in streams}
    start, end, wait = [0.0] * n, [0.0] * n, [0.0] * n
    latency = 0.0 if a.dma_fixed_on_engine else DMA_FIXED_S
    heap = []

    gpsimd, dge = _RES["gpsimd"], a.swdge_s

    def earliest(i):
        r0 = ready[i]
        if instrs[i].engine == "dma":
            if dge:  # its descriptors first, on GpSimd (swdge)
                r0 = max(r0, free[gpsimd]) + dge
            r0 += latency
        return max([r0, avail[instrs[i].stream]] + [free[r] for r in res[i]])

    for s, lst in streams.items():
        if remaining[lst[0]] == 0:
            heapq.heappush(heap, (earliest(lst[0]), lst[0]))
    done = 0
    while heap:
        key, i = heapq.heappop(heap)
        s0 = earliest(i)
        if s0 > key + 1e-15:
            heapq.heappush(heap, (s0, i))
            continue
        ins, s = instrs[i], instrs[i].stream
        start[i], end[i] = s0, s0 + dur[i]
        wait[i] = s0 - avail[s]
        for r in res[i]:
            free[r] = end[i]
        if dge and ins.engine == "dma":
            free[gpsimd] = max(ready[i], free[gpsimd]) + dge
        avail[s] = s0 if ins.engine == "dma" else end[i]
        done += 1
        for j in users[i]:
            ready[j] = max(ready[j], end[i])
            remaining[j] -= 1
            if remaining[j] == 0 and head[instrs[j].stream] == pos[j]:
                heapq.heappush(heap, (earliest(j), j))
        head[s] += 1
        lst = streams[s]
        if head[s] < len(lst) and remaining[lst[head[s]]] == 0:
            heapq.heappush(heap, (earliest(lst[head[s]]), lst[head[s]]))
    if done != n:
        raise RuntimeError(f"schedule: {n - done} of {n} instructions never became ready (a dependency cycle)")
    return Schedule(instrs, start, end, wait, max(end, default=0.0), assumptions, target)


def estimate(trace: Trace) -> dict:
    """The schedule's makespan under each bracket of ASSUMPTIONS, with the busiest-engine lower bound and the
    central schedule's active shares (`shares`)."""
    out = {}
    for name in ASSUMPTIONS:
        s = schedule(trace, name)
        out[name] = s.makespan_s
        if name == "central":
            out["shares"] = s.active_share()
    out["busiest_engine"] = cost.estimate(trace.counters, trace.target).total_s
    return out
