"""The model: shapes, parameter count, causality by gradients, initialisation, dtype policy, FLOPs; the recipe's
switches (docs/recipe.md): causality with every switch on, the record's parameter counts and initialisation, the
per-layer switches."""

import dataclasses

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


# ----------------------------------------------------------------------------- the recipe's switches

RECIPE = ModelConfig(vocab_size=96, num_layers=4, model_dim=64, num_heads=2, num_kv_heads=1, mlp_mult=2.5,
                     mlp_negative_slope=0.5, rope_dims=16, rope_rescale_from=8, ln_scale=True, xsa_last_n=2,
                     smear_gate=True, bigram_buckets=40, bigram_dim=16, ve_layers=(1, 3), ve_dim=16, init="record",
                     embed_dtype="bfloat16")


def _randomise_recipe(model, key):
    """Non-zero projections and tables everywhere (the record's init zeroes the output projections and the bigram
    table, which would hide a leak through them)."""
    _randomise_projections(model, key)
    k1, k2, k3 = jax.random.split(jax.random.fold_in(key, 99), 3)
    model.bigram.embed[...] = jax.random.normal(k1, model.bigram.embed.shape).astype(model.bigram.embed.dtype)
    model.smear.gate[...] = jax.random.normal(k2, model.smear.gate.shape)
    model.ve_shared.scale[...] = jnp.asarray(1.0)
    for blk in model.blocks:
        blk.attn.q_gain[...] = 1.0 + 0.5 * jax.random.normal(k3, blk.attn.q_gain.shape)


def test_causality_by_gradients_with_every_switch_on(monkeypatch):
    """BigramHash and SmearGate read one token back, value embeddings and XSA the own position: d loss[t] / d (the
    token embedding, the BigramHash or the value-embedding output at s) is zero for s > t, and changing the input
    tokens after t changes no loss up to t, with every switch on (T = 12 > rope_rescale_from: the rescaled base)."""
    m = GPT(RECIPE, rngs=nnx.Rngs(3), compute_dtype="float32")
    _randomise_recipe(m, jax.random.PRNGKey(1))
    T, D = 12, RECIPE.model_dim
    x = jax.random.randint(jax.random.PRNGKey(2), (1, T), 0, RECIPE.vocab_size)
    y = jnp.roll(x, -1, axis=1)
    graphdef, state = nnx.split(m)
    forward = jax.jit(lambda a, b: nnx.merge(graphdef, state)(a, b))
    base = np.asarray(forward(x, y))
    for t in (0, 5, T - 2):  # the tokens after t replaced, the targets kept
        other = x.at[:, t + 1:].set((x[:, t + 1:] + 7) % RECIPE.vocab_size)
        np.testing.assert_array_equal(np.asarray(forward(other, y))[:, :t + 1], base[:, :t + 1])
    holder = {}
    monkeypatch.setattr(ops, "embed", lambda ids, emb: ref.embed(ids, emb) + holder["d"][0].astype(emb.dtype))
    real = ref.scaled_table_projection

    def perturbed(ids, table, proj, scale, dt):  # source 1: BigramHash's output, 2: the value embeddings'
        out = real(ids, table, proj, scale, dt)
        return out + holder["d"][1 if table.shape[0] == RECIPE.bigram_buckets else 2][..., :out.shape[-1]]

    monkeypatch.setattr(ref, "scaled_table_projection", perturbed)

    def loss_at(d, t):
        holder["d"] = d
        return nnx.merge(graphdef, state)(x, y)[0, t]

    grad_fn = jax.jit(jax.grad(loss_at))  # t traced: one compilation for the three positions
    for t in (0, 5, T - 2):
        norms = np.linalg.norm(np.asarray(grad_fn(jnp.zeros((3, 1, T, D)), jnp.int32(t)))[:, 0], axis=-1)
        assert np.all(norms[:, t + 1:] == 0.0), f"position {t} sees the future: {norms}"
        assert np.all(norms[:, t] > 0)
        if t > 0:
            assert np.all(norms[:, :t].max(axis=1) > 0), "an input's earlier positions reach no loss"


def test_the_recipe_model_counts_the_records_parameters():
    """At the record's shapes (SPEC 4): 969,108 parameters at tiny.env, 26,928,220 at the run command."""
    from frontier_jax.config import load_config
    from helpers import REPO

    for name, want in (("record11_tiny.py", 969_108), ("record11.py", 26_928_220)):
        cfg = load_config(REPO / "configs" / name).model
        abstract = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0), compute_dtype="float32"))
        assert count_params(abstract) == want


def test_mlp_mult_is_truncated_and_the_ln_scale_factor_is_per_layer():
    m = nnx.eval_shape(lambda: GPT(RECIPE, rngs=nnx.Rngs(0), compute_dtype="float32"))
    assert m.blocks[0].mlp.fc.shape == (64, 160) and RECIPE.mlp_hidden == 160  # 2.5 * 64
    assert ModelConfig(model_dim=512, mlp_mult=2.9).mlp_hidden == 1484  # 1484.8 truncated, as int() does
    assert [blk.ln_scale for blk in m.blocks] == [1.0, 1 / np.sqrt(2), 1 / np.sqrt(3), 0.5]
    assert [blk.attn.xsa for blk in m.blocks] == [False, False, True, True]
    plain = nnx.eval_shape(lambda: GPT(TINY, rngs=nnx.Rngs(0), compute_dtype="float32"))
    assert all(blk.ln_scale == 1.0 and not blk.attn.xsa for blk in plain.blocks)
    assert plain.bigram is None and plain.smear is None and plain.ve_shared is None and len(plain.ve_layer_scales) == 0


