"""The cost model (kernels_nki/emulator/cost.py): per-target constants and the calibration against AWS's
published engine activity of its tutorial matmuls (bench/cost_calibration.py, bench/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import cost_calibration
from kernels_nki.emulator import cost
from kernels_nki.emulator.machine import Counters


def test_targets_match_the_published_peaks():
    # 92 TFLOPS bf16 per NeuronCore-v2 (190 per trn1 chip / 2), 79 per NeuronCore-v3
    assert 2 * cost.TARGETS["trn1"].tensor_macs_per_s == pytest.approx(92e12, rel=0.01)
    assert 2 * cost.TARGETS["trn2"].tensor_macs_per_s == pytest.approx(79e12, rel=0.01)
    assert cost.DMA_BYTES_PER_S == 272e9 and cost.TARGETS["trn2"].dma_bytes_per_s == 368e9
    with pytest.raises(ValueError, match="unknown target"):
        cost.estimate(Counters(), "trn9")


def test_engine_times_follow_the_documented_rates():
    c = Counters(pe_instructions=4, pe_macs_issued=4 * 128 * 128 * 32, vector_elems_issued=128 * 1120,
                 scalar_elems_issued=128 * 1400, dma_bytes=272)
    s = cost.engine_seconds(c, "trn1")
    assert s["tensor"] == pytest.approx(4 * 64 / 2.8e9)  # N = 32 < MM_INIT_LATENCY: 64 cycles each
    assert s["vector"] == pytest.approx(1e-6) and s["scalar"] == pytest.approx(1e-6)
    assert s["dma"] == pytest.approx(1e-9)
    fp32 = Counters(pe_instructions=1, pe_macs_issued=128 * 128 * 512, pe_macs_issued_fp32=128 * 128 * 512)
    assert cost.engine_seconds(fp32, "trn1")["tensor"] == pytest.approx(4 * 512 / 2.8e9)
    est = cost.estimate(c, "trn2")
    assert est.target == "trn2" and est.bound == max(est.engine_s, key=est.engine_s.get)


@pytest.fixture(scope="module")
def calibration():
    return cost_calibration.measure("trn2")


def test_cost_model_matches_published_profiles(calibration):
    rows = calibration["rows"]
    assert [r["schedule"] for r in rows] == ["tiled", "hoisted", "blocked", "blocked_k"]
    assert [r["bound"] for r in rows] == ["dma", "tensor", "tensor", "tensor"]  # memory bound, then compute bound
    for r in rows:
        assert abs(r["predicted"]["tensor"] - r["published"]["tensor"]) <= cost_calibration.TENSOR_TOLERANCE
        # the profile's DMA activity includes per-transfer latency the model leaves out: never below it
        assert r["predicted"]["dma"] <= r["published"]["dma"] + 0.01
    # VectorE (blocked_k's PSUM + SBUF adds): two-input instructions charged ~2N cycles (arch guide)
    assert 0.75 <= rows[3]["predicted"]["vector"] / rows[3]["published"]["vector"] <= 1.05
    assert rows[0]["est_s"] > rows[1]["est_s"] >= rows[2]["est_s"]  # each step of the tutorial is faster
    assert all(r["dma_bytes_per_buffer"] >= 1024 for r in rows)  # 512 B lhsT and 2 KiB rhs buffers


def test_schedule_against_published_figures(calibration):
    rows, dma = calibration["rows"], calibration["dma"]
    for r in rows:  # the schedule never beats the busiest-engine bound: shares of a longer makespan
        for a in cost_calibration.READINGS:
            assert r["scheduled"][a]["tensor"] <= r["predicted"]["tensor"] + 0.01
    # TensorE-bound versions keep TensorE busy under the low and central readings
    assert all(r["scheduled"]["central"]["tensor"] > 0.95 for r in rows[2:])
    # Example 1: the transfer's bar is its data at the table's rate, within 3% (low, central)
    assert all(abs(dma["example_1_ns"][a] / cost_calibration.EXAMPLE_1_NS - 1) < 0.03 for a in ("low", "central"))
    # the central reading takes its rate from the figure and reproduces it within a fifth
    for w, pub in dma["curve_published"].items():
        assert abs(dma["curve"]["central"][w] / pub - 1) < 0.2
    assert calibration["scalar_ii_ns"] == pytest.approx(cost_calibration.SCALAR_II_NS, rel=0.01)


def test_calibration_tables_in_bench_readme(calibration):
    readme = (Path(__file__).resolve().parents[1] / "bench" / "README.md").read_text()
    assert cost_calibration.tables(calibration) in readme, "rerun python -m bench.cost_calibration"
