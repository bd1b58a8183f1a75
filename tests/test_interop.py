"""Interop with the PyTorch baseline's state_dict layout: names, shapes, identity round trip, errors, CLI."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import REPO, TINY_OVERRIDES
from frontier_jax.config import ModelConfig
from frontier_jax.interop import (InteropError, load_npz, main, params_to_state_dict, restore_params, save_npz,
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
    assert main(["import", "--npz", str(npz), "--config", str(REPO / "configs" / "tiny.py"), *sets,
                 "--set", "model.num_layers=3", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {npz}: missing key 'blocks.2.") and not (tmp_path / "bad").exists()
