"""The dtype policy (frontier_jax.policies.dtypes), resolved once per run: which dtype "auto" means on a platform,
and the model and the optimizer take the resolved names (neither resolves "auto" itself)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from flax import nnx

from frontier_jax.config import Config, ConfigError, ModelConfig, OptimConfig
from frontier_jax.policies import dtypes, groups


@pytest.mark.parametrize("setting, platform, expected", [
    ("auto", "cpu", jnp.float32), ("auto", "neuron", jnp.bfloat16), ("auto", "gpu", jnp.bfloat16),
    ("float32", "neuron", jnp.float32), ("bfloat16", "cpu", jnp.bfloat16),
])
def test_dtype_policy_is_explicit(setting, platform, expected):
    cfg = Config(model=ModelConfig(compute_dtype=setting), optim=OptimConfig(muon_ns_dtype=setting))
    assert dtypes.resolve(cfg, platform) == dtypes.Dtypes(compute=jnp.dtype(expected).name,
                                                          muon_ns=jnp.dtype(expected).name)


def test_muon_ns_dtype_auto_resolves_per_platform():
    cfg = Config(optim=OptimConfig(muon_ns_dtype="auto"))
    assert dtypes.resolve(cfg, "cpu").muon_ns == "float32" and dtypes.resolve(cfg, "neuron").muon_ns == "bfloat16"
    assert dtypes.resolve(Config(), "cpu").muon_ns == "bfloat16"  # the default stays the baseline's
    with pytest.raises(ConfigError, match="auto|bfloat16|float32"):
        OptimConfig(muon_ns_dtype="float16")


def test_the_jax_modules_use_these_rules_written_once():
    """The optimizer's groups are the policy's function; the model computes in the dtype it is handed, and the
    optimizer refuses an unresolved "auto" instead of resolving it a second way (the run resolves it once)."""
    from frontier_jax import model, optim  # the JAX side (the policies themselves load no JAX)

    assert optim.label_for is groups.param_label
    tiny = ModelConfig(vocab_size=64, num_layers=1, model_dim=32, num_heads=4, num_kv_heads=2, compute_dtype="auto")
    for platform in ("cpu", "neuron"):
        resolved = dtypes.resolve(Config(model=tiny), platform)
        gpt = nnx.eval_shape(lambda: model.GPT(tiny, rngs=nnx.Rngs(0), compute_dtype=resolved.compute))
        assert gpt.compute_dtype == jnp.dtype(resolved.compute) and gpt.tok_emb.dtype == jnp.dtype(resolved.compute)
    oc = OptimConfig(muon_ns_dtype="auto")
    with pytest.raises(ValueError, match="resolve"):
        optim.build_optimizer(oc)
    optim.build_optimizer(oc, dtypes.resolve(Config(optim=oc), "cpu").muon_ns)
