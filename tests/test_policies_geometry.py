"""The step's geometry (frontier_jax.policies.geometry): a step split into micro-batches per device, an
impossible split refused; with the optimizer groups (frontier_jax.policies.groups) and the FLOPs per token."""

from __future__ import annotations

import pytest

from frontier_jax.config import ConfigError, ModelConfig
from frontier_jax.policies import geometry, groups


def test_groups_geometry_and_flops():
    for names, ndim, label in ((["tok_emb"], 2, "embed"), (["ngram_bias"], 2, "ngram"),
                               (["blocks", "0", "attn", "c_q"], 2, "muon"), (["blocks", "0", "resid_mix"], 2, "scalar"),
                               (["blocks", "0", "attn", "q_gain"], 1, "scalar"), (["skip_weights"], 2, "scalar"),
                               (["blocks", "1", "mlp", "fc"], 1, "scalar")):
        assert groups.param_label(names, ndim) == label
    assert [geometry.split_batch(*a) for a in ((64, 64, 1), (512, 64, 1), (512, 64, 2), (512, 64, 32), (8, 4, 4))] == \
        [(64, 1), (64, 8), (128, 4), (512, 1), (8, 1)]
    for args in ((8, 4, 3), (12, 8, 1)):
        with pytest.raises(ConfigError):
            geometry.split_batch(*args)
    mc = ModelConfig(vocab_size=100, num_layers=1, model_dim=8, num_heads=2, num_kv_heads=1, mlp_mult=2)
    # head dim 4; per layer q, k+v, o, MLP: 2 * (8*2*4 + 2*8*1*4 + 2*4*8 + 2*8*16) = 896; attention
    # 2*2*2*4*(T/2) = 64 at T = 4; head 2*8*100 = 1600; forward + backward = 3x
    assert mc.flops_per_token(4) == 3.0 * (896 + 64 + 1600)


def test_split_batch_keeps_tokens_per_step_and_rejects_impossible_splits():
    assert geometry.split_batch(64, 64, 1) == (64, 1)
    assert geometry.split_batch(512, 64, 1) == (64, 8)  # the baseline: 8 micro-batches of 64 on one device
    assert geometry.split_batch(512, 64, 2) == (128, 4)  # one trn1 chip: 2 NeuronCores
    assert geometry.split_batch(512, 64, 32) == (512, 1)
    assert geometry.split_batch(8, 4, 4) == (8, 1)  # fewer sequences than a micro-batch per device
    with pytest.raises(ConfigError, match="cannot be split over 3 devices"):
        geometry.split_batch(8, 4, 3)
    with pytest.raises(ConfigError, match="not a multiple of train.micro_batch_seqs"):
        geometry.split_batch(12, 8, 1)
