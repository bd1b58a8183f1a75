"""bench/cost_calibration.py's published NeuronCore-v2 kernel latencies: the points as AWS publishes them, the
saved predictions (docs/kernels/published-latencies.json) as the command computes them, and the table that
bench/README.md carries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import cost_calibration as cc
from frontier_jax.neuron import kernel_report

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def saved():
    return json.loads(cc.LATENCIES_JSON.read_text())


def test_the_published_points():
    assert len(cc.MAMBA) == 20 and len(cc.MATMUL_TRN1) == 4
    assert [p[:3] for p in cc.MAMBA[:2]] == [("v1", 256, 512), ("v1", 4096, 512)]
    assert {p[1] for p in cc.MAMBA[2:]} == {4096} and [p[2] for p in cc.MAMBA[2:11]] == list(cc.MAMBA_SEQ)
    # fused_mamba.rst's table: v2 degrades with seq_len (spills), v3 scales linearly from 1.6 ms
    assert cc.MAMBA_V2_MS[0] == cc.MAMBA_V3_MS[0] == 1.6 and cc.MAMBA_V2_MS[-1] > 1.8 * cc.MAMBA_V3_MS[-1]


def test_saved_latencies_are_the_commands(saved):
    """Cheap rows recomputed: the toy-shape mamba_v1 and the blocked_k matmul equal the saved predictions."""
    rows = {r["kernel"] + " " + r["shape"]: r for r in saved["rows"]}
    toy = cc.mamba(points=(cc.MAMBA[0],))[0]
    assert toy["predicted_s"] == pytest.approx(rows[toy["kernel"] + " " + toy["shape"]]["predicted_s"], rel=1e-9)
    assert saved["command"] == cc.SAVE_COMMAND and len(saved["rows"]) == 24
    assert saved["spread"] == json.loads(json.dumps(cc.latency_record(saved["rows"])["spread"]))


def test_latency_table_in_bench_readme(saved):
    readme = (REPO / "bench" / "README.md").read_text()
    assert cc.latency_table(saved["rows"]) in readme, f"rerun {cc.SAVE_COMMAND} and put its table in bench/README.md"


def test_step_estimate_quotes_the_saved_spread(saved):
    v = kernel_report.validation(cc.LATENCIES_JSON)
    assert v["points"] == 24 and v["central"]["min"] <= v["central"]["median"] <= v["central"]["max"]
    line = kernel_report.validation_line({"validation": v})
    assert f"{v['central']['min']:.2f} - {v['central']['max']:.2f}x" in line
    assert kernel_report.validation(REPO / "missing.json") is None


@pytest.mark.slow
def test_mamba_v3_extrapolation_bounds_the_full_trace():
    """mamba_v3 past two sequence tiles is extrapolated from 2 and 3 of them: within 3% of the full trace at 4."""
    got = cc._mamba_estimate("v3", 1024, 4 * cc.MAMBA_SEQ_TILE)
    module = cc.kernels("bench.calibration_kernels")
    tr = cc.loader.record(module.mamba_v2, *cc._mamba_specs(1024, 4 * cc.MAMBA_SEQ_TILE), target="trn1",
                          seq_tile=cc.MAMBA_SEQ_TILE)
    full = cc.schedule.estimate(tr)
    for a in cc.ORDERS:
        assert got[a] == pytest.approx(full[a], rel=0.03), a
