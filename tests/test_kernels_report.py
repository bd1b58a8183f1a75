"""`python -m kernels_nki.report`: shapes from the config, exact counts, incomplete whole-step section."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import ml_dtypes
import numpy as np

from frontier_jax.config import apply_overrides, load_config
from kernels_nki import emulator, registry, report

REPO = Path(__file__).resolve().parents[1]
SMALL = ["model.num_layers=2", "model.num_kv_heads=1", "model.model_dim=96", "model.num_heads=3"]


def test_report_on_tiny_config_json(capsys):
    assert report.main(["--config", str(REPO / "configs" / "tiny.py"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    cfg = load_config(REPO / "configs" / "tiny.py")
    N = cfg.train.seq_len * cfg.train.micro_batch_seqs
    assert rep["ops_without_kernel"] == []
    assert rep["step"]["complete"] is True and rep["step"]["note"] == "all ops covered"
    assert 0 < rep["whole_step"]["mfu"] < 1 and rep["whole_step"]["step_s"] > rep["whole_step"]["kernel_s"] > 0
    ops_ = ("rms_norm", "rope", "causal_attention", "mlp", "embed", "head_loss")
    assert {(r["op"], r["which"]) for r in rep["kernels"]} == {(op, w) for op in ops_ for w in ("fwd", "bwd")}
    for r in rep["kernels"]:
        if r["op"] in ("mlp", "head_loss", "causal_attention"):
            assert r["pe_useful_over_issued"] > 0 and r["est_s"] > 0
        if r["op"] == "causal_attention":  # counted on one sequence, times the micro-batch's sequences
            assert r["inputs"][0][0][0] == 1 and r["dma_over_min"] == 1.0
            per_micro = cfg.model.num_layers * cfg.train.micro_batch_seqs
            assert r["calls_per_step"] == per_micro * rep["microbatches_per_core_per_step"]
        if r["op"] == "embed":
            assert r["dma_over_min"] <= 1.1
    rows = [r for r in rep["kernels"] if r["op"] == "rms_norm"]
    assert [N, cfg.model.model_dim] in [r["inputs"][0][0] for r in rows]
    assert [N * cfg.model.num_heads, cfg.model.head_dim] in [r["inputs"][0][0] for r in rows]
    for r in rows:
        assert r["pe_useful_over_issued"] is None  # no matmul in RMSNorm
        assert 1.0 <= r["dma_over_min"] < 1.05 and r["bound"] == "dma" and r["est_s"] > 0
    assert rep["step"]["kernel_s_per_step"] > 0


def test_report_text_covers_every_op(capsys):
    report.main(["--config", str(REPO / "configs" / "tiny.py")])
    out = capsys.readouterr().out
    assert "count-only emulation" in out and "INCOMPLETE" not in out and "no NKI kernel (runs" not in out
    assert "all ops covered" in out and "causal_attention fwd" in out and "estimated trn1 step" in out and "MFU" in out


def test_counted_work_equals_a_full_emulated_run_at_small_shapes():
    cfg = apply_overrides(load_config(REPO / "configs" / "tiny.py"), SMALL)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_len=50, tokens_per_step=600,
                                                             micro_batch_seqs=3))  # N = 150 rows
    rng = np.random.default_rng(0)
    for call in report.kernel_calls(cfg):
        counted = report.measure(call)["counters"]
        arrays = [rng.integers(0, cfg.model.vocab_size, shape).astype(np.int32) if dt == "int32" else
                  rng.standard_normal(shape).astype(ml_dtypes.bfloat16 if dt == "bfloat16" else dt)
                  for shape, dt in call.inputs]
        if call.which == "bwd":
            arrays[1] = np.abs(arrays[1]).astype(arrays[1].dtype)
        kernel = getattr(registry.load_emulated(call.op), getattr(registry.KERNELS[call.op], call.which))
        _, full = emulator.run(kernel, *arrays, **dict(call.constants))
        assert counted == full.as_dict(), call.label
