"""What one instruction of a trace costs on a NeuronCore and what it holds while it runs: its seconds under a
bracket of unpublished assumptions (`seconds`, `ASSUMPTIONS`) and its engine, shared ports or DMA engines
(`resources`), as `schedule.py` schedules them.

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
import math

from kernels_nki.emulator import cost
from kernels_nki.emulator.trace import DMA_ENGINES, Instr

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
RESOURCES = {name: i for i, name in enumerate(LANES + ("sbuf_vg", "psum_vs"))}
DMA0 = len(RESOURCES)


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


GPSIMD = RESOURCES["gpsimd"]


def resources(ins: Instr) -> list:
    """The resource ids an instruction holds while it runs: its DMA engines, or its engine and the shared
    ports it uses (whatever the reading)."""
    e = ins.engine
    if e == "dma":
        lo, hi = ins.engines
        return list(range(DMA0 + lo, DMA0 + hi))
    if e == "tensor":
        return [RESOURCES["tensor"]]
    res = [RESOURCES[e]]
    if e == "vector":
        return res + ([RESOURCES["sbuf_vg"]] if ins.sbuf else []) + ([RESOURCES["psum_vs"]] if ins.psum else [])
    if e == "scalar":
        return res + ([RESOURCES["psum_vs"]] if ins.psum else [])
    return res + [RESOURCES["sbuf_vg"]]


def seconds(ins: Instr, dependent: bool, t: cost.Target, a: Assumptions, last_stationary) -> float:
    """The seconds one instruction runs."""
    e = ins.engine
    if e == "dma":
        lo, hi = ins.engines
        per_engine = ins.nbytes / (hi - lo)
        rate = t.dma_bytes_per_s / DMA_ENGINES * (payload_share(ins.buffer or ins.nbytes) if a.payload_curve else 1.0)
        return per_engine / rate + (DMA_FIXED_S if a.dma_fixed_on_engine else 0.0)
    if e == "tensor":
        f = t.tensor_fp32_cost if ins.fp32 else 1.0
        cyc = max(ins.cycles * f, t.mm_init_cycles)
        if ins.stationary != last_stationary:
            cyc = max(cyc, ins.stationary_free / LS_SPEEDUP * f)
        return cyc / t.tensor_hz
    cyc = float(ins.cycles) + a.access_overhead_cycles
    if e in ("vector", "scalar"):
        if e == "scalar" and dependent:
            cyc = max(SCALAR_DEPENDENT_II_CYCLES, cyc + STATIC_OVERHEAD_CYCLES)
        elif dependent or ins.free < a.small_free:
            cyc += STATIC_OVERHEAD_CYCLES
    if e == "vector":
        return cyc / t.vector_elems_per_cycle * cost.PE / t.vector_hz
    if e == "scalar":
        return cyc / t.scalar_hz
    return cyc * cost.PE / a.gpsimd_elems_per_cycle / t.gpsimd_hz
