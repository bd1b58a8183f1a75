"""Builder process: shard split, snapshots, crash and stop leave nothing behind; analyze on repeats."""

import os
import time
from dataclasses import replace

import numpy as np
import pytest

from frontier_jax.config import NgramConfig
from frontier_jax.data.shards import write_shard
from frontier_jax.ngram import analyze
from frontier_jax.ngram import snapshot as S
from frontier_jax.ngram import tables as T
from frontier_jax.ngram.builder import NgramBuilder, assert_disjoint, shard_usage_text, split_shards_for_builder

CFG = NgramConfig(enabled=True, min_order=2, max_order=8, table_log2_size=14, snapshot_every_tokens=40_000, builder_niceness=5)


def _pid_gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie not yet reaped still counts as gone
        return f.read().split()[2] == "Z"


def _shards(tmp_path, n, size, seed=0):
    rng = np.random.default_rng(seed)
    files = []
    for i in range(n):
        files.append(tmp_path / f"d_train_{i:06d}.bin")
        write_shard(files[-1], rng.integers(0, 512, size))
    return files


def test_split_is_disjoint_and_logged(tmp_path):
    files = [tmp_path / f"d_train_{i}.bin" for i in range(5)]
    trainer, builder = split_shards_for_builder(files, replace(CFG, builder_shards_from_end=2))
    assert trainer == files[:3] and builder == files[3:]
    assert "d_train_3.bin, d_train_4.bin" in shard_usage_text(trainer, builder)
    with pytest.raises(ValueError, match="leaves the trainer no shards") as e:
        split_shards_for_builder(files, replace(CFG, builder_shards_from_end=5))
    assert "--shard-tokens N" in str(e.value) and "--set ngram.enabled=False" in str(e.value)
    (tmp_path / "one").mkdir()
    one = _shards(tmp_path / "one", 1, 9_000)  # a small corpus prepared in one shard: the remedy's size is named
    with pytest.raises(ValueError) as e:
        split_shards_for_builder(one, CFG)
    msg = str(e.value)
    assert "\n" not in msg and "(1 train shard(s)" in msg and "--shard-tokens 2250, 4 shards of its 9,000" in msg
    with pytest.raises(ValueError, match="share shards"):
        assert_disjoint(files[:3], files[2:])


def test_builder_publishes_snapshots_equal_to_in_process_tables(tmp_path):
    files = _shards(tmp_path, 2, 50_000)
    with NgramBuilder(CFG, files, tmp_path / "out", chunk_tokens=20_000) as b:
        assert b.wait(60), "builder did not finish"
        assert b.done() and b.error() is None
        version, path = b.latest_snapshot()
        pid = b.pid
    assert _pid_gone(pid)
    snap = S.load_snapshot(path)
    assert snap.header["complete"] and snap.header["tokens_consumed"] == 100_000
    assert [s["file"] for s in snap.header["sources"]] == [str(f) for f in files]
    assert version == 3 and [v for v, _ in S.list_snapshots(tmp_path / "out")] == [2, 3]  # keep=2
    ref = T.NgramTables.from_config(CFG, chunk_tokens=20_000)
    for f in files:
        from frontier_jax.data.shards import read_shard

        ref.consume(read_shard(f))
    np.testing.assert_array_equal(snap.rows_OK4, ref.rows_OK4)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_builder_crash_is_reported_and_leaves_nothing(tmp_path):
    files = _shards(tmp_path, 1, 50_000)
    bad = tmp_path / "d_train_bad.bin"
    bad.write_bytes(b"not a shard")
    b = NgramBuilder(CFG, files + [bad], tmp_path / "out", chunk_tokens=20_000).start()
    assert b.wait(60)
    err = b.error()
    assert err and "d_train_bad.bin" in err and not b.alive()
    assert b.latest_snapshot() is not None  # training continues on the last snapshot
    with pytest.raises(RuntimeError, match="ngram builder failed"):
        b.raise_if_failed()
    pid = b.pid
    b.stop()
    assert _pid_gone(pid)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_stop_mid_build_leaves_nothing(tmp_path):
    files = _shards(tmp_path, 4, 4_000_000)  # 16M tokens: several seconds of work even at 3M tokens/s
    b = NgramBuilder(replace(CFG, snapshot_every_tokens=10**9), files, tmp_path / "out", chunk_tokens=50_000).start()
    time.sleep(0.5)
    assert b.alive()
    pid = b.pid
    t0 = time.perf_counter()
    b.stop()
    assert time.perf_counter() - t0 < 15
    assert _pid_gone(pid) and b.error() is None
    assert [p.name for p in (tmp_path / "out").iterdir()] == []


def test_analyze_sees_repeated_documents(tmp_path):
    rng = np.random.default_rng(5)
    docs = [np.concatenate([[1], rng.integers(4, 260, 400)]) for _ in range(40)]
    train = np.concatenate(docs)
    data = tmp_path / "data"
    write_shard(data / "d_val_000000.bin", np.concatenate(docs[:10]))  # val repeats train documents
    tables = T.NgramTables(2, 8, 18)
    tables.consume(train)
    snap = S.write_snapshot(tables, tmp_path / "snaps", 1, complete=True)
    rep = analyze.analyze_tables(snap, data, tokenizer="bytes", seq_len=256)
    o8 = rep["orders"][-1]
    assert o8["order"] == 8 and o8["coverage"] > 0.85 and o8["top1_acc"] > 0.99
    assert rep["ngram_bpb"] is not None and rep["ngram_bpb"] < 1.5  # seen-once contexts: lam = 1/2, about 1 bit
    write_shard(data / "d_val_000000.bin", np.concatenate([[1], rng.integers(4, 260, 4000)]))  # unseen text
    fresh = analyze.analyze_tables(snap, data, tokenizer="bytes", seq_len=256)
    assert fresh["orders"][-1]["coverage"] < 0.01 and fresh["ngram_bpb"] > 5.0
