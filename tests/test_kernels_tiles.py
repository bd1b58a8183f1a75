"""The shared kernel helpers of kernels_nki/tiles.py (a kernel-helper file, loaded against the emulated nki)."""

import pytest

from kernels_nki import emulator


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
