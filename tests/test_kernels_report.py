"""`python -m kernels_nki.report`: shapes from the config, exact counts, incomplete whole-step section."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from frontier_jax.config import apply_overrides, load_config
from kernels_nki import emulator, report, report_step

REPO = Path(__file__).resolve().parents[1]
SMALL = ["model.num_layers=2", "model.num_kv_heads=1", "model.model_dim=96", "model.num_heads=3"]


TINY = str(REPO / "configs" / "tiny.py")


def test_report_on_tiny_config_json(capsys):
    assert report.main(["--config", TINY, "--compare", TINY, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    cfg = load_config(REPO / "configs" / "tiny.py")
    N = cfg.train.seq_len * cfg.train.micro_batch_seqs
    assert rep["ops_without_kernel"] == []
    assert rep["step"]["complete"] is True and rep["step"]["note"] == "all ops covered"
    w = rep["whole_step"]
    assert 0 < w["mfu"] < 1 and w["step_s"] > w["kernel_s"] > 0 and rep["target"] == "trn1"
    assert w["step_s"] == pytest.approx(w["kernel_s"] + w["glue_s"] + w["optimizer_s"])
    assert w["share_counted"] + w["share_estimated"] == pytest.approx(1) and 0 < w["share_counted"] < 1
    assert w["tokens_per_30min"] == pytest.approx(1800 / w["step_s"] * cfg.train.tokens_per_step)
    proj = [r for r in rep["kernels"] if r["op"] in ("mix_norm_projection", "projection")]
    assert len(proj) == 6 and all(0 < r["pe_useful_over_issued"] <= 1 for r in proj)
    # q/k/v with resid_mix and the pre-norm: encoder-side blocks, then the decoder blocks with a skip add
    assert [r["op"] for r in proj] == ["mix_norm_projection"] * 4 + ["projection"] * 2
    m = cfg.model
    D, O = m.model_dim, (m.num_heads + 2 * m.num_kv_heads) * m.head_dim
    assert [None if a is None else a[0] for a in proj[1]["inputs"]] == [
        [N, D], [N, D], [2, D], [D, O], None, None, [N, 1], [N, D], [N, O]]  # no skip: None, never [N, 0]
    assert [a[0] for a in proj[2]["inputs"]] == [[N, D], [N, D], [2, D], [D, O], [N, D], [1, D]]
    L, micro = m.num_layers, rep["microbatches_per_core_per_step"]
    skips = min(L // 2, L - L // 2)
    assert [r["calls_per_step"] for r in proj[:4]] == [(L - skips) * micro] * 2 + [skips * micro] * 2
    # the output projection's forward reads the block's residual stream and adds it (x + s (o W))
    HK = m.num_heads * m.head_dim
    assert [shape for shape, _ in proj[4]["inputs"]] == [[N, HK], [HK, m.model_dim], [N, m.model_dim]]
    # the scaled residual adds and resid_mix run in the kernels, and so does the attention side's residual
    # gradient add (mix_norm_projection's backward): the glue keeps gradient sums and the [I, O] scale work
    glue = {g["what"] for g in rep["glue"]}
    assert not glue & {"resid_mix", "attn/mlp scaled residual adds", "U-Net skip adds", "attention residual gradient add"}
    assert {"x0 gradient sum (blocks' dx0)", "residual scales: dW = dW' s, ds", "U-Net skip gradient adds"} <= glue
    assert rep["optimizer"]["step_s"] > 0 and [c["config"] for c in rep["comparison"]] == ["tiny"]
    ops_ = ("rms_norm", "qk_attention", "norm_mlp", "embed", "head_loss", "projection", "mix_norm_projection")
    assert {(r["op"], r["which"]) for r in rep["kernels"]} == {(op, w) for op in ops_ for w in ("fwd", "bwd")}
    for r in rep["kernels"]:
        if r["op"] in ("norm_mlp", "head_loss", "qk_attention"):
            assert r["pe_useful_over_issued"] > 0 and r["est_s"] > 0
        if r["op"] == "qk_attention":  # counted on one sequence, times the micro-batch's sequences
            assert r["inputs"][0][0][0] == 1 and r["dma_over_min"] == 1.0
            per_micro = cfg.model.num_layers * cfg.train.micro_batch_seqs
            assert r["calls_per_step"] == per_micro * rep["microbatches_per_core_per_step"]
        if r["op"] == "embed":
            assert r["dma_over_min"] >= 1.0  # the minimum is a lower bound (trn1 one-hot design)
        if r["op"] == "norm_mlp":  # once per block and micro-batch, the pre-norm inside
            assert r["calls_per_step"] == cfg.model.num_layers * rep["microbatches_per_core_per_step"]
    rows = [r for r in rep["kernels"] if r["op"] == "rms_norm"]
    assert [N, cfg.model.model_dim] in [r["inputs"][0][0] for r in rows]
    # the [N, D] norms left outside kernels: the embedding's and the final one (the pre-norms are fused)
    assert {r["calls_per_step"] for r in rows if r["inputs"][0][0] == [N, cfg.model.model_dim]} == {
        2 * rep["microbatches_per_core_per_step"]}
    for r in rows:
        assert r["pe_useful_over_issued"] is None  # no matmul in RMSNorm
        assert 1.0 <= r["dma_over_min"] < 1.05 and r["bound"] != "tensor" and r["est_s"] > 0
    assert rep["step"]["kernel_s_per_step"] > 0


def test_glue_left_by_the_fused_resid_mix_and_skip_adds():
    """resid_mix and the skip adds run in mix_norm_projection: the glue keeps only the gradient sums autodiff
    forms (the blocks' dx0 shares, an encoder output's two gradients), each a whole [N, D] pass."""
    cfg = load_config(REPO / "configs" / "baseline.py")
    N, D, L = cfg.train.seq_len * cfg.train.micro_batch_seqs, cfg.model.model_dim, cfg.model.num_layers
    glue = dict(report_step.glue_passes(cfg, 2))
    assert "resid_mix" not in glue and "U-Net skip adds" not in glue
    assert glue["x0 gradient sum (blocks' dx0)"] == (L + 2) * N * D * 2
    assert glue["U-Net skip gradient adds"] == min(L // 2, L - L // 2) * 3 * N * D * 2


def test_report_text_covers_every_op_and_compares_configs(capsys):
    baseline_shaped_small = str(REPO / "configs" / "baseline.py")
    report.main(["--config", TINY, "--compare", baseline_shaped_small, "--target", "trn2"])
    out = capsys.readouterr().out
    assert "count-only emulation" in out and "INCOMPLETE" not in out and "no NKI kernel (runs" not in out
    assert "all ops covered" in out and re.search(r"qk_attention +fwd", out) and "target trn2" in out and "MFU" in out
    assert "counted from kernels:" in out and "side by side (target trn2" in out
    table = out.split("side by side")[1]
    assert "tiny" in table and "baseline" in table and "tokens/30min" in table
    m = re.search(r"DMA payloads: ([\d.]+)% of the kernels' DMA bytes move in buffers < 2 KiB, ([\d.]+)%", out)
    assert m and 0 <= float(m.group(2)) <= float(m.group(1)) <= 100 and "B/buf" in out


def test_dma_payload_columns_are_consistent_with_the_counters():
    """Every kernel row's bytes per buffer and small-buffer shares come from its counters; attention loads
    one head's [rows, K] at a time, so its buffers are K elements (the small-payload case the report flags)."""
    rep = report.build_report(load_config(TINY))
    for r in rep["kernels"]:
        c = r["counters"]
        assert c["dma_buffers"] >= c["dma_transfers"] > 0, r["op"]
        assert r["dma_bytes_per_buffer"] == pytest.approx(c["dma_bytes"] / c["dma_buffers"])
        assert 0 <= r["dma_share_under_256"] <= r["dma_share_under_2k"] <= 1
    attn = [r for r in rep["kernels"] if r["op"] == "qk_attention"]
    assert attn and all(r["dma_share_under_256"] > 0.5 for r in attn)


