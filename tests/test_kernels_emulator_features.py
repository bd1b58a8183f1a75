"""Documented NKI features the emulator supports (aws-neuron-sdk nki/api, nki/get-started/nki-language-guide.rst),
each checked against NumPy: DMA casts, views (integer/negative/Ellipsis/strided indexing, on-chip reshape,
.ap()), nl.broadcast_to, tensor_tensor_scan, nki.typing, nc_matmul options, one-hot gathers on TensorE,
dma_compute scatter-add, targets."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_kernels_emulator import _kernel_module
from test_kernels_emulator import run_kernel as run

from kernels_nki import emulator

rng = np.random.default_rng(3)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_dma_casts_through_float32(tmp_path, monkeypatch):
    out = run(tmp_path, monkeypatch, """
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a, dtype=nl.bfloat16)
        nisa.dma_copy(dst=out, src=t)
        return out
    """, A)
    np.testing.assert_array_equal(out, A.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_integer_index_keeps_partition_dim_and_views_alias(tmp_path, monkeypatch):
    out = run(tmp_path, monkeypatch, """
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
    out = run(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.add, data=t.reshape((128, 8, 8)), axis=2)
        nl.store(out, r)
        return out
    """, A)
    np.testing.assert_allclose(out, A.reshape(128, 8, 8).sum(2), rtol=1e-6, atol=1e-6)
    out = run(tmp_path, monkeypatch, """
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
    out = run(tmp_path, monkeypatch, """
        out = nl.ndarray((4, 4, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        view = t.ap([[64, 4], [16, 4], [2, 4], [8, 2], [1, 2]])
        nl.store(out, nl.max(view, axis=(3, 4)))
        return out
    """, x)
    np.testing.assert_array_equal(out, x.reshape(4, 4, 2, 4, 2).max(axis=(2, 4)))


def test_broadcast_to_and_scan_with_tile_initial(tmp_path, monkeypatch):
    out = run(tmp_path, monkeypatch, """
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


def test_nki_typing_annotations_and_copy_helpers(tmp_path, monkeypatch):
    out = run(tmp_path, monkeypatch, """
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        c = nl.copy(t)
        e = nl.equal(c, t)
        nl.store(out, nl.multiply(e, nl.negative(c)))
        return out
    """, A, header="import nki.typing as nt", sig="a: nt.tensor[128, 64]")
    np.testing.assert_array_equal(out, -A)


def test_one_hot_gather_on_tensor_engine(tmp_path, monkeypatch):
    """emb[idx] as onehot(idx) @ emb: iota + equal build the one-hot, TensorE transposes and multiplies."""
    emb = rng.standard_normal((128, 64)).astype(ml_dtypes.bfloat16)
    idx = rng.integers(0, 128, (128, 1)).astype(np.float32)
    out = run(tmp_path, monkeypatch, """
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


def test_dma_compute_scatter_add_on_trn2_needs_unique_indices(tmp_path, monkeypatch):
    body = """
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        i = nl.load(idx)
        t = nl.load(a)
        dst = out.ap(pattern=[[64, 128], [1, 64]], vector_offset=i)
        nisa.dma_compute(dst=dst, srcs=[dst, t], reduce_op=nl.add)
        return out
    """
    perm = rng.permutation(128).astype(np.int32).reshape(128, 1)
    out = run(tmp_path, monkeypatch, body, A, perm, sig="a, idx", target="trn2")
    ref = A.copy()
    ref[perm[:, 0]] += A
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    dup = perm.copy()
    dup[1] = dup[0]
    with pytest.raises(emulator.NkiRuleError, match=r"\[dma_compute.args\].*repeat"):
        run(tmp_path, monkeypatch, body, A, dup, sig="a, idx", target="trn2")
    with pytest.raises(emulator.NkiRuleError, match=r"\[dma.indirect\]"):
        run(tmp_path, monkeypatch, body, A, perm, sig="a, idx", target="trn1")


def test_targets_and_zero_size_inputs(tmp_path, monkeypatch):
    assert emulator.TARGETS == ("trn1", "trn2")
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        v = nl.full((1, 1), 2.0 if nisa.get_nc_version() == nisa.nc_version.gen3 else 1.0, dtype=nl.float32)
        nl.store(out, v)
        return out
    """)
    assert emulator.run(k, A)[0][0, 0] == 1.0 and emulator.run(k, A, target="trn2")[0][0, 0] == 2.0
    with pytest.raises(ValueError, match="unknown target"):
        emulator.run(k, A, target="trn3")
    with pytest.raises(emulator.NkiRuleError, match=r"\[tensor.zero_size\] kernel input of shape \(128, 0\)"):
        emulator.run(k, np.zeros((128, 0), np.float32))
