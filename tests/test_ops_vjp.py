"""frontier_jax.ops.vjp: the custom_vjp generated from a declaration saves the backward's operands, passes the
cotangents, maps d<arg> to each argument (zero or None without one, cast to the argument's dtype) and
applies the declared adapters (prepare, grads, forward-only static parameters)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from frontier_jax.ops.vjp import Vjp, build


def test_outputs_and_residuals_are_read_from_the_names():
    v = Vjp("x, x0, mix, w -> xo, y, inv", "x, x0, mix, w, inv, dxo, dy -> dx, dx0, dmix, dw")
    assert v.arg_names == ("x", "x0", "mix", "w") and v.outputs == ("xo", "y")
    assert v.saved == ("x", "x0", "mix", "w", "inv")
    folded = Vjp("x, wf -> y", "x, wf, dy -> dx, dwf", args="x, w, s", prepare=lambda x, w, s: (x, w * s), keep="w, s")
    assert folded.arg_names == ("x", "w", "s") and folded.saved == ("x", "wf", "w", "s")
    with pytest.raises(ValueError, match="unknown"):
        Vjp("x -> y", "x, z, dy -> dx")
    with pytest.raises(ValueError, match="first outputs"):
        Vjp("x -> inv, y", "x, inv, dy -> dx")


class Recorder:
    """A stand-in for a declared op: y = 2 x w + ids (fp32 out), s = sum(x); records each direction's operands."""

    def __init__(self):
        self.calls = []

    def __call__(self, which, *arrays, **static):
        self.calls.append((which, [tuple(a.shape) for a in arrays], static))
        if which == "fwd":
            x, w, ids = arrays
            return (2 * x * w + ids).astype(jnp.float32), jnp.sum(x, keepdims=True)
        x, s, dy = arrays
        return (2 * dy * s).astype(jnp.float32),  # only dx: w gets zeros, ids None


def test_generated_vjp_saves_the_declared_values_and_fills_the_missing_cotangents():
    run = Recorder()
    op = build(run, Vjp("x, w, ids -> y, s", "x, s, dy -> dx, dw", forward_only="shift"))
    x = jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3)
    w, ids = jnp.ones((2, 3), jnp.float32), jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
    y, vjp = jax.vjp(lambda x, w: op(x, w, ids, shift=True, scale=3.0), x, w)
    assert y.dtype == jnp.float32 and np.array_equal(y, 2 * x.astype(jnp.float32) * w + ids)
    dx, dw = vjp(jnp.ones_like(y))
    assert dx.dtype == jnp.bfloat16 and np.array_equal(dx, np.full((2, 3), 2 * 15.0))  # cast to x's dtype
    assert dw.dtype == jnp.float32 and not np.any(dw)  # no dw returned: zero
    (fwd, fwd_shapes, fwd_static), (bwd, bwd_shapes, bwd_static) = run.calls[-2:]
    assert (fwd, bwd) == ("fwd", "bwd") and bwd_shapes == [(2, 3), (1, 1), (2, 3)]  # x, s, dy
    assert fwd_static == {"shift": True, "scale": 3.0} and bwd_static == {"scale": 3.0}
    _, vjp_all = jax.vjp(lambda x, w, ids: op(x, w, ids), x, w, ids)
    assert vjp_all(jnp.ones_like(y))[2].dtype == jax.dtypes.float0  # an integer argument: None, no cotangent


def test_prepare_and_grads_adapt_the_arguments():
    """A weight folded with a scale before the forward; the scale's cotangent from the folded weight's."""
    run = lambda which, *a, **s: (a[0] * a[1],) if which == "fwd" else (a[2] * a[1], a[2] * a[0])
    v = Vjp("x, wf -> y", "x, wf, dy -> dx, dwf", args="x, w, s", prepare=lambda x, w, s: (x, w * s), keep="w, s",
            grads=lambda d: {"w": d["dwf"] * d["s"], "s": d["dwf"] * d["w"]})
    op = build(run, v)
    x, w, s = jnp.asarray(2.0), jnp.asarray(3.0), jnp.asarray(5.0)
    got = jax.grad(lambda x, w, s: op(x, w, s), argnums=(0, 1, 2))(x, w, s)
    assert [float(g) for g in got] == [15.0, 10.0, 6.0]  # d(x w s) by x, w, s
