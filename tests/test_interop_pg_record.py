"""The parameter-golf record's formats (frontier_jax.interop.pg_record) and `interop export/import --format
pg-record`: the record's key order, shapes and dtypes, banked and unbanked, banking as an identity, record.env to
and from our config, refusals, and the round trip through a run directory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from helpers import REPO, exit_code
from frontier_jax.config import apply_overrides, load_config
from frontier_jax.interop import pg_record, torch_format
from frontier_jax.interop.pg_record import RecordFormatError
from frontier_jax.interop.state_dict import main, params_to_state_dict, record_state_dict, restore_params
from frontier_jax.model import GPT

BF16 = np.dtype(ml_dtypes.bfloat16)
TINY = load_config(REPO / "configs" / "record11_tiny.py")
# record11_tiny at test size (still every branch: bigram and VE projections, XSA, partial RoPE, 2 VE layers)
SMALL = apply_overrides(TINY, ["model.vocab_size=64", "model.num_layers=2", "model.model_dim=64",
                               "model.num_heads=2", "model.num_kv_heads=1", "model.bigram_buckets=24",
                               "model.bigram_dim=16", "model.ve_dim=16", "model.ve_layers=(0,1)",
                               "model.xsa_last_n=1", "train.seq_len=32", "train.tokens_per_step=64",
                               "eval.stride=16"])


def _record_names_tiny():
    """SPEC 4's table for tiny.env, written out."""
    names = ["skip_weights", "qo_bank", "kv_bank", "mlp_up_bank", "mlp_down_bank", "tok_emb.weight", "bigram.scale",
             "bigram.embed.weight", "bigram.proj.weight", "smear.gate"]
    names += [f"blocks.{i}.{n}" for i in range(4) for n in ("attn_scale", "mlp_scale", "resid_mix", "attn.q_gain")]
    return names + ["ve_shared.scale", "ve_shared.embed.weight", "ve_shared.proj.weight", "ve_layer_scales.0",
                    "ve_layer_scales.1"]


def test_the_banked_state_dict_is_the_records_at_tiny_and_at_the_run_commands_shape():
    shapes = pg_record.banked_shapes(TINY.model)
    assert list(shapes) == _record_names_tiny() and len(shapes) == 31
    assert shapes["qo_bank"] == ((8, 128, 128), np.float32) and shapes["kv_bank"] == ((8, 64, 128), np.float32)
    assert shapes["mlp_up_bank"][0] == (4, 384, 128) and shapes["mlp_down_bank"][0] == (4, 128, 384)
    assert shapes["bigram.proj.weight"][0] == (128, 64) and shapes["ve_shared.proj.weight"][0] == (64, 128)
    assert shapes["bigram.scale"][0] == () and shapes["ve_layer_scales.1"][0] == (1,)
    assert {k for k, (_, d) in shapes.items() if d == BF16} == set(pg_record.BF16_KEYS)
    assert sum(int(np.prod(s)) for s, _ in shapes.values()) == 969_108
    big = pg_record.banked_shapes(load_config(REPO / "configs" / "record11.py").model)
    assert len(big) == 59 and sum(int(np.prod(s)) for s, _ in big.values()) == 26_928_220  # the record's log


def test_the_unbanked_order_is_the_records_unbank_order():
    names = pg_record.unbanked_names(TINY.model)
    L = 4
    want = ["skip_weights"]
    want += [f"blocks.{i}.attn.{n}.weight" for i in range(L) for n in ("c_q", "proj")]
    want += [f"blocks.{i}.attn.{n}.weight" for i in range(L) for n in ("c_k", "c_v")]
    want += [f"blocks.{i}.mlp.fc.weight" for i in range(L)] + [f"blocks.{i}.mlp.proj.weight" for i in range(L)]
    assert names == want + _record_names_tiny()[5:]


