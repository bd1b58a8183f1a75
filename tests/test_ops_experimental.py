"""frontier_jax.ops.experimental: the standalone ops (rope, rope_gain, causal_attention, norm_qkv_projection)
bind their primitives, match their direct reference path and route through their emulated kernels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import KERNEL_TOL
from helpers import assert_close_max as _assert_close
from frontier_jax import ops
from frontier_jax.ops import reference as ref
from frontier_jax.ops import experimental as xops


@pytest.fixture(autouse=True)
def _restore_auto():
    yield
    ops.configure("auto")


def _fns():
    cos, sin = ref.rope_tables(20, 16, 10000.0)
    return {
        "rope": lambda x: xops.rope(x.reshape(2, 20, 1, 16), cos, sin),
        "rope_gain": lambda x: xops.rope_gain(x.reshape(2, 20, 1, 16), cos, sin, 1.5 - x[0, :1] / 4),
        "causal_attention": lambda x: xops.causal_attention(
            x.reshape(2, 20, 1, 16), jnp.cos(x).reshape(2, 20, 1, 16), jnp.sin(x).reshape(2, 20, 1, 16)),
        "norm_projection": lambda x: jnp.concatenate(xops.norm_qkv_projection(
            x, jnp.ones((16, 8)) / 8, jnp.ones((16, 4)) / 4, jnp.ones((16, 4)) / 2), axis=-1),
    }


@pytest.mark.parametrize("op", xops.OPS)
def test_experimental_ops_bind_their_primitives_and_match_the_direct_path(op):
    """Listed "unused" in the kernel table, an experimental op calls its reference directly (no custom_vjp);
    through its primitives the generated custom_vjp gives the same values and gradients."""
    assert {r.op: r.impl for r in ops.configure("auto")}[op] == "unused"
    x = jax.random.normal(jax.random.key(0), (40, 16))
    f = lambda x: jnp.sum(jnp.sin(_fns()[op](x)))
    assert f"frontier_{op}_fwd" not in str(jax.make_jaxpr(jax.grad(f))(x))
    with ops.through_primitives():
        jaxpr = str(jax.make_jaxpr(jax.grad(f))(x))
        v_prim, g_prim = jax.jit(jax.value_and_grad(f))(x)
    assert f"frontier_{op}_fwd[" in jaxpr and f"frontier_{op}_bwd[" in jaxpr
    v, g = jax.jit(jax.value_and_grad(f))(x)
    np.testing.assert_allclose(v_prim, v, rtol=1e-6)
    np.testing.assert_allclose(g_prim, g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["causal_attention", "norm_projection"])
def test_experimental_op_routed_through_its_emulated_kernel_matches_the_reference(op):
    """The kernels inside the production files (kernels_nki/attention.py attention_fwd/_bwd,
    kernels_nki/projection/kernels.py norm_projection_fwd/_bwd) through the op's custom_vjp: values and gradients."""
    x = jax.random.normal(jax.random.key(1), (40, 16)) / 2
    f = lambda x: jnp.sum(jnp.sin(_fns()[op](x)))
    want = jax.jit(jax.value_and_grad(f))(x)
    with ops.emulated([op]) as rows:
        assert {r.op: r.impl for r in rows}[op] == "emulated"
        got = jax.jit(jax.value_and_grad(f))(x)
    for a, b in zip(got, want):
        _assert_close(a, b, KERNEL_TOL["float32"])
