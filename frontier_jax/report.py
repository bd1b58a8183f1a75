"""What only the JAX side can measure for a run: its environment (backend, devices, processes) and the
matmul peak that MFU is computed against. The run directory's files are `frontier_jax.rundir`'s.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from frontier_jax import rundir

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "sentencepiece", "ml_dtypes")


def environment() -> dict:
    """env.json's entries: rundir.environment (versions, git) plus JAX's backend, devices and processes."""
    return {
        **rundir.environment(PACKAGES),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
    }


def measure_matmul_peak(dtype=jnp.float32, n: int | None = None, reps: int = 5) -> float:
    """FLOP/s of an n^3 matmul on the default device, best of `reps` (the MFU denominator).

    n defaults to 2048 on CPU and 8192 on accelerators (2048^3 is far too small to fill a GPU: on an
    H200 it measured 117 TFLOP/s in bf16, a sixth of the device's rate). Measured once per process for
    each (backend, dtype, n, reps): a process that trains several times (the test session: about 3 s a
    probe on two loaded cores) reuses the first measurement.
    """
    backend = jax.default_backend()
    if n is None:
        n = 2048 if backend == "cpu" else 8192
    return _matmul_peak(backend, jnp.dtype(dtype), n, reps)


@functools.cache
def _matmul_peak(backend: str, dtype: jnp.dtype, n: int, reps: int) -> float:
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