@pytest.fixture(scope="module")
def small_params():
    """SMALL's parameters, every value distinctive (tables bf16 values, as the record's dtypes hold them)."""
    _, p = nnx.split(nnx.eval_shape(lambda: GPT(SMALL.model, rngs=nnx.Rngs(0), compute_dtype="float32")))
    rng = np.random.default_rng(1)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(x.shape, np.float32), x.dtype), p)


def test_banking_places_each_layers_matrices_as_the_record_and_unbanking_is_its_inverse(small_params):
    unbanked = pg_record.unbanked_state_dict(params_to_state_dict(small_params), SMALL.model)
    assert list(unbanked) == pg_record.unbanked_names(SMALL.model)
    banked = pg_record.bank(unbanked, SMALL.model)
    assert list(banked) == pg_record.banked_names(SMALL.model)
    assert {k: (v.shape, v.dtype) for k, v in banked.items()} == pg_record.banked_shapes(SMALL.model)
    p = small_params["blocks"]
    L = 2
    for i in range(L):  # [out, in]: the transposes of ours, Q at i and Out at L + i, K at i and V at L + i
        np.testing.assert_array_equal(banked["qo_bank"][i], np.asarray(p[i]["attn"]["c_q"][...]).T)
        np.testing.assert_array_equal(banked["qo_bank"][L + i], np.asarray(p[i]["attn"]["proj"][...]).T)
        np.testing.assert_array_equal(banked["kv_bank"][i], np.asarray(p[i]["attn"]["c_k"][...]).T)
        np.testing.assert_array_equal(banked["kv_bank"][L + i], np.asarray(p[i]["attn"]["c_v"][...]).T)
        np.testing.assert_array_equal(banked["mlp_up_bank"][i], np.asarray(p[i]["mlp"]["fc"][...]).T)
        np.testing.assert_array_equal(banked["mlp_down_bank"][i], np.asarray(p[i]["mlp"]["proj"][...]).T)
    np.testing.assert_array_equal(banked["bigram.proj.weight"], np.asarray(small_params["bigram"]["proj"][...]).T)
    back = pg_record.unbank(banked, SMALL.model)
    assert list(back) == list(unbanked)
    for k in unbanked:
        assert back[k].dtype == unbanked[k].dtype and np.array_equal(back[k], unbanked[k]), k


def test_a_table_bf16_does_not_hold_is_refused_not_rounded(small_params):
    sd = params_to_state_dict(small_params)
    sd["tok_emb.weight"] = sd["tok_emb.weight"].astype(np.float32) + np.float32(1e-4)
    with pytest.raises(RecordFormatError, match="tok_emb.weight holds float32 values that bfloat16 does not hold"):
        pg_record.unbanked_state_dict(sd, SMALL.model, source="run")
    with pytest.raises(RecordFormatError, match="missing key 'smear.gate'"):
        pg_record.unbanked_state_dict({k: v for k, v in params_to_state_dict(small_params).items()
                                       if k != "smear.gate"}, SMALL.model)


def test_record_env_round_trips_to_the_same_model_and_is_the_records_environment():
    for cfg in (TINY, load_config(REPO / "configs" / "record11.py"), SMALL):
        env = pg_record.record_env(cfg)
        assert set(env) <= set(pg_record.RECORD_ENV_DEFAULTS)  # variables the record's script reads
        back, ignored = pg_record.config_from_env(env)
        assert back.model == cfg.model and back.train.seq_len == cfg.train.seq_len and back.eval == cfg.eval
        assert ignored == []
    env = pg_record.record_env(TINY)
    assert (env["VE_LAYERS"], env["ROPE_DIMS"], env["XSA_LAST_N"], env["MLP_MULT"], env["LN_SCALE"]) == (
        "2,3", "16", "2", "3.0", "1")
    assert pg_record.format_env({"A": "1", "B": "x"}) == "A=1\nB=x\n"


