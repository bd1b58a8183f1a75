"""Estimated time of a kernel call on one NeuronCore from the emulator's work counters.

Model: each engine's time is its issued work divided by its throughput; engines run concurrently,
so a call takes as long as its busiest engine (the "bounding engine"): the lower bound beside the schedule
(`schedule.py`), which orders the instruction trace with its dependencies and fixed costs; `serial_s` (the
sum) is the no-overlap figure. Two targets: `trn1` (NeuronCore-v2, the default) and `trn2` (NeuronCore-v3).
Every constant cites its source in aws-neuron-sdk (path, section); checked against the engine
activity AWS publishes for its tutorial matmuls in bench/README.md ("Cost model calibration",
tests/test_kernels_report.py::test_cost_model_matches_published_profiles).

- TensorE (`nki/guides/architecture/trainium_inferentia2_arch.rst`, "Compute Engine" table and
  "Tensor Engine / Performance Consideration"): a 128 x 128 systolic array streaming one moving
  column per cycle at 2.8 GHz on NeuronCore-v2 (= 92 TFLOPS bf16, `about-neuron/arch/neuron-hardware/
  neuron-core-v2.rst`); a matmul's initiation interval is max(N, MM_INIT_LATENCY = 64 cycles); fp32
  inputs cost 4x. NeuronCore-v3: 2.4 GHz (`trainium2_arch.rst`, "Compute Engine Specifications"),
  79 bf16 / 20 fp32 TFLOPS (same file, "Tensor Engine"), MM_INIT_LATENCY not published for v3: the
  v2 value is ASSUMED. Issued cycles = issued MACs / (128 x 128) (the counters charge the whole
  array per moving column, or the tile's rows x columns per column for a matmul in row / column
  tiling mode (64-row and 64-column tiles on NeuronCore-v2), whose tiles run in parallel:
  `nki/api/nki/isa/__init__.py`, `nc_matmul`, "Tiling mode"), floored at 64 cycles per instruction
  in aggregate.
- VectorE / ScalarE / GpSimdE (same table): 128 lanes, one element per lane per cycle, at 1.12 /
  1.4 / 1.4 GHz on NeuronCore-v2; NeuronCore-v3: VectorE 256 elements per cycle (512 for bf16/fp16:
  not modelled, so bf16 VectorE work on trn2 is over-estimated up to 2x) at 0.96 GHz, ScalarE 128
  at 1.2 GHz, GpSimdE 1.2 GHz (width not published: 128 ASSUMED). Issued lane-elements already carry
  the per-instruction floor (max(MIN_II, N) cycles, `nki/api/nki/isa` docs) and idle partitions.
  Two-input VectorE instructions (tensor_tensor, scalar_tensor_tensor, tensor_tensor_scan) are
  charged 2N cycles ("Vector Engine / Performance Consideration", Cost Model: "roughly 2N cycles").
  Not charged here (the schedule charges them: `timing.py`): the ~100-cycle static overhead of
  back-to-back small or dependent instructions (arch guide, "Vector Engine / Performance Consideration";
  `nki/deep-dives/nki_perf_guide.rst`, Opt #5a), and the shared SBUF port of VectorE/GpSimdE and PSUM port
  of VectorE/ScalarE (arch guide, "Data Movement"). So this estimate is a lower bound.
- DMA (`nki/deep-dives/nki-dma-bandwidth-guide.rst`, bandwidth table): 16 engines x 17 B/ns =
  272 GB/s per NeuronCore-v2, 16 x 23 B/ns = 368 GB/s per NeuronCore-v3, reached with >= 4 KiB per
  partition per transfer; the per-transfer fixed cost (~1300 ns, same guide), the one-transfer-per-engine
  rule and the lower rate of smaller payloads ("below peak" under 2 KiB, "severely overhead-bound" under
  256 B, same guide) are the schedule's (`timing.py`); the counters record the bytes moved in small
  buffers (`Machine.count_dma`).
"""

