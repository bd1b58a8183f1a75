"""The dispatch layer: kernel table, strict mode, primitives, and the tiny model trained through the emulated kernel."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from frontier_jax import ops
from frontier_jax.ops import reference as ref
from frontier_jax.config import apply_overrides, load_config
from kernels_nki import registry

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _restore_auto():
    yield
    ops.configure("auto")


EXPERIMENTAL = [op for op, k in registry.KERNELS.items() if k.experimental]


def test_default_table_on_cpu_is_reference_for_every_op_with_reason():
    rows = ops.configure("auto")
    assert [r.op for r in rows] == list(ops.OPS) + EXPERIMENTAL and rows == ops.kernel_table()
    reasons = {r.op: (r.impl, r.reason) for r in rows}
    # every production op has a kernel
    assert all(reasons[op] == ("reference", f"platform {jax.default_backend()}") for op in ops.OPS)
    json.dumps([dataclasses.asdict(r) for r in rows])  # written to the run directory
    text = ops.format_kernel_table(rows)
    assert all(f"{r.op}" in text and r.reason in text for r in rows)
    # a CPU run's log: one line, the unused ops and Neuron's kernels counted (kernels.json has every row)
    line = ops.run_log_table(rows, "cpu")
    assert "\n" not in line and f"the {len(ops.OPS)} ops this run calls" in line and f"{len(EXPERIMENTAL)} it does" in line
    assert ops.run_log_table(rows, "neuron") == text


def test_experimental_kernels_are_listed_unused_with_the_reason():
    """No production op calls rope, rope_gain, causal_attention or norm_projection (the model runs their work
    inside qk_attention / mix_norm_projection): the table lists them unused whether or not
    frontier_jax.ops.experimental declared them, and strict mode does not require their kernels."""
    assert EXPERIMENTAL == ["rope", "rope_gain", "causal_attention", "norm_projection"]
    assert not set(EXPERIMENTAL) & set(ops.OPS)
    rows = {r.op: r for r in ops.configure("auto")}
    assert {op for op, r in rows.items() if r.impl == "unused"} == set(EXPERIMENTAL)
    assert rows["rope"].reason == "experimental: the model runs it fused, inside qk_attention"
    assert rows["norm_projection"].reason.startswith(
        "experimental: the model runs it fused, inside mix_norm_projection")
    with pytest.raises(ops.KernelUnavailableError) as info:
        ops.configure("strict")
    named = re.findall(r"(?:for |, )(\w+) \(", str(info.value))
    assert named == list(ops.OPS) and not set(named) & set(EXPERIMENTAL)


def test_the_production_path_imports_no_experimental_op():
    """Training and evaluation never import frontier_jax.ops.experimental; the table still lists its kernels."""
    code = ("import sys; from frontier_jax import evaluate, ops, trainer; rows = ops.configure('auto'); "
            "print(any(m.startswith('frontier_jax.ops.experimental') for m in sys.modules), "
            "[r.op for r in rows if r.impl == 'unused'])")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split(None, 1) == ["False", f"{EXPERIMENTAL}\n"]


def test_a_training_run_marks_the_fused_updates_unused_when_the_optax_chain_runs():
    """With optim.fused off a run never calls the fused updates: unused with the reason, not required in strict mode."""
    rows = {r.op: r for r in ops.configure("auto", unused=ops.unused_ops(False))}
    assert {op for op, r in rows.items() if r.impl == "unused"} == set(EXPERIMENTAL) | ops.FUSED_OPTIMIZER_OPS
    assert rows["adam_update"].reason == "optim.fused=False (the optax chain runs)"
    assert ops.unused_ops(True) == frozenset() and rows["qk_attention"].impl == "reference"
    with pytest.raises(ops.KernelUnavailableError) as info:
        ops.configure("strict", unused=ops.unused_ops(False))
    assert "adam_update" not in str(info.value) and "qk_attention (platform" in str(info.value)


def test_strict_refuses_naming_every_op():
    with pytest.raises(ops.KernelUnavailableError) as info:
        ops.configure("strict")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("strict kernels: no NKI kernel will run for ")
    assert all(f"{op} (platform {jax.default_backend()})" in msg for op in ops.OPS)


def test_neuron_platform_without_the_sdk_falls_back_visibly():
    rows = ops.configure("auto", platform="neuron")
    row = rows[0]
    assert row.op == "rms_norm" and row.impl == "reference"
    assert "kernel unavailable" in row.reason and "nki" in row.reason
    with pytest.raises(ops.KernelUnavailableError, match=r"rms_norm \(kernel unavailable"):
        ops.configure("strict", platform="neuron")


def test_reference_mode_and_bad_mode():
    assert ops.configure("reference")[0] == ops.KernelRow("rms_norm", "reference", "kernels=reference")
    with pytest.raises(ValueError, match="auto|reference|strict"):
        ops.configure("fast")


def test_emulated_context_is_visible_and_scoped():
    with ops.emulated(["rms_norm"]) as rows:
        assert rows[0].impl == "emulated" and ops.kernel_table()[0].impl == "emulated"
        assert all(r.impl == "reference" for r in rows[1:len(ops.OPS)])
        with pytest.raises(ops.KernelUnavailableError, match=r"rms_norm \(NumPy emulator"):
            ops.configure("strict")
    assert ops.kernel_table()[0].impl == "reference"
    with pytest.raises(ValueError, match="not_an_op has no NKI kernel"):
        with ops.emulated(["not_an_op"]):
            pass


def test_rms_norm_binds_its_primitives_and_matches_reference():
    x = jax.random.normal(jax.random.key(0), (3, 50, 96))
    f = lambda op: lambda x: jnp.sum(jnp.sin(op(x)))
    with ops.through_primitives():
        jaxpr = str(jax.make_jaxpr(jax.grad(f(ops.rms_norm)))(x))
        g_prim = jax.jit(jax.grad(f(ops.rms_norm)))(x)
    assert "frontier_rms_norm_fwd" not in str(jax.make_jaxpr(jax.grad(f(ops.rms_norm)))(x))  # direct reference
    np.testing.assert_allclose(g_prim, jax.jit(jax.grad(f(ref.rms_norm)))(x), rtol=1e-5, atol=1e-5)
    assert "frontier_rms_norm_fwd[kernel=False]" in jaxpr and "frontier_rms_norm_bwd[kernel=False]" in jaxpr
    np.testing.assert_array_equal(ops.rms_norm(x), ref.rms_norm(x))  # eager impl, same math
    g, g_ref = jax.jit(jax.grad(f(ops.rms_norm)))(x), jax.jit(jax.grad(f(ref.rms_norm)))(x)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)
    xb = x.astype(jnp.bfloat16)
    assert ops.rms_norm(xb).dtype == jnp.bfloat16 and jax.grad(f(ops.rms_norm))(xb).dtype == jnp.bfloat16


def _train_three_steps(cfg):
    """(losses of 3 steps, the first step's gradients) of the tiny model on fixed random batches."""
    from frontier_jax import optim
    from frontier_jax.model import GPT

    graphdef, params = nnx.split(GPT(cfg.model, rngs=nnx.Rngs(0), compute_dtype=cfg.model.compute_dtype))
    tx = optim.build_optimizer(cfg.optim)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x_BT, y_BT):
        loss_fn = lambda p: jnp.mean(nnx.merge(graphdef, p)(x_BT, y_BT))
        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = tx.apply(grads, opt_state, params, lr_scale=1.0, momentum=0.95)
        return params, opt_state, loss, grads

    rng = np.random.default_rng(0)
    losses, first_grads = [], None
    for _ in range(3):
        tokens = rng.integers(0, cfg.model.vocab_size, size=(2, cfg.train.seq_len + 1), dtype=np.int32)
        params, opt_state, loss, grads = step(params, opt_state, tokens[:, :-1], tokens[:, 1:])
        losses.append(float(loss))
        first_grads = grads if first_grads is None else first_grads
    return losses, first_grads


