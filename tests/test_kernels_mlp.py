"""The fused RMSNorm + relu^2 MLP + residual add NKI kernels (under the emulator) against
frontier_jax.reference.resid_norm_mlp_fwd / resid_norm_mlp_bwd (x + mlp(rms_norm(x)), the scale folded into
W_proj by frontier_jax.ops)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from conftest import KERNEL_TOL as TOL
from conftest import assert_close_max as _assert_close
from frontier_jax import ops
from frontier_jax import reference as ref
from kernels_nki import emulator, registry



@pytest.fixture(scope="module")
def kernels():
    return registry.load_emulated("norm_mlp")


@pytest.mark.parametrize("dtype,shape", [("float32", (300, 64, 128)), ("float32", (130, 200, 300)),
                                         ("float32", (72, 640, 256)), ("bfloat16", (300, 64, 128))])
def test_forward_and_backward_match_reference(kernels, shape, dtype):
    N, D, F = shape  # N (and D, F) not multiples of 128; D > 128 and F > 256 take several tiles; D = 640:
    # two 512-column chunks of the norm's backward; N = 72: one half of a row-tiled transpose
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(N)
    x = (rng.standard_normal((N, D)) * 3 + 0.5).astype(np_dtype)
    w1 = (rng.standard_normal((D, F)) / np.sqrt(D)).astype(np_dtype)
    w2 = (rng.standard_normal((F, D)) / np.sqrt(F)).astype(np_dtype)
    dy = rng.standard_normal((N, D)).astype(np_dtype)
    f32 = lambda a: jnp.asarray(a.astype(np.float32))
    y_ref, inv_ref = ref.resid_norm_mlp_fwd(f32(x), f32(w1), f32(w2))
    y, inv = kernels.norm_mlp_fwd(x, w1, w2)
    assert y.dtype == np_dtype and inv.shape == (N, 1) and inv.dtype == np.float32
    _assert_close(y, y_ref, TOL[dtype])
    _assert_close(inv, inv_ref, 1e-5)
    want = ref.resid_norm_mlp_bwd(f32(x), f32(w1), f32(w2), inv_ref, f32(dy))
    got = kernels.norm_mlp_bwd(x, w1, w2, inv, dy)
    assert [g.dtype for g in got] == [np_dtype, np_dtype, np.float32]  # dw_proj fp32: ops derives ds from it
    for g, w in zip(got, want):
        _assert_close(g, w, TOL[dtype])
    # the residual's share: dx - dy is the MLP's and norm's backward alone
    _assert_close(got[0].astype(np.float32) - dy.astype(np.float32),
                  ref.norm_mlp_bwd(f32(x), f32(w1), f32(w2), inv_ref, f32(dy))[0], 2 * TOL[dtype])


def test_tensor_engine_utilisation_at_baseline_width(kernels):
    """D=512, F=1024 (baseline) on 8192 tokens: useful/issued >= 0.9 forward and backward."""
    w = (((512, 1024), "bfloat16"), ((1024, 512), "bfloat16"))
    x, inv = ((8192, 512), "bfloat16"), ((8192, 1), "float32")
    fwd = emulator.count(kernels.norm_mlp_fwd, x, *w)
    bwd = emulator.count(kernels.norm_mlp_bwd, x, *w, inv, x)
    assert emulator.pe_utilisation(fwd) >= 0.9 and emulator.pe_utilisation(bwd) >= 0.9
    assert emulator.estimate(fwd).bound == emulator.estimate(bwd).bound == "tensor"
    # h never goes to HBM, nor does rms_norm(x): x in, y and the norm's inv out; the residual add reuses x's tile
    assert fwd.dma_bytes == 2 * 8192 * 512 * 2 + 2 * 512 * 1024 * 2 + 4 * 8192
    # x, dy in once (dy also the residual's pass-through into dx), dx out, inv in, dw_fc in x's dtype, dw_proj fp32
    assert bwd.dma_bytes == 3 * 8192 * 512 * 2 + 2 * 512 * 1024 * 2 + 4 * 8192 + 512 * 1024 * (2 + 4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_op_routed_through_emulated_kernel_matches_reference(dtype):
    """ops.norm_mlp = x + s * mlp(rms_norm(x)): values and the gradients of x, both weights and the scale s
    (folded into W_proj on the kernel path, ds from the fp32 dW_proj) against the block's unfused reference
    (scale and add in x's dtype)."""
    dt = jnp.dtype(dtype)
    x = jax.random.normal(jax.random.key(0), (70, 32), jnp.float32).astype(dt)
    w1 = jax.random.normal(jax.random.key(1), (32, 96), jnp.float32) / 6
    w2 = jax.random.normal(jax.random.key(2), (96, 32), jnp.float32) / 10
    s = 1 + jax.random.normal(jax.random.key(3), (32,), jnp.float32) / 4
    f = lambda op: jax.jit(jax.value_and_grad(lambda *a: jnp.sum(jnp.sin(op(*a).astype(jnp.float32))),
                                              argnums=(0, 1, 2, 3)))
    v_ref, g_ref = f(lambda x, w1, w2, s: x + s.astype(x.dtype) * ref.norm_mlp(x, w1, w2))(x, w1, w2, s)
    with ops.emulated(["norm_mlp"]):
        v_emu, g_emu = f(ops.norm_mlp)(x, w1, w2, s)
    tol = 1e-5 if dtype == "float32" else TOL[dtype]
    _assert_close(v_emu, v_ref, tol)
    for a, b in zip(g_emu, g_ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        _assert_close(a, b, tol)
