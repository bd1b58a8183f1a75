"""The shared kernel helpers of kernels_nki/tiles.py (a kernel-helper file, loaded against the emulated nki)."""

import ml_dtypes
import numpy as np
import pytest
from helpers import run_kernel

from kernels_nki import emulator

BF16 = np.dtype(ml_dtypes.bfloat16)  # TensorE's operands: a transpose (x 1, + 0) is exact
HEADER = ("from kernels_nki.tiles import accumulate_weight_grad, identity, norm_grad_rows, row_tiles, "
          "stacked_transpose, transpose")
rng = np.random.default_rng(3)


@pytest.fixture(scope="module")
def tiles():
    return emulator.load_kernel_module("kernels_nki.tiles")


@pytest.mark.parametrize("n,size", [(1, 128), (128, 128), (300, 128), (1024, 512), (1000, 512)])
def test_row_tiles_cover_the_axis_once_in_order(tiles, n, size):
    ts = tiles.row_tiles(n, size)
    assert [i for i, _, _ in ts] == list(range(len(ts)))
    assert [s for _, s, _ in ts] == [i * size for i in range(len(ts))]
    assert all(0 < r <= size for _, _, r in ts) and sum(r for _, _, r in ts) == n
    assert all(r == size for _, _, r in ts[:-1])


def test_row_tiles_default_to_the_partition_count(tiles):
    assert tiles.row_tiles(300) == [(0, 0, 128), (1, 128, 128), (2, 256, 44)]


@pytest.mark.parametrize("n", [1, 2, 5])
def test_pipeline_runs_each_stage_once_per_item_at_its_offset(tiles, n):
    log = []
    table = [(0, lambda i: log.append(("load", i))), (2, lambda i: log.append(("store", i))),
             (1, lambda i: log.append(("compute", i)))]
    tiles.pipeline(n, table)
    for name in ("load", "compute", "store"):
        assert [i for s, i in log if s == name] == list(range(n))
    # step s runs load(s), store(s - 2), compute(s - 1) in table order
    expected = [(name, s - off) for s in range(n + 2) for off, name in ((0, "load"), (2, "store"), (1, "compute"))
                if 0 <= s - off < n]
    assert log == expected
    # every item is loaded before it is computed, and computed before it is stored
    for i in range(n):
        assert log.index(("load", i)) < log.index(("compute", i)) < log.index(("store", i))


@pytest.mark.parametrize("rows,cols,on_vector", [(100, 48, False), (128, 128, True), (40, 128, False)])
def test_transpose_is_exact(tmp_path, monkeypatch, rows, cols, on_vector):
    """Two <= 64-row halves (one when rows <= 64), a <= 64-column source on a 64-column tile; out of PSUM on
    ScalarE or VectorE."""
    a = rng.standard_normal((rows, cols)).astype(BF16)
    out = run_kernel(tmp_path, monkeypatch, f"""
        ident = identity(a.dtype)
        src = nl.ndarray((128, {cols}), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src[0:{rows}], src=a)
        dst = nl.ndarray((128, {rows}), dtype=a.dtype, buffer=nl.sbuf)
        transpose(dst[0:{cols}], src[0:{rows}], {rows}, {cols}, ident, on_vector={on_vector})
        out = nl.ndarray(({cols}, {rows}), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst[0:{cols}])
        return out
    """, a, header=HEADER)
    np.testing.assert_array_equal(np.asarray(out, np.float32), a.T.astype(np.float32))


def test_stacked_transpose_puts_the_two_halves_one_above_the_other(tmp_path, monkeypatch):
    a = rng.standard_normal((96, 128)).astype(BF16)  # its column halves [96, 64] stacked: a^T
    out = run_kernel(tmp_path, monkeypatch, """
        ident = identity(a.dtype)
        src = nl.ndarray((128, 128), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src[0:96], src=a)
        dst = nl.ndarray((128, 96), dtype=a.dtype, buffer=nl.sbuf)
        stacked_transpose(dst, [src[0:96, 0:64], src[0:96, 64:128]], 96, ident)
        out = nl.ndarray((128, 96), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst)
        return out
    """, a, header=HEADER)
    np.testing.assert_array_equal(np.asarray(out, np.float32), a.T.astype(np.float32))


@pytest.mark.parametrize("on_vector", [False, True])
def test_accumulate_weight_grad_adds_lhs_t_rhs_per_slice(tmp_path, monkeypatch, on_vector):
    """K = 200: a ragged second row tile; C = 600: a ragged second 512-column slice; called twice: it adds."""
    lhs = rng.standard_normal((100, 200)).astype(BF16)
    rhs = rng.standard_normal((100, 600)).astype(BF16)
    out = run_kernel(tmp_path, monkeypatch, f"""
        n, K, C = 100, 200, 600
        l = nl.ndarray((128, K), dtype=lhs.dtype, buffer=nl.sbuf)
        r = nl.ndarray((128, C), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=l[0:n], src=lhs)
        nisa.dma_copy(dst=r[0:n], src=rhs)
        acc = [nl.zeros((128, C), dtype=nl.float32, buffer=nl.sbuf) for _ in row_tiles(K)]

        def matmuls(g_ps, k0, ki, c0, cw):
            nisa.nc_matmul(dst=g_ps[0:ki, 0:cw], stationary=l[0:n, k0:k0 + ki], moving=r[0:n, c0:c0 + cw])

        accumulate_weight_grad(acc, K, C, 512, matmuls, on_vector={on_vector})
        accumulate_weight_grad(acc, K, C, 512, matmuls, on_vector={on_vector})
        out = nl.ndarray((K, C), dtype=nl.float32, buffer=nl.shared_hbm)
        for i, k0, ki in row_tiles(K):
            nisa.dma_copy(dst=out[k0:k0 + ki], src=acc[i][0:ki])
        return out
    """, lhs, rhs, header=HEADER, sig="lhs, rhs")
    want = 2 * lhs.astype(np.float32).T @ rhs.astype(np.float32)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


def test_norm_grad_rows_is_the_rmsnorm_backward_before_its_scale(tmp_path, monkeypatch):
    """work = g + x c, c = -mean(g x) inv^2, g given as fp32 PSUM chunks of 512 columns (D = 640: two)."""
    rows, D = 100, 640
    g = rng.standard_normal((rows, D)).astype(np.float32)
    x = rng.standard_normal((rows, D)).astype(np.float32)
    inv = (1 / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)).astype(np.float32)
    out = run_kernel(tmp_path, monkeypatch, """
        rows, D = g.shape
        gs = nl.ndarray((128, D), dtype=nl.float32, buffer=nl.sbuf)
        xs = nl.ndarray((128, D), dtype=nl.float32, buffer=nl.sbuf)
        invs = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=gs[0:rows], src=g)
        nisa.dma_copy(dst=xs[0:rows], src=x)
        nisa.dma_copy(dst=invs[0:rows], src=inv)
        g_ps = []
        for _, c0, cw in row_tiles(D, 512):
            p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            nisa.tensor_copy(dst=p[0:rows, 0:cw], src=gs[0:rows, c0:c0 + cw])
            g_ps.append(p)
        work = norm_grad_rows(g_ps, xs[0:rows], invs, rows, 512)
        out = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=work[0:rows])
        return out
    """, g, x, inv, header=HEADER, sig="g, x, inv")
    c = -(g * x).mean(axis=1, keepdims=True) * inv * inv
    np.testing.assert_allclose(out, g + x * c, rtol=1e-5, atol=1e-5)
