"""frontier_jax.report: the matmul peak (MFU denominator) is a positive FLOP rate measured once per process
and setting."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from frontier_jax import report


def test_matmul_peak_measured_once_per_setting():
    report._matmul_peak.cache_clear()
    first = report.measure_matmul_peak(jnp.float32, n=128, reps=2)
    assert first > 0 and math.isfinite(first)
    assert report.measure_matmul_peak(np.float32, n=128, reps=2) == first  # same dtype spelled otherwise: reused
    info = report._matmul_peak.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    report.measure_matmul_peak(jnp.float32, n=64, reps=2)  # another size is measured anew
    assert report._matmul_peak.cache_info().misses == 2