def _assert_same_training(run_ref, run_emu):
    """Kernels vs reference through training: one step's gradients (same parameters, so only the ops
    differ) and the loss trajectory. Parameters after several Muon steps are not compared: Newton-Schulz
    amplifies summation-order differences (1.9e-4 after 3 steps was seen), so they test NS, not the ops."""
    (losses_ref, grads_ref), (losses_emu, grads_emu) = run_ref, run_emu
    assert losses_ref[2] != losses_ref[0]  # it trained
    np.testing.assert_allclose(losses_emu, losses_ref, rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(grads_emu), jax.tree_util.tree_leaves(grads_ref)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(float(np.abs(b).max()), 1e-6))


@pytest.fixture
def _fast_compile():
    prev = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", prev)


def _tiny_cfg(*extra):
    return apply_overrides(load_config(REPO / "configs" / "tiny.py"), [
        "model.vocab_size=256", "model.num_layers=2", "model.model_dim=64", "model.num_heads=4",
        "model.num_kv_heads=2", "model.compute_dtype='float32'", "train.seq_len=32",
        "optim.muon_ns_dtype='float32'", *extra])


def test_tiny_model_three_steps_emulated_rms_norm_matches_reference(_fast_compile):
    cfg = _tiny_cfg()
    ops.configure("auto")
    run_ref = _train_three_steps(cfg)
    with ops.emulated(["rms_norm"]):
        run_emu = _train_three_steps(cfg)
    _assert_same_training(run_ref, run_emu)


