"""The emulated nki.isa instructions (kernels_nki/emulator/isa.py), against NumPy: nc_matmul's values, counters,
accumulation and tiling modes, 0/1-stationary and recomputed products, TensorE one-hot gathers,
tensor_tensor_scan, the multi-core instructions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import load_kernel, run_kernel

from kernels_nki import emulator
from kernels_nki.emulator import cost

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_matmul_values_counters_and_estimate(tmp_path, monkeypatch):
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a[0:128, 0:128])
        m = nl.load(a[0:128, 0:512])
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, s, m)
        res = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    a = np.random.default_rng(0).standard_normal((128, 512)).astype(ml_dtypes.bfloat16)
    out, c = emulator.run(k, a)
    a32 = a.astype(np.float32)
    np.testing.assert_allclose(out, a32[:, :128].T @ a32, rtol=1e-5, atol=1e-4)
    assert (c.pe_instructions, c.pe_macs_issued, c.pe_macs_useful) == (1, 128 * 128 * 512, 128 * 128 * 512)
    assert c.pe_macs_issued_fp32 == 0
    assert c.dma_bytes == 2 * (128 * 128 + 128 * 512) + 128 * 512 * 4 and c.dma_transfers == 3
    assert (c.vector_instructions, c.vector_elems_issued, c.vector_elems_useful) == (1, 128 * 512, 128 * 512)
    assert c.psum_peak_banks == 1
    est = emulator.estimate(c)
    assert est.engine_s["tensor"] == pytest.approx(128 * 128 * 512 / cost.TENSOR_MACS_PER_S)
    assert est.engine_s["dma"] == pytest.approx(c.dma_bytes / cost.DMA_BYTES_PER_S)
    assert est.bound == max(est.engine_s, key=est.engine_s.get) and est.total_s == max(est.engine_s.values())


def test_padding_waste_and_accumulation(tmp_path, monkeypatch):
    """K=64, M=100, N=300 issues the full 128 x 128 array; two matmuls into one PSUM tile accumulate."""
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((100, 300), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a[0:64, 0:100])
        m = nl.load(a[0:64, 0:300])
        acc = nl.ndarray((100, 300), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, s, m)
        nisa.nc_matmul(acc, s, m)
        res = nl.ndarray((100, 300), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    a = np.random.default_rng(1).standard_normal((64, 300)).astype(np.float32)
    out, c = emulator.run(k, a)
    np.testing.assert_allclose(out, 2 * a[:, :100].T @ a, rtol=1e-5, atol=1e-4)
    assert c.pe_macs_issued == 2 * 128 * 128 * 300 == c.pe_macs_issued_fp32
    assert c.pe_macs_useful == 2 * 64 * 100 * 300
    assert emulator.pe_utilisation(c) == pytest.approx(64 * 100 / (128 * 128))


def test_row_tiled_matmuls_are_charged_their_row_tile(tmp_path, monkeypatch):
    """Two K=64 matmuls on the two 64-row tiles, each with its operands on its tile's partitions, run in parallel
    (nc_matmul "Tiling mode"): each is charged 64 x 128 x N, together one full-array pass; the same matmul
    untiled costs twice that."""
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a[0:128, 0:128])
        m = nl.load(a[0:128, 0:256])
        acc0 = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
        acc1 = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc0, s[0:64], m[0:64], tile_position=(0, 0), tile_size=(64, 128))
        nisa.nc_matmul(acc1, s[64:128], m[64:128], tile_position=(64, 0), tile_size=(64, 128))
        nisa.nc_matmul(acc1, s[64:128], m[64:128])
        res = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc1)
        nl.store(out, res)
        return out
    """, reading="strict")
    a = np.random.default_rng(3).standard_normal((128, 256)).astype(ml_dtypes.bfloat16)
    out, c = emulator.run(k, a)
    a32 = a.astype(np.float32)[64:]
    np.testing.assert_allclose(out, 2 * a32[:, :128].T @ a32, rtol=1e-4, atol=1e-3)
    assert c.pe_macs_issued == 2 * 64 * 128 * 256 + 128 * 128 * 256
    assert c.pe_macs_useful == 3 * 64 * 128 * 256


