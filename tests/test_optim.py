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