@pytest.mark.parametrize("op", ["norm_mlp", "embed", "head_loss", "mix_norm_projection", "projection"])
def test_model_ops_bind_their_primitives(op):
    """Each op is a custom_vjp over frontier_<op>_fwd/_bwd; on CPU the primitives lower to the reference."""
    k = jax.random.key(0)
    x = jax.random.normal(k, (40, 16))
    fns = {
        "norm_mlp": lambda x: ops.norm_mlp(x, jnp.ones((16, 24)) / 8, jnp.ones((24, 16)) / 8, 1.5 - x[0] / 4),
        "projection": lambda x: ops.out_projection(x ** 2, jnp.ones((16, 16)) / 8, x, 1.5 - x[1] / 4),
        "mix_norm_projection": lambda x: jnp.concatenate(ops.mix_norm_qkv_projection(
            x, jnp.cos(x), jnp.ones((2, 16)) / 2, jnp.ones((16, 8)) / 8, jnp.ones((16, 4)) / 4, jnp.ones((16, 4)) / 2,
            jnp.sin(x), jnp.full((16,), 0.7)), axis=-1),
        "embed": lambda x: ops.embed(jnp.arange(40) % 7, x),
        "head_loss": lambda x: ops.head_loss(x, jnp.ones((32, 16)) / 4, jnp.arange(40) % 32, 30.0),
    }
    f = lambda x: jnp.sum(jnp.sin(fns[op](x)))
    with ops.through_primitives():
        jaxpr = str(jax.make_jaxpr(jax.grad(f))(x))
        g_prim = jax.jit(jax.grad(f))(x)
    assert f"frontier_{op}_fwd[" in jaxpr and f"frontier_{op}_bwd[" in jaxpr
    # vs the direct reference; with a residual scale the primitives fold it into the weight (ops._fold): fp32
    # products rounded in another order
    atol = 1e-5 if op in ("norm_mlp", "projection") else 1e-6
    np.testing.assert_allclose(g_prim, jax.jit(jax.grad(f))(x), rtol=1e-5, atol=atol)