def test_column_tiled_matmuls_are_charged_their_tile_and_write_its_partitions(tmp_path, monkeypatch):
    """A [64, 64] stationary fits one of the four 64 x 64 tiles of the PE array on NeuronCore-v2 (row and
    column tiling, nc_matmul "Tiling mode"): charged 64 x 64 x N; the column tile at 64 writes PSUM
    partitions 64..127 (rule matmul.tiling_dst)."""
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a[0:64, 0:64])
        m = nl.load(a[0:64, 0:256])
        acc = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc[0:64], s, m, tile_position=(0, 0), tile_size=(64, 64))
        nisa.nc_matmul(acc[64:128], s, m, tile_position=(64, 64), tile_size=(64, 64))
        res = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    a = np.random.default_rng(4).standard_normal((64, 256)).astype(ml_dtypes.bfloat16)
    out, c = emulator.run(k, a)
    a32 = a.astype(np.float32)
    np.testing.assert_allclose(out, np.concatenate([a32[:, :64].T @ a32] * 2), rtol=1e-4, atol=1e-3)
    assert c.pe_macs_issued == c.pe_macs_useful == 2 * 64 * 64 * 256


def test_onezero_stationary_matmul_is_issued_not_useful(tmp_path, monkeypatch):
    """A 0/1 stationary (is_stationary_onezero: a mask or selection) moves data, like a transpose."""
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a)
        acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, s, s, is_stationary_onezero=True)
        res = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    eye = np.eye(128, dtype=ml_dtypes.bfloat16)
    out, c = emulator.run(k, eye)
    np.testing.assert_array_equal(out, np.eye(128, dtype=np.float32))
    assert (c.pe_macs_issued, c.pe_macs_useful) == (128 * 128 * 128, 0)


def test_recomputed_product_is_issued_not_useful(tmp_path, monkeypatch):
    """A matmul named "recompute..." (nc_matmul's documented `name`) computes a product the kernel already
    computed, in another layout: it runs and is issued, with zero useful MACs; other names count."""
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a)
        acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, s, s, name="recompute s^T")
        nisa.nc_matmul(acc, s, s, name="scores")
        res = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    a = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    out, c = emulator.run(k, a)
    np.testing.assert_allclose(out, 2 * a.T @ a, rtol=1e-5, atol=1e-4)
    assert (c.pe_macs_issued, c.pe_macs_useful) == (2 * 128 * 128 * 128, 128 * 128 * 128)


def test_broadcast_to_and_scan_with_tile_initial(tmp_path, monkeypatch):
    out = run_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        row = nl.load(a[0:1])
        b = nl.broadcast_to(row, (128, 64))
        t = nl.load(a)
        r = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=r, data0=b, data1=t, initial=t[:, 0:1], op0=nl.multiply, op1=nl.add)
        nl.store(out, r)
        return out
    """, A)
    ref = np.empty_like(A, dtype=np.float64)
    prev = A[:, 0].astype(np.float64)
    for i in range(64):
        prev = A[0, i] * prev + A[:, i]
        ref[:, i] = prev
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_one_hot_gather_on_tensor_engine(tmp_path, monkeypatch):
    """emb[idx] as onehot(idx) @ emb: iota + equal build the one-hot, TensorE transposes and multiplies."""
    emb = rng.standard_normal((128, 64)).astype(ml_dtypes.bfloat16)
    idx = rng.integers(0, 128, (128, 1)).astype(np.float32)
    out = run_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        col = nl.load(idx)
        iv = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.iota(dst=iv, pattern=[[1, 128]])
        hot = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=hot, data=iv, op0=nl.equal, operand0=col)
        hot_ps = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=hot_ps, data=hot)
        hotT = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.activation(dst=hotT, op=nl.copy, data=hot_ps)
        e = nl.load(a)
        acc = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, hotT, e, is_stationary_onezero=True)
        r = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=acc)
        nl.store(out, r)
        return out
    """, emb, idx, sig="a, idx")
    np.testing.assert_array_equal(out, emb.astype(np.float32)[idx[:, 0].astype(int)])


def test_multi_core_instructions_name_their_requirement(tmp_path, monkeypatch):
    k, _ = load_kernel(tmp_path, monkeypatch, """
        nisa.core_barrier(a, (0, 1))
        return a
    """)
    with pytest.raises(emulator.NkiEmulatorError, match="LNC > 1"):
        emulator.run(k, A)
