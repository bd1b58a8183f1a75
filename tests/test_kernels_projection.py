"""The projection NKI kernels (kernels_nki/projection/) under the emulator: `projection` (with the residual
add of the attention's output projection) against NumPy, `norm_projection` (the pre-attention RMSNorm fused
in) against frontier_jax.ops.reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from helpers import KERNEL_TOL as TOL
from helpers import assert_close_max as _assert_close
from frontier_jax.ops import reference as ref
from kernels_nki import emulator, registry


@pytest.fixture(scope="module")
def kernels():
    return registry.load_emulated("projection")


@pytest.mark.parametrize("dtype,N,I,O", [
    ("float32", 200, 96, 80),  # ragged token tile, contraction and output smaller than a tile
    ("float32", 130, 256, 640),  # two contraction tiles, two PSUM banks of output (512 + 128)
    ("bfloat16", 256, 128, 192),
    ("float32", 130, 512, 600),  # dw: 4 x 2 = 8 PSUM banks, one pass beside dx's pass
    ("float32", 130, 640, 520),  # dw: 5 x 2 = 10 banks: one pass over x per 512-column slice
])
def test_forward_and_backward_match_numpy(kernels, dtype, N, I, O):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(N + I + O)
    x, w, r, dy = (rng.standard_normal(s).astype(dt) for s in ((N, I), (I, O), (N, O), (N, O)))
    x32, w32, r32, dy32 = (a.astype(np.float32) for a in (x, w, r, dy))
    y = kernels.projection_fwd(x, w, r)
    assert y.shape == (N, O) and y.dtype == dt
    _assert_close(y, r32 + x32 @ w32, TOL[dtype])
    _assert_close(y, ref.resid_projection_fwd(x32, w32, r32)[0], TOL[dtype])
    dx, dw = kernels.projection_bwd(x, w, dy)
    assert dx.shape == (N, I) and dx.dtype == dt and dw.shape == (I, O) and dw.dtype == np.float32
    _assert_close(dx, dy32 @ w32.T, TOL[dtype])
    _assert_close(dw, x32.T @ dy32, TOL[dtype])


@pytest.mark.parametrize("dtype,N,I,O", [
    ("float32", 200, 96, 80),  # ragged token tile (second row-tiled transpose half of 72 rows)
    ("float32", 2100, 128, 192),  # 17 token tiles: a second dw block of one ragged tile
    ("float32", 72, 640, 600),  # a tile of one transpose half; two 512-column chunks of g and of y
    ("bfloat16", 300, 256, 640),
])
def test_norm_projection_matches_reference(kernels, dtype, N, I, O):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(N + I + O)
    x = (rng.standard_normal((N, I)) * 3 + 0.5).astype(dt)
    w, dy = (rng.standard_normal(s).astype(dt) for s in ((I, O), (N, O)))
    f32 = lambda a: np.asarray(a, np.float32)
    y_ref, inv_ref = ref.norm_projection_fwd(f32(x), f32(w))
    y, inv = kernels.norm_projection_fwd(x, w)
    assert y.shape == (N, O) and y.dtype == dt and inv.shape == (N, 1) and inv.dtype == np.float32
    _assert_close(y, y_ref, TOL[dtype])
    _assert_close(inv, inv_ref, 1e-5)
    dx, dw = kernels.norm_projection_bwd(x, w, inv, dy)
    assert dx.shape == (N, I) and dx.dtype == dt and dw.shape == (I, O) and dw.dtype == np.float32
    dx_ref, dw_ref = ref.norm_projection_bwd(f32(x), f32(w), inv_ref, f32(dy))
    _assert_close(dx, dx_ref, TOL[dtype])
    _assert_close(dw, dw_ref, TOL[dtype])


def test_counts_at_the_models_qkv_shape(kernels):
    N, I, O = 4096, 512, 1024  # baseline: D = 512 -> (H + 2G) K = 1024
    x, w, dy = ((N, I), "bfloat16"), ((I, O), "bfloat16"), ((N, O), "bfloat16")
    fwd = emulator.count(kernels.projection_fwd, x, w, dy)
    bwd = emulator.count(kernels.projection_bwd, x, w, dy)
    nt = N // 128
    # forward: per token tile I/128 x^T blocks, each two row-tiled halves of 64 x 128 x 64 MACs (= 64
    # columns of the whole array; all on TensorE: VectorE 32 x 32 transposes pay no more under the schedule),
    # and (I/128) x O columns of matmul
    blocks = nt * (I // 128)
    assert fwd.pe_macs_useful == N * I * O
    assert fwd.pe_macs_issued == 128 * 128 * (64 * blocks + blocks * O)
    assert bwd.pe_macs_useful == 2 * N * I * O
    assert fwd.dma_bytes == 2 * (N * I + I * O + 2 * N * O)  # x, w, the residual in and y out once
    assert bwd.psum_peak_banks <= 8 and fwd.psum_peak_banks <= 8
    # dw's 4 x 2 banks fit at once: x read once, dy twice (dx's pass and dw's); w once, dx and dw out
    assert bwd.dma_bytes == 2 * (N * I + 2 * N * O + I * O + N * I) + 4 * I * O


def test_norm_projection_counts_at_the_models_qkv_shape(kernels):
    """The fused q/k/v kernel: TensorE useful/issued >= 0.9 both ways, TensorE-bound, and each of x, dy, w
    moved once (plus the norm's inv [N, 1] fp32): no pass of its own for the norm. (At N = 4096 the
    forward is DMA-bound: the weight's load is not yet amortised.)"""
    N, I, O = 16384, 512, 1024
    x, w, dy, inv = ((N, I), "bfloat16"), ((I, O), "bfloat16"), ((N, O), "bfloat16"), ((N, 1), "float32")
    fwd = emulator.count(kernels.norm_projection_fwd, x, w)
    bwd = emulator.count(kernels.norm_projection_bwd, x, w, inv, dy)
    assert fwd.pe_macs_useful == N * I * O and bwd.pe_macs_useful == 2 * N * I * O
    assert emulator.pe_utilisation(fwd) >= 0.9 and emulator.pe_utilisation(bwd) >= 0.9
    assert emulator.estimate(fwd).bound == emulator.estimate(bwd).bound == "tensor"
    assert fwd.dma_bytes == 2 * (N * I + I * O + N * O) + 4 * N
    assert bwd.dma_bytes == 2 * (2 * N * I + I * O + N * O) + 4 * N + 4 * I * O
    assert bwd.psum_peak_banks <= 8 and fwd.psum_peak_banks <= 8


def _widths(O):
    """q/k/v widths splitting O as the model does (q twice k and v), none a multiple of 128 at the small shapes."""
    return (O - 2 * (O // 4), O // 4, O // 4)


def _mix_inputs(dtype, N, I, O, skip, seed):
    """mix_norm_projection's operands (x_in, x0, mix, w, skip, sw; skip and sw of width 0 for none, as the
    primitive takes them) and cotangents (dx of the written x, dy); the weights hold values of dt in fp32."""
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    r = np.random.default_rng(seed)
    x_in, x0, dxo = ((r.standard_normal((N, I)) * 2 + 0.3).astype(dt) for _ in range(3))
    mix = (1 + r.standard_normal((2, I)) / 2).astype(dt).astype(np.float32)
    w = (r.standard_normal((I, O)) / np.sqrt(I)).astype(dt)
    sk = r.standard_normal((N, I if skip else 0)).astype(dt)
    sw = (1 + r.standard_normal((1, I if skip else 0)) / 2).astype(dt).astype(np.float32)
    return (x_in, x0, mix, w, sk, sw), (dxo, r.standard_normal((N, O)).astype(dt))


@pytest.mark.parametrize("dtype,N,I,O,skip", [
    ("float32", 200, 96, 80, False),  # ragged token tile, contraction and output smaller than a tile
    ("float32", 200, 96, 80, True),
    ("float32", 2100, 128, 192, True),  # 17 token tiles: a second dw block of one ragged tile
    ("float32", 72, 640, 600, False),  # a tile of one transpose half; I = 640: a ragged 128-column sum slice
    ("bfloat16", 300, 256, 640, False),
    ("bfloat16", 300, 256, 640, True),
])
def test_mix_norm_projection_matches_reference(kernels, dtype, N, I, O, skip):
    """The resid_mix (and skip add) fused into the q/k/v kernel: x, q, k, v, inv and every gradient (dx_in, dx0,
    the fp32 token sums dmix / dsw, dw, dskip) against frontier_jax.ops.reference on the same values in fp32."""
    (x_in, x0, mix, w, sk, sw), (dxo, dy) = _mix_inputs(dtype, N, I, O, skip, N + I + O)
    dt = x_in.dtype
    f32 = lambda a: np.asarray(a, np.float32)
    widths = _widths(O)
    want = ref.mix_norm_projection_fwd(f32(x_in), f32(x0), mix, f32(w), f32(sk), sw, widths=widths)
    got = kernels.mix_norm_projection_fwd(x_in, x0, mix, w, sk if skip else None, sw if skip else None,
                                          widths=widths)
    assert [(g.shape, g.dtype) for g in got] == [((N, I), dt)] + [((N, c), dt) for c in widths] + [
        ((N, 1), np.float32)]
    for g, w_ in zip(got, want):
        _assert_close(g, w_, TOL[dtype])
    cuts = [widths[0], widths[0] + widths[1]]
    dys = np.split(dy, cuts, axis=1)
    got_b = kernels.mix_norm_projection_bwd(x_in, x0, mix, w, sk if skip else None, sw if skip else None, got[4],
                                            dxo, *dys)
    want_b = ref.mix_norm_projection_bwd(f32(x_in), f32(x0), mix, f32(w), f32(sk), sw, want[4], f32(dxo),
                                         *(f32(d) for d in dys))
    shapes = [((N, I), dt), ((N, I), dt), ((2, I), np.float32), ((I, O), np.float32)]
    assert [(g.shape, g.dtype) for g in got_b] == shapes + ([((N, I), dt), ((1, I), np.float32)] if skip else [])
    for g, w_ in zip(got_b, want_b):
        _assert_close(g, w_, TOL[dtype])


@pytest.mark.parametrize("skip", [False, True])
def test_mix_norm_projection_counts_at_the_models_qkv_shape(kernels, skip):
    """Each operand moved once (the forward's x_in, x0, w in and x, y, inv out; the backward's x_in, x0, dx of x,
    dy, w, inv in and dx_in, dx0, dmix, dw out; a skip adds skip and its weight in and dskip, dsw out), no pass
    for the mix of its own: the backward recomputes x on chip instead of reading it. TensorE work as
    norm_projection's plus one [128, 128] matmul per 128 columns of each token sum (the products' sums on its
    diagonal), useful/issued >= 0.9."""
    N, I, O = 16384, 512, 1024
    x, w, dy, inv = ((N, I), "bfloat16"), ((I, O), "bfloat16"), ((N, O), "bfloat16"), ((N, 1), "float32")
    mix, sw = ((2, I), "float32"), ((1, I), "float32")
    opt = (x, sw) if skip else (None, None)
    widths = (512, 256, 256)  # the baseline's q, k, v
    fwd = emulator.count(kernels.mix_norm_projection_fwd, x, x, mix, w, *opt, widths=widths)
    dys = [((N, c), "bfloat16") for c in widths]
    bwd = emulator.count(kernels.mix_norm_projection_bwd, x, x, mix, w, *opt, inv, x, *dys)
    plain = emulator.count(kernels.norm_projection_bwd, x, w, inv, dy)
    sums = 3 if skip else 2
    assert fwd.pe_macs_useful == N * I * O
    assert bwd.pe_macs_useful == 2 * N * I * O + sums * N * I * 128  # the token sums: a 128-column block per slice
    # dw's second 512-column slice holds dk and dv, two tiles: one matmul more per 128 rows of I and row tile
    assert bwd.pe_instructions == plain.pe_instructions + (sums + 1) * (I // 128) * (N // 128)
    assert emulator.pe_utilisation(fwd) >= 0.9 and emulator.pe_utilisation(bwd) >= 0.9
    nd, bcast = 2 * N * I, (2 + skip) * 128 * I * 4  # the fp32 weights go to every partition (stride-0 DMA)
    assert fwd.dma_bytes == (3 + skip) * nd + 2 * (I * O + N * O) + 4 * N + bcast
    assert bwd.dma_bytes == (5 + 2 * skip) * nd + 2 * (I * O + N * O) + 4 * N + bcast + 4 * I * O + 4 * I * (2 + skip)
    assert bwd.psum_peak_banks <= 8 and fwd.psum_peak_banks <= 8
    assert emulator.estimate(fwd).bound == "dma"  # at N = 16384 too
    # the backward's two-input element-wise work sits on GpSimd (N cycles, VectorE 2N on the port they share):
    # GpSimd's busy time is level with DMA's
    assert emulator.estimate(bwd).bound in ("dma", "gpsimd")


def test_ops_routed_through_emulated_kernel_match_reference():
    """norm_qkv_projection (one fused weight on the kernel, three parameters) and out_projection with its
    scaled residual add (resid + s (o w): s folded into w's columns on the kernel path): values, x's
    gradient (through both branches), the weights' gradients (fp32 dw from the kernel, per weight) and
    the scale's against the reference path (rms_norm, then plain matmuls, scale and add in bf16)."""
    import jax
    import jax.numpy as jnp

    from frontier_jax import ops
    from frontier_jax.ops import experimental as experimental

    k = jax.random.split(jax.random.key(0), 6)
    x = jax.random.normal(k[0], (2, 100, 64), jnp.float32).astype(jnp.bfloat16)
    wq, wk, wv = (jax.random.normal(k[i], (64, o), jnp.float32) / 8 for i, o in ((1, 64), (2, 32), (3, 32)))
    wo = jax.random.normal(k[4], (64, 64), jnp.float32) / 8
    s = 1 + jax.random.normal(k[5], (64,), jnp.float32) / 4

    def f(proj_qkv, proj_out):
        def loss(x, wq, wk, wv, wo, s):
            q, kk, v = proj_qkv(x, wq, wk, wv)
            return jnp.sum(proj_out(q * v.repeat(2, -1) + kk.repeat(2, -1), wo, x, s).astype(jnp.float32) ** 2)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5)))(x, wq, wk, wv, wo, s)

    plain_qkv = lambda x, wq, wk, wv: tuple(ref.rms_norm(x) @ w.astype(x.dtype) for w in (wq, wk, wv))
    want = f(plain_qkv, lambda o, w, r, s: r + s.astype(r.dtype) * (o @ w.astype(o.dtype)))
    with ops.emulated(["projection", "norm_projection"]):
        got = f(experimental.norm_qkv_projection, ops.out_projection)
    _assert_close(got[0], want[0], TOL["bfloat16"])
    for g, w in zip(got[1], want[1]):
        assert g.dtype == w.dtype and g.shape == w.shape
        _assert_close(g, w, TOL["bfloat16"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mix_op_through_emulated_kernel_matches_direct_path(dtype):
    """ops.mix_norm_qkv_projection with and without a skip, through the emulated kernel: x, q, k, v and the
    gradients of x_in, x0, skip, resid_mix, skip_w and the three weights against the direct (reference) path,
    which is the unfused model's code."""
    import jax
    import jax.numpy as jnp

    from frontier_jax import ops

    dt = jnp.dtype(dtype)
    k = jax.random.split(jax.random.key(1), 9)
    x_in, x0, skip = (jax.random.normal(k[i], (2, 100, 64), jnp.float32).astype(dt) for i in range(3))
    mix = jnp.stack([1 + jax.random.normal(k[3], (64,)) / 4, jax.random.normal(k[4], (64,)) / 4])
    sw = 1 + jax.random.normal(k[5], (64,)) / 4
    wq, wk, wv = (jax.random.normal(k[6 + i], (64, o), jnp.float32) / 8 for i, o in enumerate((64, 32, 32)))

    def f(with_skip):
        def loss(x_in, x0, skip, mix, sw, wq, wk, wv):
            x, q, kk, v = ops.mix_norm_qkv_projection(x_in, x0, mix, wq, wk, wv, *((skip, sw) if with_skip else ()))
            y = x[..., :32] * (q[..., :32] + kk) + v * q[..., 32:] + x[..., 32:] ** 2
            return jnp.sum(y.astype(jnp.float32) ** 2)
        return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(8))))(x_in, x0, skip, mix, sw, wq, wk, wv)

    for with_skip in (False, True):
        want = f(with_skip)
        with ops.emulated(["mix_norm_projection"]):
            got = f(with_skip)
        _assert_close(got[0], want[0], TOL[dtype])
        for g, w in zip(got[1], want[1]):
            assert g.dtype == w.dtype and g.shape == w.shape
            _assert_close(g, w, TOL[dtype])