def test_tiny_model_three_steps_every_op_emulated_matches_reference(_fast_compile):
    """Integration: every op (the six model ops and the fused optimizer updates) routed through the
    emulated NKI source, trained 3 steps: the first step's gradients and the losses match the reference."""
    cfg = _tiny_cfg("optim.fused=True")
    ops.configure("auto")
    run_ref = _train_three_steps(cfg)
    with ops.emulated(ops.OPS) as rows:
        assert [r.op for r in rows if r.impl == "emulated"] == list(ops.OPS)
        run_emu = _train_three_steps(cfg)
    _assert_same_training(run_ref, run_emu)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mix_norm_qkv_projection_direct_path_is_the_unfused_model(dtype):
    """On the reference path ops.mix_norm_qkv_projection computes exactly what the unfused block did (the skip
    add, resid_mix in the compute dtype, then rms_norm and the three projections): values and gradients bit
    for bit."""
    dt = jnp.dtype(dtype)
    k = jax.random.split(jax.random.key(3), 8)
    x_in, x0, skip = (jax.random.normal(k[i], (2, 24, 32)).astype(dt) for i in range(3))
    mix, sw = 1 + jax.random.normal(k[3], (2, 32)) / 4, 1 + jax.random.normal(k[4], (32,)) / 4
    wq, wk, wv = (jax.random.normal(k[5 + i], (32, o)) / 6 for i, o in enumerate((32, 16, 16)))

    def unfused(x_in, x0, mix, wq, wk, wv, skip=None, sw=None):
        if skip is not None:
            x_in = x_in + sw.astype(x_in.dtype) * skip
        m = mix.astype(x_in.dtype)
        x = m[0] * x_in + m[1] * x0
        xn = ref.rms_norm(x)
        return (x, *(xn @ w.astype(x.dtype) for w in (wq, wk, wv)))

    def run(fn, *skip):
        loss = lambda *a: sum(jnp.sum(jnp.sin(t.astype(jnp.float32))) for t in fn(*a))
        return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(6 + len(skip)))))(x_in, x0, mix, wq, wk, wv, *skip)

    ops.configure("auto")
    assert ops.kernel_table()[ops.OPS.index("mix_norm_projection")].impl == "reference"
    for skip in ((), (skip, sw)):
        got, want = run(ops.mix_norm_qkv_projection, *skip), run(unfused, *skip)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            assert g.dtype == w.dtype and np.array_equal(np.asarray(g), np.asarray(w))


def test_attention_forward_choice_is_made_on_the_host_from_the_score_bound():
    """The bounded-shift forward while sqrt(K) |g| (1 + 2^-5) <= SHIFT_LIMIT and T <= SHIFT_MAX_T, the
    exact-max one otherwise; the choice is a trace-time constant (`attention_forward`), so the traced
    program has no cond, and the primitive's `exact_max` parameter says which kernel it calls."""
    limit = ops.SHIFT_LIMIT / (64 ** 0.5 * ops.SHIFT_MARGIN)
    at_limit = float(ops.score_bound([jnp.asarray([1.5, -limit])], 64))
    assert ops.attention_forward_kind(at_limit, 1024).startswith("bounded shift")
    assert ops.bounded_shift_valid(at_limit, 1024)
    assert not ops.bounded_shift_valid(float(ops.score_bound([jnp.asarray([1.5, -1.01 * limit])], 64)), 1024)
    assert ops.attention_forward_kind(at_limit, ops.SHIFT_MAX_T + 1).startswith("exact max")
    T, H, G, K = 8, 2, 1, 16
    cos, sin = ref.rope_tables(T, K, 10000.0)
    args = (jnp.ones((1, T, H, K)), jnp.ones((1, T, G, K)), jnp.ones((1, T, G, K)), cos, sin, jnp.ones((H,)))
    for exact in (False, True):
        with ops.kernel_primitives():
            def f(*a):
                with ops.attention_forward(exact):
                    return ops.qk_attention(*a)
            jaxpr = str(jax.make_jaxpr(f)(*args))
        assert f"exact_max={exact}" in jaxpr and "cond[" not in jaxpr


# ----------------------------------------------------------------------------- the recipe's switches


