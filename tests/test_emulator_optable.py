"""Dtypes and tile sizes (kernels_nki/emulator/optable.py): the fp8 names (NKI 0.4-0.5), tile_size per target."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import run_kernel

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_fp8_dtype_names_are_distinct_types(tmp_path, monkeypatch):
    """float8_e4m3 (legacy, max 240) and float8_e4m3fn (OCP, max 448) are distinct since NKI 0.4; e8m0fnu (0.5)
    and the packed x4 names exist; a kernel casts through them by DMA."""
    out = run_kernel(tmp_path, monkeypatch, """
        assert nl.float8_e4m3 != nl.float8_e4m3fn and nl.float8_e4m3fn_x4 != nl.float8_e5m2_x4
        assert nl.float8_e8m0fnu.itemsize == 1 and nl.float4_e2m1fn_x4.itemsize == 2
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a, dtype=nl.float8_e4m3)
        nl.store(out, t)
        return out
    """, 300 * A)
    np.testing.assert_array_equal(out, (300 * A).astype(ml_dtypes.float8_e4m3).astype(np.float32))
    assert ml_dtypes.finfo(ml_dtypes.float8_e4m3).max == 240 and ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max == 448


@pytest.mark.parametrize("target,kib", [("trn1", 192), ("trn2", 224)])
def test_tile_size_capacities_follow_the_target(tmp_path, monkeypatch, target, kib):
    out = run_kernel(tmp_path, monkeypatch, """
        ts = nl.tile_size
        assert ts.psum_num_banks == 8 and ts.psum_bank_fmax == 512 and ts.psum_bank_fmax_bytes == 2048
        assert ts.sbuf_size_bytes == 128 * ts.sbuf_fmax_bytes == 128 * ts.total_available_sbuf_size
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.full((1, 1), ts.sbuf_fmax * 4, dtype=nl.float32))
        return out
    """, A, target=target)
    assert out[0, 0] == kib * 1024
