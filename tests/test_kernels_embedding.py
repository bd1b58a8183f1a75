"""The embedding gather / scatter-add NKI kernels (one-hot matmuls, under the emulator): duplicates,
padding-free work."""

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
    return registry.load_emulated("embed")


def _ids(kind, N, V, rng):
    if kind == "random":
        return rng.integers(0, V, N).astype(np.int32)
    if kind == "duplicates":  # many repeats inside each 128-token tile
        return rng.integers(0, 5, N).astype(np.int32) * (V // 5)
    return np.full(N, V - 1, np.int32)  # an all-identical-id batch


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["random", "duplicates", "identical"])
def test_gather_and_scatter_add_match_reference(kernels, kind, dtype):
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(len(kind))
    N, V, D = 333, 260, 48  # N, V, D not multiples of 128
    ids = _ids(kind, N, V, rng)
    emb = rng.standard_normal((V, D)).astype(np_dtype)
    dy = rng.standard_normal((N, D)).astype(np_dtype)
    np.testing.assert_array_equal(kernels.embed_fwd(ids, emb), emb[ids])
    demb = kernels.embed_bwd(ids, emb, dy)
    assert demb.dtype == np.float32
    _, vjp = jax.vjp(lambda e: ref.embed(jnp.asarray(ids), e), jnp.asarray(emb.astype(np.float32)))
    _assert_close(demb, vjp(jnp.asarray(dy.astype(np.float32)))[0], 1e-5)  # fp32 accumulation either way


def test_one_hot_matmuls_do_no_padding_work_at_baseline_shapes(kernels):
    """Every token meets every vocabulary row exactly once on TensorE (useful MACs = N V D, all issued
    MACs useful), and DMA moves each row once: no padded tokens, no indirect DMA."""
    N, V, D = 65536, 1024, 512
    bwd = emulator.count(kernels.embed_bwd, ((N,), "int32"), ((V, D), "bfloat16"), ((N, D), "bfloat16"))
    assert bwd.pe_macs_useful == bwd.pe_macs_issued == N * V * D
    assert bwd.dma_bytes == N * D * 2 + 4 * N + V * D * 4  # dy rows, ids, the fp32 output written once
    fwd = emulator.count(kernels.embed_fwd, ((N,), "int32"), ((V, D), "bfloat16"))
    assert fwd.pe_macs_useful == fwd.pe_macs_issued == N * V * D
    assert fwd.dma_bytes == N * D * 2 + 128 * 4 * N + V * D * 2  # rows out, ids on 128 partitions, emb once
    ragged = emulator.count(kernels.embed_fwd, ((300,), "int32"), ((V, D), "bfloat16"))
    assert ragged.pe_macs_useful == 300 * V * D  # the last tile is sliced, never padded
    assert ragged.dma_bytes == 300 * D * 2 + 128 * 4 * 300 + V * D * 2


@pytest.mark.parametrize("dtype", [jnp.bfloat16])  # fp32 is covered kernel-level above
def test_op_routed_through_emulated_kernel_matches_reference(dtype):
    ids = jnp.asarray(np.r_[np.full(40, 3), np.arange(60) % 7], jnp.int32).reshape(4, 25)
    emb = jax.random.normal(jax.random.key(0), (11, 24), jnp.float32).astype(dtype)
    w = jax.random.normal(jax.random.key(1), (4, 25, 24), jnp.float32)
    f = lambda op: jax.jit(jax.value_and_grad(lambda e: jnp.sum(op(ids, e).astype(jnp.float32) * w)))
    v_ref, g_ref = f(ref.embed)(emb)
    with ops.emulated(["embed"]):
        v_emu, g_emu = f(ops.embed)(emb)
    assert g_emu.dtype == dtype
    tol = TOL["bfloat16" if dtype == jnp.bfloat16 else "float32"]
    _assert_close(v_emu, v_ref, tol)
    _assert_close(g_emu, g_ref, tol)


def test_emulated_iota_semantics():
    """iota fills offset + channel_multiplier * partition + step * index (the one-hot compare values)."""
    from kernels_nki.emulator import isa, language, machine

    m = machine.Machine()
    with machine.running(m):
        io = m.allocate((2, 5), np.float32, language.sbuf)
        isa.iota(dst=io, pattern=[[2, 5]], offset=7, channel_multiplier=100)
        assert io.data.tolist() == [[7, 9, 11, 13, 15], [107, 109, 111, 113, 115]]
    assert m.counters.gpsimd_instructions == 1
