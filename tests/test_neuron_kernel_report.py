"""`python -m frontier_jax.kernel_report`: the schedule estimate per kernel and per step from the traced step,
the busiest-engine figure beside it, the range."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from frontier_jax.neuron import kernel_calls as kc
from frontier_jax.neuron import kernel_report
from frontier_jax.config import apply_overrides, load_config
from kernels_nki import emulator
from kernels_nki.emulator import loader, schedule

REPO = Path(__file__).resolve().parents[1]
SMALL = ["model.num_layers=2", "model.num_kv_heads=1", "model.model_dim=96", "model.num_heads=3"]


def small_config(name="small"):
    cfg = apply_overrides(load_config(REPO / "configs" / "tiny.py"), SMALL)
    return dataclasses.replace(cfg, name=name, train=dataclasses.replace(
        cfg.train, seq_len=50, tokens_per_step=1200, micro_batch_seqs=3))


@pytest.fixture(scope="module")
def rep():
    return kernel_report.build_report(small_config())


def test_step_is_the_kernels_plus_the_glue_under_every_reading(rep):
    for k in ("busiest", kernel_report.IN_ORDER) + kernel_report.READINGS:
        assert rep["step_s"][k] == pytest.approx(rep["kernel_s"][k] + rep["glue_s"][k])
        assert rep["mfu"][k] == pytest.approx(rep["flops_per_step_per_core"] / (rep["step_s"][k] * 2 * 2.8e9 * 128 ** 2))
    s = rep["step_s"]
    assert s["busiest"] <= s["low"] <= s["central"] <= s["high"]
    for r in rep["kernels"]:  # the schedule never beats the busiest-engine lower bound
        assert r["busiest_s"] <= r["schedule_s"]["low"] * 1.0001, (r["op"], r["which"])
        assert r["schedule_s"]["low"] <= r["schedule_s"]["central"] * 1.0001 <= r["schedule_s"]["high"] * 1.0002
    assert {r["op"] for r in rep["kernels"]} == {"rms_norm", "mix_norm_projection", "projection", "norm_mlp",
                                                 "qk_attention", "embed", "head_loss"}


def test_text_and_json_output(capsys):
    cfg_path = str(REPO / "configs" / "tiny.py")
    # one worker: tiny's few small calls trace in less time than two spawned processes take to import JAX
    kernel_report.main(["--config", cfg_path, "--compare", cfg_path, "--json", "--workers", "1"])
    out = json.loads(capsys.readouterr().out)
    assert out["report"]["config"] == "tiny" and out["comparison"] == []
    text = kernel_report.format_report(out["report"]) + "\n" + kernel_report.format_comparison([out["report"]])
    assert "step per core: schedule" in text and "busiest-engine lower bound" in text and "in program order" in text
    assert "MFU range" in text and "MFU:" not in text and "side by side" in text
    assert "AWS's published trn1 training runs report 13.8% - 33.1% MFU" in text and "not a ceiling" in text
    assert "kernel latencies AWS publishes at" in text  # the validation beside the range


def test_batch_extrapolation_bounds_the_full_trace():
    """qk_attention is priced from 2 and 3 sequences (the first sequence's set-up is not yet the steady state
    the others share); against the full trace of 4 within 2%."""
    cfg = small_config()
    call = next(c for c in kc.kernel_calls(cfg) if c.op == "qk_attention" and c.which == "bwd")
    call = dataclasses.replace(call, inputs=kernel_report.with_batch(call, 4))
    got = kernel_report.measure(call)
    full = loader.record(kernel_report.kernel_of(call), *call.inputs, **dict(call.constants))
    assert got["batch_extrapolated"] and got["counters"] == full.counters.as_dict()
    est = schedule.estimate(full)
    for a in kernel_report.READINGS + (kernel_report.IN_ORDER,):
        assert got["schedule_s"][a] == pytest.approx(est[a], rel=0.02), a


def test_counted_work_equals_a_full_emulated_run():
    cfg = small_config()
    rng = np.random.default_rng(0)
    for call in kc.kernel_calls(cfg):
        counted = loader.record(kernel_report.kernel_of(call), *call.inputs, **dict(call.constants)).counters
        arrays = [None if spec is None else
                  rng.integers(0, cfg.model.vocab_size, spec[0]).astype(np.int32) if spec[1] == "int32" else
                  rng.standard_normal(spec[0]).astype(ml_dtypes.bfloat16 if spec[1] == "bfloat16" else spec[1])
                  for spec in call.inputs]
        if call.op == "rms_norm" and call.which == "bwd":
            arrays[1] = np.abs(arrays[1]).astype(arrays[1].dtype)  # the saved inverse RMS
        if call.op == "qk_attention":  # the gain: a broadcast over 128 rows, within ops.SHIFT_LIMIT
            arrays[5] = np.broadcast_to(rng.uniform(0.5, 2.0, arrays[5].shape[1]).astype(np.float32),
                                        arrays[5].shape).copy()
            if call.which == "bwd":
                arrays[7] = np.abs(arrays[7]) + 1.0  # lse
                for i in (9, 11):  # the saved inverse RMS of q and k
                    arrays[i] = np.abs(arrays[i]) + 0.5
        if call.op == "mix_norm_projection" and call.which == "bwd":
            arrays[6] = np.abs(arrays[6]).astype(arrays[6].dtype)
        _, full = emulator.run(kernel_report.kernel_of(call), *arrays, **dict(call.constants))
        assert counted == full, (call.op, call.which)


def test_workers_price_the_same_report(rep):
    """The kernel calls traced and scheduled in two spawned processes give the report of one process, each
    distinct call (the step's and the exact-max forward's) traced once."""
    kernel_report._TRACED.clear()
    kernel_report._priced.cache_clear()
    cfg = small_config()
    calls = kc.kernel_calls(cfg)
    keys = {k for c in calls for k in kernel_report._traced_calls(c, "trn1")}
    lines = []
    assert kernel_report.build_report(cfg, progress=lines.append, workers=2) == rep
    assert f"kernel_report: tracing and scheduling {len(keys) + 1} distinct kernel calls in 2 processes" in lines
    assert any(x.startswith(f"kernel_report: traced {len(keys) + 1}/{len(keys) + 1}, ") for x in lines)
    assert len(kernel_report._TRACED) == len(keys) + 1  # and the exact-max forward's


def test_report_bad_config_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        kernel_report.main(["--config", str(tmp_path / "missing.py")])
    assert exc.value.code == 2 and capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
def test_docs_step_estimate_is_the_reports(neuron_traced, monkeypatch):
    """docs/kernels/step-estimate.md carries `kernel_report --config configs/baseline.py --markdown --against
    docs/kernels/step-estimate-row-major.json` verbatim (baseline and the default comparison, frontier14).
    `kc.program(cfg)` is the train step of the session's trace (`neuron_traced`: the same call, which the program
    check of every config reads too)."""
    monkeypatch.setattr(kc, "program", lambda cfg: neuron_traced(cfg).programs["train"])
    reps = kernel_report.build_reports([load_config(REPO / "configs" / name) for name in ("baseline.py", "frontier14.py")],
                                       workers=kernel_report.cpus())
    docs = REPO / "docs" / "kernels"
    old = kernel_report._saved_report(docs / "step-estimate-row-major.json", "baseline", "trn1")
    md = kernel_report.format_markdown(reps) + "\n\n" + kernel_report.format_against(reps[0], old)
    assert md in (docs / "step-estimate.md").read_text(), "rerun python -m frontier_jax.kernel_report --config " \
        "configs/baseline.py --markdown --against docs/kernels/step-estimate-row-major.json into the page"
    # docs/kernels/optimizer.md's per-step figures are frontier14's report's
    lines = kernel_report.optimizer_lines(reps[1])
    ratio = {line.split(":")[0]: line.split(", ")[1].split("x")[0] for line in lines}
    assert f"Adam {ratio['adam_update']}x, Muon {ratio['muon_update']}x per step" in (docs / "optimizer.md").read_text()


def test_markdown_tables(rep):
    md = kernel_report.format_markdown([rep, rep])
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    d = rep["dma_per_step"]
    assert d["dma_transfers"] == sum(r["dma_transfers"] * r["calls_per_step"] for r in rep["kernels"]) > 0
    assert 0 <= d["dma_bytes_under_256"] <= d["dma_bytes_under_2k"] <= d["dma_bytes"]
    assert sum(line.startswith(f"| {rep['config']} |") for line in rows) == 2  # the side-by-side rows
    assert len(rows) == (1 + len(rep["kernels"])) + (1 + len({r["op"] for r in rep["kernels"]}) + 2) + 1 + 2
    assert f"{d['dma_transfers'] / 1e6:.3f} M transfers" in md
    (fallback,) = rep["exact_max_forward"]  # the exact-max attention forward, priced beside the bounded one
    assert fallback["op"] == "qk_attention" and fallback["constants"]["exact_max"] is True
    assert "exact-max qk_attention forward (the fallback, not in the step)" in md


def test_against_sets_each_call_beside_the_saved_one(rep, tmp_path, capsys):
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"report": rep}, default=str))
    md = kernel_report.format_against(rep, kernel_report._saved_report(saved, rep["config"], rep["target"]))
    rows = [line for line in md.splitlines() if line.startswith(f"| {rep['kernels'][0]['op']} |")]
    assert rows and " -> " in rows[0] and "(new call)" not in md
    with pytest.raises(SystemExit) as exc:  # another config's report: one line, exit 2, before anything runs
        kernel_report.main(["--config", str(REPO / "configs" / "tiny.py"), "--markdown", "--against", str(saved)])
    assert exc.value.code == 2 and "not tiny on trn1" in capsys.readouterr().err


def test_fused_optimizer_rows_carry_their_bytes_over_the_minimum_and_qk_attention_its_sequences(capsys):
    """Every fused-optimizer row of --json has bytes_over_min (DMA over each state read and written once, >= 1),
    the tables print it, and the text says how many sequences one qk_attention call runs (profile draws one)."""
    cfg = small_config()
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, fused=True))
    lines = []
    rep = kernel_report.build_report(cfg, progress=lines.append)
    opt = [r for r in rep["kernels"] if r["op"] in ("adam_update", "muon_update")]
    assert {r["op"] for r in opt} == {"adam_update", "muon_update"}
    # never below the least; a large state moves close to it (the [128, k] fp32 runtime scalars weigh on tiny ones)
    assert all(r["bytes_over_min"] >= 1.0 and r["min_bytes"] > 0 for r in opt)
    assert max(opt, key=lambda r: r["min_bytes"])["bytes_over_min"] < 1.01
    assert all("bytes_over_min" not in r for r in rep["kernels"] if r not in opt)
    adam = next(r for r in opt if r["op"] == "adam_update")
    state = lambda shape, dt: ((shape, dt),)
    call = kc.KernelCall("adam_update", "fwd", state((10,), "bfloat16") * 4 + state((128, 4), "float32"), (), 1)
    assert kernel_report.min_bytes(call) == 7 * 2 * 10  # p, g, m, v read and p', m', v' written once
    call = kc.KernelCall("muon_update", "fwd", state((4, 8), "float32") * 3 + state((128, 2), "float32"), (), 1)
    assert kernel_report.min_bytes(call) == 5 * 4 * 32  # p, g, buf read and p', buf' written once
    text = kernel_report.format_report(rep)
    assert "x min" in text and "adam_update: " in text and "x the least it must move" in text
    assert "qk_attention: a call runs 3 sequences" in text and "profile draws one sequence" in text
    md = kernel_report.format_markdown([rep])
    assert "| DMA / least |" in md and f"{adam['bytes_over_min']:.3f}x" in md
    assert lines[0].startswith("kernel_report: small: tracing") and any("pricing kernel call" in x for x in lines)


def test_an_op_on_its_reference_path_is_named_and_priced_outside_the_kernels(rep):
    """A model whose MLP is LeakyReLU(-0.25)^2 (a slope no kernel computes; the record's 0.5 runs in the kernel): the
    step calls no norm_mlp kernel; the report names the fallback and its setting, and its matmuls are priced in the
    work outside kernels (more matmul work there than the same model's with the kernel)."""
    cfg = apply_overrides(small_config(), ["model.mlp_negative_slope=-0.25"])
    leaky = kernel_report.build_report(cfg)
    why = ("model.mlp_negative_slope=-0.25: the kernel reads the activation's sign off the stored LeakyReLU(h), which "
           "needs a slope >= 0")
    assert "norm_mlp" not in {r["op"] for r in leaky["kernels"]} and "norm_mlp" in {r["op"] for r in rep["kernels"]}
    assert leaky["reference_fallbacks"] == [{"op": "norm_mlp", "reason": why}]
    assert rep["reference_fallbacks"] == []
    assert leaky["glue"]["dot_macs"] > rep["glue"]["dot_macs"] and leaky["glue_s"]["central"] > rep["glue_s"]["central"]
    assert f"  of which the reference path of norm_mlp (no kernel call: {why})" in kernel_report.format_report(leaky)
