"""Config files, `--set` overrides (types, unknown keys), checks in __post_init__, JSON round trip, hashes."""

import re

import pytest

from helpers import REPO
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
    # the recipe's switches
    ("model.ve_layers=2", "expected a tuple of int, got int"),
    ("model.ve_layers=(1.0,)", "model.ve_layers[0]=1.0: expected int, got float"),
    ("model.ve_layers=(1,1)", "distinct layer indices in [0, 9)"),
    ("model.ve_layers=(9,)", "distinct layer indices in [0, 9)"),
    ("model.rope_dims=3", "must be even and in [0, head dim 64]"),
    ("model.rope_dims=66", "must be even"),
    ("model.xsa_last_n=10", "model.xsa_last_n must be in [0, 9], got 10"),
    ("model.bigram_buckets=1", "one bucket is reserved for position 0"),
    ("model.init=xavier", "model.init must be baseline|record"),
    ("model.embed_dtype=fp8", "model.embed_dtype must be compute|bfloat16|float32"),
    ("model.mlp_mult=0.001", "gives no MLP hidden unit"),
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
    (dict(num_layers=0), r"model.num_layers must be in \[1, inf\)"),
    (dict(num_heads=0), r"model.num_heads must be in \[1, inf\)"),  # was a ZeroDivisionError traceback
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
    assert model_hash(other) == model_hash(cfg)  # training settings do not change the model identity
    assert model_hash(apply_overrides(cfg, ["model.num_layers=3"])) != model_hash(cfg)


def test_the_model_hash_covers_every_setting_that_shapes_the_parameters():
    """The n-gram bias parameter is [orders, confidence buckets] (frontier_jax.model.build): its orders and
    buckets change the hash; the n-gram settings that shape no parameter do not, nor does a disabled bias."""
    cfg = load_config(CONFIGS / "tiny.py")
    on = ["ngram.enabled=True", "ngram.table_log2_size=4", "ngram.min_order=2", "ngram.max_order=4"]
    bias = apply_overrides(cfg, on)
    hashes = {model_hash(cfg), model_hash(bias), model_hash(apply_overrides(cfg, on + ["ngram.max_order=5"])),
              model_hash(apply_overrides(cfg, on + ["ngram.min_order=3"])),
              model_hash(apply_overrides(cfg, on + ["ngram.confidence_buckets=4"]))}
    assert len(hashes) == 5
    assert model_hash(apply_overrides(cfg, on + ["ngram.table_log2_size=5", "ngram.strict=True"])) == model_hash(bias)
    assert model_hash(apply_overrides(cfg, ["ngram.max_order=5"])) == model_hash(cfg)  # off: no bias parameter