def test_value_embeddings_reach_only_the_listed_layers(monkeypatch):
    from frontier_jax.model import Block

    m = nnx.eval_shape(lambda: GPT(RECIPE, rngs=nnx.Rngs(0), compute_dtype="float32"))
    seen = []
    real = Block.attention_half

    def record(self, x, x0, skip=None, skip_w=None, ve=None):
        seen.append(ve is not None)
        return real(self, x, x0, skip, skip_w, ve)

    monkeypatch.setattr(Block, "attention_half", record)
    x = jnp.zeros((1, 4), jnp.int32)
    graphdef, state = nnx.split(m)
    jax.eval_shape(lambda st: nnx.merge(graphdef, st)(x, x), state)  # traced, not run
    assert seen == [False, True, False, True]  # ve_layers = (1, 3)
    assert [v.shape for v in m.ve_layer_scales] == [(1,), (1,)]


def test_the_records_init_statistics():
    cfg = ModelConfig(vocab_size=256, num_layers=2, model_dim=128, num_heads=4, num_kv_heads=2, mlp_mult=3.0,
                      bigram_buckets=512, bigram_dim=64, ve_layers=(1,), ve_dim=128, smear_gate=True, init="record",
                      embed_dtype="bfloat16")
    m = _model(cfg)
    bf16_exact = lambda a: np.array_equal(np.asarray(a, np.float32),
                                          np.asarray(jnp.asarray(a).astype(jnp.bfloat16), np.float32))
    for blk in m.blocks:
        for w in (blk.attn.c_q, blk.attn.c_k, blk.attn.c_v, blk.mlp.fc):  # orthonormal rows or columns
            a = np.asarray(w[...], np.float64)
            small = a.T @ a if a.shape[0] >= a.shape[1] else a @ a.T
            assert np.abs(small - np.eye(len(small))).max() < 4e-3  # to bf16 precision (the record: 1.3e-3)
            assert bf16_exact(w[...]) and w[...].dtype == jnp.float32
        assert not np.any(np.asarray(blk.attn.proj[...])) and not np.any(np.asarray(blk.mlp.proj[...]))
    assert not np.any(np.asarray(m.bigram.embed[...], np.float32)) and m.bigram.embed.dtype == jnp.bfloat16
    p = np.asarray(m.bigram.proj[...], np.float64)  # [64, 128]: orthonormal rows
    assert np.abs(p @ p.T - np.eye(64)).max() < 4e-3
    ve = np.asarray(m.ve_shared.embed[...], np.float64)
    assert abs(ve.std() - 0.01) < 5e-4 and m.ve_shared.embed.dtype == jnp.bfloat16
    p = np.asarray(m.ve_shared.proj[...], np.float64)  # [128, G * K = 64]: orthonormal columns
    assert p.shape == (128, 64) and np.abs(p.T @ p - np.eye(64)).max() < 4e-3
    assert float(m.bigram.scale[...]) == 0.050048828125 and float(m.ve_shared.scale[...]) == 0.10009765625
    assert not np.any(np.asarray(m.smear.gate[...])) and m.tok_emb.dtype == jnp.bfloat16
    emb = np.asarray(m.tok_emb[...], np.float64)
    assert abs(emb.std() - 0.005) < 2.5e-4
    assert all(np.asarray(v[...]).tolist() == [1.0] for v in m.ve_layer_scales)
    # the record keeps a projection with a dim < 64 at its zero init (train_gpt.py:892-897)
    small = _model(dataclasses.replace(cfg, bigram_dim=32))
    assert small.bigram.proj.shape == (32, 128) and not np.any(np.asarray(small.bigram.proj[...]))
    base = _model(dataclasses.replace(cfg, init="baseline"))  # PyTorch's default: bounded uniform, not rounded
    assert np.abs(np.asarray(base.bigram.proj[...])).max() <= 1 / np.sqrt(64)
    assert float(base.bigram.scale[...]) == np.float32(0.05)


def test_the_baseline_parameters_do_not_depend_on_the_switches():
    """The baseline's parameters are drawn first, in the baseline's order: a model with switches that add no
    draw before them has the same initial block weights and embedding as the baseline's."""
    plain = _model(dataclasses.replace(TINY, vocab_size=96))
    switched = _model(dataclasses.replace(TINY, smear_gate=True, bigram_buckets=10, bigram_dim=8, ve_layers=(0,),
                                          ve_dim=8, ln_scale=True, xsa_last_n=1, rope_dims=4))
    np.testing.assert_array_equal(plain.tok_emb[...], switched.tok_emb[...])
    for a, b in zip(plain.blocks, switched.blocks):
        np.testing.assert_array_equal(a.attn.c_q[...], b.attn.c_q[...])
        np.testing.assert_array_equal(a.mlp.fc[...], b.mlp.fc[...])
