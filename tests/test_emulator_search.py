"""The top-8 search instructions (kernels_nki/emulator/search.py): max8, nc_find_index8, nc_match_replace8."""

from __future__ import annotations

import numpy as np
from helpers import run_kernel

rng = np.random.default_rng(7)


def test_top8_search_instructions(tmp_path, monkeypatch):
    x = rng.permutation(128 * 64).reshape(128, 64).astype(np.float32)  # distinct values
    out = run_kernel(tmp_path, monkeypatch, """
        t = nl.load(a)
        top = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=top, src=t)
        idx = nl.ndarray((128, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx, data=t, vals=top)
        rep = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=rep, data=t, vals=top, imm=-1.0)
        out = nl.ndarray((128, 80), dtype=nl.float32, buffer=nl.shared_hbm)
        f = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=f, src=idx)
        nl.store(out[:, 0:8], top)
        nl.store(out[:, 8:16], f)
        nl.store(out[:, 16:80], rep)
        return out
    """, x)
    order = np.argsort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(out[:, :8], np.take_along_axis(x, order, 1))
    np.testing.assert_array_equal(out[:, 8:16], order)
    rep = x.copy()
    np.put_along_axis(rep, order, -1.0, 1)
    np.testing.assert_array_equal(out[:, 16:], rep)
