"""Estimated trn1 (one NeuronCore-v2) time of a kernel call from the emulator's work counters.

Model: each engine's time is its issued work divided by its throughput; engines run concurrently,
so a call takes as long as its busiest engine (the "bounding engine"); `serial_s` (the sum) is the
no-overlap upper bound. Constants and where they come from (../shared/specs/nki.md section 6, which
cites the Neuron SDK docs: about-neuron/arch/neuron-hardware/{trainium,neuron-core-v2,trn1-arch}.rst,
nki/deep-dives/nki-dma-bandwidth-guide.rst):

- TensorE 92 TFLOPS bf16/fp16/tf32 per core (190 per chip / 2) = 46e12 MAC/s of issued MACs; fp32
  inputs run at a quarter of that (23 TFLOPS, 47.5 per chip / 2).
- VectorE 2.3 TFLOPS fp32 and ScalarE 2.9 TFLOPS fp32, applied as one operation per issued
  lane-element. Issued lane-elements already include the ISA's per-instruction floor (cost is
  max(MIN_II, N) cycles with MIN_II ~ 64, sdk nki/api isa docs) and idle partitions (a 5-row tile
  occupies all 128 lanes). CAVEAT: if those TFLOPS figures count several FLOPs per element, real
  Vector/Scalar times are longer than estimated here; calibrate against a trn1 profile.
- GpSimd: nki.md gives no figure. ASSUMPTION: 8 general-purpose 512-bit cores (sdk
  neuron-core-v2.rst) at a quarter of VectorE's rate. No project kernel uses GpSimd yet.
- DMA 272e9 B/s per core: the docs disagree (16 engines x 27 GiB/s = 464 GB/s vs 272 GB/s
  aggregate); we take the lower. HBM (820 GB/s per chip shared by 2 cores = 410 GB/s) is not the
  tighter bound. Per-transfer latency and descriptor efficiency of small transfers are not modelled.
"""

from __future__ import annotations

import dataclasses

from kernels_nki.emulator.machine import Counters

TENSOR_MACS_PER_S = 92e12 / 2
TENSOR_FP32_MACS_PER_S = 23e12 / 2
VECTOR_ELEMS_PER_S = 2.3e12
SCALAR_ELEMS_PER_S = 2.9e12
GPSIMD_ELEMS_PER_S = 2.3e12 / 4  # assumption, see module docstring
DMA_BYTES_PER_S = 272e9

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclasses.dataclass(frozen=True)
class Estimate:
    engine_s: dict[str, float]
    total_s: float  # engines overlapped: the busiest engine
    serial_s: float  # no overlap at all
    bound: str  # the bounding engine

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def engine_seconds(c: Counters) -> dict[str, float]:
    bf16_like = c.pe_macs_issued - c.pe_macs_issued_fp32
    return {
        "tensor": bf16_like / TENSOR_MACS_PER_S + c.pe_macs_issued_fp32 / TENSOR_FP32_MACS_PER_S,
        "vector": c.vector_elems_issued / VECTOR_ELEMS_PER_S,
        "scalar": c.scalar_elems_issued / SCALAR_ELEMS_PER_S,
        "gpsimd": c.gpsimd_elems_issued / GPSIMD_ELEMS_PER_S,
        "dma": c.dma_bytes / DMA_BYTES_PER_S,
    }


def estimate(c: Counters) -> Estimate:
    secs = engine_seconds(c)
    bound = max(ENGINES, key=lambda e: secs[e])
    return Estimate(engine_s=secs, total_s=secs[bound], serial_s=sum(secs.values()), bound=bound)


def pe_utilisation(c: Counters) -> float | None:
    """Useful / issued TensorE MACs, None for a kernel that issues no matmul."""
    return c.pe_macs_useful / c.pe_macs_issued if c.pe_macs_issued else None