def test_the_run_commands_environment_builds_configs_record11():
    """record11.env (the README's run command less the variables the script never reads) through
    config_from_env: configs/record11.py's model, optimizer and schedule."""
    env = {"NUM_LAYERS": "11", "BIGRAM_VOCAB_SIZE": "1536", "XSA_LAST_N": "4", "SWA_ENABLED": "1", "SWA_EVERY": "50",
           "ROPE_DIMS": "16", "LN_SCALE": "1", "LATE_QAT_THRESHOLD": "0.15", "VE_ENABLED": "1", "VE_DIM": "128",
           "VE_LAYERS": "9,10", "TTT_ENABLED": "1", "TTT_LR": "0.002", "TTT_EPOCHS": "3", "TTT_CHUNK_TOKENS": "32768",
           "TTT_FREEZE_BLOCKS": "0", "TTT_MOMENTUM": "0.9", "TTT_BATCH_SEQS": "32", "TTT_GRAD_CLIP": "1.0",
           "MUON_WD": "0.04", "ADAM_WD": "0.04", "MATRIX_LR": "0.025", "SCALAR_LR": "0.025", "TIED_EMBED_LR": "0.035",
           "MUON_MOMENTUM": "0.99", "MUON_MOMENTUM_WARMUP_START": "0.92", "MUON_MOMENTUM_WARMUP_STEPS": "1500",
           "WARMDOWN_ITERS": "3500", "ITERATIONS": "9000", "MAX_WALLCLOCK_SECONDS": "600", "EVAL_STRIDE": "64",
           "SEED": "1337"}
    cfg, ignored = pg_record.config_from_env(env)
    want = load_config(REPO / "configs" / "record11.py")
    assert cfg.model == want.model and cfg.optim == want.optim and cfg.eval == want.eval and cfg.ttt == want.ttt
    for field in ("seq_len", "tokens_per_step", "budget_seconds", "max_steps", "seed", "compile_warmup_steps",
                  "val_every_steps", "log_every_steps"):
        assert getattr(cfg.train, field) == getattr(want.train, field), field
    assert not {"TTT_ENABLED", "NUM_LAYERS", "MUON_WD"} & set(ignored)
    # the training variables back from the config: the same optimizer and schedule
    again, _ = pg_record.config_from_env({**pg_record.record_env(want), **pg_record.record_training_env(want)})
    assert again.optim == want.optim and again.train.max_steps == want.train.max_steps
    qat_from_start = pg_record.config_from_env({**env, "QAT_ENABLED": "1"})[0]
    assert qat_from_start.optim.late_qat_threshold == float("inf")
    with pytest.raises(pg_record.RecordFormatError, match="optim.ema_decay=0.0: the record's script cannot express"):
        pg_record.record_training_env(apply_overrides(want, ["optim.ema_decay=0.0"]))


def test_the_ttt_variables_round_trip_and_a_block_freeze_is_refused():
    """TTT_* to the ttt section and back; the record's TTT_FREEZE_BLOCKS (its blocks' control tensors only, its
    matrices being banks) is not ttt.freeze_blocks (whole blocks): refused both ways with TTT on, dropped with it off
    (the script's default TTT_FREEZE_BLOCKS=2 with TTT_ENABLED=0)."""
    env = pg_record.record_env(TINY)
    assert {k: env[k] for k in env if k.startswith("TTT_")} == {
        "TTT_ENABLED": "1", "TTT_LR": "0.002", "TTT_EPOCHS": "3", "TTT_CHUNK_TOKENS": "4096", "TTT_FREEZE_BLOCKS": "0",
        "TTT_MOMENTUM": "0.9", "TTT_BATCH_SEQS": "32", "TTT_GRAD_CLIP": "1.0"}
    assert pg_record.config_from_env(env)[0].ttt == TINY.ttt
    off, _ = pg_record.config_from_env({})
    assert not off.ttt.enabled and off.ttt.freeze_blocks == 0 and off.eval.score == "sliding"
    with pytest.raises(RecordFormatError, match="TTT_FREEZE_BLOCKS=2: the record freezes only"):
        pg_record.config_from_env({"TTT_ENABLED": "1", "TTT_FREEZE_BLOCKS": "2"})
    with pytest.raises(RecordFormatError, match="ttt.freeze_blocks=1: the record's TTT_FREEZE_BLOCKS"):
        pg_record.record_env(apply_overrides(TINY, ["ttt.freeze_blocks=1"]))


