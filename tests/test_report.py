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



def test_mfu_peak_is_documented_for_trn1_and_a_repeated_probe_elsewhere(monkeypatch):
    """AWS documents the XLA device kind NC_v2 for Trainium1 and 190 BF16 TFLOPS per 2-core chip."""
    class Dev:
        device_kind = "NC_v2"

    monkeypatch.setattr(report.jax, "devices", lambda: [Dev()])
    doc = report.matmul_peak(jnp.bfloat16, num_devices=2)
    assert doc["matmul_peak_flops"] == 190e12 and doc["peak_spread"] is None
    assert doc["peak_source"].startswith("documented: AWS Trainium") and "trainium.rst" in doc["peak_source"]
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(report, "measure_matmul_peak", lambda dtype, round_=0: calls.append(round_) or 100.0 + round_)
    probe = report.matmul_peak(jnp.float32)
    assert calls == list(range(report.PROBE_ROUNDS)) and probe["matmul_peak_flops"] == 102.0
    assert probe["peak_spread"] == [100.0, 104.0] and probe["peak_source"].startswith("measured: median of 5 probes")