def _recipe_model(**kw):
    from frontier_jax.config import ModelConfig

    return ModelConfig(**{**dict(num_layers=2, model_dim=64, num_heads=2, num_kv_heads=1, mlp_negative_slope=0.5,
                                 rope_dims=16, ln_scale=True, xsa_last_n=1), **kw})


def test_a_switch_no_kernel_computes_is_a_reference_row_naming_it_and_fails_strict():
    """The kernel table for the run's model: norm_mlp's kernel computes LeakyReLU(slope)^2 for slopes >= 0 only, so
    a model with a negative slope shows it as reference with the setting named, on every platform and even where
    the kernel would be emulated; strict mode fails naming it; the baseline's and the record's models (slopes 0 and
    0.5, partial RoPE, LN scale, XSA) have no such row."""
    m = _recipe_model(mlp_negative_slope=-0.25)
    why = ("model.mlp_negative_slope=-0.25: the kernel reads the activation's sign off the stored LeakyReLU(h), "
           "which needs a slope >= 0")
    assert ops.switch_fallbacks(None) == [] and ops.switch_fallbacks(_recipe_model(mlp_negative_slope=0.0)) == []
    assert ops.switch_fallbacks(_recipe_model()) == []
    assert ops.switch_fallbacks(m) == [ops.KernelRow("norm_mlp", "reference", why)]
    for platform in (None, "neuron"):
        rows = {r.op: r for r in ops.configure("auto", platform=platform, model=m)}
        assert rows["norm_mlp"] == ops.KernelRow("norm_mlp", "reference", why)
        assert rows["qk_attention"].reason != why  # partial RoPE, LN scale and XSA run with the kernels
        with pytest.raises(ops.KernelUnavailableError, match=re.escape(f"norm_mlp ({why})")):
            ops.configure("strict", platform=platform, model=m)
    ops.configure("auto", model=m)
    with ops.emulated(["norm_mlp", "rms_norm"]) as rows:
        assert {r.op: r.impl for r in rows}["norm_mlp"] == "reference" and rows[0].impl == "emulated"
    assert ops.kernel_table()[ops.OPS.index("norm_mlp")].reason == why  # the model survives re-configuring


def test_a_switched_call_where_the_table_says_kernel_is_an_error_never_a_silent_reference():
    x, w_fc, w_proj, s = jnp.ones((4, 16)), jnp.ones((16, 24)) / 8, jnp.ones((24, 16)) / 8, jnp.ones((16,))
    ops.configure("auto")  # a table for the baseline's model
    with ops.emulated(["norm_mlp"]):
        with pytest.raises(ops.dispatch.SwitchNotConfiguredError, match="negative_slope=-0.25"):
            ops.norm_mlp(x, w_fc, w_proj, s, negative_slope=-0.25)
    np.testing.assert_array_equal(ops.norm_mlp(x, w_fc, w_proj, s, negative_slope=-0.25),  # a reference row: fine
                                  ops._norm_mlp_reference(x, w_fc, w_proj, s, negative_slope=-0.25))


def _recipe_op_cases():
    """op name -> (function of x, the kernel-path adapter it exercises)."""
    T, H, G, K = 16, 4, 2, 32
    cos, sin = ref.rope_tables(T, 12, 10000.0)  # partial RoPE on 12 of 32 head dims
    gain = jnp.asarray([0.5, 1.0, 1.5, 2.0])
    w = lambda i, *shape: jax.random.normal(jax.random.key(i), shape) / 6

    def attention(x):
        q, k, v = x[..., :H * K].reshape(2, T, H, K), x[..., :G * K].reshape(2, T, G, K), jnp.cos(x[..., :G * K])
        return ops.qk_attention(q, k, v.reshape(2, T, G, K), cos, sin, gain, xsa=True)

    return {
        "qk_attention": attention,
        "mix_norm_projection": lambda x: jnp.concatenate(ops.mix_norm_qkv_projection(
            x, jnp.cos(x), 1 + w(1, 2, 128), w(2, 128, 64), w(3, 128, 32), w(4, 128, 32), jnp.sin(x),
            jnp.full((128,), 0.7), ln_scale=1 / np.sqrt(3)), axis=-1),
        "norm_mlp": lambda x: ops.norm_mlp(x, w(5, 128, 96), w(6, 96, 128), 1.5 - x[0, 0] / 4, ln_scale=0.5,
                                            negative_slope=0.5),
    }