from __future__ import annotations

import dataclasses

from kernels_nki.emulator.machine import Counters

PE = 128  # systolic array rows = columns (arch guide, "Tensor Engine")


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    tensor_hz: float  # moving columns per second through the whole array
    tensor_fp32_cost: float  # cycles per column for fp32 inputs relative to bf16
    mm_init_cycles: int  # minimum initiation interval of a matmul
    vector_hz: float
    vector_elems_per_cycle: int
    scalar_hz: float
    scalar_elems_per_cycle: int
    gpsimd_hz: float
    gpsimd_elems_per_cycle: int
    dma_bytes_per_s: float

    @property
    def tensor_macs_per_s(self) -> float:
        """bf16 peak MACs per second of one core."""
        return PE * PE * self.tensor_hz


TARGETS = {
    "trn1": Target("trn1", tensor_hz=2.8e9, tensor_fp32_cost=4.0, mm_init_cycles=64,
                   vector_hz=1.12e9, vector_elems_per_cycle=128, scalar_hz=1.4e9, scalar_elems_per_cycle=128,
                   gpsimd_hz=1.4e9, gpsimd_elems_per_cycle=128, dma_bytes_per_s=272e9),
    "trn2": Target("trn2", tensor_hz=2.4e9, tensor_fp32_cost=79 / 20, mm_init_cycles=64,
                   vector_hz=0.96e9, vector_elems_per_cycle=256, scalar_hz=1.2e9, scalar_elems_per_cycle=128,
                   gpsimd_hz=1.2e9, gpsimd_elems_per_cycle=128, dma_bytes_per_s=368e9),
}
DEFAULT_TARGET = "trn1"

# trn1 figures, kept as module constants for callers that cost work outside a kernel
TENSOR_MACS_PER_S = TARGETS["trn1"].tensor_macs_per_s
DMA_BYTES_PER_S = TARGETS["trn1"].dma_bytes_per_s

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclasses.dataclass(frozen=True)
class Estimate:
    engine_s: dict[str, float]
    total_s: float  # engines overlapped: the busiest engine
    serial_s: float  # no overlap at all
    bound: str  # the bounding engine
    target: str = DEFAULT_TARGET

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}: expected one of {', '.join(TARGETS)}")
    return TARGETS[name]


def tensor_cycles(c: Counters, t: Target) -> float:
    bf16_like = c.pe_macs_issued - c.pe_macs_issued_fp32
    cycles = (bf16_like + t.tensor_fp32_cost * c.pe_macs_issued_fp32) / (PE * PE)
    return max(cycles, t.mm_init_cycles * c.pe_instructions)


def engine_seconds(c: Counters, target_name: str = DEFAULT_TARGET) -> dict[str, float]:
    t = target(target_name)
    return {
        "tensor": tensor_cycles(c, t) / t.tensor_hz,
        "vector": c.vector_elems_issued / t.vector_elems_per_cycle / t.vector_hz,
        "scalar": c.scalar_elems_issued / t.scalar_elems_per_cycle / t.scalar_hz,
        "gpsimd": c.gpsimd_elems_issued / t.gpsimd_elems_per_cycle / t.gpsimd_hz,
        "dma": c.dma_bytes / t.dma_bytes_per_s,
    }


def estimate(c: Counters, target_name: str = DEFAULT_TARGET) -> Estimate:
    secs = engine_seconds(c, target_name)
    bound = max(ENGINES, key=lambda e: secs[e])
    return Estimate(engine_s=secs, total_s=secs[bound], serial_s=sum(secs.values()), bound=bound,
                    target=target_name)


def pe_utilisation(c: Counters) -> float | None:
    """Useful / issued TensorE MACs, None for a kernel that issues no matmul."""
    return c.pe_macs_useful / c.pe_macs_issued if c.pe_macs_issued else None
