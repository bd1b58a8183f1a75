"""The run's size before anything is built (frontier_jax.policies.sizing): the parameter count from the config is
the built model's, and a model that cannot fit the host's memory is refused in one line before any allocation,
by both trainers."""

from __future__ import annotations

import time

import pytest
from flax import nnx

from helpers import REPO, TINY_OVERRIDES, tiny_config
from frontier_jax.config import ConfigError, load_config
from frontier_jax.model import build, count_params
from frontier_jax.policies import sizing


@pytest.mark.parametrize("extra", [(), ("model.num_layers=3", "model.mlp_mult=3"),
                                   ("ngram.enabled=True", "ngram.table_log2_size=10")])
def test_the_parameter_count_is_the_built_models(tmp_path, extra):
    cfg = tiny_config(tmp_path, *extra)
    assert sizing.num_params(cfg) == count_params(nnx.eval_shape(lambda: build(cfg, "float32")))


@pytest.mark.parametrize("name, count", [("record11.py", 26_928_220), ("record11_tiny.py", 969_108)])
def test_the_recipes_parameter_count_is_the_built_models_and_the_records(name, count):
    """BigramHash, SmearGate, the value embeddings and their per-layer scales, the MLP's float multiple: record11's
    count is the record's log's `model_params:26928220`."""
    cfg = load_config(REPO / "configs" / name)
    assert sizing.num_params(cfg) == count_params(nnx.eval_shape(lambda: build(cfg, "float32"))) == count


def test_a_model_over_the_hosts_memory_is_refused_in_one_line(tmp_path):
    cfg = tiny_config(tmp_path, "model.num_layers=1000000")
    with pytest.raises(ConfigError) as e:
        sizing.check_host_memory(cfg, available=64 << 30)
    msg = str(e.value)
    assert "\n" not in msg and "model.num_layers=1000000" in msg and "64.0 GiB this host has available" in msg
    small = tiny_config(tmp_path)
    need = sizing.check_host_memory(small, available=64 << 30)
    assert need == 16 * sizing.num_params(small) + 8 * small.train.tokens_per_step
    assert sizing.available_memory_bytes() > 0


@pytest.mark.parametrize("setting", ["model.num_layers=1000000", "train.tokens_per_step=1000000000000000000"])
@pytest.mark.parametrize("trainer", ["jax", "torch"])
def test_both_trainers_refuse_a_run_that_cannot_fit_before_allocating(byte_data, tmp_path, capsys, trainer, setting):
    """`--set model.num_layers=1000000` spent 13 minutes in set-up, deaf to SIGTERM, and
    `train.tokens_per_step=1e18` ended in a traceback: now one line, exit 2, at once, and no run directory."""
    if trainer == "torch":
        pytest.importorskip("torch", reason="the PyTorch baseline needs the optional extra: pip install -e .[torch]")
        from baseline_torch.train import main
    else:
        from frontier_jax.train import main
    out = tmp_path / "run"
    sets = [a for o in (*TINY_OVERRIDES, setting) for a in ("--set", o)]
    t0 = time.perf_counter()
    try:
        rc = main(["--config", str(REPO / "configs" / "tiny.py"), "--data", str(byte_data), "--tokenizer", "bytes",
                   "--out", str(out), *sets])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and setting.split("=")[0] in err and "available" in err, err
    assert time.perf_counter() - t0 < 30 and not out.exists()
