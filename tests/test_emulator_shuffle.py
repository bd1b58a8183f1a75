"""nc_stream_shuffle (kernels_nki/emulator/shuffle.py)."""

from __future__ import annotations

import numpy as np
from helpers import run_kernel

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_stream_shuffle_broadcasts_a_partition(tmp_path, monkeypatch):
    out = run_kernel(tmp_path, monkeypatch, """
        t = nl.load(a)
        b = nl.ndarray((64, 64), dtype=a.dtype, buffer=nl.sbuf)
        for q in range(2):
            nisa.nc_stream_shuffle(src=t[0:1, :], dst=b[q * 32:(q + 1) * 32, :], shuffle_mask=[0] * 32)
        out = nl.ndarray((64, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, b)
        return out
    """, A)
    np.testing.assert_array_equal(out, np.broadcast_to(A[0], (64, 64)))
