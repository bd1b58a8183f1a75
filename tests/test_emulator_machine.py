"""The emulated NeuronCore state (kernels_nki/emulator/machine.py): tensor views (integer, negative, Ellipsis and
strided indexing, on-chip reshape, .ap()), bounds, NaN-filled fresh memory, live on-chip memory and its
release, SBUF spills, the Vector/Scalar/GpSimd work counters."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import load_kernel, run_kernel

from kernels_nki import emulator

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_out_of_bounds_slice_raises(tmp_path, monkeypatch):
    k, where = load_kernel(tmp_path, monkeypatch, """
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[200:328, :])  # <-
    """)
    with pytest.raises(emulator.NkiEmulatorError, match="out of bounds") as info:
        k(np.zeros((256, 8), np.float32))
    assert str(info.value).startswith(where)


def test_uninitialised_reads_are_nan(tmp_path, monkeypatch):
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:5], src=a[0:5])
        u = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u, data=t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=out, src=u)
        return out
    """)
    out = k(np.ones((8, 4), np.float32))
    np.testing.assert_array_equal(out[:5], 2.0)
    assert np.isnan(out[5:]).all()


def test_small_vector_op_counts_min_ii_and_idle_lanes(tmp_path, monkeypatch):
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((5, 10), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a[0:5, 0:10])
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.multiply)
        nl.store(out, t)
        return out
    """)
    x = np.arange(50, dtype=np.float32).reshape(5, 10)
    out, c = emulator.run(k, x)
    np.testing.assert_array_equal(out, x * x)
    assert (c.vector_elems_issued, c.vector_elems_useful) == (128 * 64, 50)
    assert c.dma_bytes == 2 * 50 * 4


def test_two_input_vector_instructions_cost_2n(tmp_path, monkeypatch):
    """tensor_tensor / scalar_tensor_tensor read two tiles: ~2N cycles (arch guide, VectorE cost model);
    tensor_scalar reads one: N."""
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        u = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.add)
        nisa.scalar_tensor_tensor(dst=u, data=u, op0=nl.multiply, operand0=0.5, op1=nl.add, operand1=t)
        nisa.tensor_scalar(dst=u, data=u, op0=nl.multiply, operand0=2.0)
        nl.store(out, u)
        return out
    """)
    x = np.random.default_rng(4).standard_normal((128, 512)).astype(np.float32)
    out, c = emulator.run(k, x)
    np.testing.assert_allclose(out, 2 * (0.5 * (2 * x) + x), rtol=1e-6)
    assert c.vector_instructions == 3 and c.vector_elems_issued == 128 * (2 * 512 + 2 * 512 + 512)
    assert c.vector_elems_useful == 3 * 128 * 512


def test_loop_reallocation_releases_memory(tmp_path, monkeypatch):
    k, _ = load_kernel(tmp_path, monkeypatch, """
        for i in nl.affine_range(50):
            big = nl.ndarray((128, 20 * 1024), dtype=nl.float32, buffer=nl.sbuf)
            acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        return nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    """)
    _, c = emulator.run(k, np.zeros((1, 1), np.float32))
    assert c.sbuf_peak_bytes == 2 * 20 * 1024 * 4 and c.psum_peak_banks == 2


def test_automatic_sbuf_overflow_is_a_spill_not_an_error(tmp_path, monkeypatch):
    """Live automatically allocated SBUF beyond the partition is spilled by the compiler (memory-hierarchy-
    overview.rst): counted, not refused; directly allocated tiles are not in the live total."""
    k, _ = load_kernel(tmp_path, monkeypatch, """
        b = nl.ndarray((128, 40 * 1024), dtype=nl.float32, buffer=nl.sbuf)
        c = nl.ndarray((128, 9 * 1024), dtype=nl.float32, buffer=nl.sbuf)
        d = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 7 * 2048))
        return nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    """)
    _, c = emulator.run(k, np.zeros((1, 1), np.float32))
    assert c.sbuf_peak_bytes == 49 * 1024 * 4 and c.sbuf_spill_peak_bytes == 49 * 1024 * 4 - 192 * 1024
    _, c2 = emulator.run(k, np.zeros((1, 1), np.float32), target="trn2")
    assert c2.sbuf_spill_peak_bytes == 0
    k, where = load_kernel(tmp_path, monkeypatch, """
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 1024))  # <-
        return p
    """)
    with pytest.raises(emulator.NkiRuleError, match="sbuf.capacity.*bank") as info:
        emulator.run(k, np.zeros((1, 1), np.float32))
    assert str(info.value).startswith(where)


def test_integer_index_keeps_partition_dim_and_views_alias(tmp_path, monkeypatch):
    out = run_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((65, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        assert t[3].shape == (1, 64) and t[3, 5].shape == (1, 1) and a[3].shape == (64,)
        assert t[..., 0].shape == (128, 1) and t[-1].shape == (1, 64)
        r = nl.ndarray((65, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=r, value=0.0)
        nisa.tensor_copy(dst=r[0], src=t[32])
        nisa.dma_copy(dst=r[33], src=a[-1])
        nisa.memset(dst=r[64:65, 0:64:2], value=7.0)
        nisa.memset(dst=r[64, 1:64:2], value=-7.0)
        nisa.dma_copy(dst=out, src=r)
        return out
    """, A)
    np.testing.assert_array_equal(out[[0, 33]], A[[32, -1]])
    np.testing.assert_array_equal(out[64], np.tile([7.0, -7.0], 32))


def test_strided_store_and_onchip_reshape_reduce(tmp_path, monkeypatch):
    out = run_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.add, data=t.reshape((128, 8, 8)), axis=2)
        nl.store(out, r)
        return out
    """, A)
    np.testing.assert_allclose(out, A.reshape(128, 8, 8).sum(2), rtol=1e-6, atol=1e-6)
    out = run_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out[:, 0:64:2], t[:, 1:64:2])
        nl.store(out[:, 1:64:2], t[:, 0:64:2])
        return out
    """, A)
    np.testing.assert_array_equal(out[:, ::2], A[:, 1::2])
    np.testing.assert_array_equal(out[:, 1::2], A[:, ::2])


def test_ap_pooling_view_on_sbuf(tmp_path, monkeypatch):
    x = rng.standard_normal((4, 8, 8)).astype(np.float32)
    out = run_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((4, 4, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        view = t.ap([[64, 4], [16, 4], [2, 4], [8, 2], [1, 2]])
        nl.store(out, nl.max(view, axis=(3, 4)))
        return out
    """, x)
    np.testing.assert_array_equal(out, x.reshape(4, 4, 2, 4, 2).max(axis=(2, 4)))
