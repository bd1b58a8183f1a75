"""The causal GQA flash-attention NKI kernels (under the emulator) against frontier_jax.ops.reference.causal_attention."""

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
from kernels_nki import emulator, registry



@pytest.fixture(scope="module")
def kernels():
    return registry.load_emulated("causal_attention")


def _case(B, T, H, G, K, dtype, seed):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B, T, H, K)) * 1.5).astype(dtype)  # peaky rows: the online max matters
    k = rng.standard_normal((B, T, G, K)).astype(dtype)
    v = rng.standard_normal((B, T, G, K)).astype(dtype)
    do = rng.standard_normal((B, T, H, K)).astype(dtype)
    return q, k, v, do


@pytest.mark.parametrize("dtype,B,T,H,G,K", [
    ("float32", 1, 200, 2, 1, 32),  # GQA ratio 2, T not a multiple of 128 (ragged last tile)
    ("float32", 2, 130, 2, 2, 16),  # ratio 1, a 2-row last tile, batch > 1
    ("float32", 1, 600, 1, 1, 32),  # two key chunks of <= 512: the online rescaling
    ("bfloat16", 1, 200, 4, 2, 64),  # the model's head dim
])
def test_forward_and_backward_match_reference(kernels, dtype, B, T, H, G, K):
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    q, k, v, do = _case(B, T, H, G, K, np_dtype, T + H + K)
    f32 = lambda a: jnp.asarray(a.astype(np.float32))
    o_ref, vjp = jax.vjp(ref.causal_attention, f32(q), f32(k), f32(v))
    o, lse = kernels.attention_fwd(q, k, v)
    assert o.shape == q.shape and o.dtype == np_dtype and lse.shape == (B, H, T, 1) and lse.dtype == np.float32
    _assert_close(o, o_ref, TOL[dtype])
    s = jnp.einsum("btgrk,bsgk->bgrts", f32(q).reshape(B, T, G, H // G, K), f32(k)) / np.sqrt(K)
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    _assert_close(lse, jax.nn.logsumexp(s, axis=-1).reshape(B, H, T, 1), TOL[dtype])
    dq, dk, dv = kernels.attention_bwd(q, k, v, o, lse, do)
    assert dq.dtype == dk.dtype == dv.dtype == np_dtype and dk.shape == k.shape
    for got, want in zip((dq, dk, dv), vjp(f32(do))):
        _assert_close(got, want, TOL[dtype])


def _blocks(T):
    n = -(-T // 128)
    return n * (n + 1) // 2  # 128x128 (query, key) blocks on or below the diagonal


def test_counts_at_seq_1024_skip_every_block_above_the_diagonal(kernels):
    B, T, H, G, K = 1, 1024, 8, 4, 64
    q, kv = ((B, T, H, K), "bfloat16"), ((B, T, G, K), "bfloat16")
    fwd = emulator.count(kernels.attention_fwd, q, kv, kv)
    bwd = emulator.count(kernels.attention_bwd, q, kv, kv, q, ((B, H, T, 1), "float32"), q)
    unit, nb, nt = 128 * 128, _blocks(T), T // 128
    # per block, in 128 x 128 x N units: fwd s (N=128 on the whole array: q^T and k^T sit on partitions
    # 0 .. 63 only, so no row tile of their own; all useful), s^T again in key-major layout (the whole array,
    # named "recompute": not useful), the -max shift added into it (a K=1 matmul, 0/1 stationary: not
    # useful), p^T [v | 1] (N=K+1, the ones column giving the row sums); bwd s (the whole array), dp (a 64-row
    # tile: a stacked head's dO^T and v^T on its half of the partitions; N=128), p^T dO, ds^T q, ds k (N=K
    # each), ds^T
    # (two 64-row tiles of N=64: 64, transpose); per query tile the q^T (and dO^T) transposes (32 each: two
    # 64 x 64 tiles of N=64, the data being 64 columns wide) and the diagonal block's mask matmul (identity
    # stationary: zero useful MACs, N=128; the backward's masks its scores too, so that its exp gives p = 0
    # there, instead of a GpSimd select of p) and, forward only, per key chunk the [rows, 1] -> [1, rows]
    # transpose of the shifts (32); per kv head tile the k^T (and v^T) transposes (32); per query tile the
    # log-sum-exp columns of all heads moved to (forward) or from (backward) their [H, T] rows by one fp32
    # transpose ([128, H] -> [H, 128]: 32; [H, 128] -> [128, H], N = H: 4)
    chunks = sum(-(-(i + 1) * 128 // 512) for i in range(nt))
    assert fwd.pe_macs_useful == H * nb * unit * (2 * K + 1)
    # (+ o to the consecutive-rows layout: two transposes per 128-row block and head, 32 each)
    assert fwd.pe_macs_issued == unit * (H * (nb * (128 + 128 + 128 + K + 1) + nt * (32 + 128) + chunks * 32) + G * nt * 32
                                         + nt * 32 + H * nt * 64)
    # the backward's -Di = -rowsum(dO o), made in the consecutive-rows layout, to natural columns the same
    # way: per tile [128, H] -> [H, 128] rows (32) and back (4)
    assert fwd.pe_macs_issued_fp32 == unit * nt * 32 and bwd.pe_macs_issued_fp32 == unit * nt * (4 + 32 + 4)
    assert bwd.pe_macs_useful == H * nb * unit * 5 * K
    # backward: dO arrives in the consecutive-rows layout, its rows are dO^T transposed back (32 per tile);
    # dq, dk, dv leave in natural rows, as made (no transposes); a kv head's two query heads have their dO^T
    # stacked on the two halves of the partitions, so its v^T is transposed onto both halves (one 32 more per tile)
    assert bwd.pe_macs_issued == unit * (H * (nb * (128 + 64 + 3 * K + 64) + nt * (3 * 32 + 128)) + G * 3 * nt * 32
                                         + nt * (4 + 32 + 4))
    # the transposes above, the whole array for the K = 64 scores (and the backward's mask matmuls: TensorE time
    # for GpSimd's, TensorE having room)
    assert emulator.pe_utilisation(fwd) > 0.25 and emulator.pe_utilisation(bwd) > 0.6
    # at the documented engine rates (cost.py, two-input VectorE instructions at 2N) the softmax's
    # Vector/Scalar work, not TensorE, bounds both directions
    for c in (fwd, bwd):
        secs = emulator.estimate(c).engine_s
        # (the backward's dp - Di leaves PSUM on ScalarE: VectorE shares GpSimd's SBUF port)
        assert emulator.estimate(c).bound in ("vector", "scalar") and secs["tensor"] < max(secs["vector"],
                                                                                          secs["scalar"])
    assert fwd.psum_peak_banks <= 8 and bwd.psum_peak_banks <= 8
    # q, k, v in and o out once; lse out (fp32)
    assert fwd.dma_bytes == 2 * (2 * B * T * H * K + 2 * B * T * G * K) + 4 * B * H * T


def test_head_dim_64_contractions_run_on_the_row_tile_of_their_operands(kernels, monkeypatch):
    """K = 64 contractions run in row tiling mode (nc_matmul "Tiling mode", NeuronCore-v2 or newer) where their
    operands sit on that 64-row half of the partitions: transposes, and the dp matmuls of a kv head's two query
    heads, whose dO^T are stacked on the two halves (v^T on both); q k^T, whose q^T and k^T sit on partitions
    0 .. 63 only, runs on the whole array (a row tile multiplies its own partitions: the strict reading)."""
    from kernels_nki.emulator import isa

    seen, real = [], isa.nc_matmul

    def spy(dst, stationary, moving, *args, **kw):
        seen.append((stationary.shape[0], stationary.pstart, moving.pstart, kw.get("tile_position", ()),
                     kw.get("tile_size", ())))
        return real(dst, stationary, moving, *args, **kw)

    monkeypatch.setattr(isa, "nc_matmul", spy)
    B, T, H, G, K = 1, 640, 2, 1, 64
    q, kv = ((B, T, H, K), "bfloat16"), ((B, T, G, K), "bfloat16")
    emulator.count(kernels.attention_fwd, q, kv, kv)
    emulator.count(kernels.attention_bwd, q, kv, kv, q, ((B, H, T, 1), "float32"), q)
    tiled = [(k, s0, m0, pos, size) for k, s0, m0, pos, size in seen if size]
    # every tiled matmul: a <= 64-row tile (64-column too when the stationary is <= 64 wide: transposes of
    # [rows, K] tiles), both operands on its partitions
    assert tiled and all(size in ((64, 128), (64, 64)) for *_, size in tiled)
    assert all(pos[0] <= s0 and s0 + k <= pos[0] + 64 and pos[0] <= m0 and m0 + k <= pos[0] + 64
               for k, s0, m0, pos, _ in tiled)
    assert {pos for *_, pos, _ in tiled} == {(0, 0), (64, 0), (0, 64), (64, 64)}
    # the upper row tile multiplies operands of its own (transposes' second halves, the odd head's dp)
    assert any(pos == (64, 0) and k == 64 and s0 == 64 for k, s0, _, pos, _ in tiled)
    # the whole array: q k^T (q^T and k^T on partitions 0 .. 63) and the contractions over more than 64 rows
    assert any(k == K and not size and s0 == 0 for k, s0, _, _, size in seen)
    assert all(not size for k, *_, size in seen if k > 64)
    # the column tile at 64 only for 64-column transposes (two heads' stacked on the two halves of PSUM)
    assert all(size == (64, 64) for *_, pos, size in tiled if pos[1] == 64)


def test_transposes_run_as_two_parallel_64_row_tiles(kernels, monkeypatch):
    """Every TensorE transpose is nc_matmul(is_transpose=True) of a <= 64-row half against a 64 x 64
    identity on its own row tile: a 128-row transpose streams 64 identity columns per tile, both tiles in
    parallel (nc_matmul "Tiling mode" / "Transpose mode"); data <= 64 columns wide (here K = 32) also takes
    a 64-column tile only, at column 0 (its result lands on PSUM partitions 0 .. K)."""
    from kernels_nki.emulator import isa

    seen, real = [], isa.nc_matmul

    def spy(dst, stationary, moving, *args, **kw):
        if kw.get("is_transpose"):
            seen.append((stationary.shape[0], moving.shape, kw.get("tile_position"), kw.get("tile_size")))
        return real(dst, stationary, moving, *args, **kw)

    monkeypatch.setattr(isa, "nc_matmul", spy)
    q, k, v, do = _case(1, 200, 2, 1, 32, np.float32, 5)
    o, lse = kernels.attention_fwd(q, k, v)
    kernels.attention_bwd(q, k, v, o, lse, do)
    assert seen and all(rows <= 64 and mov == (rows, rows) for rows, mov, _, size in seen)
    assert {size for *_, size in seen} == {(64, 64), (64, 128)}  # [rows, K] tiles and [128, 128] ds blocks
    assert {pos for _, _, pos, _ in seen} == {(0, 0), (64, 0)}


# ----------------------------------------------------------------------------- qk_attention (QK-norm + RoPE + gain fused)


@pytest.fixture(scope="module")
def qk_kernels():
    return registry.load_emulated("qk_attention")


def _qk_case(B, T, H, G, K, dtype, seed, gain_scale=1.0):
    """Raw q/k at a scale the QK-norm removes, cos/sin rounded to the dtype (as ops.qk_attention passes
    them) and the gain broadcast over 128 rows, rounded likewise."""
    q, k, v, do = _case(B, T, H, G, K, dtype, seed)
    q, k = (q.astype(np.float32) * 3).astype(dtype), (k.astype(np.float32) * 0.5 + 0.2).astype(dtype)
    jdt = jnp.bfloat16 if dtype == np.dtype(ml_dtypes.bfloat16) else jnp.float32
    rounded = lambda a: np.asarray(jnp.asarray(a).astype(jdt).astype(jnp.float32))
    cos, sin = (rounded(t) for t in ref.rope_tables(T, K, 10000.0))
    gain = np.random.default_rng(seed).uniform(0.5, 2.0, H) * gain_scale
    g_PH = np.broadcast_to(rounded(gain.astype(np.float32))[None], (128, H)).copy()
    return q, k, v, do, cos, sin, g_PH


@pytest.mark.parametrize("dtype,B,T,H,G,K,gain_scale,exact_max,xsa", [
    ("float32", 1, 200, 2, 1, 32, 1.0, False, False),  # GQA ratio 2, ragged last tile
    ("float32", 2, 130, 2, 2, 16, 1.0, False, True),  # ratio 1, a 2-row last tile, batch > 1; XSA
    ("float32", 1, 600, 1, 1, 32, 1.0, False, False),  # two query chunks
    ("float32", 1, 600, 1, 1, 32, 4.0, True, False),  # exact max: two key chunks (the online rescaling), peaky rows
    ("float32", 1, 200, 2, 1, 32, 1.0, True, True),  # exact max with XSA's epilogue
    ("bfloat16", 1, 200, 4, 2, 64, 1.0, False, False),  # the model's head dim
    ("bfloat16", 1, 256, 8, 4, 64, 1.0, False, True),  # record11's heads (8 / 4 of 64) at a short sequence
])  # record11_tiny's heads with partial RoPE and XSA: the op's test below
def test_qk_attention_matches_reference(qk_kernels, dtype, B, T, H, G, K, gain_scale, exact_max, xsa):
    """The fused kernel (QK-norm, RoPE, gain, attention, with xsa XSA's epilogue), with either softmax shift,
    against reference.qk_attention_fwd / _bwd: o, the residuals (lse, the normed, rotated q / k and their inverse
    RMS, with XSA each row's o . u before it), dq / dk through the norm and rotation, dv (with XSA's share), and the
    gain's gradient per (batch, head)."""
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    q, k, v, do, cos, sin, g_PH = _qk_case(B, T, H, G, K, np_dtype, T + H + K, gain_scale)
    assert ops.bounded_shift_valid(float(ops.score_bound([g_PH], K)), T) or exact_max
    f32 = lambda a: jnp.asarray(a.astype(np.float32))
    want_fwd = ref.qk_attention_fwd(f32(q), f32(k), f32(v), cos, sin, g_PH, xsa_on=xsa)
    got_fwd = qk_kernels.qk_attention_fwd(q, k, v, cos, sin, g_PH, exact_max=exact_max, xsa_on=xsa)
    assert len(got_fwd) == 8 + xsa  # with XSA, xc too
    o, lse, qg, qinv, kr, kinv, qgT, krT = got_fwd[:8]
    assert o.dtype == qg.dtype == kr.dtype == qgT.dtype == krT.dtype == np_dtype and lse.shape == (B, H, T, 1)
    assert qinv.shape == (B, T, H, 1) and kinv.shape == (B, T, G, 1) and qinv.dtype == np.float32
    np.testing.assert_array_equal(qgT, np.transpose(qg, (0, 2, 3, 1)))  # bit-identical: the same values
    np.testing.assert_array_equal(krT, np.transpose(kr, (0, 2, 3, 1)))
    for a, b in zip(got_fwd, want_fwd):
        _assert_close(a, b, TOL[dtype])
    xc = got_fwd[8] if xsa else None  # no XSA: no xc
    got = qk_kernels.qk_attention_bwd(q, k, v, cos, sin, g_PH, *got_fwd[:8], xc, do, xsa_on=xsa)
    want = ref.qk_attention_bwd(f32(q), f32(k), f32(v), cos, sin, g_PH, *want_fwd, f32(do), xsa_on=xsa)
    assert [a.shape for a in got] == [q.shape, k.shape, v.shape, (B, H, 1)] and got[3].dtype == np.float32
    for a, b in zip(got, want):
        _assert_close(a, b, TOL[dtype])


def test_qk_attention_bounded_xsa_over_two_query_chunks_matches_reference(qk_kernels):
    """The bounded forward's XSA epilogue where a query chunk ends before the last step (T > 512: two chunks, so a
    chunk end's XSA second half is issued between later steps), against reference.qk_attention_fwd."""
    q, k, v, _, cos, sin, g_PH = _qk_case(1, 600, 1, 1, 16, np.dtype(np.float32), 21)
    want = ref.qk_attention_fwd(*(jnp.asarray(a) for a in (q, k, v, cos, sin, g_PH)), xsa_on=True)
    got = qk_kernels.qk_attention_fwd(q, k, v, cos, sin, g_PH, xsa_on=True)
    assert len(got) == len(want) == 9
    for a, b in zip(got, want):
        _assert_close(a, b, TOL["float32"])


def test_bounded_shift_is_exact_at_its_limit_on_the_worst_rows(qk_kernels):
    """The bounded forward's worst case: every key anti-aligned with every query (each score = -B_h, the
    lower end of the bound) at the largest gains ops allows (B_h = SHIFT_LIMIT): each row's sum is ~
    e^(35 - 2 B_h) = e^-43, inside ScalarE's log range (the emulator checks it), and o / lse equal the
    reference's (uniform rows)."""
    B, T, H, G, K = 1, 300, 2, 1, 64
    rng = np.random.default_rng(11)
    u = rng.standard_normal(K).astype(np.float32)
    q = np.broadcast_to(u, (B, T, H, K)).copy()
    cos, sin = (np.asarray(t) for t in ref.rope_tables(T, K, 10000.0))
    cos, sin = np.ones_like(cos), np.zeros_like(sin)  # no rotation: k = -q stays anti-aligned at every offset
    k = -q[:, :, :G]
    v = rng.standard_normal((B, T, G, K)).astype(np.float32)
    g = ops.SHIFT_LIMIT / (K ** 0.5 * ops.SHIFT_MARGIN)
    g_PH = np.full((128, H), g, np.float32)
    assert ops.bounded_shift_valid(float(ops.score_bound([g_PH], K)), T)
    assert not ops.bounded_shift_valid(float(ops.score_bound([g_PH * 1.01], K)), T)
    got = qk_kernels.qk_attention_fwd(q, k, v, cos, sin, g_PH)
    want = ref.qk_attention_fwd(*(jnp.asarray(a) for a in (q, k, v, cos, sin, g_PH)))
    assert np.all(np.isfinite(got[0])) and np.all(np.isfinite(got[1]))
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-4)  # lse ~ -39 + log(t + 1)
    _assert_close(got[0], want[0], 1e-5)


def test_kernel_and_ops_agree_on_the_bound():
    """The kernel's shift and ops' limits: the same margin on the bound, and at the limits the row sum l in
    [e^(S - 2 B), T e^S] stays inside ScalarE's log range [2^-64, 2^64] (S = SHIFT_OFFSET)."""
    kernels = registry.load_emulated("qk_attention")
    assert kernels.BOUND_MARGIN == ops.SHIFT_MARGIN
    lo, hi = -64 * np.log(2), 64 * np.log(2)
    assert kernels.SHIFT_OFFSET - 2 * ops.SHIFT_LIMIT >= lo
    assert np.log(ops.SHIFT_MAX_T) + kernels.SHIFT_OFFSET <= hi


def test_qk_attention_op_runs_the_forward_the_host_chose(monkeypatch):
    """ops.qk_attention under the emulated kernel runs the forward `ops.attention_forward` chose at trace time
    (the trainer: bounded for ordinary gains, exact-max past the limit); both give the reference's values."""
    kernels = registry.load_emulated("qk_attention")
    seen, real = [], kernels.qk_attention_fwd

    def spy(*a, exact_max, xsa_on):
        seen.append(exact_max)
        return real(*a, exact_max=exact_max, xsa_on=xsa_on)

    monkeypatch.setattr(kernels, "qk_attention_fwd", spy)
    q, k, v, _, cos, sin, g_PH = _qk_case(1, 40, 2, 1, 16, np.dtype(np.float32), 5)
    cos32, sin32 = ref.rope_tables(40, 16, 10000.0)
    limit = ops.SHIFT_LIMIT / (16 ** 0.5 * ops.SHIFT_MARGIN)
    for gain in (jnp.asarray([1.0, -2.0]), jnp.asarray([1.0, -1.05 * limit])):
        exact = not ops.bounded_shift_valid(float(ops.score_bound([gain], 16)), 40)
        assert exact == (float(gain[1]) < -limit)
        want = ref.qk_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), cos32, sin32, gain)
        seen.clear()

        def f(*a):
            with ops.attention_forward(exact):
                return ops.qk_attention(*a)

        with ops.emulated(["qk_attention"]):
            got = jax.jit(f)(q, k, v, cos32, sin32, gain)
        assert seen == [exact]
        _assert_close(got, want, 1e-5)


def test_qk_attention_op_with_the_records_switches_through_the_emulated_kernels_matches_reference():
    """ops.qk_attention with partial RoPE (16 of 32 head dims, the record's base rescaling in the tables) and XSA at
    record11_tiny's heads (4 / 2): both kernels (the whole-head rotation on permuted heads, XSA's epilogue and its
    backward) give the reference's values and gradients of q, k, v and the gain."""
    B, T, H, G, K, R = 1, 136, 4, 2, 32, 16
    q, k, v, do, *_ = _qk_case(B, T, H, G, K, np.dtype(np.float32), 9)
    cos, sin = ref.rope_tables(T, R, 10000.0 * (T / 64) ** (R / (R - 2)))
    gain = jnp.asarray([0.5, 1.0, 1.5, 2.0])
    loss = lambda op: jax.jit(jax.value_and_grad(lambda *a: jnp.sum(op(*a) * do), argnums=(0, 1, 2, 3)))
    v_ref, g_ref = loss(lambda q, k, v, g: ref.qk_attention(q, k, v, cos, sin, g, True))(q, k, v, gain)
    with ops.emulated(["qk_attention"]):
        v_emu, g_emu = loss(lambda q, k, v, g: ops.qk_attention(q, k, v, cos, sin, g, xsa=True))(q, k, v, gain)
    _assert_close(v_emu, v_ref, 1e-5)
    for a, b in zip(g_emu, g_ref):
        _assert_close(a, b, 1e-4)


def test_qk_attention_reference_is_the_model_composition():
    """reference.qk_attention_fwd / _bwd are the forward and autodiff of QK-norm -> RoPE (* gain) ->
    attention as the model composed them from separate ops, so the fused op changes no number on CPU."""
    q, k, v, do, cos, sin, g_PH = _qk_case(2, 40, 4, 2, 16, np.dtype(np.float32), 7)
    q, k, v, do = (jnp.asarray(a) for a in (q, k, v, do))
    gain = jnp.asarray(g_PH[0])

    def composed(q, k, v, gain):
        qg = ref.rope_gain(ref.rms_norm(q), cos, sin, gain)
        return ref.causal_attention(qg, ref.rope(ref.rms_norm(k), cos, sin), v)

    o, vjp = jax.vjp(composed, q, k, v, gain)
    saved = ref.qk_attention_fwd(q, k, v, cos, sin, g_PH)
    np.testing.assert_allclose(saved[0], o, rtol=1e-6, atol=1e-6)
    dq, dk, dv, dg = vjp(do)
    got = ref.qk_attention_bwd(q, k, v, cos, sin, g_PH, *saved, do)
    for a, b in zip(got[:3], (dq, dk, dv)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[3][..., 0].sum(axis=0), dg, rtol=1e-5, atol=1e-5)


def test_qk_attention_op_routed_through_emulated_kernel_matches_reference():
    """ops.qk_attention under the emulated kernel: values and gradients w.r.t. q, k, v and the gain equal
    the direct (reference) path, as the model calls it."""
    q, k, v, _, cos, sin, g_PH = _qk_case(2, 40, 4, 2, 16, np.dtype(np.float32), 3)
    q, k, v, gain = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(g_PH[0])
    cos32, sin32 = ref.rope_tables(40, 16, 10000.0)
    loss = lambda q, k, v, g: jnp.sum(jnp.sin(ops.qk_attention(q, k, v, cos32, sin32, g)))
    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
    v_ref, g_ref = f(q, k, v, gain)
    with ops.through_primitives():
        jaxpr = str(jax.make_jaxpr(jax.grad(loss))(q, k, v, gain))
    assert "frontier_qk_attention_fwd[" in jaxpr and "frontier_qk_attention_bwd[" in jaxpr
    with ops.emulated(["qk_attention"]):
        v_emu, g_emu = f(q, k, v, gain)
    _assert_close(v_emu, v_ref, 1e-5)
    for a, b in zip(g_emu, g_ref):
        _assert_close(a, b, 1e-5)


def test_qk_attention_counts_at_seq_1024(qk_kernels, kernels):
    """At the model's shapes the fused prep adds no TensorE work beyond one [128, 1] sum per head (the
    gain's gradient); the forward writes the normed, rotated q / k and their inverse RMS once, the
    backward reads their transposes and the inverse RMS once (and q, k, v, dO, o once); the kernel stays
    Vector/Scalar/GpSimd-bound.
    The bounded forward issues s^T once per block (useful, on the whole PE array: q^T and k^T sit on partitions
    0 .. 63 only) and p^T [v | 1], nothing else but transposes (q^T / k^T, o to the consecutive-rows layout) and
    the diagonal blocks' mask matmuls: TensorE useful/issued > 0.5, and it is the faster forward. The backward loads q^T / k^T
    (saved by the forward) instead of transposing them again, and makes the rows qg / kr from them."""
    B, T, H, G, K = 1, 1024, 8, 4, 64
    q, kv, lse = ((B, T, H, K), "bfloat16"), ((B, T, G, K), "bfloat16"), ((B, H, T, 1), "float32")
    tabs, g = (((T, K // 2), "float32"),) * 2, ((128, H), "float32")
    qinv, kinv = ((B, T, H, 1), "float32"), ((B, T, G, 1), "float32")
    bounded = emulator.count(qk_kernels.qk_attention_fwd, q, kv, kv, *tabs, g)
    unit, nb, nt = 128 * 128, _blocks(T), T // 128
    assert bounded.pe_macs_useful == H * nb * unit * (2 * K + 1)
    # + the lse rows; + o to the consecutive-rows layout: two transposes per 128-row block (32 units each); + per
    # diagonal block the causal bias added to s^T (identity stationary, N = 128: TensorE time instead of a GpSimd
    # select of p^T, GpSimd sharing VectorE's SBUF port)
    assert bounded.pe_macs_issued == unit * (H * (nb * (128 + K + 1) + nt * (32 + 128)) + G * nt * 32 + nt * 32
                                             + H * nt * 64)
    assert emulator.pe_utilisation(bounded) > 0.5
    fwd = emulator.count(qk_kernels.qk_attention_fwd, q, kv, kv, *tabs, g, exact_max=True)
    assert emulator.estimate(bounded).total_s < 0.7 * emulator.estimate(fwd).total_s
    assert bounded.dma_bytes == fwd.dma_bytes
    qT, kT = ((B, H, K, T), "bfloat16"), ((B, G, K, T), "bfloat16")
    bwd = emulator.count(qk_kernels.qk_attention_bwd, q, kv, kv, *tabs, g, q, lse, q, qinv, kv, kinv, qT, kT, None, q)
    plain_fwd = emulator.count(kernels.attention_fwd, q, kv, kv)
    plain_bwd = emulator.count(kernels.attention_bwd, q, kv, kv, q, lse, q)
    assert fwd.pe_macs_issued == plain_fwd.pe_macs_issued and fwd.pe_macs_useful == plain_fwd.pe_macs_useful
    # the dg sums ([128,1] x [128,1]) more; the q^T / k^T transposes (32 units each) are loaded from the forward
    # instead, and its saved rows qg / kr are the transposes back of them (32 units each): as many
    assert bwd.pe_macs_issued - plain_bwd.pe_macs_issued == H * 128 * 128 * 1
    assert bwd.pe_macs_useful - plain_bwd.pe_macs_useful == H * 128  # the same useful work bar the dg sums
    consts = 4 * T * K + 4 * 128 * H
    saved = 2 * 2 * T * (H + G) * K + 4 * T * (H + G)  # qg, kr and their transposes (bf16), the inverse RMS (fp32)
    assert fwd.dma_bytes == plain_fwd.dma_bytes + consts + saved
    assert bwd.dma_bytes == plain_bwd.dma_bytes + consts + saved - 2 * T * (H + G) * K + 4 * H  # no qg / kr rows
    for c in (fwd, bwd):
        assert emulator.estimate(c).bound in ("vector", "scalar", "gpsimd")
