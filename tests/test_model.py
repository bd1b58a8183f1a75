"""The baseline model: shapes, parameter count, causality by gradients, initialisation, dtype policy, FLOPs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from frontier_jax import ops
from frontier_jax.ops import reference as ref
from frontier_jax.config import ModelConfig
from frontier_jax.model import GPT, count_params

TINY = ModelConfig(vocab_size=96, num_layers=3, model_dim=32, num_heads=4, num_kv_heads=2)


def _model(cfg=TINY, dtype="float32", seed=0):
    return GPT(cfg, rngs=nnx.Rngs(seed), compute_dtype=dtype)


@pytest.fixture(scope="module")
def tiny_model():
    return _model()


def _jitted(model, method="__call__"):
    """model.method as one compiled function (eager op-by-op execution is slow on CPU)."""
    graphdef, state = nnx.split(model)
    f = jax.jit(lambda st, *a: getattr(nnx.merge(graphdef, st), method)(*a))
    return lambda *a: f(state, *a)


def test_shapes_and_finite_per_token_loss(tiny_model):
    m = tiny_model
    x = jax.random.randint(jax.random.PRNGKey(0), (2, 16), 0, TINY.vocab_size)
    loss = _jitted(m)(x, jnp.roll(x, -1, axis=1))
    assert loss.shape == (2, 16) and loss.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(loss)))
    assert _jitted(m, "hidden")(x).shape == (2, 16, TINY.model_dim)
    # Zero-init output projections: at init every position predicts from its own embedding only, close to uniform.
    assert abs(float(loss.mean()) - np.log(TINY.vocab_size)) < 0.1


def test_baseline_parameter_count_without_allocating():
    abstract = nnx.eval_shape(lambda: GPT(ModelConfig(), rngs=nnx.Rngs(0), compute_dtype="bfloat16"))
    n = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(nnx.state(abstract, nnx.Param)))
    assert n == 17_059_912


def test_count_params_matches_the_state(tiny_model):
    m = tiny_model
    D, V, L = TINY.model_dim, TINY.vocab_size, TINY.num_layers
    KV = TINY.num_kv_heads * TINY.head_dim
    per_block = D * D * 2 + 2 * D * KV + 2 * D * 2 * D + TINY.num_heads + 2 * D + 2 * D
    assert count_params(m) == V * D + (L // 2) * D + L * per_block


def _randomise_projections(model, key):
    """Non-zero output projections, so information flows between positions (zero-init would hide a leak)."""
    for i, blk in enumerate(model.blocks):
        k1, k2 = jax.random.split(jax.random.fold_in(key, i))
        blk.attn.proj[...] = 0.2 * jax.random.normal(k1, blk.attn.proj.shape)
        blk.mlp.proj[...] = 0.2 * jax.random.normal(k2, blk.mlp.proj.shape)


def test_causality_by_gradients(monkeypatch):
    """d loss[t] / d (input embedding at s) is exactly zero for s > t, and non-zero for some s < t."""
    m = _model(seed=3)
    _randomise_projections(m, jax.random.PRNGKey(1))
    T, D = 12, TINY.model_dim
    x = jax.random.randint(jax.random.PRNGKey(2), (1, T), 0, TINY.vocab_size)
    y = jnp.roll(x, -1, axis=1)
    holder = {}
    monkeypatch.setattr(ops, "embed", lambda ids, emb: ref.embed(ids, emb) + holder["delta"].astype(emb.dtype))

    graphdef, state = nnx.split(m)

    def loss_at(delta_BTD, t):
        holder["delta"] = delta_BTD
        return nnx.merge(graphdef, state)(x, y)[0, t]

    grad_fn = jax.jit(jax.grad(loss_at), static_argnums=1)
    for t in (0, 5, T - 2):
        g_TD = grad_fn(jnp.zeros((1, T, D)), t)[0]
        norms = np.asarray(jnp.linalg.norm(g_TD, axis=-1))
        assert np.all(norms[t + 1:] == 0.0), f"position {t} sees the future: {norms}"
        assert norms[t] > 0
        if t > 0:
            assert np.any(norms[:t] > 0), "no gradient reaches earlier positions: the test would not detect a leak"


def test_init_matches_the_spec():
    cfg = ModelConfig(vocab_size=1024, num_layers=4, model_dim=256, num_heads=4, num_kv_heads=2)
    m = _model(cfg)
    emb = np.asarray(m.tok_emb[...], np.float64)
    assert abs(emb.std() - cfg.tied_embed_init_std) < 0.05 * cfg.tied_embed_init_std and abs(emb.mean()) < 1e-4
    assert m.skip_weights.shape == (2, 256) and np.all(np.asarray(m.skip_weights[...]) == 1.0)
    for blk in m.blocks:
        assert np.all(np.asarray(blk.attn.proj[...]) == 0) and np.all(np.asarray(blk.mlp.proj[...]) == 0)
        assert np.all(np.asarray(blk.attn.q_gain[...]) == 1.5) and blk.attn.q_gain.shape == (4,)
        mix = np.asarray(blk.resid_mix[...])
        assert mix.shape == (2, 256) and np.all(mix[0] == 1) and np.all(mix[1] == 0)
        assert np.all(np.asarray(blk.attn_scale[...]) == 1) and np.all(np.asarray(blk.mlp_scale[...]) == 1)
        for w, fan_in in ((blk.attn.c_q, 256), (blk.attn.c_k, 256), (blk.attn.c_v, 256), (blk.mlp.fc, 256)):
            a = np.asarray(w[...])
            bound = 1 / np.sqrt(fan_in)  # PyTorch nn.Linear default, U(-1/sqrt(in), 1/sqrt(in))
            assert a.shape[0] == fan_in and np.abs(a).max() <= bound and np.abs(a).max() > 0.95 * bound
    assert m.blocks[0].attn.c_k.shape == (256, 2 * 64)  # GQA: kv heads x head dim


def test_embedding_is_stored_in_the_compute_dtype_and_other_params_in_fp32():
    m = _model(dtype="bfloat16")
    assert m.tok_emb[...].dtype == jnp.bfloat16
    others = [x for p, x in nnx.to_flat_state(nnx.state(m, nnx.Param)) if p != ("tok_emb",)]
    assert all(x[...].dtype == jnp.float32 for x in others)
    x = jnp.zeros((1, 8), jnp.int32)
    assert _jitted(m)(x, x).dtype == jnp.float32  # cross-entropy in fp32 whatever the matmul dtype


def test_flops_per_token_is_six_n_plus_attention(tiny_model):
    m = tiny_model
    T = 64
    D, V, L = TINY.model_dim, TINY.vocab_size, TINY.num_layers
    matrix_params = sum(int(np.prod(x.shape)) for p, x in nnx.to_flat_state(nnx.state(m, nnx.Param))
                        if p[0] == "blocks" and x.ndim == 2 and p[-1] != "resid_mix")
    attn = L * 3 * 2 * 2 * TINY.num_heads * TINY.head_dim * (T / 2)
    assert TINY.flops_per_token(T) == pytest.approx(6 * (matrix_params + V * D) + attn)


def test_build_is_the_run_model_with_its_ngram_bias():
    """model.build(cfg, dtype): cfg.model seeded by cfg.train.seed, plus the n-gram bias [orders, buckets]
    (zero) exactly when cfg.ngram.enabled."""
    import dataclasses

    from frontier_jax import model
    from frontier_jax.config import Config, NgramConfig, TrainConfig

    cfg = Config(model=TINY, train=TrainConfig(seed=3))
    plain = nnx.state(nnx.eval_shape(lambda: model.build(cfg, "float32")), nnx.Param)
    assert "ngram_bias" not in plain
    ng = dataclasses.replace(cfg, ngram=NgramConfig(enabled=True, min_order=2, max_order=5, confidence_buckets=4))
    built = model.build(ng, "float32")
    assert built.ngram_bias[...].shape == (4, 4) and not np.any(np.asarray(built.ngram_bias[...]))
    direct = GPT(TINY, rngs=nnx.Rngs(3), compute_dtype="float32")
    np.testing.assert_array_equal(built.tok_emb[...], direct.tok_emb[...])