def test_missing_config_file_and_missing_get_config(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.py")
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no get_config"):
        load_config(bad)


@pytest.mark.parametrize("source, fragment", [
    ("def get_config(:\n", r"bad.py:1: syntax error"),
    ("import no_such_module_xyz\n", r"bad.py:1: loading failed: ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("def get_config():\n    return 1 / 0\n", r"bad.py:2: get_config\(\) failed: ZeroDivisionError: division by zero"),
    ("from frontier_jax.config import *\ndef get_config():\n    return Config(model=ModelConfig(num_heads=3))\n",
     r"bad.py: model.model_dim=512 is not divisible"),
])
def test_a_broken_config_file_is_one_line_naming_the_file_and_exit_2(tmp_path, capsys, source, fragment):
    """#7: syntax error, import error, a get_config() that raises -> ConfigError -> one stderr line, exit 2."""
    from frontier_jax.errors import EXIT_BAD_INPUT, exit_on_error

    bad = tmp_path / "bad.py"
    bad.write_text(source)
    with pytest.raises(ConfigError, match=fragment):
        load_config(bad)
    with pytest.raises(SystemExit) as e, exit_on_error():
        load_config(bad)
    err = capsys.readouterr().err
    assert e.value.code == EXIT_BAD_INPUT and err.count("\n") == 1 and str(bad) in err


@pytest.mark.parametrize("item, fragment", [
    ("train.val_batch_seqs=0", "train.val_batch_seqs must be positive"),
    ("ngram.table_log2_size=40", r"ngram.table_log2_size must be in \[1, 30\], got 40"),
    ("ngram.table_log2_size=0", r"must be in \[1, 30\]"),
    ("ngram.max_table_bytes=1000", "over ngram.max_table_bytes=1000"),
])
def test_settings_that_failed_late_are_refused_at_config_validation(item, fragment):
    """#11: refused when the config is built, not after the run has compiled and trained."""
    with pytest.raises(ConfigError, match=fragment):
        apply_overrides(Config(), ["ngram.enabled=True", item])


@pytest.mark.parametrize("raw", ["inf", "Infinity", repr(float("inf"))])
def test_an_infinite_budget_is_accepted(raw):
    """#12: `--budget inf` becomes `--set train.budget_seconds=inf`; repr(inf) is not a Python literal."""
    cfg = apply_overrides(Config(), [f"train.budget_seconds={raw}"])
    assert cfg.train.budget_seconds == float("inf")
    assert from_dict(to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match="expected int"):
        apply_overrides(Config(), ["train.max_steps=inf"])


@pytest.mark.parametrize("text, fragment", [
    ('{"model": {"num_layers": 4', "unreadable run config (not JSON"),
    ("\xff\xfe", "unreadable run config"),
    ('[1, 2]', "bad run config (config: expected an object, got list)"),
    ('{"model": 5}', "bad run config (model.: expected an object, got int)"),
    ('{"model": {"num_layers": "four"}}', "bad run config (model.num_layers='four': expected int, got str)"),
    ('{"model": {"num_heads": 3}}', "bad run config (model.model_dim=512 is not divisible"),
])
def test_a_corrupt_run_config_is_a_config_error_naming_the_file(tmp_path, text, fragment):
    """#11: `--resume`/evaluate of a run whose config.json is corrupt: one line naming the file."""
    from frontier_jax.config import load_run_config

    path = tmp_path / "config.json"
    path.write_text(text, encoding="latin-1")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {fragment}")):
        load_run_config(path)


def test_frontier14_keeps_every_baseline_field_it_does_not_name(monkeypatch):
    """A field set in baseline.py is never dropped: frontier14 replaces only its own fields."""
    import dataclasses

    import configs.baseline as base_mod
    import configs.frontier14 as f14_mod
    from frontier_jax.config import NgramConfig, OptimConfig, TrainConfig

    real = base_mod.get_config()
    marked = dataclasses.replace(real, model=dataclasses.replace(real.model, rope_base=500.0, num_layers=3),
                                 ngram=dataclasses.replace(real.ngram, max_order=7))
    monkeypatch.setattr(f14_mod, "_baseline", lambda: marked)
    f14 = f14_mod.get_config()
    assert f14.model == dataclasses.replace(marked.model, num_layers=14)
    assert f14.ngram == dataclasses.replace(marked.ngram, enabled=True) and f14.ngram.num_orders == 6
    assert f14.optim == dataclasses.replace(OptimConfig(), fused=True) and f14.train == TrainConfig(budget_seconds=1800.0)
    assert NgramConfig(min_order=3, max_order=5).num_orders == 3


def test_every_config_field_has_a_comment():
    """Each dataclass field line in config.py carries a comment, or follows a comment block."""
    import dataclasses

    from frontier_jax import config as C

    lines = (REPO / "frontier_jax" / "config.py").read_text().splitlines()
    for cls in (C.ModelConfig, C.OptimConfig, C.DataConfig, C.TrainConfig, C.NgramConfig, C.ParallelConfig, C.EvalConfig,
                C.Config):
        for f in dataclasses.fields(cls):
            i = next(i for i, line in enumerate(lines) if line.startswith(f"    {f.name}: ") and
                     any(lines[j].startswith(f"class {cls.__name__}") for j in range(max(0, i - 60), i)))
            assert "#" in lines[i] or lines[i - 1].strip().startswith("#"), f"{cls.__name__}.{f.name} has no comment"


def test_table_row_bytes_match_the_table_format():
    from frontier_jax.config import TABLE_ROW_BYTES
    from frontier_jax.ngram.hashing import ROW_WORDS

    assert TABLE_ROW_BYTES == ROW_WORDS * 4


@pytest.mark.parametrize("item, fragment", [
    ("train.val_max_tokens=10", "train.val_max_tokens=10 scores no whole window"),
    ("train.val_max_tokens=-1", "train.val_max_tokens=-1 scores no whole window"),
    ("train.val_every_steps=-2", "train.val_every_steps must be >= 0"),
    ("train.checkpoint_every_steps=-1", "train.checkpoint_every_steps must be >= 0"),
    ("train.seed=-1", r"train.seed must be in \[0, 2\*\*32 - 1\]"),
    ("train.seed=4294967296", r"train.seed must be in \[0, 2\*\*32 - 1\]"),
    ("train.seed=99999999999999999999", r"train.seed must be in"),
])
def test_settings_that_scored_zero_tokens_or_aliased_are_refused(item, fragment):
    """Round 3, causes 7 and 9: a periodic validation shorter than one window (it logged `bpb 0.0000`),
    negative cadences, seeds outside JAX's 32-bit key (aliasing) or int64 (a traceback): refused at build."""
    with pytest.raises(ConfigError, match=fragment):
        apply_overrides(Config(), [item])
    assert apply_overrides(Config(), ["train.val_max_tokens=1024"]).train.val_max_tokens == 1024


def test_ngram_settings_that_failed_late_are_refused_at_build(monkeypatch):
    """Round 3, cause 9: several builder processes (not implemented), tables over the host's memory."""
    import frontier_jax.config as C

    with pytest.raises(ConfigError, match="only 1 builder process"):
        apply_overrides(Config(), ["ngram.enabled=True", "ngram.builder_processes=2"])
    monkeypatch.setattr(C, "host_memory_bytes", lambda: 64 << 20)
    with pytest.raises(ConfigError, match="over half of this host's"):
        apply_overrides(Config(), ["ngram.enabled=True", "ngram.table_log2_size=20"])


def test_override_checks_do_not_depend_on_the_order_of_the_flags():
    """Round 3: `--set` validation of n-gram sizes saw an intermediate combination (order-dependent)."""
    a = ["ngram.enabled=True", "ngram.table_log2_size=24", "ngram.max_table_bytes=8589934592"]
    b = [a[0], a[2], a[1]]
    assert apply_overrides(Config(), a) == apply_overrides(Config(), b)
    c = ["ngram.enabled=True", "ngram.min_order=18", "ngram.max_order=20"]
    assert apply_overrides(Config(), c) == apply_overrides(Config(), [c[0], c[2], c[1]])
    with pytest.raises(ConfigError, match="--set ngram.enabled, ngram.table_log2_size: ngram tables need"):
        apply_overrides(Config(), ["ngram.enabled=True", "ngram.table_log2_size=28"])


def test_unknown_keys_in_a_run_config_are_refused_not_dropped(tmp_path):
    """Round 3: a resumed config.json with a key this version does not know was dropped silently."""
    from frontier_jax.config import load_run_config

    d = to_dict(Config())
    d["train"]["val_evry_steps"] = 5
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(d))
    with pytest.raises(ConfigError, match=re.escape(f"{path}: bad run config (train.val_evry_steps: unknown key")):
        load_run_config(path)


@pytest.mark.parametrize("item, fragment", [
    ("optim.beta2=1.5", r"optim.beta2 must be in \[0, 1\), got 1.5"),
    ("optim.warmdown_steps=-5", r"optim.warmdown_steps must be in \[0, inf\), got -5"),
    ("optim.adam_eps=0", r"optim.adam_eps must be in \(0, inf\)"),
    ("optim.matrix_lr=-0.1", "optim.matrix_lr must be in"),
    ("optim.muon_momentum=1.0", "optim.muon_momentum must be in"),
    ("optim.muon_ns_steps=0", "optim.muon_ns_steps must be in"),
    ("model.rope_base=0", "model.rope_base must be in"),
    ("model.logit_softcap=-30", "model.logit_softcap must be in"),
    ("model.vocab_size=70000", r"model.vocab_size must be in \[1, 65536\]"),
    ("model.bigram_dim=0", r"model.bigram_dim must be in \[1, inf\), got 0"),
    ("model.ve_dim=-1", r"model.ve_dim must be in \[1, inf\), got -1"),
    ("model.rope_dims=-2", r"model.rope_dims must be in \[0, inf\)"),
    ("model.rope_rescale_from=-1", "model.rope_rescale_from must be in"),
    ("model.bigram_buckets=-3", "model.bigram_buckets must be in"),
    ("model.mlp_mult=-2.0", r"model.mlp_mult must be in \(0, inf\)"),
    ("train.log_every_seconds=0", "train.log_every_seconds must be in"),
    ("train.budget_seconds=nan", "expected float"),  # a bare word; a NaN from a config file is refused below
    ("parallel.heartbeat_timeout_seconds=0", "parallel.heartbeat_timeout_seconds must be in"),
    ("data.val_pattern=''", "data.val_pattern must be a non-empty glob pattern"),
])
def test_every_numeric_setting_is_range_checked_in_one_line(item, fragment):
    """The probe accepted `optim.beta2=1.5` and `optim.warmdown_steps=-5` (and trained on them)."""
    with pytest.raises(ConfigError, match=fragment) as e:
        apply_overrides(Config(), [item])
    assert "\n" not in str(e.value)


def test_a_config_file_with_a_missing_section_or_a_nan_is_refused_naming_the_file(tmp_path):
    """A config returning `model=None` failed much later with a traceback; a NaN budget from a config file
    passed `budget_seconds <= 0`."""
    for body, fragment in (("Config(model=None)", "config section model is NoneType, expected ModelConfig"),
                           ("Config(train=TrainConfig(budget_seconds=float('nan')))", "budget_seconds must be > 0"),
                           ("Config(name='../elsewhere')", "must be a file name"),
                           ("Config(model=ModelConfig(mlp_negative_slope=float('inf')))",
                            r"model.mlp_negative_slope must be in \(-inf, inf\), got inf")):
        path = tmp_path / "c.py"
        path.write_text(f"from frontier_jax.config import *\n\ndef get_config():\n    return {body}\n")
        with pytest.raises(ConfigError, match=fragment) as e:
            load_config(path)
        assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- the recipe's switches


def test_ve_layers_is_a_typed_tuple_of_ints_through_set_and_json():
    cfg = apply_overrides(Config(), ["model.ve_layers=(2,3)", "model.mlp_mult=2.9"])
    assert cfg.model.ve_layers == (2, 3) and cfg.model.mlp_hidden == 1484
    assert apply_overrides(Config(), ["model.ve_layers=[7]"]).model.ve_layers == (7,)
    assert apply_overrides(cfg, ["model.ve_layers=()"]).model.ve_layers == ()
    assert from_dict(to_dict(cfg)) == cfg  # JSON turns the tuple into a list; the field is a tuple again
    assert isinstance(from_dict(to_dict(cfg)).model.ve_layers, tuple)


def test_rescaling_rope_needs_more_than_two_rotated_dims_and_bigram_ids_must_not_overflow_int32():
    with pytest.raises(ConfigError, match="more than 2 rotated dims"):
        ModelConfig(rope_dims=2, rope_rescale_from=1024)
    with pytest.raises(ConfigError, match="overflow from id 59138"):
        ModelConfig(vocab_size=60_000, bigram_buckets=16)
    assert ModelConfig(vocab_size=60_000).bigram_buckets == 0  # off: no hash, no limit


def test_the_baselines_model_hash_and_switches_do_not_move_and_the_recipes_parameters_enter_the_hash():
    base = Config()
    assert model_hash(base) == "7f9b7a36c47a" and base.model.recipe_switches() == []  # the hash before the recipe
    assert base.model.mlp_mult == 2.0 and base.model.mlp_hidden == 1024
    recipe = load_config(CONFIGS / "record11.py")
    hashes = {model_hash(apply_overrides(recipe, [s])) for s in (
        "model.bigram_dim=64", "model.ve_dim=64", "model.ve_layers=(9,)", "model.embed_dtype=float32",
        "model.smear_gate=False", "model.bigram_buckets=0")}
    assert len(hashes | {model_hash(recipe)}) == 7
    assert model_hash(apply_overrides(recipe, ["model.xsa_last_n=2", "model.ln_scale=False"])) == model_hash(recipe)


def test_the_record_configs_are_the_records_run_command_and_its_tiny_shape():
    r = load_config(CONFIGS / "record11.py")
    m, o, t = r.model, r.optim, r.train
    assert (m.num_layers, m.model_dim, m.num_heads, m.num_kv_heads, m.mlp_hidden) == (11, 512, 8, 4, 1536)
    assert (m.mlp_negative_slope, m.bigram_buckets, m.bigram_dim, m.xsa_last_n, m.rope_dims) == (0.5, 1536, 128, 4, 16)
    assert (m.rope_rescale_from, m.ln_scale, m.ve_layers, m.ve_dim, m.smear_gate) == (1024, True, (9, 10), 128, True)
    assert (m.init, m.embed_dtype, t.seq_len, t.tokens_per_step, t.seed) == ("record", "bfloat16", 2048, 786_432, 1337)
    assert (o.matrix_lr, o.scalar_lr, o.embed_lr, o.muon_momentum, o.muon_momentum_warmup_start) == (
        0.025, 0.025, 0.035, 0.99, 0.92)
    assert (o.muon_momentum_warmup_steps, o.warmdown_steps, t.budget_seconds, t.max_steps) == (1500, 3500, 600.0, 9000)
    assert (r.eval_seq_len, r.eval.stride, r.eval.artifact, r.eval.score) == (2048, 64, "int6_lzma", "ttt")
    tiny = load_config(CONFIGS / "record11_tiny.py")
    tm = tiny.model
    assert (tm.num_layers, tm.model_dim, tm.num_heads, tm.num_kv_heads, tm.bigram_dim) == (4, 128, 4, 2, 64)
    assert (tm.ve_layers, tm.xsa_layers(), tiny.train.seq_len) == ((2, 3), range(2, 4), 256)
    for field in ("mlp_negative_slope", "rope_dims", "rope_rescale_from", "ln_scale", "smear_gate", "bigram_buckets",
                  "ve_dim", "init", "embed_dtype", "mlp_mult"):
        assert getattr(tm, field) == getattr(m, field), field


def test_an_infinite_budget_survives_the_run_directorys_strict_json(tmp_path):
    """`--budget inf` (or a pg-record import of MAX_WALLCLOCK_SECONDS=0) wrote budget_seconds as null into
    config.json, which a resume or `evaluate` then refused."""
    from frontier_jax.config import load_run_config
    from frontier_jax.run import rundir

    cfg = apply_overrides(Config(), ["train.budget_seconds=inf"])
    rundir.write_json(tmp_path / "config.json", to_dict(cfg))
    assert '"budget_seconds": "inf"' in (tmp_path / "config.json").read_text()
    assert load_run_config(tmp_path / "config.json") == cfg and config_hash(from_dict(to_dict(cfg))) == config_hash(cfg)


def test_frontier_is_the_record_recipe_on_the_trainium_entrys_system():
    """configs/frontier.py: record11's model switches at 14 layers (value embeddings on the last two), the order-16
    n-gram bias and the fused optimizers on, the record's optimizer with its step-counted schedule scaled to the
    trn1 step estimate, 1800 s with the auto micro-batch, its artifact and sliding windows as the score, the
    record's TTT section kept but off (the Trainium contest states no rule on it)."""
    import dataclasses

    rec, front = load_config(CONFIGS / "record11.py"), load_config(CONFIGS / "frontier.py")
    assert front.name == "frontier" and front.rules.profile == "trainium-frontier"
    assert front.model == dataclasses.replace(rec.model, num_layers=14, ve_layers=(12, 13))
    assert front.ngram.enabled and (front.ngram.min_order, front.ngram.max_order) == (2, 16)
    assert front.optim == dataclasses.replace(rec.optim, fused=True, warmdown_steps=280, muon_momentum_warmup_steps=120)
    assert (front.train.budget_seconds, front.train.micro_batch_seqs) == (1800.0, 0)
    assert (front.train.seq_len, front.train.tokens_per_step) == (rec.train.seq_len, rec.train.tokens_per_step)
    assert front.eval == dataclasses.replace(rec.eval, score="sliding") and front.eval.artifact == "int6_lzma"
    assert front.ttt == dataclasses.replace(rec.ttt, enabled=False)
