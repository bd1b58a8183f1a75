"""Interop with the PyTorch baseline's state_dict layout: names, shapes, identity round trip, errors, CLI."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import REPO, TINY_OVERRIDES, exit_code
from frontier_jax.config import ModelConfig
from frontier_jax.interop.state_dict import (InteropError, load_npz, main, params_to_state_dict, restore_params, save_npz,
                                  state_dict_to_params)
from frontier_jax.model import GPT

CFG = ModelConfig(vocab_size=64, num_layers=3, model_dim=32, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module")
def params():
    _, p = nnx.split(GPT(CFG, rngs=nnx.Rngs(0), compute_dtype="bfloat16"))
    # Make every value distinctive (zero-init projections would hide a transposition mistake).
    leaves, treedef = jax.tree_util.tree_flatten(p)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    return jax.tree_util.tree_unflatten(treedef, [jax.random.normal(k, x.shape).astype(x.dtype) for k, x in zip(keys, leaves)])


def test_keys_and_shapes_are_the_pytorch_baselines(params):
    sd = params_to_state_dict(params)
    D, V, F, KV = 32, 64, 64, 2 * 8
    expected = {"tok_emb.weight": (V, D), "skip_weights": (1, D)}
    for i in range(3):
        expected.update({
            f"blocks.{i}.attn.c_q.weight": (D, D), f"blocks.{i}.attn.c_k.weight": (KV, D),
            f"blocks.{i}.attn.c_v.weight": (KV, D), f"blocks.{i}.attn.proj.weight": (D, D),
            f"blocks.{i}.attn.q_gain": (4,), f"blocks.{i}.attn_scale": (D,), f"blocks.{i}.mlp_scale": (D,),
            f"blocks.{i}.resid_mix": (2, D), f"blocks.{i}.mlp.fc.weight": (F, D), f"blocks.{i}.mlp.proj.weight": (D, F)})
    assert {k: v.shape for k, v in sd.items()} == expected
    # [out, in] in PyTorch: the transpose of ours.
    np.testing.assert_array_equal(sd["blocks.1.mlp.fc.weight"], np.asarray(params["blocks"][1]["mlp"]["fc"][...]).T)
    assert sd["tok_emb.weight"].dtype == jnp.bfloat16


def test_baseline_shapes_total_17_059_912():
    abstract = nnx.split(nnx.eval_shape(lambda: GPT(ModelConfig(), rngs=nnx.Rngs(0), compute_dtype="bfloat16")))[1]
    sd = params_to_state_dict(jax.tree_util.tree_map(lambda x: np.zeros(x.shape, np.int8), abstract))
    assert len(sd) == 2 + 9 * 10 and sum(v.size for v in sd.values()) == 17_059_912
    assert sd["blocks.0.attn.c_k.weight"].shape == (256, 512) and sd["skip_weights"].shape == (4, 512)


def test_export_import_is_the_identity_including_bf16(params, tmp_path):
    path = tmp_path / "w.npz"
    save_npz(path, params_to_state_dict(params), {"note": "test"})
    with np.load(path) as z:
        assert z["tok_emb.weight"].dtype == np.float32  # readable by torch.from_numpy without ml_dtypes
        assert json.loads(str(z["__dtypes__"]))["tok_emb.weight"] == "bfloat16"
    sd, meta = load_npz(path)
    assert meta == {"note": "test"}
    back = state_dict_to_params(sd, jax.eval_shape(lambda: params), source=str(path))
    for (p, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves_with_path(back)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), p


@pytest.mark.parametrize("edit, fragment", [
    (lambda sd: sd.pop("blocks.2.attn.q_gain"), "missing key 'blocks.2.attn.q_gain'"),
    (lambda sd: sd.update({"lm_head.weight": np.zeros((64, 32))}), "unexpected key 'lm_head.weight'"),
    (lambda sd: sd.update({"blocks.0.mlp.fc.weight": sd["blocks.0.mlp.fc.weight"].T}), "'blocks.0.mlp.fc.weight' has shape [32, 64]"),
])
def test_mismatches_are_one_line_errors_naming_file_and_key(params, edit, fragment):
    sd = dict(params_to_state_dict(params))
    edit(sd)
    with pytest.raises(InteropError) as e:
        state_dict_to_params(sd, jax.eval_shape(lambda: params), source="weights.npz")
    assert str(e.value).startswith("weights.npz: ") and fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_export_then_import_restores_the_same_weights(trained_run, tmp_path, capsys):
    run_dir, _ = trained_run
    npz = tmp_path / "w.npz"
    assert main(["export", "--run", str(run_dir), "--out", str(npz)]) == 0
    sets = [a for o in TINY_OVERRIDES for a in ("--set", o)]
    assert main(["import", "--npz", str(npz), "--config", str(REPO / "configs" / "tiny.py"), *sets,
                 "--out", str(tmp_path / "imported")]) == 0
    _, _, original, step, _ = restore_params(run_dir)
    _, _, imported, step0, _ = restore_params(tmp_path / "imported")
    assert step0 == 0 and step == 200
    for a, b in zip(jax.tree_util.tree_leaves(original), jax.tree_util.tree_leaves(imported)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    capsys.readouterr()
    # Another model's config: refused with one line, nothing created.
    assert _exit_code(["import", "--npz", str(npz), "--config", str(REPO / "configs" / "tiny.py"), *sets,
                       "--set", "model.num_layers=3", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {npz}: missing key 'blocks.2.") and not (tmp_path / "bad").exists()


def _exit_code(argv) -> int:
    return exit_code(main, argv)


@pytest.fixture(scope="module")
def tiny_npz(tmp_path_factory):
    """(npz path, state_dict) of the test-sized tiny model (TINY_OVERRIDES), as `export` writes it."""
    from frontier_jax.config import apply_overrides, load_config

    cfg = apply_overrides(load_config(REPO / "configs" / "tiny.py"), TINY_OVERRIDES)
    _, p = nnx.split(GPT(cfg.model, rngs=nnx.Rngs(0), compute_dtype="float32"))
    sd = params_to_state_dict(p)
    path = tmp_path_factory.mktemp("npz") / "tiny.npz"
    save_npz(path, sd)
    return path, sd


def _import(npz, out):
    sets = [a for o in TINY_OVERRIDES for a in ("--set", o)]
    return _exit_code(["import", "--npz", str(npz), "--config", str(REPO / "configs" / "tiny.py"), *sets, "--out", str(out)])


def _corrupt(path, sd):
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 100)


def _truncated(path, sd):
    save_npz(path, sd)
    path.write_bytes(path.read_bytes()[:5000])


def _int8(path, sd):
    save_npz(path, {**sd, "tok_emb.weight": sd["tok_emb.weight"].astype(np.int8)})


def _nan(path, sd):
    bad = sd["blocks.0.attn.q_gain"].copy()
    bad[0] = np.nan
    save_npz(path, {**sd, "blocks.0.attn.q_gain": bad})


@pytest.mark.parametrize("make, fragment", [
    (_corrupt, "not a readable npz (BadZipFile"),
    (_truncated, "not a readable npz"),
    (_int8, "key 'tok_emb.weight' has dtype int8; parameters must be floating point"),
    (_nan, "key 'blocks.0.attn.q_gain' holds non-finite values"),
])
def test_import_of_a_bad_npz_is_one_line_exit_2_and_writes_nothing(tiny_npz, tmp_path, capsys, make, fragment):
    """#11 and the smaller case: a corrupt npz, int8 arrays or NaN values are refused before anything is written."""
    _, sd = tiny_npz
    npz = tmp_path / "bad.npz"
    make(npz, sd)
    assert _import(npz, tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {npz}: ") and fragment in err
    assert not (tmp_path / "run").exists()


def test_export_to_an_unwritable_path_is_one_line_exit_2(params, tmp_path, capsys, monkeypatch):
    """#11: the output cannot be created (its parent is a file): one line naming it, exit 2, no temporary left."""
    import frontier_jax.interop.state_dict as interop
    from frontier_jax.config import Config

    monkeypatch.setattr(interop, "restore_params", lambda run_dir: (Config(model=CFG), None, params, 7, jnp.bfloat16))
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert _exit_code(["export", "--run", str(tmp_path), "--out", str(blocker / "w.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(blocker) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_read_run_config_of_a_corrupt_config_json_is_a_config_error(tmp_path):
    """#11: `--resume`/evaluate of a run with a corrupt config.json: ConfigError naming the file."""
    from frontier_jax.config import ConfigError
    from frontier_jax.interop.state_dict import read_run_config

    (tmp_path / "config.json").write_text('{"model": {"num_layers": ')
    with pytest.raises(ConfigError, match=f"{tmp_path / 'config.json'}: unreadable run config"):
        read_run_config(tmp_path)


def test_the_command_line_answers_help_without_loading_jax():
    """`interop --help` took 5-8 s while JAX and flax loaded; they are imported by the functions that use them."""
    import subprocess
    import sys

    code = ("import sys; sys.argv = ['interop', '--help']; import frontier_jax.interop.state_dict as m\n"
            "try:\n    m.main()\nexcept SystemExit:\n    pass\n"
            "bad = [k for k in sys.modules if k.split('.')[0] in ('jax', 'flax', 'optax')]; assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1000:]
    assert "export" in r.stdout and "import" in r.stdout


def test_a_failed_import_leaves_nothing_that_blocks_its_retry(params, tmp_path, monkeypatch):
    """A disk-full `interop import` left config.json behind, and its retry said 'already holds a run'. A failed
    import removes what it wrote; the retry with the same --out works."""
    from frontier_jax import checkpoint
    from frontier_jax.config import Config
    from frontier_jax.interop.state_dict import import_run

    save_npz(tmp_path / "w.npz", params_to_state_dict(params))
    cfg = Config(model=ModelConfig(**{**CFG.__dict__, "compute_dtype": "bfloat16"}))
    real = checkpoint.save

    def full_disk(*a, **k):
        raise checkpoint.CheckpointError(f"{tmp_path}/run/checkpoints/0: checkpoint not written (disk full (ENOSPC))")

    monkeypatch.setattr(checkpoint, "save", full_disk)
    with pytest.raises(checkpoint.CheckpointError, match="disk full"):
        import_run(tmp_path / "w.npz", cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(checkpoint, "save", real)
    assert import_run(tmp_path / "w.npz", cfg, tmp_path / "run")["step"] == 0
