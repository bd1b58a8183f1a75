"""frontier_jax.ops.dispatch without the Neuron SDK: on platform neuron an op calls its `@nki.jit` kernel directly
inside the jitted function (AWS's documented JAX path), the kernel adapter hands it the right operands,
shapes and static parameters (a fake `nki` module stands in for the SDK), no kernel ever receives a
zero-size operand, a kernel primitive is never lowered, strict mode is bad input."""

from __future__ import annotations

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from frontier_jax.ops import dispatch
from frontier_jax import ops
from frontier_jax.ops import reference as ref
from frontier_jax.errors import BadInput
from kernels_nki import registry


@pytest.fixture(autouse=True)
def _restore_auto():
    yield
    ops.configure("auto")


class FakeKernel:
    """What the fake `nki.jit` returns: records each call; returns zeros shaped by `outputs`."""

    outputs = {}  # kernel name -> fn(*operands, **static) -> [(shape, dtype)]

    def __init__(self, fn):
        self.name, self.calls = fn.__name__, []

    def __call__(self, *operands, **static):
        self.calls.append(([(tuple(a.shape), jnp.dtype(a.dtype)) for a in operands if a is not None], static))
        outs = tuple(jnp.zeros(s, d) for s, d in self.outputs[self.name](*operands, **static))
        return outs if len(outs) > 1 else outs[0]


@pytest.fixture
def fake_nki(monkeypatch):
    """A fake Neuron SDK: `nki`, `nki.language`, `nki.isa` in sys.modules, kernel modules imported against
    it (and removed again)."""
    nki = types.ModuleType("nki")
    nki.jit = lambda fn=None, **kw: FakeKernel(fn) if fn is not None else FakeKernel
    for name in ("language", "isa"):
        sub = types.ModuleType(f"nki.{name}")
        sub.__getattr__ = lambda attr: types.SimpleNamespace()  # module-level constants of a kernel file
        setattr(nki, name, sub)
        monkeypatch.setitem(sys.modules, f"nki.{name}", sub)
    nki.language.NKIObject = type("NKIObject", (), {})  # the base of the kernels' state classes
    monkeypatch.setitem(sys.modules, "nki", nki)
    kernel_modules = {s.module for s in registry.KERNELS.values()}
    for m in kernel_modules:
        monkeypatch.delitem(sys.modules, m, raising=False)
    yield nki
    for m in kernel_modules:
        sys.modules.pop(m, None)


def test_kernels_are_called_directly_on_platform_neuron(fake_nki):
    rows = ops.configure("auto", platform="cpu")
    assert all(r.impl == "reference" for r in rows[:len(ops.OPS)])
    rows = ops.configure("strict", platform="neuron")  # every kernel module imports: strict passes
    assert [r.op for r in rows if r.impl == "nki"] == list(ops.OPS)
    assert all(r.impl == "unused" and r.reason.startswith("experimental: ") for r in rows[len(ops.OPS):])
    assert {r.op: r.reason for r in rows}["rms_norm"] == "kernels_nki.rmsnorm.rmsnorm_fwd/rmsnorm_bwd"
    FakeKernel.outputs["rmsnorm_fwd"] = lambda x: [(x.shape, x.dtype), ((x.shape[0], 1), jnp.float32)]
    x = jnp.ones((6, 8), jnp.float32)
    jaxpr = jax.make_jaxpr(ops.rms_norm)(x)
    kernel = dispatch._nki_kernel("rms_norm", "fwd")
    assert kernel.calls and kernel.calls[-1][0] == [((6, 8), jnp.float32)]  # traced inside the jitted function
    assert "frontier_rms_norm" not in str(jaxpr)  # no primitive of ours stands between: the kernel's own call
    assert ops.configure("reference", platform="neuron")[0].impl == "reference"


def test_a_kernel_primitive_never_lowers():
    """The program-check trace binds kernel=True primitives; compiling one is an error, never a silent reference."""
    x = jnp.ones((4, 8), jnp.float32)
    with ops.kernel_primitives():
        assert "frontier_rms_norm_fwd" in str(jax.make_jaxpr(ops.rms_norm)(x))
        with pytest.raises(Exception, match="kernel=True primitive"):
            jax.jit(ops.rms_norm)(x)


def _lowered(op: str, which: str, *arrays, **static):
    """Run `op`'s direction `which` as on Neuron (platform neuron, the fake kernel) under jit."""
    ops.configure("auto", platform="neuron")
    outs = jax.jit(lambda *a: dispatch.SPECS[op](which, *a, **static))(*arrays)
    return dispatch._nki_kernel(op, which), outs


