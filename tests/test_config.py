"""Config files, `--set` overrides (types, unknown keys), checks in __post_init__, JSON round trip, hashes."""

import pytest

from conftest import REPO
from frontier_jax.config import (Config, ConfigError, ModelConfig, apply_overrides, config_hash, from_dict, load_config,
                                 model_hash, to_dict)

CONFIGS = REPO / "configs"


def test_the_three_configs_load_with_their_documented_shapes():
    base = load_config(CONFIGS / "baseline.py")
    assert (base.model.num_layers, base.model.model_dim, base.model.num_heads, base.model.num_kv_heads) == (9, 512, 8, 4)
    assert (base.train.tokens_per_step, base.train.seq_len, base.train.budget_seconds) == (524_288, 1024, 1800.0)
    assert (base.model.vocab_size, base.model.mlp_mult) == (1024, 2)
    f14 = load_config(CONFIGS / "frontier14.py")
    assert f14.model.num_layers == 14 and f14.model.model_dim == 512 and f14.train == base.train
    tiny = load_config(CONFIGS / "tiny.py")
    assert tiny.name == "tiny" and tiny.model.num_layers < base.model.num_layers
    assert tiny.train.tokens_per_step % tiny.train.seq_len == 0


def test_override_parses_and_keeps_types():
    cfg = apply_overrides(Config(), ["model.num_layers=4", "train.budget_seconds=10", "optim.warmdown_mode=steps",
                                     "data.tokenizer='bytes'", "ngram.enabled=True"])
    assert cfg.model.num_layers == 4
    assert cfg.train.budget_seconds == 10.0 and isinstance(cfg.train.budget_seconds, float)  # int widened to float
    assert cfg.optim.warmdown_mode == "steps" and cfg.data.tokenizer == "bytes" and cfg.ngram.enabled is True
    assert Config().model.num_layers == 9  # frozen original untouched


@pytest.mark.parametrize("item, fragment", [
    ("model.num_layers=4.5", "expected int"),
    ("model.num_layers=abc", "expected int"),
    ("model.num_layers=True", "got bool"),
    ("train.budget_seconds='long'", "expected float"),
    ("ngram.enabled=1", "expected bool"),
    ("model.nope=1", "unknown key"),
    ("nosection.x=1", "unknown key"),
    ("model=1", "is a section"),
    ("model.num_layers", "expected key=value"),
])
def test_bad_overrides_are_one_line_config_errors(item, fragment):
    with pytest.raises(ConfigError) as e:
        apply_overrides(Config(), [item])
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg and item.split("=")[0] in msg


@pytest.mark.parametrize("item", ["train.budget_seconds=0", "train.budget_seconds=-5"])
def test_non_positive_budget_is_rejected(item):
    with pytest.raises(ConfigError, match="budget_seconds must be > 0"):
        apply_overrides(Config(), [item])


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(model_dim=100, num_heads=8), "not divisible"),
    (dict(num_heads=8, num_kv_heads=3), "not a multiple"),
    (dict(model_dim=24, num_heads=8, num_kv_heads=4), "even"),
    (dict(num_layers=0), "positive"),
])
def test_impossible_model_shapes_are_rejected(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        ModelConfig(**kwargs)


def test_impossible_split_via_override_names_the_key():
    with pytest.raises(ConfigError, match="--set model.num_kv_heads"):
        apply_overrides(Config(), ["model.num_kv_heads=3"])


def test_tokens_per_step_must_be_whole_sequences():
    with pytest.raises(ConfigError, match="multiple of train.seq_len"):
        apply_overrides(Config(), ["train.tokens_per_step=1000"])


def test_json_round_trip_and_hashes():
    cfg = load_config(CONFIGS / "tiny.py")
    assert from_dict(to_dict(cfg)) == cfg
    assert config_hash(from_dict(to_dict(cfg))) == config_hash(cfg)
    other = apply_overrides(cfg, ["train.seed=1"])
    assert config_hash(other) != config_hash(cfg)
    assert model_hash(other.model) == model_hash(cfg.model)  # training settings do not change the model identity
    assert model_hash(apply_overrides(cfg, ["model.num_layers=3"]).model) != model_hash(cfg.model)


def test_missing_config_file_and_missing_get_config(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.py")
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no get_config"):
        load_config(bad)