@pytest.mark.parametrize("op", ["qk_attention", "mix_norm_projection", "norm_mlp"])
def test_the_kernel_paths_compute_the_switches_they_adapt_exactly(op):
    """Partial RoPE (head dims permuted for the whole-head rotation, cos 1 / sin 0 past R/2) with XSA on the
    attention's output, and the LN-scale factor folded into the first weight: the kernel path (its primitives,
    lowered to the kernels' references) equals the direct reference in values and gradients."""
    x = jax.random.normal(jax.random.key(0), (2, 16, 128))
    op_fn = _recipe_op_cases()[op]
    f = lambda x: jnp.sum(jnp.sin(op_fn(x)))
    ops.configure("auto")
    with ops.through_primitives():
        jaxpr = str(jax.make_jaxpr(jax.grad(f))(x))
        y_prim, g_prim = jax.jit(op_fn)(x), jax.jit(jax.grad(f))(x)
    assert f"frontier_{op}_fwd[" in jaxpr  # the kernel path ran
    y_ref, g_ref = jax.jit(op_fn)(x), jax.jit(jax.grad(f))(x)
    assert "frontier_" not in str(jax.make_jaxpr(jax.grad(f))(x))
    np.testing.assert_allclose(y_prim, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g_prim, g_ref, rtol=1e-4, atol=1e-5)


def test_rope_permutation_pairs_each_rotated_dim_with_its_partner_and_keeps_every_dim():
    for K, R in ((32, 16), (64, 16), (32, 2), (16, 16)):
        order = [d for a, b in ops.rope_permutation(K, R) for d in range(a, b)]
        assert sorted(order) == list(range(K))
        for j in range(R // 2):  # position j and j + K/2 hold the record's pair (j, j + R/2)
            assert (order[j], order[j + K // 2]) == (j, j + R // 2)


def test_a_kernel_trace_runs_the_reference_of_an_op_whose_kernel_lacks_the_models_switch():
    """kernel_primitives(model): the program as on Neuron for that model: norm_mlp with a negative slope traces
    its reference (plain JAX), the other ops their kernel primitives."""
    x, w_fc, w_proj, s = jnp.ones((4, 16)), jnp.ones((16, 24)) / 8, jnp.ones((24, 16)) / 8, jnp.ones((16,))
    with ops.kernel_primitives(_recipe_model(mlp_negative_slope=-0.25)) as fallbacks:
        slope = str(jax.make_jaxpr(lambda x: ops.norm_mlp(x, w_fc, w_proj, s, negative_slope=-0.25))(x))
        norm = str(jax.make_jaxpr(ops.rms_norm)(x))
    assert [r.op for r in fallbacks] == ["norm_mlp"]
    assert "frontier_norm_mlp" not in slope and "frontier_rms_norm_fwd[kernel=True" in norm
    with ops.kernel_primitives(_recipe_model()) as fallbacks:  # the record's slope, 0.5: the kernel
        leaky = str(jax.make_jaxpr(lambda x: ops.norm_mlp(x, w_fc, w_proj, s, negative_slope=0.5))(x))
    assert fallbacks == [] and "frontier_norm_mlp_fwd[" in leaky and "negative_slope=0.5" in leaky
    with ops.kernel_primitives():  # traced for the baseline's model: a switched call is refused
        with pytest.raises(ops.dispatch.SwitchNotConfiguredError):
            jax.make_jaxpr(lambda x: ops.norm_mlp(x, w_fc, w_proj, s, negative_slope=-0.25))(x)
