"""dma_transpose (kernels_nki/emulator/dma_transpose.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from helpers import run_kernel

rng = np.random.default_rng(7)


def test_dma_transpose_2d_and_4d(tmp_path, monkeypatch):
    x = rng.standard_normal((2, 3, 4, 16)).astype(ml_dtypes.bfloat16)
    out = run_kernel(tmp_path, monkeypatch, """
        t = nl.ndarray((16, 3, 4, 2), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a)
        out = nl.ndarray((16, 3, 4, 2), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out
    """, x)
    np.testing.assert_array_equal(out, np.transpose(x, (3, 1, 2, 0)))
    y = rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    out = run_kernel(tmp_path, monkeypatch, """
        t = nl.load(a)
        u = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=u, src=t, axes=(1, 0))
        out = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, u)
        return out
    """, y)
    np.testing.assert_array_equal(out, y.T)
