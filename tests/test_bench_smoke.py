"""bench/: each script runs at tiny shapes (the `smoke` case of bench/common.py, or small CLI values) and prints
its table, run as `python -m bench.<name>` in a subprocess (the scripts set up the allocator before JAX starts).

Smoke-tested elsewhere: aws_kernels (tests/test_bench_aws_kernels.py), cost_calibration (tests/test_emulator_cost.py,
its tables in sync with bench/README.md). Not scripts: common (the cases), aws_cases, calibration_kernels and
probe_kernels (kernels those two run). data_checks writes synthetic shards and needs the sp1024 tokenizer
(../shared/data: skipped without it).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from bench import step_ablation
from bench.common import CASES, FP32, random_batch
from frontier_jax import ops
from frontier_jax.model import build

REPO = Path(__file__).resolve().parents[1]
NUMBER = r"(-?[0-9][0-9,]*\.?[0-9]*)"


def run_bench(name: str, *args: str, timeout: float = 120) -> str:
    r = subprocess.run([sys.executable, "-m", f"bench.{name}", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def finite(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in:\n{text}"
    value = float(m.group(1).replace(",", ""))
    assert math.isfinite(value), text
    return value


def _grad_jaxpr(variant: str) -> str:
    case = CASES["smoke"]
    cfg = case.load(*FP32)
    x, y = (jnp.asarray(a) for a in random_batch(case, cfg.model.vocab_size))
    graphdef, params = nnx.split(build(cfg, jnp.float32))
    with step_ablation.ablated(variant), ops.kernel_primitives():
        return str(jax.make_jaxpr(jax.grad(lambda p: jnp.mean(nnx.merge(graphdef, p)(x, y))))(params))


def test_step_ablation_removes_the_attention_op_the_model_calls():
    assert "frontier_qk_attention" in _grad_jaxpr("full")
    ablated = _grad_jaxpr("no_attention")
    assert "frontier_qk_attention" not in ablated
    assert "frontier_norm_mlp" in ablated  # the rest of the model is still there
    assert ops.qk_attention is not step_ablation._cheap_attention  # restored after tracing


@pytest.mark.slow
def test_step_ablation_prints_each_family():
    out = run_bench("step_ablation", "--cases", "smoke", "--rounds", "1")
    assert finite(out, r"full train step\s+" + NUMBER + " ms") > 0
    for row in ("attention core fwd\\+bwd", "optimizer \\(Muon NS \\+ Adam\\)", "rest of the model"):
        finite(out, row + r"\s+" + NUMBER + " ms")


def test_train_throughput_prints_tokens_per_second_and_mfu():
    out = run_bench("train_throughput", "--quick", "--cases", "smoke", "--dtype", "float32")
    assert finite(out, r"smoke: .*?: " + NUMBER + " tok/s median") > 0
    assert finite(out, r"MFU " + NUMBER + "% median") > 0


@pytest.mark.slow
def test_profile_ops_prints_each_family():
    out = run_bench("profile_ops", "--cases", "smoke", "--rounds", "1", timeout=300)
    for row in ("FULL train step", "FULL fwd\\+bwd",
                "qk_attention \\(qk-norm, rope, gain, attn\\)", "head: tied logits\\+softcap\\+CE", "data feed"):
        finite(out, row + r".*? " + NUMBER + "%")
    assert finite(out, r"HLO cost analysis of the compiled step = " + NUMBER + " G") > 0


def test_step_parts_times_both_halves_of_the_jax_step():
    out = run_bench("step_parts", "--cases", "smoke", "--reps", "1", "--impls", "jax")
    for half in ("forward\\+backward", "optimizer"):
        assert finite(out, r"jax .*?" + half + " " + NUMBER + " / ") >= 0


@pytest.mark.slow
def test_jax_vs_torch_prints_tokens_per_second_and_the_ratio():
    pytest.importorskip("torch", reason="the PyTorch baseline needs the optional extra: pip install -e .[torch]")
    out = run_bench("jax_vs_torch", "--cases", "smoke", "--reps", "1", "--steps", "1", "--no-compile")
    for impl in ("jax", "torch-eager"):
        assert finite(out, impl + r"\s+" + NUMBER + " tokens/s") > 0
    assert finite(out, r"ratio JAX / best PyTorch \(torch-eager\): " + NUMBER + "x") > 0


def test_ngram_build_reports_throughput():
    out = run_bench("ngram_build", "--tokens", "20000", "--log2-size", "12", "--max-order", "4", "--chunk", "4096")
    result = json.loads(out.strip().splitlines()[-1])
    assert result and all(math.isfinite(v) for v in result.values() if isinstance(v, (int, float))), result


def test_data_checks_times_the_start_up_checks(shared_data, tmp_path):
    from tests.conftest import SP_MODEL_NAME

    out = run_bench("data_checks", "--dir", str(tmp_path / "shards"), "--tokenizer", str(shared_data / SP_MODEL_NAME),
                    "--train-shards", "1", "--train-tokens", "20000", "--val-tokens", "5000")
    assert out.strip(), out
