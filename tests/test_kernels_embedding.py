"""The embedding gather / scatter-add NKI kernels (under the emulator): duplicates, padding-free work."""

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
    return registry.load_emulated("embed")


def _ids(kind, N, V, rng):
    if kind == "random":
        return rng.integers(0, V, N).astype(np.int32)
    if kind == "duplicates":  # many repeats inside each 128-row DMA
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


def test_scatter_add_issues_no_work_on_padding_at_baseline_shapes(kernels):
    N, V, D = 65536, 1024, 512
    c = emulator.count(kernels.embed_bwd, ((N,), "int32"), ((V, D), "bfloat16"), ((N, D), "bfloat16"))
    useful = N * D * 2 + 4 * N + V * D * 4  # dy rows, ids, the fp32 output written once
    assert c.dma_bytes / useful <= 1.1 and c.pe_macs_issued == 0
    ragged = emulator.count(kernels.embed_fwd, ((300,), "int32"), ((V, D), "bfloat16"))
    assert ragged.dma_bytes == 300 * D * 2 + 300 * 4  # the last tile is sliced, never padded


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


def test_emulated_indirect_dma_and_iota_semantics():
    """Gather/scatter through `.ap(vector_offset=...)`; colliding scatter-adds are lost unless
    unique_indices=False (as on the hardware); iota fills offset + step * index; out-of-range rows raise."""
    from kernels_nki.emulator import isa, language as nl, machine

    m = machine.Machine()
    with machine.running(m):
        base = m.wrap_hbm(np.zeros((4, 3), np.float32))
        ids = m.allocate((3, 1), np.int32, "sbuf", fill=0)
        ids.data[:, 0] = [2, 2, 0]
        src = m.wrap_hbm(np.ones((3, 3), np.float32))
        pattern = dict(pattern=[[3, 3], [1, 3]], offset=0, vector_offset=ids, indirect_dim=0)
        isa.dma_copy(dst=base.ap(**pattern), src=src, dst_rmw_op=nl.add)  # default unique_indices=True
        assert base.data[2].tolist() == [1, 1, 1] and base.data[0].tolist() == [1, 1, 1]
        isa.dma_copy(dst=base.ap(**pattern), src=src, dst_rmw_op=nl.add, unique_indices=False)
        assert base.data[2].tolist() == [3, 3, 3] and base.data[0].tolist() == [2, 2, 2]
        out = m.allocate((3, 3), np.float32, "sbuf")
        isa.dma_copy(dst=out, src=base.ap(**pattern))
        assert out.data[:, 0].tolist() == [3, 3, 2]
        ids.data[0, 0] = 4
        with pytest.raises(emulator.NkiLimitError, match="out of bounds"):
            isa.dma_copy(dst=out, src=base.ap(**pattern))
        io = m.allocate((2, 5), np.float32, "sbuf")
        isa.iota(dst=io, pattern=[[2, 5]], offset=7, channel_multiplier=100)
        assert io.data.tolist() == [[7, 9, 11, 13, 15], [107, 109, 111, 113, 115]]
    assert m.counters.gpsimd_instructions == 1 and m.counters.dma_bytes == 4 * 9 * 4
