"""Training stream (wrap-around, resume, per-process slices) and validation windows."""

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frontier_jax.data.shards import DataError, write_shard
from frontier_jax.data.stream import (
    TokenStream,
    TrainLoader,
    load_val_tokens,
    sliding_windows,
    val_batches,
    window_starts,
)

SIZES = (7, 3, 11)  # three shards of different lengths, 21 tokens in all


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    files, start = [], 0
    for i, n in enumerate(SIZES):
        f = d / f"t_train_{i:06d}.bin"
        write_shard(f, np.arange(start, start + n))
        files.append(f)
        start += n
    return files


def _expected(start: int, n: int) -> np.ndarray:
    return (start + np.arange(n)) % sum(SIZES)


def test_take_spans_shards_and_wraps(shards):
    s = TokenStream(shards)
    a = s.take(5)
    assert a.dtype == np.int32 and a.tolist() == [0, 1, 2, 3, 4]
    assert s.take(20).tolist() == _expected(5, 20).tolist()  # crosses shard 1, 2, then wraps to 0
    assert s.state() == {"shard": 0, "offset": 4}
    assert s.take(0).shape == (0,)
    assert s.take(50).tolist() == _expected(25, 50).tolist()  # longer than the whole stream


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=8), st.integers(0, 7))
def test_state_restore_continues_exactly(shards, sizes, cut):
    """Reading in pieces, saving the state (through JSON) and resuming in a new stream equals one read."""
    cut = min(cut, len(sizes))
    s = TokenStream(shards)
    parts = [s.take(n) for n in sizes[:cut]]
    state = json.loads(json.dumps(s.state()))
    resumed = TokenStream(shards)
    resumed.restore(state)
    parts += [resumed.take(n) for n in sizes[cut:]]
    got = np.concatenate(parts)
    assert got.tolist() == _expected(0, sum(sizes)).tolist()


def test_restore_rejects_bad_positions(shards):
    s = TokenStream(shards)
    with pytest.raises(DataError, match="names shard 3, only 3 exist"):
        s.restore({"shard": 3, "offset": 0})
    with pytest.raises(DataError, match=re.escape(f"{shards[1]}: saved stream offset 4")):
        s.restore({"shard": 1, "offset": 4})


def test_empty_shards_are_skipped_and_all_empty_is_an_error(tmp_path):
    write_shard(tmp_path / "a.bin", np.zeros(0, np.int32))
    write_shard(tmp_path / "b.bin", np.array([5, 6]))
    s = TokenStream([tmp_path / "a.bin", tmp_path / "b.bin"])
    assert s.take(5).tolist() == [5, 6, 5, 6, 5]
    with pytest.raises(DataError, match="all 1 train shards are empty"):
        TokenStream([tmp_path / "a.bin"]).take(1)


@pytest.mark.parametrize("procs", [1, 2, 4])
def test_train_loader_matches_baseline_slicing(shards, procs):
    """Each micro-batch takes global+1 tokens; process p gets rows [p*R, (p+1)*R) of the global batch."""
    seq, gseq = 2, 4
    loaders = [TrainLoader(shards, seq, p, procs) for p in range(procs)]
    local = gseq * seq // procs
    consumed = 0
    for _ in range(4):
        chunk = _expected(consumed, gseq * seq + 1)
        for p, loader in enumerate(loaders):
            x, y = loader.next_batch(gseq)
            assert x.dtype == y.dtype == np.int32 and x.shape == y.shape == (gseq // procs, seq)
            assert x.ravel().tolist() == chunk[p * local : (p + 1) * local].tolist()
            assert y.ravel().tolist() == chunk[p * local + 1 : (p + 1) * local + 1].tolist()
        consumed += gseq * seq + 1
        assert all(lo.position_tokens() == consumed for lo in loaders)


def test_processes_together_see_the_single_process_batch(shards):
    """Rows of all processes, stacked in process order, equal the batch one process reads."""
    seq, gseq, steps = 3, 4, 5
    two = [TrainLoader(shards, seq, p, 2) for p in range(2)]
    one = TrainLoader(shards, seq)
    for _ in range(steps):
        parts = [lo.next_batch(gseq) for lo in two]
        x1, y1 = one.next_batch(gseq)
        assert (np.concatenate([x for x, _ in parts]) == x1).all()
        assert (np.concatenate([y for _, y in parts]) == y1).all()


def test_train_loader_state_round_trip(shards):
    a = TrainLoader(shards, 2)
    a.next_batch(3)
    state = json.loads(json.dumps(a.state()))
    assert state["position_tokens"] == 7
    b = TrainLoader(shards, 2)
    b.restore(state)
    assert b.position_tokens() == 7
    xa, ya = a.next_batch(2)
    xb, yb = b.next_batch(2)
    assert (xa == xb).all() and (ya == yb).all()


def test_train_loader_rejects_indivisible_batch(shards):
    with pytest.raises(ValueError, match="global_seqs 3 is not a positive multiple of process_count 2"):
        TrainLoader(shards, 2, 0, 2).next_batch(3)


def test_load_val_tokens_truncates(tmp_path):
    write_shard(tmp_path / "v_val_000000.bin", np.arange(10))
    write_shard(tmp_path / "v_val_000001.bin", np.arange(10, 24))
    files = [tmp_path / "v_val_000000.bin", tmp_path / "v_val_000001.bin"]
    got = load_val_tokens(files, 5)  # 24 tokens: (23 // 5) * 5 + 1 = 21
    assert got.dtype == np.int32 and got.tolist() == list(range(21))
    assert load_val_tokens(files, 23).tolist() == list(range(24))


def test_load_val_tokens_too_short(tmp_path):
    write_shard(tmp_path / "v.bin", np.arange(100))
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'v.bin'}: val split has 100 tokens, fewer than one window of 1025")):
        load_val_tokens([tmp_path / "v.bin"], 1024)


