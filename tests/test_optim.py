"""Optimizer (frontier_jax.optim): label map, Newton-Schulz, Muon orientation/scale, Adam groups, schedule,
momentum warm-up, loss falls; the fused Adam/Muon transformations (optim.fused=True) vs the unfused optax
chain, no recompiles, donation, one `apply` for both kinds."""

import dataclasses


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from frontier_jax import ops, optim
from frontier_jax.ops import reference
from frontier_jax.policies import schedules
from frontier_jax.config import ModelConfig, OptimConfig
from frontier_jax.model import GPT
from frontier_jax.steps import make_train_step

CFG = ModelConfig(vocab_size=64, num_layers=3, model_dim=32, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module")
def split_model():
    return nnx.split(GPT(CFG, rngs=nnx.Rngs(0), compute_dtype="float32"))


def _labels_by_path(params) -> dict[str, str]:
    return {".".join(map(str, p)): v for p, v in nnx.to_flat_state(optim.param_labels(params))}


def test_label_map_is_exactly_the_baseline_split(split_model):
    labels = _labels_by_path(split_model[1])
    expected = {"tok_emb": "embed", "skip_weights": "scalar"}
    for i in range(CFG.num_layers):
        for name in ("attn.c_q", "attn.c_k", "attn.c_v", "attn.proj", "mlp.fc", "mlp.proj"):
            expected[f"blocks.{i}.{name}"] = "muon"
        for name in ("attn.q_gain", "attn_scale", "mlp_scale", "resid_mix"):
            expected[f"blocks.{i}.{name}"] = "scalar"
    assert labels == expected
    # resid_mix and skip_weights are 2-D yet go to Adam (control tensors); tok_emb is 2-D yet never Muon.
    assert split_model[1]["blocks"][0]["resid_mix"].ndim == 2 and split_model[1]["skip_weights"].ndim == 2


@pytest.mark.parametrize("shape", [(64, 64), (32, 96), (96, 32)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_newton_schulz_orthogonalises(shape, dtype):
    g = jax.random.normal(jax.random.PRNGKey(sum(shape)), shape)
    o = reference.newton_schulz(g, 5, jnp.dtype(dtype))
    assert o.shape == shape and o.dtype == jnp.dtype(dtype)
    s = np.linalg.svd(np.asarray(o, np.float32), compute_uv=False)
    assert s.max() < 1.5, s
    # 5 quintic steps cannot lift the near-zero singular values a random SQUARE matrix has at its
    # spectrum's edge; rectangular ones have a gap at zero, so there every value lands in [0.5, 1.5].
    assert (np.quantile(s, 0.05) if shape[0] == shape[1] else s.min()) > 0.5, s
    # Same column/row space as g: o is (approximately) U V^T of g.
    u, _, vt = np.linalg.svd(np.asarray(g), full_matrices=False)
    assert np.abs(np.asarray(o, np.float32) - u @ vt).mean() < 0.3


def test_newton_schulz_tall_is_the_transpose_of_wide():
    g = jax.random.normal(jax.random.PRNGKey(7), (96, 32))
    tall = reference.newton_schulz(g, 5, jnp.float32)
    wide = reference.newton_schulz(g.T, 5, jnp.float32)
    np.testing.assert_allclose(np.asarray(tall), np.asarray(wide).T, atol=1e-5)


def test_muon_update_uses_pytorch_orientation_and_scale():
    """fc is stored [D, F]; PyTorch has [F, D] (tall), so the update is NS(g.T).T * sqrt(F/D)."""
    tx = optim.scale_by_muon(ns_steps=5, ns_dtype="float32")
    g = {"fc": jax.random.normal(jax.random.PRNGKey(0), (32, 64)), "proj": jax.random.normal(jax.random.PRNGKey(1), (64, 32))}
    u, _ = tx.update(g, tx.init(g), momentum=0.0)
    np.testing.assert_allclose(np.asarray(u["fc"]), np.asarray(reference.newton_schulz(g["fc"].T, 5, jnp.float32)).T * np.sqrt(2),
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(u["proj"]), np.asarray(reference.newton_schulz(g["proj"].T, 5, jnp.float32)).T, atol=1e-6)


def test_groups_get_their_own_learning_rate(split_model):
    """First Adam step is -lr * g/(|g|+eps): embed_lr on tok_emb, scalar_lr on the rest; lr_scale 0 freezes all."""
    cfg = OptimConfig(embed_lr=0.05, scalar_lr=0.04, matrix_lr=0.02)
    params = split_model[1]
    tx = optim.build_optimizer(cfg)
    grads = jax.tree_util.tree_map(lambda p: jax.random.normal(jax.random.PRNGKey(3), p.shape, jnp.float32), params)
    update = jax.jit(lambda g, st, p, lr: tx.update(g, st, p, lr_scale=lr, momentum=jnp.float32(0.9)))
    u, _ = update(grads, tx.init(params), params, jnp.float32(1.0))
    emb_u, emb_g = np.asarray(u["tok_emb"][...]), np.asarray(grads["tok_emb"][...])
    np.testing.assert_allclose(emb_u, -0.05 * np.sign(emb_g), rtol=1e-3)
    np.testing.assert_allclose(np.asarray(u["blocks"][0]["resid_mix"][...]),
                               -0.04 * np.sign(np.asarray(grads["blocks"][0]["resid_mix"][...])), rtol=1e-3)
    cq = np.asarray(u["blocks"][0]["attn"]["c_q"][...])
    s = np.linalg.svd(cq / 0.02, compute_uv=False)
    assert s.min() > 0.5 and s.max() < 1.5  # Muon: orthogonalised update times matrix_lr
    u0, _ = update(grads, tx.init(params), params, jnp.float32(0.0))
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree_util.tree_leaves(u0))


def test_loss_falls_on_a_repeating_corpus(split_model):
    graphdef, params = split_model
    params = jax.tree_util.tree_map(jnp.copy, params)
    cfg = OptimConfig()
    tx = optim.build_optimizer(cfg)
    step = make_train_step(graphdef, tx)
    period = np.random.default_rng(0).integers(0, CFG.vocab_size, 24)
    corpus = np.tile(period, 40)
    opt_state = tx.init(params)
    losses = []
    for i in range(30):
        starts = (np.arange(4) * 7 + i * 5) % (corpus.size - 33)
        x = np.stack([corpus[s:s + 32] for s in starts])[None]
        y = np.stack([corpus[s + 1:s + 33] for s in starts])[None]
        params, opt_state, m = step(params, opt_state, x, y, jnp.float32(1.0), jnp.float32(schedules.muon_momentum(cfg, i)), None)
        losses.append(float(m["loss"]))
    assert np.isfinite(losses).all()
    assert losses[0] > np.log(CFG.vocab_size) - 0.3
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses


# ----------------------------------------------------------------------------- the fused transformations

FUSED_MODEL = ModelConfig(vocab_size=64, num_layers=2, model_dim=64, num_heads=4, num_kv_heads=2, compute_dtype="float32")
TOL = {"muon": {"float32": 1e-5, "bfloat16": 1e-2}, "adam": 1e-6}


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def _max_rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def fused_model():
    return nnx.split(GPT(FUSED_MODEL, rngs=nnx.Rngs(0), compute_dtype="float32"))


@pytest.mark.parametrize("ns_dtype", ["float32", "bfloat16"])
def test_100_steps_equal_the_unfused_chain(fused_model, ns_dtype):
    """100 training steps (schedule with warmdown, momentum warm-up, Adam bias correction at every count).
    Each step both optimizers update the same parameters with the same gradients (the unfused chain's
    trajectory), so the comparison measures the optimizers, not the chaotic growth of 1-ulp differences
    through the model; the optimizer states run on their own and are compared at the end."""
    graphdef, params = fused_model
    cfg = OptimConfig(muon_ns_dtype=ns_dtype, muon_momentum_warmup_steps=50, warmdown_steps=40, warmdown_mode="steps")
    tx_ref, tx_fused = optim.build_optimizer(cfg), optim.build_optimizer(dataclasses.replace(cfg, fused=True))
    assert isinstance(tx_ref, optim.Optimizer) and isinstance(tx_fused, optim.Optimizer)
    labels = jax.tree_util.tree_leaves(optim.param_labels(params))

    def loss(p, x, y):
        return jnp.mean(nnx.merge(graphdef, p)(x, y))

    @jax.jit
    def both(p, s_ref, s_fused, x, y, lr, mom):
        g = jax.grad(loss)(p, x, y)
        u, s_ref = tx_ref.update(g, s_ref, p, lr_scale=lr, momentum=mom)
        p_fused, s_fused = tx_fused.apply(g, s_fused, p, lr_scale=lr, momentum=mom)
        return optax.apply_updates(p, u), p_fused, s_ref, s_fused

    data = np.random.default_rng(0).integers(0, FUSED_MODEL.vocab_size, (100, 2, 33))
    p, s_ref, s_fused = params, tx_ref.init(params), tx_fused.init(params)
    worst = {"muon": 0.0, "adam": 0.0}
    for i in range(100):
        x, y = jnp.asarray(data[i, :, :-1]), jnp.asarray(data[i, :, 1:])
        lr, mom = schedules.lr_scale(cfg, i, 0.0, 1.0, 100), schedules.muon_momentum(cfg, i)
        p_new, p_fused, s_ref, s_fused = both(p, s_ref, s_fused, x, y, jnp.float32(lr), jnp.float32(mom))
        for lab, a, b in zip(labels, jax.tree_util.tree_leaves(p_fused), jax.tree_util.tree_leaves(p_new)):
            kind = "muon" if lab == "muon" else "adam"
            worst[kind] = max(worst[kind], _max_rel(a, b))
        p = p_new
    assert worst["adam"] <= TOL["adam"], worst
    assert worst["muon"] <= TOL["muon"][ns_dtype], worst
    assert lr < 0.05  # the schedule ran into the end of the warmdown
    # states: Adam moments and Muon buffers after 100 steps, and the Adam step count
    inner = s_ref.inner_states
    assert int(s_fused["scalar"].count) == int(inner["scalar"].inner_state[0].count) == 100
    ref_mu = [x for x in jax.tree_util.tree_leaves(inner["scalar"].inner_state[0].mu)]
    assert all(_max_rel(a, b) <= 1e-5 for a, b in zip(s_fused["scalar"].mu, ref_mu))
    ref_buf = jax.tree_util.tree_leaves(inner["muon"].inner_state[0].momentum_buffer)
    assert all(_max_rel(a, b) <= 1e-5 for a, b in zip(s_fused["muon"].momentum_buffer, ref_buf))


def test_schedule_changes_do_not_recompile(fused_model):
    graphdef, params = fused_model
    tx = optim.build_optimizer(OptimConfig(fused=True, muon_ns_dtype="float32"))
    traces = {"n": 0}
    inner = tx.apply

    def counted(*a, **k):
        traces["n"] += 1  # runs only while tracing: one trace per compilation
        return inner(*a, **k)

    step = make_train_step(graphdef, tx._replace(apply=counted), donate=False)
    x = jnp.zeros((1, 2, 16), jnp.int32)
    p, s = params, tx.init(params)
    for lr, mom in ((1.0, 0.85), (0.5, 0.9), (0.0, 0.95)):
        p, s, _ = step(p, s, x, x, jnp.float32(lr), jnp.float32(mom), None)
    assert traces["n"] == 1 and step._cache_size() == 1


def test_donation_updates_parameters_and_state_in_place(fused_model):
    """memory_analysis of the compiled fused step: every parameter and optimizer-state byte of the output
    aliases a donated input (only the metrics are fresh), the temporaries grow by at most about one copy
    of the parameters when donating (XLA:CPU copies the donated parameters once), and the optimised
    program copies no optimizer-state buffer."""
    graphdef, params = fused_model
    tx = optim.build_optimizer(OptimConfig(fused=True))
    state = tx.init(params)
    x = jnp.zeros((1, 1, 8), jnp.int32)
    args = (params, state, x, x, jnp.float32(1.0), jnp.float32(0.9), None)
    donated = make_train_step(graphdef, tx).lower(*args).compile()
    kept = make_train_step(graphdef, tx, donate=False).lower(*args).compile()
    md, mk = donated.memory_analysis(), kept.memory_analysis()
    state_b, params_b = _nbytes(state), _nbytes(params)
    assert md.alias_size_in_bytes >= params_b + state_b and mk.alias_size_in_bytes == 0
    assert md.output_size_in_bytes - md.alias_size_in_bytes < 1024  # loss + grad norm only
    # donating adds temporaries of at most one copy of the parameters (XLA:CPU copies donated parameters
    # that the step still reads after writing them) plus a little: never a second copy of the state
    assert md.temp_size_in_bytes - mk.temp_size_in_bytes < params_b + state_b // 4
    hlo = donated.as_text()
    assert not any(" copy(%opt_state" in line for line in hlo.splitlines())


def test_kernel_table_and_optax_protocol(fused_model):
    rows = {r.op: r for r in ops.configure("auto")}
    for op in ("adam_update", "muon_update"):
        assert rows[op].impl == "reference" and rows[op].reason == f"platform {jax.default_backend()}"
    _, params = fused_model
    tx = optim.build_optimizer(OptimConfig(fused=True, muon_ns_dtype="float32"))
    grads = jax.tree_util.tree_map(lambda q: jnp.full(q.shape, 0.01, q.dtype), params)
    state = tx.init(params)
    extra = dict(lr_scale=jnp.float32(1.0), momentum=jnp.float32(0.9))
    new_p, _ = tx.apply(grads, state, params, **extra)
    u, _ = tx.update(grads, state, params, **extra)  # optax protocol: updates = p' - p
    for a, b in zip(jax.tree_util.tree_leaves(optax.apply_updates(params, u)), jax.tree_util.tree_leaves(new_p)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- the record's settings

RECORD = dict(muon_weight_decay=0.04, adam_weight_decay=0.05, grad_clip_norm=0.3, muon_momentum_dtype="bfloat16",
              muon_shape_scale="lr", muon_ns_dtype="float32")
# one parameter of each kind a recipe model has, by its path (few matrices: the optimizer compiles in seconds):
# Muon matrices with shape scales sqrt(2) and sqrt(3) and 1, the embedding and a table (Adam "embed"), a projection,
# a scale and the block controls (Adam "scalar")
RECIPE_SHAPES = {"tok_emb": (64, 16), "bigram": {"embed": (16, 8), "proj": (8, 16), "scale": ()},
                 "blocks": [{"attn": {"c_q": (16, 32), "q_gain": (4,)}, "mlp": {"fc": (16, 48), "proj": (48, 16)},
                             "resid_mix": (2, 16)}], "skip_weights": (1, 16)}


@pytest.fixture(scope="module")
def recipe_params():
    shapes = jax.tree_util.tree_leaves(RECIPE_SHAPES, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(jax.random.PRNGKey(1), len(shapes))
    leaves = [0.5 * jax.random.normal(k, sh, jnp.float32) for k, sh in zip(keys, shapes)]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(RECIPE_SHAPES, is_leaf=lambda x: isinstance(x, tuple)),
                                        leaves)


def _applier(tx):
    """tx.apply jitted once (lr scale a runtime argument): apply(grads, state, params, lr) -> (params', state')."""
    step = jax.jit(lambda g, s, p, lr: tx.apply(g, s, p, lr_scale=lr, momentum=jnp.float32(0.9)))
    return lambda g, s, p, lr: step(g, s, p, jnp.float32(lr))


def _group_lr(cfg: OptimConfig, label: str) -> float:
    return {"muon": cfg.matrix_lr, "embed": cfg.embed_lr, "scalar": cfg.scalar_lr, "ngram": cfg.ngram_lr}[label]


@pytest.mark.parametrize("fused", [False, True])
def test_weight_decay_is_decoupled_and_scheduled(recipe_params, fused):
    """Muon and Adam alike, unfused and fused: at lr scale 0 the step changes nothing (whatever the gradient);
    with a zero gradient every parameter shrinks by exactly 1 - lr wd, lr the group's scheduled learning rate."""
    cfg = OptimConfig(fused=fused, **RECORD)
    tx = optim.build_optimizer(cfg)
    params, state = recipe_params, tx.init(recipe_params)
    noise = jax.tree_util.tree_map(lambda p: jax.random.normal(jax.random.PRNGKey(2), p.shape, p.dtype), params)
    apply = _applier(tx)
    frozen, _ = apply(noise, state, params, 0.0)
    for a, b in zip(jax.tree_util.tree_leaves(frozen), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    shrunk, _ = apply(jax.tree_util.tree_map(jnp.zeros_like, params), state, params, 0.5)
    labels = jax.tree_util.tree_leaves(optim.param_labels(params))
    assert set(labels) == {"muon", "embed", "scalar"}
    for lab, a, b in zip(labels, jax.tree_util.tree_leaves(shrunk), jax.tree_util.tree_leaves(params)):
        wd = cfg.muon_weight_decay if lab == "muon" else cfg.adam_weight_decay
        np.testing.assert_allclose(np.asarray(a), np.asarray(b) * (1 - 0.5 * _group_lr(cfg, lab) * wd), rtol=1e-6)


def test_clipping_bounds_the_global_norm(recipe_params):
    """torch's clip_grad_norm_: above the bound the whole gradient is scaled to norm c * n / (n + 1e-6) <= c (one
    factor for every parameter), below it nothing changes; the optimizer updates with the clipped gradient."""
    grads = jax.tree_util.tree_map(lambda p: jax.random.normal(jax.random.PRNGKey(4), p.shape, p.dtype), recipe_params)
    n = float(optax.tree.norm(grads))
    assert n > 0.3
    clipped = optim.clip_by_global_norm(grads, 0.3)
    assert float(optax.tree.norm(clipped)) <= 0.3 * (1 + 1e-6)  # (fp32)
    np.testing.assert_allclose(float(optax.tree.norm(clipped)), 0.3 * n / (n + 1e-6), rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(clipped), jax.tree_util.tree_leaves(grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b) * 0.3 / (n + 1e-6), rtol=1e-6)
    same = optim.clip_by_global_norm(grads, 2 * n)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(same), jax.tree_util.tree_leaves(grads)))
    tx, plain = optim.build_optimizer(OptimConfig(**RECORD)), optim.build_optimizer(
        OptimConfig(**{**RECORD, "grad_clip_norm": 0.0}))
    a, _ = _applier(tx)(grads, tx.init(recipe_params), recipe_params, 1.0)
    b, _ = _applier(plain)(clipped, plain.init(recipe_params), recipe_params, 1.0)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_ema_after_k_steps_is_its_closed_form_and_swa_sums_its_snapshots(recipe_params):
    """ema_k = d^k p_0 + (1 - d) sum_i d^(k - i) p_i over the parameters after each update (fp32, from the initial
    weights); SWA sums the weights after the steps whose number is a multiple of swa_every and whose lr scale is
    below the threshold; `final_params` is the EMA cast to the parameters' dtypes."""
    d, k = 0.9, 6
    tx = optim.build_optimizer(OptimConfig(ema_decay=d, swa_every=2, swa_threshold=0.5, **RECORD))
    params, state, apply = recipe_params, tx.init(recipe_params), _applier(tx)
    seen, scales = [params], [1.0, 0.8, 0.6, 0.4, 0.4, 0.2]
    for i, lr in enumerate(scales):
        grads = jax.tree_util.tree_map(lambda p: jax.random.normal(jax.random.PRNGKey(10 + i), p.shape, p.dtype), params)
        params, state = apply(grads, state, params, lr)
        seen.append(params)
    leaves = [jax.tree_util.tree_leaves(p) for p in seen]
    want = [d ** k * np.asarray(x0, np.float64) for x0 in leaves[0]]
    for i in range(1, k + 1):
        want = [w + (1 - d) * d ** (k - i) * np.asarray(x, np.float64) for w, x in zip(want, leaves[i])]
    for e, w in zip(jax.tree_util.tree_leaves(state.ema), want):
        np.testing.assert_allclose(np.asarray(e), w, rtol=2e-5, atol=1e-6)
    # steps 4 and 6 (scales 0.4, 0.2 < 0.5); step 2 (scale 0.8) is not taken
    assert int(state.swa.count) == 2 and int(state.swa.step) == k
    for t, a, b in zip(jax.tree_util.tree_leaves(state.swa.total), leaves[4], leaves[6]):
        np.testing.assert_allclose(np.asarray(t), np.asarray(a) + np.asarray(b), rtol=1e-6)
    final = optim.final_params(params, state)
    for f, e in zip(jax.tree_util.tree_leaves(final), jax.tree_util.tree_leaves(state.ema)):
        np.testing.assert_array_equal(np.asarray(f), np.asarray(e))
    assert optim.final_params(params, optim.build_optimizer(OptimConfig()).init(params)) is params


@pytest.mark.parametrize("ns_dtype", ["float32", "bfloat16"])
def test_record_settings_fused_equal_the_unfused_chain(recipe_params, ns_dtype):
    """The record's settings (weight decay, clipping, bf16 momentum, the shape scale in the lr, EMA) through the
    fused updates and the optax chain: the same parameters, buffers and EMA over 20 steps of the same gradients."""
    cfg = OptimConfig(ema_decay=0.997, **{**RECORD, "muon_ns_dtype": ns_dtype})
    tx_ref, tx_fused = optim.build_optimizer(cfg), optim.build_optimizer(dataclasses.replace(cfg, fused=True))
    p, s_ref, s_fused = recipe_params, tx_ref.init(recipe_params), tx_fused.init(recipe_params)
    both = jax.jit(lambda g, a, b, p, lr: (tx_ref.apply(g, a, p, lr_scale=lr, momentum=jnp.float32(0.93)),
                                           tx_fused.apply(g, b, p, lr_scale=lr, momentum=jnp.float32(0.93))))
    labels = jax.tree_util.tree_leaves(optim.param_labels(p))
    worst = {"muon": 0.0, "adam": 0.0}
    for i in range(20):
        g = jax.tree_util.tree_map(lambda q: jax.random.normal(jax.random.PRNGKey(100 + i), q.shape, q.dtype), p)
        (p_ref, s_ref), (p_fused, s_fused) = both(g, s_ref, s_fused, p, jnp.float32(1.0 - i / 20))
        for lab, a, b in zip(labels, jax.tree_util.tree_leaves(p_fused), jax.tree_util.tree_leaves(p_ref)):
            kind = "muon" if lab == "muon" else "adam"
            worst[kind] = max(worst[kind], _max_rel(a, b))
        p = p_ref
    assert worst["adam"] <= TOL["adam"] and worst["muon"] <= TOL["muon"][ns_dtype], worst
    for a, b in zip(jax.tree_util.tree_leaves(s_fused.ema), jax.tree_util.tree_leaves(s_ref.ema)):
        assert _max_rel(a, b) <= 1e-5
    assert all(b.dtype == jnp.bfloat16 for b in s_fused.inner["muon"].momentum_buffer)


# ----------------------------------------------------------------------------- the record's banked Muon in torch

# the record's four banks at a small width ([n, out, in], PyTorch orientation): qo [2L, D, D], kv [2L, G K, D],
# mlp_up [L, F, D] (tall: shape scale sqrt(3)), mlp_down [L, D, F]
BANKS = {"qo": (4, 64, 64), "kv": (4, 32, 64), "mlp_up": (2, 192, 64), "mlp_down": (2, 64, 192)}


def _torch_bank_muon_step(torch, p_NOI, grad_NOI, buf_NOI, lr: float, momentum: float, wd: float):
    """The record's Parallel Muon step on one bank at world size 1, written from its definition (train_gpt.py:
    104-123 and 226-253): the gradient rounded to bf16, buf = buf * momentum + g in bf16, Nesterov g + momentum buf
    (one rounding to bf16, alpha in fp32 as torch's CUDA add computes it; its CPU kernel rounds alpha to bf16
    first), Newton-Schulz batched over the bank in bf16 (each matrix normalised by its own Frobenius norm, tall
    ones transposed), then p *= 1 - lr wd and p -= lr sqrt(max(1, out / in)) update. In place."""
    a, b, c = reference.NS_COEFFS
    g = grad_NOI.bfloat16()
    buf_NOI.mul_(momentum).add_(g)
    x = (g.float() + momentum * buf_NOI.float()).bfloat16()
    tall = x.size(-2) > x.size(-1)
    x = x.mT if tall else x
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + reference.NS_EPS)
    for _ in range(5):
        a_NRR = x @ x.mT
        x = a * x + (b * a_NRR + c * (a_NRR @ a_NRR)) @ x
    update = x.mT if tall else x
    p_NOI.mul_(1 - lr * wd)
    p_NOI.add_(update.to(p_NOI.dtype), alpha=-lr * max(1, p_NOI.shape[-2] / p_NOI.shape[-1]) ** 0.5)


def test_the_records_banked_muon_is_this_per_matrix_muon():
    """Parallel Muon on one process is per-matrix Muon: three steps of the record's bank update (torch, bf16
    gradient, momentum and Newton-Schulz, the shape scale in the lr, decoupled weight decay) equal, bank by bank,
    the same steps of each bank's matrices updated one by one in torch, and of frontier_jax's unfused Muon on the
    unbanked matrices ([in, out], optim.muon_momentum_dtype="bfloat16", muon_shape_scale="lr",
    muon_weight_decay): the bf16 momentum buffers bit for bit, and the updates to fp32 rounding in most matrices; a
    bf16 product rounded one ulp apart (XLA's dot against torch's) spreads through Newton-Schulz to about 1e-3
    of a few matrices' updates."""
    torch = pytest.importorskip("torch")
    cfg = OptimConfig(muon_weight_decay=0.04, muon_momentum_dtype="bfloat16", muon_shape_scale="lr",
                      muon_ns_dtype="bfloat16")
    rng = np.random.default_rng(0)
    p0 = {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in BANKS.items()}
    unbank = lambda banks: {"blocks": [{"mlp": {"fc": [jnp.asarray(m.T) for k in BANKS for m in banks[k]]}}]}
    tx = optim.build_optimizer(cfg)
    params = unbank(p0)
    assert set(jax.tree_util.tree_leaves(optim.param_labels(params))) == {"muon"}
    state = tx.init(params)
    step = jax.jit(lambda g, s, p, lr, m: tx.apply(g, s, p, lr_scale=lr, momentum=m))
    banks = {k: torch.from_numpy(v.copy()) for k, v in p0.items()}
    bufs = {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in BANKS.items()}
    single = {k: [torch.from_numpy(m.copy()) for m in v] for k, v in p0.items()}
    single_bufs = {k: [torch.zeros(s[1:], dtype=torch.bfloat16) for _ in range(s[0])] for k, s in BANKS.items()}
    for scale, mom in ((1.0, 0.92), (0.8, 0.95), (0.5, 0.99)):
        g = {k: rng.standard_normal(s).astype(np.float32) for k, s in BANKS.items()}
        lr = cfg.matrix_lr * scale
        for k in BANKS:
            _torch_bank_muon_step(torch, banks[k], torch.from_numpy(g[k]), bufs[k], lr, mom, cfg.muon_weight_decay)
            for i in range(BANKS[k][0]):
                _torch_bank_muon_step(torch, single[k][i], torch.from_numpy(g[k][i]), single_bufs[k][i], lr, mom,
                                      cfg.muon_weight_decay)
        params, state = step(unbank(g), state, params, jnp.float32(scale), jnp.float32(mom))
    for k in BANKS:  # batched Newton-Schulz over a bank = the matrices one by one
        assert torch.equal(banks[k], torch.stack(single[k])) and torch.equal(bufs[k], torch.stack(single_bufs[k]))
    ours = [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]
    ours_buf = jax.tree_util.tree_leaves(state.inner_states["muon"].inner_state[0].momentum_buffer)
    theirs = [m.T for k in BANKS for m in banks[k].numpy()]
    theirs_buf = [m.T for k in BANKS for m in bufs[k].float().numpy()]
    start = [m.T for k in BANKS for m in p0[k]]
    assert all(b.dtype == jnp.bfloat16 for b in ours_buf)
    for a, b in zip(ours_buf, theirs_buf):
        np.testing.assert_array_equal(np.asarray(a, np.float32), b)
    rel = [np.linalg.norm((o - z) - (t - z)) / np.linalg.norm(t - z) for o, t, z in zip(ours, theirs, start)]
    assert np.median(rel) <= 1e-5 and max(rel) <= 1e-2, rel
