"""The emulated DMA instructions (kernels_nki/emulator/dma.py): casts, contiguous buffers of both sides,
dma_compute scatter-add."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import load_kernel, run_kernel

from kernels_nki import emulator

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_dma_buffers_follow_the_contiguous_runs_of_both_sides(tmp_path, monkeypatch):
    """One head's rows of a [T, H, K] tensor are 128 B apart-strided runs (one buffer per row, under 256 B);
    whole [128, 512] fp32 rows are 2 KiB buffers; an SBUF tile's column slice caps the run at its width;
    count-only mode sees the same layouts as a full run."""
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[0:128, 3, 0:64])
        w = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=w, src=b[0:128, 0:512])
        nisa.dma_copy(dst=out[0:128, 0:512], src=w)
        nisa.dma_copy(dst=out[0:128, 0:100], src=w[0:128, 0:100])
        return out
    """, sig="a, b")
    a = np.zeros((128, 8, 64), ml_dtypes.bfloat16)
    b = np.zeros((128, 512), np.float32)
    _, c = emulator.run(k, a, b)
    assert c.dma_transfers == 4
    assert c.dma_buffers == 128 + 128 + 128 + 128
    assert c.dma_bytes_under_256 == 128 * 64 * 2
    assert c.dma_bytes_under_2k == 128 * 64 * 2 + 128 * 100 * 4
    assert emulator.count(k, (a.shape, "bfloat16"), (b.shape, "float32")) == c


def test_dma_casts_through_float32(tmp_path, monkeypatch):
    out = run_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a, dtype=nl.bfloat16)
        nisa.dma_copy(dst=out, src=t)
        return out
    """, A)
    np.testing.assert_array_equal(out, A.astype(ml_dtypes.bfloat16).astype(np.float32))


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
    out = run_kernel(tmp_path, monkeypatch, body, A, perm, sig="a, idx", target="trn2")
    ref = A.copy()
    ref[perm[:, 0]] += A
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    dup = perm.copy()
    dup[1] = dup[0]
    with pytest.raises(emulator.NkiRuleError, match=r"\[dma_compute.args\].*repeat"):
        run_kernel(tmp_path, monkeypatch, body, A, dup, sig="a, idx", target="trn2")
    with pytest.raises(emulator.NkiRuleError, match=r"\[dma.indirect\]"):
        run_kernel(tmp_path, monkeypatch, body, A, perm, sig="a, idx", target="trn1")
