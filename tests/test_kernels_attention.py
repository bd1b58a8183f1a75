"""The causal GQA flash-attention NKI kernels (under the emulator) against frontier_jax.reference.causal_attention."""

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
    # per block, in 128 x 128 x N units: fwd s (N=128 on one 64-row tile: charged 64 rows, all useful),
    # p^T (two 64-row tiles, N=64 each: 64, transpose), p v (N=K); bwd s, dp (64-row tiles, N=128 each),
    # p^T dO, ds^T q, ds k (N=K each), ds^T (64, transpose); per query tile the q^T (and dO^T) transposes
    # (64 each) and, forward only, the diagonal block's mask matmul (identity stationary: zero useful
    # MACs, N=128); per kv head tile the k^T (and v^T) transposes
    assert fwd.pe_macs_useful == H * nb * unit * 2 * K
    assert fwd.pe_macs_issued == unit * (H * (nb * (K + 64 + K) + nt * (64 + 128)) + G * nt * 64)
    assert bwd.pe_macs_useful == H * nb * unit * 5 * K
    assert bwd.pe_macs_issued == unit * (H * (nb * (2 * K + 3 * K + 64) + nt * 2 * 64) + G * 2 * nt * 64)
    assert emulator.pe_utilisation(fwd) > 0.52 and emulator.pe_utilisation(bwd) > 0.74  # see the module docstring
    # at the documented engine rates (cost.py, two-input VectorE instructions at 2N) the softmax's
    # Vector/Scalar work, not TensorE, bounds both directions
    for c in (fwd, bwd):
        secs = emulator.estimate(c).engine_s
        assert emulator.estimate(c).bound in ("vector", "scalar") and secs["tensor"] < secs["vector"]
    assert fwd.psum_peak_banks <= 8 and bwd.psum_peak_banks <= 8
    # q, k, v in and o out once; lse out (fp32)
    assert fwd.dma_bytes == 2 * (2 * B * T * H * K + 2 * B * T * G * K) + 4 * B * H * T


def test_op_routed_through_emulated_kernel_matches_reference():
    q, k, v, _ = _case(2, 40, 4, 2, 16, np.float32, 3)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    f = lambda op: jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jnp.sin(op(q, k, v))), argnums=(0, 1, 2)))
    v_ref, g_ref = f(ref.causal_attention)(q, k, v)
    with ops.through_primitives():  # on CPU the op otherwise calls the reference directly
        jaxpr = str(jax.make_jaxpr(jax.grad(lambda q: jnp.sum(ops.causal_attention(q, k, v))))(q))
    assert "frontier_causal_attention_fwd[" in jaxpr and "frontier_causal_attention_bwd[" in jaxpr
    with ops.emulated(["causal_attention"]):
        v_emu, g_emu = f(ops.causal_attention)(q, k, v)
    _assert_close(v_emu, v_ref, 1e-5)
    for a, b in zip(g_emu, g_ref):
        _assert_close(a, b, 1e-5)


def test_head_dim_64_contractions_run_on_half_the_pe_array(kernels, monkeypatch):
    """q k^T and dO v^T contract over K = 64: row tiling mode, the halves alternating so that consecutive
    ones can run in parallel (nc_matmul "Tiling mode", NeuronCore-v2 or newer)."""
    from kernels_nki.emulator import isa

    seen, real = [], isa.nc_matmul

    def spy(dst, stationary, moving, *args, **kw):
        seen.append((stationary.shape[0], kw.get("tile_position", ()), kw.get("tile_size", ())))
        return real(dst, stationary, moving, *args, **kw)

    monkeypatch.setattr(isa, "nc_matmul", spy)
    B, T, H, G, K = 1, 640, 2, 1, 64
    q, kv = ((B, T, H, K), "bfloat16"), ((B, T, G, K), "bfloat16")
    emulator.count(kernels.attention_fwd, q, kv, kv)
    emulator.count(kernels.attention_bwd, q, kv, kv, q, ((B, H, T, 1), "float32"), q)
    tiled = [pos for k, pos, size in seen if size]
    assert all(size == (64, 128) for k, _, size in seen if k <= 64)
    assert all(not size for k, _, size in seen if k > 64)
    assert {pos for pos in tiled} == {(0, 0), (64, 0)} and len(tiled) > 0


def test_transposes_run_as_two_parallel_64_row_tiles(kernels, monkeypatch):
    """Every TensorE transpose is nc_matmul(is_transpose=True) of a <= 64-row half against a 64 x 64
    identity on its own row tile: a 128-row transpose streams 64 identity columns per tile, both tiles in
    parallel (nc_matmul "Tiling mode" / "Transpose mode")."""
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
    assert seen and all(rows <= 64 and mov == (rows, rows) and size == (64, 128) for rows, mov, _, size in seen)
    assert {pos for _, _, pos, _ in seen} == {(0, 0), (64, 0)}