@pytest.mark.parametrize("sets, fragment", [
    (["model.smear_gate=False"], "model.smear_gate=False: the record's script cannot express it"),
    (["model.mlp_negative_slope=0.0"], "model.mlp_negative_slope=0.0"),
    (["model.rope_rescale_from=2048"], "model.rope_rescale_from=2048"),
    (["ngram.enabled=True", "ngram.table_log2_size=4"], "ngram.enabled=True"),
])
def test_a_config_the_records_script_cannot_express_is_refused_naming_the_setting(sets, fragment):
    with pytest.raises(RecordFormatError) as e:
        pg_record.record_env(apply_overrides(TINY, sets))
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, fragment", [
    ("NUM_LAYERS=4\nNOT_A_SETTING=1\n", ":2: NOT_A_SETTING is not a variable the record's script reads"),
    ("NUM_LAYERS 4\n", ":1: expected KEY=VALUE, got 'NUM_LAYERS 4'"),
])
def test_a_bad_record_env_is_one_line_naming_file_and_line(tmp_path, text, fragment):
    (tmp_path / "record.env").write_text(text)
    with pytest.raises(RecordFormatError) as e:
        pg_record.read_env(tmp_path / "record.env")
    assert str(e.value) == f"{tmp_path / 'record.env'}{fragment}"