def test_report_imports_no_trainer_and_no_jax():
    code = ("import sys, kernels_nki.report; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('jax', 'flax', 'optax') or m in ('frontier_jax.model', 'frontier_jax.optim', "
            "'frontier_jax.dispatch', 'frontier_jax.ops')); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("name", ["baseline.py", "frontier14.py", "tiny.py"])
def test_shapes_from_the_config_equal_the_models(name):
    import jax
    from flax import nnx

    from frontier_jax import model, optim

    cfg = load_config(REPO / "configs" / name)
    dt = jax.numpy.float32 if cfg.model.compute_dtype == "float32" else jax.numpy.bfloat16
    abstract = jax.eval_shape(lambda: nnx.split(model.GPT(cfg.model, rngs=nnx.Rngs(0), compute_dtype=dt,
                                                          num_bias_orders=cfg.ngram.bias_orders,
                                                          bias_buckets=cfg.ngram.confidence_buckets))[1])
    labels = jax.tree_util.tree_leaves(optim.param_labels(abstract))
    want = sorted(("muon" if lab == "muon" else "adam", tuple(x.shape), np.dtype(x.dtype).name)
                  for lab, x in zip(labels, jax.tree_util.tree_leaves(abstract)))
    got = sorted((kind, shape, dtn) for _, kind, shape, dtn in report_step.param_specs(cfg))
    assert got == want


def test_counted_work_equals_a_full_emulated_run_at_small_shapes():
    cfg = apply_overrides(load_config(REPO / "configs" / "tiny.py"), SMALL)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_len=50, tokens_per_step=600,
                                                             micro_batch_seqs=3))  # N = 150 rows
    rng = np.random.default_rng(0)
    for call in report.kernel_calls(cfg):
        counted = report.measure(call)["counters"]
        arrays = [None if spec is None else
                  rng.integers(0, cfg.model.vocab_size, spec[0]).astype(np.int32) if spec[1] == "int32" else
                  rng.standard_normal(spec[0]).astype(ml_dtypes.bfloat16 if spec[1] == "bfloat16" else spec[1])
                  for spec in call.inputs]
        if call.which == "bwd":
            arrays[1] = np.abs(arrays[1]).astype(arrays[1].dtype)
        if call.op == "qk_attention":  # the gain: a broadcast over 128 rows, within ops.SHIFT_LIMIT
            arrays[5] = np.broadcast_to(rng.uniform(0.5, 2.0, arrays[5].shape[1]).astype(np.float32),
                                        arrays[5].shape).copy()
        _, full = emulator.run(report.kernel_of(call), *arrays, **dict(call.constants))
        assert counted == full.as_dict(), call.label
