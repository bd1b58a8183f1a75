"""The RoPE NKI kernels (kernels_nki/experimental/rope.py, under the emulator) against
frontier_jax.ops.reference.rope / rope_gain, forward and backward, and the experimental ops routed through them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from helpers import KERNEL_TOL as TOL
from helpers import assert_close_max as _assert_close
from frontier_jax import ops
from frontier_jax.ops import reference as ref
from frontier_jax.ops import experimental as xops
from kernels_nki import emulator, registry



@pytest.fixture(scope="module")
def kernels():
    return registry.load_emulated("rope")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(2, 150, 3, 64), (1, 37, 2, 16)])  # T not a multiple of 128
def test_forward_and_backward_match_reference(kernels, shape, dtype):
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np_dtype)
    dy = rng.standard_normal(shape).astype(np_dtype)
    cos, sin = ref.rope_tables(shape[1], shape[3], 10000.0)
    c, s = cos.astype(np_dtype), sin.astype(np_dtype)  # ops casts the host tables to x's dtype
    x32, c32, s32 = (a.astype(np.float32) for a in (x, c, s))
    y_ref, vjp = jax.vjp(lambda x: ref.rope(x, c32, s32), jnp.asarray(x32))
    y = kernels.rope_fwd(x, c, s)
    assert y.dtype == np_dtype
    _assert_close(y, y_ref, TOL[dtype])
    _assert_close(kernels.rope_bwd(dy, c, s), vjp(jnp.asarray(dy.astype(np.float32)))[0], TOL[dtype])


def test_cos_sin_loaded_once_per_sequence_tile(kernels):
    """cos/sin rows are fetched once per T tile and reused across the batch: DMA = x in + y out + tables."""
    B, T, H, K = 8, 200, 4, 64
    c = emulator.count(kernels.rope_fwd, ((B, T, H, K), "bfloat16"), ((T, K // 2), "bfloat16"), ((T, K // 2), "bfloat16"))
    assert c.dma_bytes == 2 * B * T * H * K * 2 + 2 * T * (K // 2) * 2
    assert c.pe_macs_issued == 0


def test_rotation_is_one_scalar_and_one_two_input_vector_pass(kernels):
    """Per element: one ScalarE product (cos column as the scale) and one two-input VectorE multiply-add
    (sin column as the scalar operand); the rest is the fp32 cos/+-sin columns, 3 small VectorE
    instructions per T tile. 16 sequences x 4 heads: 64-element instructions, at the MIN_II floor."""
    B, T, H, K = 16, 256, 4, 64
    c = emulator.count(kernels.rope_fwd, ((B, T, H, K), "bfloat16"), ((T, K // 2), "bfloat16"), ((T, K // 2), "bfloat16"))
    n, tiles = B * T * H * K, T // 128
    assert c.scalar_elems_issued == n
    assert c.vector_elems_issued == 2 * n + tiles * 3 * 128 * 64
    assert c.gpsimd_elems_issued == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_several_sequence_chunks_last_ragged(kernels, dtype):
    """B above the chunk size (32 sequences for rope at H*K = 512, 16 / 12 for rope_gain fwd / bwd):
    every chunk, the ragged last one included, matches the reference, and dg sums over all chunks."""
    shape = (33, 5, 8, 64)
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(11)
    x, dy = (rng.standard_normal(shape).astype(np_dtype) for _ in range(2))
    g = rng.standard_normal(shape[2]).astype(np.float32)
    cos, sin = ref.rope_tables(shape[1], shape[3], 10000.0)
    c, s = cos.astype(np_dtype), sin.astype(np_dtype)
    x32, dy32, c32, s32 = (a.astype(np.float32) for a in (x, dy, c, s))
    _assert_close(kernels.rope_fwd(x, c, s), ref.rope(x32, c32, s32), TOL[dtype])
    _assert_close(kernels.rope_bwd(dy, c, s), ref.rope(dy32, c32, -s32), TOL[dtype])
    g_PH = np.broadcast_to(g, (128, shape[2])).copy()
    _assert_close(kernels.rope_gain_fwd(x, c, s, g_PH), ref.rope_gain(x32, c32, s32, g), TOL[dtype])
    dx, dg_TH = kernels.rope_gain_bwd(x, c, s, g_PH, dy)
    dx_ref, dg_ref = ref.rope_gain_bwd(x32, c32, s32, g_PH, dy32)
    _assert_close(dx, dx_ref, TOL[dtype])
    _assert_close(dg_TH, dg_ref, TOL[dtype])


@pytest.mark.parametrize("dtype", [jnp.bfloat16])  # fp32 is covered kernel-level above
def test_op_routed_through_emulated_kernel_matches_reference(dtype):
    x = jax.random.normal(jax.random.key(0), (2, 70, 4, 32), jnp.float32).astype(dtype)
    cos, sin = ref.rope_tables(70, 32, 10000.0)
    w = jax.random.normal(jax.random.key(1), (32,), jnp.float32).astype(dtype)
    loss = lambda f: lambda x: jnp.sum((f(x, cos, sin) * w).astype(jnp.float32) ** 2)
    run = lambda f: jax.jit(lambda x: (f(x, cos, sin), jax.grad(loss(f))(x)))(x)
    y_ref, g_ref = run(ref.rope)
    with ops.emulated(["rope"]):
        y_emu, g_emu = run(xops.rope)
    tol = TOL["bfloat16" if dtype == jnp.bfloat16 else "float32"]
    _assert_close(y_emu, y_ref, tol)
    _assert_close(g_emu, g_ref, tol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(2, 150, 3, 64), (3, 37, 2, 16)])
def test_gain_forward_and_backward_match_reference(kernels, shape, dtype):
    """rope_gain: y = rope(x) * g[h]; dx = g rope^-1(dy); dg partials [T, H] = sum over b, k of dy . rope(x)."""
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(7 + sum(shape))
    x, dy = (rng.standard_normal(shape).astype(np_dtype) for _ in range(2))
    g = (1.5 + rng.standard_normal(shape[2])).astype(np_dtype).astype(np.float32)
    g_PH = np.broadcast_to(g, (128, shape[2])).copy()
    cos, sin = ref.rope_tables(shape[1], shape[3], 10000.0)
    c, s = cos.astype(np_dtype), sin.astype(np_dtype)
    x32, dy32, c32, s32 = (a.astype(np.float32) for a in (x, dy, c, s))
    y_ref, vjp = jax.vjp(lambda x, g: ref.rope_gain(x, c32, s32, g), jnp.asarray(x32), jnp.asarray(g))
    dx_ref, dg_ref = vjp(jnp.asarray(dy32))
    y = kernels.rope_gain_fwd(x, c, s, g_PH)
    assert y.dtype == np_dtype
    _assert_close(y, y_ref, TOL[dtype])
    dx, dg_TH = kernels.rope_gain_bwd(x, c, s, g_PH, dy)
    assert dx.dtype == np_dtype and dg_TH.shape == (shape[1], shape[2]) and dg_TH.dtype == np.float32
    _assert_close(dx, dx_ref, TOL[dtype])
    _assert_close(dg_TH.sum(0), dg_ref, TOL[dtype])
    # the reference backward the op declares gives the same partials
    dx_decl, dg_decl = ref.rope_gain_bwd(x32, c32, s32, g_PH, dy32)
    _assert_close(dg_TH, dg_decl, TOL[dtype])


def test_gain_costs_one_scalar_pass_forward_and_gpsimd_product_backward(kernels):
    """The forward scales x by g[h] in one ScalarE pass (no VectorE work, no extra HBM pass but the
    [128, H] gain); the backward's r * x product runs on GpSimd, once per element."""
    B, T, H, K = 8, 256, 4, 64
    x, tab, g = ((B, T, H, K), "bfloat16"), ((T, K // 2), "bfloat16"), ((128, H), "float32")
    n = B * T * H * K
    plain = emulator.count(kernels.rope_fwd, x, tab, tab)
    gained = emulator.count(kernels.rope_gain_fwd, x, tab, tab, g)
    assert gained.dma_bytes == plain.dma_bytes + 128 * H * 4
    assert gained.vector_elems_issued == plain.vector_elems_issued
    assert gained.scalar_elems_issued == plain.scalar_elems_issued + n
    bwd = emulator.count(kernels.rope_gain_bwd, x, tab, tab, g, x)
    assert bwd.gpsimd_elems_issued == n and bwd.gpsimd_instructions == T // 128  # one chunk of 8 sequences
    assert bwd.vector_elems_issued < plain.vector_elems_issued + (T // 128) * 128 * 64 * 2


def test_gain_op_routed_through_emulated_kernel_matches_reference():
    x = jax.random.normal(jax.random.key(2), (2, 70, 4, 32), jnp.float32).astype(jnp.bfloat16)
    g = jnp.asarray([1.5, 0.5, -2.0, 3.0], jnp.float32)
    cos, sin = ref.rope_tables(70, 32, 10000.0)
    w = jax.random.normal(jax.random.key(3), (32,), jnp.float32).astype(jnp.bfloat16)
    loss = lambda f: lambda x, g: jnp.sum((f(x, cos, sin, g) * w).astype(jnp.float32) ** 2)
    run = lambda f, x: jax.jit(lambda x, g: (f(x, cos, sin, g), jax.grad(loss(f), argnums=(0, 1))(x, g)))(x, g)
    # the reference in fp32: autodiff of the bf16 reference sums dg's 4480 terms in bf16 (~25% low here),
    # the kernel accumulates in fp32
    y_ref, (dx_ref, dg_ref) = run(ref.rope_gain, x.astype(jnp.float32))
    with ops.emulated(["rope_gain"]):
        y_emu, (dx_emu, dg_emu) = run(xops.rope_gain, x)
    assert dg_emu.dtype == jnp.float32 and dg_emu.shape == (4,)
    _assert_close(y_emu, y_ref, TOL["bfloat16"])
    _assert_close(dx_emu, dx_ref, TOL["bfloat16"])
    _assert_close(dg_emu, dg_ref, TOL["bfloat16"])
