"""The optimizer groups (frontier_jax.policies.groups.param_label): the baseline's split unchanged, and the recipe's
parameters in the record's groups (train_gpt.py:1502-1570): the three tables with the tied embedding, the
projections, scales and gate with the scalars, the block matrices with Muon."""

from __future__ import annotations

import jax
from flax import nnx

from helpers import REPO
from frontier_jax import optim
from frontier_jax.config import load_config
from frontier_jax.model import GPT
from frontier_jax.policies.groups import param_label


def _labels(cfg_model) -> dict[str, str]:
    """{parameter path: its group} of the model, as the optimizer labels it (optim.path_names of its pytree)."""
    _, params = nnx.split(nnx.eval_shape(lambda: GPT(cfg_model, rngs=nnx.Rngs(0), compute_dtype="float32")))
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {".".join(optim.path_names(p)): param_label(optim.path_names(p), x.ndim) for p, x in flat}


def test_the_record_models_parameters_are_in_the_records_groups():
    m = load_config(REPO / "configs" / "record11_tiny.py").model
    labels = _labels(m)
    embed = {"tok_emb", "bigram.embed", "ve_shared.embed"}  # optimizer_tok (TIED_EMBED_LR)
    scalar = {"skip_weights", "smear.gate", "bigram.scale", "bigram.proj", "ve_shared.scale", "ve_shared.proj",
              "ve_layer_scales.0", "ve_layer_scales.1"}  # optimizer_scalar (SCALAR_LR)
    for i in range(m.num_layers):
        scalar |= {f"blocks.{i}.{n}" for n in ("attn.q_gain", "attn_scale", "mlp_scale", "resid_mix")}
    muon = {f"blocks.{i}.{n}" for i in range(m.num_layers)  # the banks' slices (Muon, MATRIX_LR)
            for n in ("attn.c_q", "attn.c_k", "attn.c_v", "attn.proj", "mlp.fc", "mlp.proj")}
    assert labels == {**dict.fromkeys(embed, "embed"), **dict.fromkeys(scalar, "scalar"), **dict.fromkeys(muon, "muon")}


def test_the_baselines_labels_do_not_move():
    m = load_config(REPO / "configs" / "baseline.py").model
    labels = _labels(m)
    assert labels["tok_emb"] == "embed" and labels["skip_weights"] == "scalar"
    assert {v for k, v in labels.items() if k.endswith(("c_q", "c_k", "c_v", "proj", "fc"))} == {"muon"}
    assert sum(v == "muon" for v in labels.values()) == 6 * m.num_layers
    # the function of the names: 2-D inside a block is Muon unless it is a control tensor; a table never is
    assert param_label(["blocks", "0", "resid_mix"], 2) == "scalar" and param_label(["ngram_bias"], 2) == "ngram"
    assert param_label(["bigram", "proj"], 2) == "scalar" and param_label(["ve_shared", "embed"], 2) == "embed"
    assert set(labels.values()) == {"embed", "muon", "scalar"}
