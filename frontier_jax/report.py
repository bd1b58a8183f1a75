"""What only the JAX side can measure for a run: its environment (backend, devices, processes) and the
matmul peak that MFU is computed against (`matmul_peak`: documented where known, else a repeated probe
reported with its spread). The run directory's files are `frontier_jax.rundir`'s.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from frontier_jax import rundir
from frontier_jax.progress import probe_summary

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "sentencepiece", "ml_dtypes")


def environment() -> dict:
    """env.json's entries: rundir.environment (versions, git) plus JAX's backend, devices and processes."""
    return {
        **rundir.environment(PACKAGES),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,  # the rules profiles' hardware (frontier_jax.contest.limits)
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
    }


# Documented dense matmul peaks per device, keyed by the XLA device kind. AWS documents the kind
# "NC_v2" for Trainium1 (aws-neuron-sdk `archive/nxd-training/pytorch-neuron-programming-guide.rst`,
# `xla_device_kind`); a Trainium chip is two NeuronCore-v2 with 190 FP16/BF16 and 47.5 FP32 TFLOPS
# (`about-neuron/arch/neuron-hardware/trainium.rst`, the Trainium table): per core half of that.
DOCUMENTED_PEAKS = {
    "NC_v2": {"bfloat16": 190e12 / 2, "float32": 47.5e12 / 2,
              "source": "documented: AWS Trainium (trn1) 190 BF16 / 47.5 FP32 TFLOPS per chip of 2 NeuronCore-v2, "
                        "aws-neuron-sdk about-neuron/arch/neuron-hardware/trainium.rst"},
}
PROBE_ROUNDS = 5


def matmul_peak(dtype=jnp.float32, num_devices: int = 1) -> dict:
    """The MFU denominator for all `num_devices` devices: {"matmul_peak_flops", "peak_source", "peak_spread"}.

    The device's documented peak where `DOCUMENTED_PEAKS` knows its kind (spread None), else the median
    of `PROBE_ROUNDS` probes (`measure_matmul_peak`, each the best of 5 timings), with their min and max
    as the spread: one probe read 72 to 168 GFLOP/s on the same loaded CPU, so a single one is noise."""
    kind = jax.devices()[0].device_kind
    doc = DOCUMENTED_PEAKS.get(kind)
    name = jnp.dtype(dtype).name
    if doc and name in doc:
        return {"matmul_peak_flops": doc[name] * num_devices, "peak_source": f"{doc['source']} ({name})",
                "peak_spread": None}
    backend = jax.default_backend()
    samples = [measure_matmul_peak(dtype, round_=i) * num_devices for i in range(PROBE_ROUNDS)]
    n = 2048 if backend == "cpu" else 8192  # measure_matmul_peak's default
    return probe_summary(samples, f"{n}^3 {name} matmul on {backend} ({kind}) x {num_devices} device(s)")


def measure_matmul_peak(dtype=jnp.float32, n: int | None = None, reps: int = 5, round_: int = 0) -> float:
    """FLOP/s of an n^3 matmul on the default device, best of `reps` (the MFU denominator).

    n defaults to 2048 on CPU and 8192 on accelerators (2048^3 is far too small to fill a GPU: on an
    H200 it measured 117 TFLOP/s in bf16, a sixth of the device's rate). Measured once per process for
    each (backend, dtype, n, reps): a process that trains several times (the test session: about 3 s a
    probe on two loaded cores) reuses the first measurement.
    """
    backend = jax.default_backend()
    if n is None:
        n = 2048 if backend == "cpu" else 8192
    return _matmul_peak(backend, jnp.dtype(dtype), n, reps, round_)


@functools.cache
def _matmul_peak(backend: str, dtype: jnp.dtype, n: int, reps: int, round_: int) -> float:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best