@pytest.mark.parametrize("procs", [1, 3])
@pytest.mark.parametrize("n_windows, batch", [(7, 2), (10, 4), (2, 5)])
def test_val_batches_cover_each_window_once(procs, n_windows, batch):
    seq = 4
    tokens = np.arange(n_windows * seq + 1 + 2, dtype=np.int32)  # a 2-token tail shorter than a window is dropped
    seen, counts = [], set()
    for p in range(procs):
        starts, n = [], 0
        for x, y, mask in val_batches(tokens, seq, batch * procs, p, procs):
            assert x.dtype == y.dtype == mask.dtype == np.int32 and x.shape == y.shape == mask.shape == (batch, seq)
            real = mask.any(axis=1)
            assert (mask[real] == 1).all() and (mask[~real] == 0).all() and (x[~real] == 0).all()  # padding rows
            assert (y[real] == x[real] + 1).all()  # y is x shifted by one token
            starts += (x[real, 0] // seq).tolist()
            n += 1
        assert starts == sorted(starts) and (not starts or starts[-1] - starts[0] == len(starts) - 1)  # contiguous
        seen += starts
        counts.add(n)
    assert sorted(seen) == list(range(n_windows))
    assert len(counts) == 1  # every process runs the same number of batches (lockstep)


def test_val_batches_rejects_bad_batch_shapes():
    with pytest.raises(ValueError, match="not a positive multiple of process_count 2"):
        next(val_batches(np.arange(20), 4, 3, 0, 2))
    with pytest.raises(ValueError, match="not a positive multiple"):
        next(val_batches(np.arange(20), 4, 0))
    with pytest.raises(ValueError, match="process_index 2 not in"):
        next(val_batches(np.arange(20), 4, 2, 2, 2))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), st.integers(1, 12), st.integers(0, 60))
def test_sliding_windows_score_each_target_once_with_longest_context(seq, stride_raw, extra):
    stride = 1 + (stride_raw - 1) % seq
    n = seq + 1 + extra
    tokens = np.arange(n, dtype=np.int32) * 3 + 1
    count = np.zeros(n, dtype=np.int64)
    starts = []
    for x, y, f in sliding_windows(tokens, seq, stride):
        s = int(x[0] - 1) // 3
        assert x.tolist() == tokens[s : s + seq].tolist() and y.tolist() == tokens[s + 1 : s + seq + 1].tolist()
        for j in range(f, seq):
            pos = s + 1 + j  # target position; its context is tokens[s : pos], j + 1 tokens
            count[pos] += 1
            assert j + 1 == min(pos, seq) or j + 1 >= seq - stride + 1
        starts.append(s)
    assert count[0] == 0 and (count[1:] == 1).all()
    assert starts[0] == 0 and starts[-1] == n - 1 - seq
    assert all(b - a == stride for a, b in zip(starts[:-2], starts[1:-1]))


def test_sliding_windows_first_window_and_stride_equal_seq():
    tokens = np.arange(11)
    got = [(x.tolist(), f) for x, _, f in sliding_windows(tokens, 4, 4)]
    assert got == [([0, 1, 2, 3], 0), ([4, 5, 6, 7], 0), ([6, 7, 8, 9], 2)]
    with pytest.raises(ValueError, match="stride"):
        next(sliding_windows(tokens, 4, 5))
    with pytest.raises(ValueError, match="fewer than one window"):
        next(sliding_windows(tokens[:4], 4, 2))


@pytest.mark.parametrize("procs", [1, 2])
def test_val_batches_with_stride_are_the_sliding_windows_masked(procs):
    tokens = np.arange(50)
    singles = list(sliding_windows(tokens, 8, 3))
    rows = []
    for p in range(procs):
        for x, y, mask in val_batches(tokens, 8, 4, p, procs, stride=3):
            assert x.shape == (4 // procs, 8)
            real = mask.any(axis=1)
            rows += [(xi.tolist(), yi.tolist(), int(np.argmax(mi))) for xi, yi, mi in zip(x[real], y[real], mask[real])]
    assert rows == [(x.tolist(), y.tolist(), f) for x, y, f in singles]  # mask[b, t] = t >= score_from[b]


def test_window_starts_non_overlapping_matches_stride_equal_seq_on_whole_windows():
    starts, frm = window_starts(4 * 5 + 1, 5)
    assert starts.tolist() == [0, 5, 10, 15] and frm.tolist() == [0] * 4
    s2, f2 = window_starts(4 * 5 + 1, 5, stride=5)
    assert s2.tolist() == starts.tolist() and f2.tolist() == frm.tolist()
    assert window_starts(3, 5)[0].size == 0  # fewer tokens than a window: no non-overlapping window
