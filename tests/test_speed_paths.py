"""The speed work of bench/README.md keeps the numerics: block-causal attention, the direct reference path,
Muon's "auto" NS dtype, and a train step that compiles once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from frontier_jax import ops, optim
from frontier_jax.ops import reference as ref
from frontier_jax.config import ConfigError, ModelConfig, OptimConfig
from frontier_jax.model import GPT
from frontier_jax.steps import make_train_step


def _qkv(B, T, H, G, K, seed=0):
    r = np.random.default_rng(seed)
    return tuple(jnp.asarray(r.standard_normal(s), jnp.float32) for s in ((B, T, H, K), (B, T, G, K), (B, T, G, K)))


@pytest.mark.parametrize("T,block", [(256, 64), (256, 128), (192, 64), (128, None), (40, None)])
def test_block_causal_attention_is_the_dense_masked_softmax(T, block):
    q, k, v = _qkv(2, T, 4, 2, 16)
    ct = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)
    f = lambda b: jax.jit(jax.grad(lambda q, k, v: jnp.vdot(ref.causal_attention(q, k, v, block=b), ct), (0, 1, 2)))
    np.testing.assert_allclose(ref.causal_attention(q, k, v, block=block), ref.causal_attention(q, k, v, block=0),
                               rtol=1e-5, atol=1e-5)
    for a, b in zip(f(block)(q, k, v), f(0)(q, k, v)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _dense_softmax_attention(q, k, v):
    """Independent oracle: the textbook dense masked softmax, differentiated by plain autodiff."""
    B, T, H, K = q.shape
    G = k.shape[2]
    kk, vv = jnp.repeat(k, H // G, axis=2), jnp.repeat(v, H // G, axis=2)
    s = jnp.einsum("bthk,bshk->bhts", q, kk) / np.sqrt(K)
    s = jnp.where(np.tril(np.ones((T, T), bool)), s, -jnp.inf)
    return jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(s, axis=-1), vv)


@pytest.mark.parametrize("T,H,G,block", [(256, 4, 2, None), (192, 4, 4, 64), (64, 8, 2, 0)])
def test_attention_custom_vjp_equals_autodiff_of_the_dense_softmax(T, H, G, block):
    q, k, v = _qkv(2, T, H, G, 16, seed=3)
    ct = jnp.asarray(np.random.default_rng(4).standard_normal(q.shape), jnp.float32)
    value_grad = lambda f: jax.jit(jax.value_and_grad(lambda q, k, v: jnp.vdot(f(q, k, v), ct), (0, 1, 2)))(q, k, v)
    (v_ref, g_ref), (v_new, g_new) = value_grad(_dense_softmax_attention), value_grad(
        lambda q, k, v: ref.causal_attention(q, k, v, block=block))
    np.testing.assert_allclose(v_new, v_ref, rtol=1e-5)
    for a, b in zip(g_new, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_attention_bwd_recomputed_from_lse_equals_saved_probabilities():
    q, k, v = _qkv(1, 256, 4, 2, 16, seed=5)
    do = jnp.asarray(np.random.default_rng(6).standard_normal(q.shape), jnp.float32)
    o, lse, probs = ref.causal_attention_fwd(q, k, v)
    assert lse.shape == (1, 4, 256, 1) and lse.dtype == jnp.float32
    saved = ref.causal_attention_bwd(q, k, v, o, lse, do, probs=probs)
    for a, b in zip(ref.causal_attention_bwd(q, k, v, o, lse, do), saved):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_attention_block_choice():
    assert [ref.attention_block(T) for T in (1024, 256, 128, 100, 40)] == [128, 64, 64, 100, 40]


def test_causality_by_gradient_with_blocks():
    q, k, v = _qkv(1, 256, 4, 2, 16)
    g = jax.grad(lambda k: jnp.sum(ref.causal_attention(q, k, v)[:, 100]))(k)
    assert np.all(np.asarray(g[:, 101:]) == 0) and np.any(np.asarray(g[:, :101]) != 0)


def test_direct_reference_equals_the_primitive_path():
    cfg = ModelConfig(vocab_size=64, num_layers=2, model_dim=32, num_heads=4, num_kv_heads=2, compute_dtype="float32")
    graphdef, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0), compute_dtype=cfg.compute_dtype))
    params = jax.tree_util.tree_map(lambda p: p + 0.01, params)  # zero-init projections get a gradient path
    x = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 128)), jnp.int32)
    loss = lambda p: jnp.mean(nnx.merge(graphdef, p)(x, jnp.roll(x, -1, 1)))
    direct = jax.jit(jax.value_and_grad(loss))(params)
    with ops.through_primitives():
        prim = jax.jit(jax.value_and_grad(loss))(params)
    for a, b in zip(jax.tree_util.tree_leaves(direct), jax.tree_util.tree_leaves(prim)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_train_step_compiles_once_across_schedule_values():
    cfg = ModelConfig(vocab_size=64, num_layers=1, model_dim=32, num_heads=4, num_kv_heads=2, compute_dtype="float32")
    graphdef, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0), compute_dtype=cfg.compute_dtype))
    tx = optim.build_optimizer(OptimConfig(muon_ns_dtype="float32"))
    opt_state = tx.init(params)
    step = make_train_step(graphdef, tx)
    x = np.random.default_rng(0).integers(0, 64, (1, 2, 16)).astype(np.int32)
    for i in range(3):
        params, opt_state, m = step(params, opt_state, x, x, jnp.float32(1.0 - 0.1 * i), jnp.float32(0.85 + 0.01 * i), None)
    jax.block_until_ready(m)
    assert step._cache_size() == 1
