"""The fused RMSNorm + relu^2 MLP + residual add NKI kernels (under the emulator) against
frontier_jax.ops.reference.resid_norm_mlp_fwd / resid_norm_mlp_bwd (x + mlp(rms_norm(x)), the scale folded into
W_proj by frontier_jax.ops)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from helpers import KERNEL_TOL as TOL
from helpers import assert_close_max as _assert_close
from frontier_jax import ops
from frontier_jax.config import ModelConfig
from frontier_jax.ops import reference as ref
from kernels_nki import emulator, registry



@pytest.fixture(scope="module")
def kernels():
    return registry.load_emulated("norm_mlp")


@pytest.mark.parametrize("dtype,shape,slope", [
    ("float32", (300, 64, 128), 0.0), ("float32", (130, 200, 300), 1.5), ("float32", (72, 640, 256), 0.0),
    ("bfloat16", (300, 64, 128), 0.5), ("bfloat16", (1100, 64, 640), 0.0), ("bfloat16", (260, 128, 384), 0.5),
    ("bfloat16", (130, 512, 1536), 0.5)])
def test_forward_and_backward_match_reference(kernels, shape, dtype, slope):
    N, D, F = shape  # N (and D, F) not multiples of 128; D > 128 and F > 256 take several tiles; D = 640:
    # two 512-column chunks of the norm's backward; N = 72: one half of a row-tiled transpose; N = 1100: three
    # forward blocks and two backward blocks (NW = 1024), the last ragged; F = 640: a 128-column chunk of F;
    # slope: LeakyReLU(slope)^2 (0: relu^2, 0.5: the record's, 1.5: a slope > 1, the activation a min), (D, F) =
    # (128, 384): record11_tiny's MLP (3 x 128), (512, 1536): record11's (3 x 512, the backward in groups of NB
    # tokens), F = 300: a non-integer mlp_mult's width
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(N)
    x = (rng.standard_normal((N, D)) * 3 + 0.5).astype(np_dtype)
    w1 = (rng.standard_normal((D, F)) / np.sqrt(D)).astype(np_dtype)
    w2 = (rng.standard_normal((F, D)) / np.sqrt(F)).astype(np_dtype)
    dy = rng.standard_normal((N, D)).astype(np_dtype)
    f32 = lambda a: jnp.asarray(a.astype(np.float32))
    y_ref, inv_ref, rT_ref = ref.resid_norm_mlp_fwd(f32(x), f32(w1), f32(w2), negative_slope=slope)
    y, inv, rT = kernels.norm_mlp_fwd(x, w1, w2, negative_slope=slope)
    assert y.dtype == np_dtype and inv.shape == (N, 1) and inv.dtype == np.float32
    assert rT.shape == (F, N) and rT.dtype == np_dtype  # act(h)^T, the backward's residual
    assert (np.asarray(rT, np.float32) < 0).any() == (slope > 0)  # the negative side kept (LeakyReLU) or not
    _assert_close(y, y_ref, TOL[dtype])
    _assert_close(inv, inv_ref, 1e-5)
    _assert_close(rT, rT_ref, TOL[dtype])
    # the backward from the kernel's own rT (as ops runs it); the reference from the same rT, so that a bf16
    # rounding flip of act(h) between the two forwards does not count against the backward
    want = ref.resid_norm_mlp_bwd(f32(x), f32(w1), f32(w2), inv_ref, f32(rT), f32(dy), negative_slope=slope)
    got = kernels.norm_mlp_bwd(x, w1, w2, inv, rT, dy, negative_slope=slope)
    assert [g.dtype for g in got] == [np_dtype, np_dtype, np.float32]  # dw_proj fp32: ops derives ds from it
    for g, w in zip(got, want):
        _assert_close(g, w, TOL[dtype])
    # the residual's share: dx - dy is the MLP's and norm's backward alone
    _assert_close(got[0].astype(np.float32) - dy.astype(np.float32),
                  ref.norm_mlp_bwd(f32(x), f32(w1), f32(w2), inv_ref, f32(rT), f32(dy), slope)[0], 2 * TOL[dtype])


def test_tensor_engine_utilisation_at_baseline_width(kernels):
    """D=512, F=1024 (baseline) on 8192 tokens: TensorE-bound; the backward reads the forward's relu(h)^T
    instead of recomputing h (4 token x D x F matmuls, not 5); fits on chip (the emulator enforces SBUF / PSUM
    capacity). useful/issued: forward >= 0.93; backward >= 0.92, its floor with 20 128 x 128 transposes per
    128 tokens (dy^T, r from rT, dh'^T: each needed in both layouts; 0.927 at N = 65536, 0.924 here with the
    per-call weight transposes)."""
    N, D, F = 8192, 512, 1024
    w = (((D, F), "bfloat16"), ((F, D), "bfloat16"))
    x, inv, rT = ((N, D), "bfloat16"), ((N, 1), "float32"), ((F, N), "bfloat16")
    fwd = emulator.count(kernels.norm_mlp_fwd, x, *w)
    bwd = emulator.count(kernels.norm_mlp_bwd, x, *w, inv, rT, x)
    assert emulator.pe_utilisation(fwd) >= 0.93 and emulator.pe_utilisation(bwd) >= 0.92
    assert emulator.estimate(fwd).bound == emulator.estimate(bwd).bound == "tensor"
    # useful MACs: forward h and y; backward da, dW_proj, dW_fc and dx only (no recompute of h)
    assert fwd.pe_macs_useful == 2 * N * D * F and bwd.pe_macs_useful == 4 * N * D * F
    # rms_norm(x) never goes to HBM, h only as relu(h)^T: x in, y, the norm's inv and rT out; the residual add
    # reuses x's tile
    assert fwd.dma_bytes == 2 * N * D * 2 + 2 * D * F * 2 + 4 * N + N * F * 2
    # x, dy, rT in once (dy also the residual's pass-through into dx), dx out, inv in, dw_fc in x's dtype,
    # dw_proj fp32
    assert bwd.dma_bytes == 3 * N * D * 2 + 2 * D * F * 2 + 4 * N + D * F * (2 + 4) + N * F * 2
    # VectorE: only [P, 1] columns and the accumulators' memsets. The element-wise work runs on GpSimd from SBUF
    # (1 element issued per element), its PSUM operands copied out by ScalarE, so that VectorE's two-input PSUM
    # reads do not bind the shared VectorE/ScalarE PSUM port: a = r r and dh' = r da (N F each), the norm's
    # backward (g x, g + x c: N D each), dy's pass-through add (N D), and one fp32 [128, 512] add per 1024
    # tokens (NW) for each of the 2 D F / (128 x 512) chunks of dW_fc and dW_proj
    assert 0 <= bwd.vector_elems_issued < N * 512
    adds = N // 1024 * (2 * D * F // (128 * 512)) * 128 * 512
    assert bwd.gpsimd_elems_issued - (adds + 2 * N * F + 3 * N * D) in range(0, 128 * 128 + 1)  # + the identity
    assert bwd.psum_peak_banks <= 8 and bwd.sbuf_peak_bytes <= 192 * 1024


def test_record_width_fits_on_chip_and_stays_tensor_bound(kernels):
    """D = 512, F = 1536 (the record's 3x MLP, LeakyReLU(0.5)^2) on 8192 tokens: the backward's groups of NB tokens
    keep its live SBUF within the 192 KiB partition (no spill), TensorE bounds both directions, the useful MACs
    are the relu^2 kernel's, and the activation costs one VectorE pass over the hidden layer each way (the forward's r
    = max(h, slope h), the backward's r act'(h) = max(r, slope r)), nothing more on TensorE or DMA."""
    N, D, F = 8192, 512, 1536
    w = (((D, F), "bfloat16"), ((F, D), "bfloat16"))
    x, inv, rT = ((N, D), "bfloat16"), ((N, 1), "float32"), ((F, N), "bfloat16")
    (fwd0, bwd0), (fwd, bwd) = ((emulator.count(kernels.norm_mlp_fwd, x, *w, negative_slope=s),
                                 emulator.count(kernels.norm_mlp_bwd, x, *w, inv, rT, x, negative_slope=s))
                                for s in (0.0, 0.5))
    assert kernels.bwd_group(F) == kernels.NB and kernels.bwd_group(1024) == kernels.NW
    for c in (fwd, bwd):
        assert c.sbuf_peak_bytes <= 192 * 1024 and c.sbuf_spill_peak_bytes == 0 and c.psum_peak_banks <= 8
        assert emulator.estimate(c).bound == "tensor"
    assert fwd.pe_macs_useful == fwd0.pe_macs_useful == 2 * N * D * F and bwd.pe_macs_useful == 4 * N * D * F
    assert (fwd.pe_macs_issued, fwd.dma_bytes, bwd.pe_macs_issued, bwd.dma_bytes) == (
        fwd0.pe_macs_issued, fwd0.dma_bytes, bwd0.pe_macs_issued, bwd0.dma_bytes)
    # (two inputs: 2 elements issued per element, cost.py's VectorE rule)
    assert fwd.vector_elems_issued - fwd0.vector_elems_issued == 2 * N * F  # r = max(h, slope h)
    assert bwd.vector_elems_issued - bwd0.vector_elems_issued == 2 * N * F  # m = max(r, slope r)


@pytest.mark.parametrize("dtype,slope,ln_scale", [("bfloat16", 0.0, 1.0), ("float32", 0.5, 0.5 ** 0.5)])
def test_op_routed_through_emulated_kernel_matches_reference(dtype, slope, ln_scale):
    """ops.norm_mlp = x + s * mlp(rms_norm(x) * ln_scale) with act = LeakyReLU(slope): values and the gradients of x,
    both weights and the scale s (folded into W_proj on the kernel path, ds from the fp32 dW_proj; the LN-scale
    factor folded into W_fc) against the block's unfused reference (scale and add in x's dtype)."""
    dt = jnp.dtype(dtype)
    x = jax.random.normal(jax.random.key(0), (70, 32), jnp.float32).astype(dt)
    w1 = jax.random.normal(jax.random.key(1), (32, 96), jnp.float32) / 6
    w2 = jax.random.normal(jax.random.key(2), (96, 32), jnp.float32) / 10
    s = 1 + jax.random.normal(jax.random.key(3), (32,), jnp.float32) / 4
    f = lambda op: jax.jit(jax.value_and_grad(lambda *a: jnp.sum(jnp.sin(op(*a).astype(jnp.float32))),
                                              argnums=(0, 1, 2, 3)))
    v_ref, g_ref = f(lambda x, w1, w2, s: x + s.astype(x.dtype) * ref.norm_mlp(x, w1, w2, slope, ln_scale))(
        x, w1, w2, s)
    ops.configure("auto", model=None if slope == 0 else ModelConfig(mlp_negative_slope=slope))
    with ops.emulated(["norm_mlp"]):
        v_emu, g_emu = f(lambda *a: ops.norm_mlp(*a, negative_slope=slope, ln_scale=ln_scale))(x, w1, w2, s)
    tol = 1e-5 if dtype == "float32" else TOL[dtype]
    _assert_close(v_emu, v_ref, tol)
    for a, b in zip(g_emu, g_ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        _assert_close(a, b, tol)
