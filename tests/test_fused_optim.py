"""Fused Adam/Muon transformations (frontier_jax.optim, optim.fused=True) vs the unfused optax chain, no
recompiles, donation, one `apply` for both kinds."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from frontier_jax import ops, optim
from frontier_jax import run_policy as policy
from frontier_jax.config import ModelConfig, OptimConfig
from frontier_jax.model import GPT
from frontier_jax.steps import make_train_step

MODEL = ModelConfig(vocab_size=64, num_layers=2, model_dim=64, num_heads=4, num_kv_heads=2, compute_dtype="float32")
TOL = {"muon": {"float32": 1e-5, "bfloat16": 1e-2}, "adam": 1e-6}


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def _max_rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def model():
    return nnx.split(GPT(MODEL, rngs=nnx.Rngs(0), compute_dtype="float32"))


@pytest.mark.parametrize("ns_dtype", ["float32", "bfloat16"])
def test_100_steps_equal_the_unfused_chain(model, ns_dtype):
    """100 training steps (schedule with warmdown, momentum warm-up, Adam bias correction at every count).
    Each step both optimizers update the same parameters with the same gradients (the unfused chain's
    trajectory), so the comparison measures the optimizers, not the chaotic growth of 1-ulp differences
    through the model; the optimizer states run on their own and are compared at the end."""
    graphdef, params = model
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

    data = np.random.default_rng(0).integers(0, MODEL.vocab_size, (100, 2, 33))
    p, s_ref, s_fused = params, tx_ref.init(params), tx_fused.init(params)
    worst = {"muon": 0.0, "adam": 0.0}
    for i in range(100):
        x, y = jnp.asarray(data[i, :, :-1]), jnp.asarray(data[i, :, 1:])
        lr, mom = policy.lr_scale(cfg, i, 0.0, 1.0, 100), policy.muon_momentum(cfg, i)
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


def test_schedule_changes_do_not_recompile(model):
    graphdef, params = model
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


def test_donation_updates_parameters_and_state_in_place(model):
    """memory_analysis of the compiled fused step: every parameter and optimizer-state byte of the output
    aliases a donated input (only the metrics are fresh), the temporaries grow by at most about one copy
    of the parameters when donating (XLA:CPU copies the donated parameters once), and the optimised
    program copies no optimizer-state buffer."""
    graphdef, params = model
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


def test_kernel_table_and_optax_protocol(model):
    rows = {r.op: r for r in ops.configure("auto")}
    for op in ("adam_update", "muon_update"):
        assert rows[op].impl == "reference" and rows[op].reason == f"platform {jax.default_backend()}"
    _, params = model
    tx = optim.build_optimizer(OptimConfig(fused=True, muon_ns_dtype="float32"))
    grads = jax.tree_util.tree_map(lambda q: jnp.full(q.shape, 0.01, q.dtype), params)
    state = tx.init(params)
    extra = dict(lr_scale=jnp.float32(1.0), momentum=jnp.float32(0.9))
    new_p, _ = tx.apply(grads, state, params, **extra)
    u, _ = tx.update(grads, state, params, **extra)  # optax protocol: updates = p' - p
    for a, b in zip(jax.tree_util.tree_leaves(optax.apply_updates(params, u)), jax.tree_util.tree_leaves(new_p)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
