"""Packed row groups (kernels_nki/packing.py, a kernel-helper file loaded against the emulated nki): groups, their
runs (`blocks`) and the HBM view of one row tile (`row_tile_ap`)."""

import numpy as np
import pytest
from helpers import run_kernel

from kernels_nki import emulator


@pytest.fixture(scope="module")
def packing():
    return emulator.load_kernel_module("kernels_nki.packing")


@pytest.mark.parametrize("N,R,cap", [(1, 4, 16), (300, 4, 16), (1100, 4, 16), (5000, 4, 16), (5000, 8, 4)])
def test_blocks_are_the_groups_in_runs_of_at_most_cap_row_tiles(packing, N, R, cap):
    blks = packing.blocks(N, R, cap)
    assert [g for b in blks for g in b] == packing.groups(N, R)
    assert all(b for b in blks)
    tiles = [sum(rows for _, _, rows in b) for b in blks]
    assert all(t <= max(cap, R) for t in tiles)
    # a run closes only when the next group would not fit
    for b, nxt in zip(blks, blks[1:]):
        (_, _, rows), *_ = nxt
        assert sum(r for _, _, r in b) + rows > cap


@pytest.mark.parametrize("N,R", [(300, 2), (1100, 4)])
def test_row_tile_ap_is_rows_r0_plus_p_R_plus_j(tmp_path, monkeypatch, packing, N, R):
    """Row tile j of group (r0, parts, R') holds rows r0 + p R' + j on partition p: out's 128-row block q is the
    q-th (group, j) row tile, read from HBM by row_tile_ap."""
    a = np.arange(N * 8, dtype=np.float32).reshape(N, 8)
    gs = packing.groups(N, R)
    out = run_kernel(tmp_path, monkeypatch, f"""
        q = 0
        gs = groups({N}, {R})
        out = nl.ndarray((128 * sum(rows for _, _, rows in gs), 8), dtype=a.dtype, buffer=nl.shared_hbm)
        for g in gs:
            _, parts, rows = g
            for j in range(rows):
                t = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=t[0:parts], src=row_tile_ap(a, g, j))
                nisa.dma_copy(dst=out[q * 128:q * 128 + parts], src=t[0:parts])
                q += 1
        return out
    """, a, header="from kernels_nki.packing import groups, row_tile_ap")
    q = 0
    for r0, parts, rows in gs:
        for j in range(rows):
            np.testing.assert_array_equal(out[q * 128:q * 128 + parts], a[r0 + np.arange(parts) * rows + j])
            q += 1


@pytest.mark.parametrize("N", [1, 127, 128, 300, 1100, 5000])
def test_groups_cover_the_rows_once_in_order(packing, N):
    """Full groups of 128 x 4 rows, the rest as 128 x R' rows and a last group of fewer than 128 single rows."""
    gs = packing.groups(N, 4)
    assert [r0 for r0, _, _ in gs] == list(np.cumsum([0] + [p * r for _, p, r in gs])[:-1])
    assert sum(p * r for _, p, r in gs) == N
    *full, (_, p, r) = gs
    assert all(p == 128 and 1 <= r <= 4 for _, p, r in full)
    assert (p == 128 and 1 <= r <= 4) or (p < 128 and r == 1)


def test_rows_per_partition_and_columns(packing):
    assert packing.rows_per_partition(512) == 8 and packing.rows_per_partition(512, cap=4) == 4
    assert packing.rows_per_partition(5000) == 1
    g = (256, 128, 4)  # row tile j's tokens are the free-axis columns j, j + 4, ... of the group's tokens in order
    for j in range(4):
        assert list(range(512)[packing.columns(g, j)]) == list(range(j, 512, 4))
    assert list(range(600)[packing.columns(g, 1, c0=88)]) == list(range(89, 600, 4))[:128]


@pytest.mark.parametrize("via_tiles", [False, True])
def test_load_tile_store_round_trip(tmp_path, monkeypatch, via_tiles):
    """A group loaded with one DMA and stored back with one (`load` / `store`), or read row tile by row tile
    (`tile`) and written through `row_tile_ap` (checked above): the array comes back."""
    a = np.arange(1100 * 8, dtype=np.float32).reshape(1100, 8)
    out = run_kernel(tmp_path, monkeypatch, f"""
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for g in groups(1100, 4):
            _, _, rows = g
            t = load(a, g, a.dtype, 4)
            if {via_tiles}:
                for j in range(rows):
                    nisa.dma_copy(dst=row_tile_ap(out, g, j), src=tile(t, g, j, 8))
            else:
                store(out, g, t)
        return out
    """, a, header="from kernels_nki.packing import groups, load, row_tile_ap, store, tile")
    np.testing.assert_array_equal(out, a)
