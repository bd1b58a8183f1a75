"""The RMSNorm NKI kernels (run under the emulator) against frontier_jax.ops.reference, forward and backward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from frontier_jax import ops
from frontier_jax.ops import reference as ref
from kernels_nki import emulator, registry

TOL = {"float32": 1e-5, "bfloat16": 2e-2}
# [N, D] block shapes and the QK-norm [N * heads, 64] shape; N not a multiple of 128 included; 1100 x 512
# and 8500 x 64 reach the full tiles of 128 x R rows (R = 8 / 64 rows per partition), then 128 x R' rows
# and a ragged last tile
SHAPES = [(128, 512), (300, 512), (1, 256), (257, 64), (1000, 64), (700, 512), (1100, 512), (8500, 64)]


def _assert_close(a, b, tol):
    """Max-mode tolerance (docs/testing.md: kernel vs reference): |a - b| <= atol + rtol * max|b|, atol = rtol = tol."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert not np.isnan(a).any()
    err, bound = np.abs(a - b).max(), tol + tol * np.abs(b).max()
    assert err <= bound, f"max |a-b| = {err:.3g} > {bound:.3g}"


def _inputs(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 0.5).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    return x, dy


@jax.jit
def _reference_fwd_bwd(x, dy):
    y, vjp = jax.vjp(ref.rms_norm, x)
    return y, vjp(dy)[0]


@pytest.fixture(scope="module")
def kernels():
    return registry.load_emulated("rms_norm")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_backward_match_reference(kernels, shape, dtype):
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    x, dy = _inputs(shape, np_dtype, seed=sum(shape))
    x32 = x.astype(np.float32)
    # reference in fp32 from the same (possibly bf16-rounded) inputs
    y_ref, dx_ref = _reference_fwd_bwd(jnp.asarray(x32), jnp.asarray(dy.astype(np.float32)))
    y, inv = kernels.rmsnorm_fwd(x)
    assert y.dtype == np_dtype and inv.shape == (shape[0], 1) and inv.dtype == np.float32
    _assert_close(y, y_ref, TOL[dtype])
    _assert_close(inv, 1.0 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + ref.RMS_EPS), 1e-5)

    dx = kernels.rmsnorm_bwd(x, inv, dy)
    assert dx.dtype == np_dtype
    _assert_close(dx, dx_ref, TOL[dtype])


def test_kernel_uses_no_padding_rows(kernels):
    """A ragged last tile is sliced: DMA moves exactly the rows that exist."""
    c = emulator.count(kernels.rmsnorm_fwd, ((300, 512), "bfloat16"))
    assert c.dma_bytes == 2 * 300 * 512 * 2 + 300 * 4
    assert c.sbuf_peak_bytes <= 192 * 1024 and c.pe_macs_issued == 0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_op_routed_through_emulated_kernel_matches_reference(dtype):
    """ops.rms_norm under ops.emulated: forward and gradient through jax.pure_callback, QK-norm shape."""
    x = jax.random.normal(jax.random.key(0), (2, 70, 3, 64), jnp.float32).astype(dtype)
    w = jax.random.normal(jax.random.key(1), (64,), jnp.float32).astype(dtype)
    loss = lambda f: lambda x: jnp.sum((f(x) * w).astype(jnp.float32) ** 2)
    y_ref, g_ref = jax.jit(lambda x: (ref.rms_norm(x), jax.grad(loss(ref.rms_norm))(x)))(x)
    with ops.emulated(["rms_norm"]):
        y_emu, g_emu = jax.jit(lambda x: (ops.rms_norm(x), jax.grad(loss(ops.rms_norm))(x)))(x)
    tol = TOL["bfloat16" if dtype == jnp.bfloat16 else "float32"]
    _assert_close(y_emu, y_ref, tol)
    _assert_close(g_emu, g_ref, tol)


@pytest.mark.parametrize("D", [64, 512])
def test_backward_engine_split(kernels, D):
    """Backward per element: the dy * x product once on GpSimd, one two-input VectorE pass (dx = dy inv + x e);
    VectorE's other work is 3 [P, R] instructions per tile of 128 x R rows (R = ROW_ELEMS // D)."""
    R = kernels.ROW_ELEMS // D
    N = 2 * 128 * R  # two full tiles
    x = ((N, D), "bfloat16")
    c = emulator.count(kernels.rmsnorm_bwd, x, ((N, 1), "float32"), x)
    assert c.gpsimd_elems_issued == N * D
    assert c.vector_elems_issued == 2 * N * D + 2 * 3 * 128 * max(64, 2 * R)
    assert c.scalar_elems_issued == N * D + N * (max(64, D) + 64)  # x e, and the row sums of dy * x
