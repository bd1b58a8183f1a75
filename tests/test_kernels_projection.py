"""The projection NKI kernels (kernels_nki/projection.py) under the emulator against NumPy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import KERNEL_TOL as TOL
from conftest import assert_close_max as _assert_close
from kernels_nki import emulator


@pytest.fixture(scope="module")
def kernels():
    return emulator.load_kernel_module("kernels_nki.projection")


@pytest.mark.parametrize("dtype,N,I,O", [
    ("float32", 200, 96, 80),  # ragged token tile, contraction and output smaller than a tile
    ("float32", 130, 256, 640),  # two contraction tiles, two PSUM banks of output (512 + 128)
    ("bfloat16", 256, 128, 192),
])
def test_forward_and_backward_match_numpy(kernels, dtype, N, I, O):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(N + I + O)
    x, w, dy = (rng.standard_normal(s).astype(dt) for s in ((N, I), (I, O), (N, O)))
    x32, w32, dy32 = (a.astype(np.float32) for a in (x, w, dy))
    y = kernels.projection_fwd(x, w)
    assert y.shape == (N, O) and y.dtype == dt
    _assert_close(y, x32 @ w32, TOL[dtype])
    dx, dw = kernels.projection_bwd(x, w, dy)
    assert dx.shape == (N, I) and dx.dtype == dt and dw.shape == (I, O) and dw.dtype == np.float32
    _assert_close(dx, dy32 @ w32.T, TOL[dtype])
    _assert_close(dw, x32.T @ dy32, TOL[dtype])


def test_counts_at_the_models_qkv_shape(kernels):
    N, I, O = 4096, 512, 1024  # baseline: D = 512 -> (H + 2G) K = 1024
    x, w, dy = ((N, I), "bfloat16"), ((I, O), "bfloat16"), ((N, O), "bfloat16")
    fwd = emulator.count(kernels.projection_fwd, x, w)
    bwd = emulator.count(kernels.projection_bwd, x, w, dy)
    nt = N // 128
    # forward: per token tile I/128 transposes (128 columns) and (I/128) x O columns of matmul
    assert fwd.pe_macs_useful == N * I * O
    assert fwd.pe_macs_issued == 128 * 128 * nt * (I // 128) * (128 + O)
    assert emulator.pe_utilisation(fwd) == pytest.approx(O / (O + 128))
    assert bwd.pe_macs_useful == 2 * N * I * O
    assert fwd.dma_bytes == 2 * (N * I + I * O + N * O)  # x, w in and y out once
    assert bwd.psum_peak_banks <= 8 and fwd.psum_peak_banks <= 8