def test_adapter_passes_flat_adam_operands_and_static_params(fake_nki):
    FakeKernel.outputs["adam_update"] = lambda p, g, m, v, s, **k: [(p.shape, p.dtype), (m.shape, m.dtype),
                                                                     (v.shape, v.dtype)]
    p = jnp.ones((3, 5), jnp.float32)
    scal = ops.scalars_PK(0.1, 0.5, 0.25, 0.0)
    kernel, outs = _lowered("adam_update", "fwd", p, p, p, p, scal, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0)
    operands, static = kernel.calls[-1]
    assert operands == [((15,), jnp.float32)] * 4 + [((128, 4), jnp.float32)]
    assert static == {"b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.0}
    assert [o.shape for o in outs] == [(3, 5)] * 3  # reshaped back to the parameter's shape


def test_adapter_never_hands_head_loss_a_zero_size_bias(fake_nki):
    """No bias: S = 0 sources on the primitive, None (the kernel's no-bias form) for the kernel."""
    FakeKernel.outputs["head_loss_fwd"] = lambda x, e, t, i, v, **k: [((x.shape[0], 1), jnp.float32)] * 2
    FakeKernel.outputs["head_loss_bwd"] = lambda x, e, t, i, v, lse, g, **k: (
        [(x.shape, x.dtype), (e.shape, e.dtype)] + ([] if i is None else [(i.shape, jnp.float32)]))
    N, D, V = 6, 8, 16
    x, emb = jnp.ones((N, D)), jnp.ones((V, D))
    tg, ids, vals = jnp.zeros((N, 1), jnp.int32), jnp.zeros((N, 0), jnp.int32), jnp.zeros((N, 0), jnp.float32)
    kernel, outs = _lowered("head_loss", "fwd", x, emb, tg, ids, vals, softcap=30.0)
    operands, static = kernel.calls[-1]
    assert [s for s, _ in operands] == [(N, D), (V, D), (N, 1)] and static == {"softcap": 30.0}
    assert [o.shape for o in outs] == [(N, 1), (N, 1)]
    lse = dloss = jnp.zeros((N, 1))
    kernel, outs = _lowered("head_loss", "bwd", x, emb, tg, ids, vals, lse, dloss, softcap=30.0)
    assert [s for s, _ in kernel.calls[-1][0]] == [(N, D), (V, D), (N, 1), (N, 1), (N, 1)]  # no bias operands
    assert [o.shape for o in outs] == [(N, D), (V, D)]
    with_bias = _lowered("head_loss", "bwd", x, emb, tg, jnp.zeros((N, 2), jnp.int32), jnp.zeros((N, 2)), lse,
                         dloss, softcap=30.0)[1]
    assert [o.shape for o in with_bias] == [(N, D), (V, D), (N, 2)]


def test_zero_size_operand_is_refused_before_any_kernel_runs():
    called = []
    with pytest.raises(dispatch.ZeroSizeOperandError, match=r"rms_norm fwd: kernel operand 0 has shape \(0, 4\)"):
        dispatch.kernel_call(dispatch.SPECS["rms_norm"], "fwd", lambda *a: called.append(a), [np.zeros((0, 4))], {})
    assert called == []


def test_emulated_head_loss_without_bias_equals_the_reference():
    """The (N, 0) case end to end: the emulated kernel runs in its no-bias form, value and gradients
    equal the reference's."""
    r = np.random.default_rng(0)
    x = jnp.asarray(r.standard_normal((20, 16)), jnp.float32)
    emb = jnp.asarray(r.standard_normal((40, 16)) * 0.3, jnp.float32)
    tg = jnp.asarray(r.integers(0, 40, 20), jnp.int32)
    f = lambda head: jax.jit(jax.value_and_grad(lambda x, e: jnp.sum(head(x, e, tg, 30.0)), (0, 1)))
    v_ref, g_ref = f(ref.head_loss)(x, emb)
    with ops.emulated(["head_loss"]):
        v_emu, g_emu = f(ops.head_loss)(x, emb)
    np.testing.assert_allclose(v_emu, v_ref, rtol=1e-5)
    for a, b in zip(g_emu, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_abstract_shapes_come_from_the_reference():
    x = jax.ShapeDtypeStruct((10, 4), jnp.bfloat16)
    y, inv = jax.eval_shape(lambda x: dispatch.SPECS["rms_norm"].prims["fwd"].bind(x, kernel=False), x)
    assert (y.shape, y.dtype, inv.shape, inv.dtype) == ((10, 4), jnp.bfloat16, (10, 1), jnp.float32)


def test_strict_and_bad_mode_are_bad_input():
    with pytest.raises(BadInput):
        ops.configure("strict")
    with pytest.raises(BadInput, match="auto|reference|strict"):
        ops.configure("fast")
    assert issubclass(ops.KernelUnavailableError, BadInput)


def test_every_declared_op_has_a_kernel_row_and_every_kernel_an_op():
    """Every kernel is a production op's (frontier_jax.ops) or an experimental one's (frontier_jax.ops.experimental)."""
    from frontier_jax.ops import experimental

    production = [op for op in dispatch.SPECS if op in ops.OPS]
    assert production == list(ops.OPS) and set(dispatch.SPECS) == set(ops.OPS) | set(experimental.OPS)
    assert set(registry.KERNELS) == set(dispatch.SPECS)
    assert {op for op, k in registry.KERNELS.items() if k.experimental} == set(experimental.OPS)
    for op, spec in dispatch.SPECS.items():
        k = registry.KERNELS[op]
        assert set(spec.prims) == ({"fwd", "bwd"} if k.bwd else {"fwd"})


def test_an_emulated_op_is_used_even_if_an_earlier_run_left_it_unused():
    """`emulated` after a configure that listed the fused optimizer ops unused (an in-process run with
    optim.fused off): the ops asked for run emulated, and the earlier state comes back afterwards."""
    ops.configure("auto", unused=ops.FUSED_OPTIMIZER_OPS)
    try:
        with ops.emulated(["adam_update"]) as rows:
            assert {r.op: r.impl for r in rows}["adam_update"] == "emulated"
        assert {r.op: r.impl for r in ops.kernel_table()}["adam_update"] == "unused"
    finally:
        ops.configure("auto")