@pytest.mark.parametrize("env, fragment", [
    ({"TIE_EMBEDDINGS": "0"}, "TIE_EMBEDDINGS=0: a setting of the record's model this model does not have"),
    ({"VALUE_RESIDUAL": "1"}, "VALUE_RESIDUAL=1"),
    ({"VE_LAYERS": "9,11"}, "model.ve_layers=(9, 11)"),
    ({"NUM_LAYERS": "four"}, "unreadable value"),
])
def test_an_environment_our_model_cannot_build_is_refused(env, fragment):
    with pytest.raises(RecordFormatError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        pg_record.config_from_env(env)


def _exit_code(argv) -> int:
    return exit_code(main, argv)


@pytest.fixture(scope="module")
def record_dir(small_params, tmp_path_factory):
    """A directory as the record's pipeline leaves it: final_model.pt (the record's state dict of SMALL's
    parameters) and record.env."""
    d = tmp_path_factory.mktemp("record")
    (d / "final_model.pt").write_bytes(torch_format.dumps(record_state_dict(small_params, SMALL)))
    (d / "record.env").write_text(pg_record.format_env(pg_record.record_env(SMALL)))
    return d


def test_import_then_export_gives_identical_parameters_and_files(record_dir, small_params, tmp_path, capsys):
    assert _exit_code(["import", "--format", "pg-record", str(record_dir), "--out", str(tmp_path / "run")]) == 0
    assert f"imported {len(pg_record.unbanked_names(SMALL.model))} tensors" in capsys.readouterr().out
    cfg, _, params, step, _ = restore_params(tmp_path / "run")
    assert step == 0 and cfg.model == SMALL.model
    flat = lambda t: jax.tree_util.tree_leaves_with_path(t)
    for (path, a), (_, b) in zip(flat(small_params), flat(params)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), path
    assert _exit_code(["export", "--run", str(tmp_path / "run"), "--format", "pg-record", "--out",
                       str(tmp_path / "out")]) == 0
    for name in ("final_model.pt", "record.env"):
        assert (tmp_path / "out" / name).read_bytes() == (record_dir / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["final_model.pt", "record.env"]


def test_the_exported_file_is_what_torch_load_reads_as_the_records_state_dict(record_dir):
    torch = pytest.importorskip("torch")
    sd = torch.load(record_dir / "final_model.pt", map_location="cpu", weights_only=True)
    want = pg_record.banked_shapes(SMALL.model)
    assert list(sd) == list(want)
    to_torch = {np.dtype(np.float32): torch.float32, BF16: torch.bfloat16}
    for k, (shape, dtype) in want.items():
        assert tuple(sd[k].shape) == shape and sd[k].dtype == to_torch[dtype], k
    ours = torch_format.loads((record_dir / "final_model.pt").read_bytes())
    np.testing.assert_array_equal(sd["kv_bank"].numpy(), ours["kv_bank"])
    assert sd["bigram.scale"].ndim == 0 and float(sd["bigram.scale"]) == float(ours["bigram.scale"])


@pytest.mark.parametrize("edit, fragment", [
    (lambda sd: sd.pop("smear.gate"), "missing key 'smear.gate'"),
    (lambda sd: sd.update({"lm_head.weight": np.zeros((64, 64), np.float32)}), "unexpected key 'lm_head.weight'"),
    (lambda sd: sd.update({"tok_emb.weight": sd["tok_emb.weight"].astype(np.float32)}),
     "key 'tok_emb.weight' is [64, 64] float32, the record's model holds [64, 64] bfloat16"),
    (lambda sd: sd.update({"qo_bank": sd["qo_bank"][:3]}), "key 'qo_bank' is [3, 64, 64] float32"),
])
def test_a_state_that_does_not_fit_record_env_is_one_line_exit_2_and_writes_nothing(record_dir, tmp_path, capsys,
                                                                                    edit, fragment):
    sd = torch_format.loads((record_dir / "final_model.pt").read_bytes())
    edit(sd)
    src = tmp_path / "src"
    src.mkdir()
    (src / "final_model.pt").write_bytes(torch_format.dumps(sd))
    (src / "record.env").write_bytes((record_dir / "record.env").read_bytes())
    assert _exit_code(["import", "--format", "pg-record", str(src), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {src / 'final_model.pt'}: ") and fragment in err
    assert not (tmp_path / "run").exists()


def test_exporting_a_run_the_record_cannot_express_is_one_line_exit_2_and_writes_nothing(small_params, tmp_path,
                                                                                         capsys, monkeypatch):
    import frontier_jax.interop.state_dict as interop

    cfg = apply_overrides(SMALL, ["model.smear_gate=False"])
    monkeypatch.setattr(interop, "restore_params", lambda run_dir: (cfg, None, small_params, 3, jnp.float32))
    assert _exit_code(["export", "--run", str(tmp_path), "--format", "pg-record", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.smear_gate=False: the record's script cannot express it" in err
    assert not (tmp_path / "o").exists()


def test_a_failed_pg_record_import_removes_what_it_wrote_and_a_fifo_state_is_refused(record_dir, tmp_path, capsys,
                                                                                      monkeypatch):
    """Both imports write their run directory through one writer, which removes what it wrote on a failure (so the
    retry with the same --out works); the record's files are read only when they are regular files."""
    import os

    from frontier_jax import checkpoint

    def full_disk(*a, **k):
        raise checkpoint.CheckpointError(f"{tmp_path}/run/checkpoints/0: checkpoint not written (disk full (ENOSPC))")

    monkeypatch.setattr(checkpoint, "save", full_disk)
    assert _exit_code(["import", "--format", "pg-record", str(record_dir), "--out", str(tmp_path / "run")]) == 2
    assert "disk full" in capsys.readouterr().err and not (tmp_path / "run").exists()
    src = tmp_path / "src"
    src.mkdir()
    os.mkfifo(src / "final_model.pt")
    (src / "record.env").write_bytes((record_dir / "record.env").read_bytes())
    assert _exit_code(["import", "--format", "pg-record", str(src), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the record's state dict is a FIFO, not a regular file" in err
    assert not (tmp_path / "run").exists()
