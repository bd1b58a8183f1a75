"""Host n-gram tables: hash definition, exact counts vs brute force, collisions, snapshots, memory cap."""

import collections
from dataclasses import replace

import numpy as np
import pytest

from frontier_jax.config import NgramConfig
from frontier_jax.ngram import snapshot as S
from frontier_jax.ngram import tables as T


def _truth(tokens, n):
    """{context tuple: Counter(next token)} by brute force."""
    c = collections.defaultdict(collections.Counter)
    tok = [int(v) for v in tokens]
    for t in range(n - 1, len(tok) - 1):
        c[tuple(tok[t - n + 1 : t + 1])][tok[t + 1]] += 1
    return c


def _best(counter):
    tok, cnt = max(counter.items(), key=lambda kv: (kv[1], -kv[0]))
    return tok, cnt, sum(counter.values())


def _scalar_hash(ctx, mul, seed):
    h = seed
    for v in reversed(ctx):  # newest token first
        g = ((h ^ (v + 1)) * mul) & 0xFFFFFFFF
        h = g ^ (g >> 15)
    return h


def _bucket_collisions(tokens, orders, L):
    """True if two distinct contexts of some order share a bucket."""
    for n in orders:
        buckets = {}
        for ctx in _truth(tokens, n):
            b = _scalar_hash(ctx, T.MUL_A, T.SEED_A) >> (32 - L)
            if buckets.setdefault(b, ctx) != ctx:
                return True
    return False


def test_hash_matches_scalar_definition():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 65536, 64).astype(np.uint16)
    for n, a, b in T.order_hashes(x, 6):
        for t in range(n - 1, x.size):
            ctx = [int(v) for v in x[t - n + 1 : t + 1]]
            assert a[t] == _scalar_hash(ctx, T.MUL_A, T.SEED_A)
            assert b[t] == _scalar_hash(ctx, T.MUL_B, T.SEED_B)


def _exact_check(tables, tokens, orders):
    hit, top, cnt, tot = T.lookup(tables.rows_OK4, tables.min_order, tokens)
    for n in orders:
        truth = _truth(tokens, n)
        o = n - tables.min_order
        for t in range(n - 1, tokens.size - 1):
            want = _best(truth[tuple(int(v) for v in tokens[t - n + 1 : t + 1])])
            assert hit[t, o] and (top[t, o], cnt[t, o], tot[t, o]) == want, (n, t)
        assert not hit[: n - 1, o].any()


def test_single_chunk_equals_brute_force():
    L, orders = 20, range(2, 6)
    for seed in range(10):
        tokens = np.random.default_rng(seed).integers(0, 12, 1200).astype(np.uint16)
        if not _bucket_collisions(tokens, orders, L):
            break
    tables = T.NgramTables(2, 5, L)
    tables.consume(tokens)
    _exact_check(tables, tokens, orders)
    assert tables.unigram_V.sum() == tokens.size - 1
    assert tables.dropped_O.sum() == 0


def test_many_chunks_exact_on_deterministic_continuations():
    for seed in range(10):
        doc = np.random.default_rng(seed).integers(0, 40000, 300).astype(np.uint16)
        tokens = np.concatenate([doc] * 7)  # each context has one continuation, spread over many chunks
        if not _bucket_collisions(tokens, range(4, 9), 18):
            break
    tables = T.NgramTables(4, 8, 18, chunk_tokens=257)
    for start in range(0, tokens.size, 1000):  # streamed in pieces unaligned with chunks
        tables.consume(tokens[start : start + 1000])
    _exact_check(tables, tokens, range(4, 9))


def test_totals_exact_across_chunks():
    tokens = np.random.default_rng(2).integers(0, 6, 900).astype(np.uint16)
    tables = T.NgramTables(2, 3, 20, chunk_tokens=100)
    tables.consume(tokens)
    hit, top, cnt, tot = T.lookup(tables.rows_OK4, 2, tokens)
    for n in (2, 3):
        truth = _truth(tokens, n)
        for t in range(n - 1, tokens.size - 1):
            c = truth[tuple(int(v) for v in tokens[t - n + 1 : t + 1])]
            assert tot[t, n - 2] == sum(c.values())
            assert cnt[t, n - 2] <= c[int(top[t, n - 2])]
            assert cnt[t, n - 2] >= 1


@pytest.mark.parametrize("chunk", [64, 1 << 20])
def test_tiny_table_degrades_gracefully(chunk):
    rng = np.random.default_rng(3)
    tokens = np.concatenate([rng.integers(0, 300, 2000), np.tile(rng.integers(0, 300, 50), 20)]).astype(np.uint16)
    tables = T.NgramTables(2, 6, 4, chunk_tokens=chunk)  # 16 buckets per order: nearly everything collides
    tables.consume(tokens)
    assert tables.dropped_O.sum() > 0
    assert (tables.occupied_O == (tables.rows_OK4[:, :, T.TOTAL] > 0).sum(axis=1)).all()
    hit, top, cnt, tot = T.lookup(tables.rows_OK4, 2, tokens)
    assert hit.any()
    for n in range(2, 7):
        truth = _truth(tokens, n)
        o = n - 2
        for t in np.flatnonzero(hit[:, o]):
            c = truth[tuple(int(v) for v in tokens[t - n + 1 : t + 1])]
            # a hit is this very context (fingerprint) and never claims more than the truth
            assert 1 <= cnt[t, o] <= c[int(top[t, o])]
            assert cnt[t, o] <= tot[t, o] <= sum(c.values())


def test_snapshot_roundtrip_is_atomic(tmp_path):
    tables = T.NgramTables(2, 4, 10)
    tables.consume(np.arange(500, dtype=np.uint16) % 37)
    tables.sources.append({"file": "a.bin", "start": 0, "stop": 500})
    p = S.write_snapshot(tables, tmp_path, 3, complete=True)
    snap = S.load_snapshot(p)
    assert snap.version == 3 and snap.min_order == 2 and snap.header["tokens_consumed"] == 500
    assert snap.header["sources"][0]["file"] == "a.bin" and snap.header["complete"]
    np.testing.assert_array_equal(snap.rows_OK4, tables.rows_OK4)
    assert not snap.rows_OK4.flags.writeable
    assert [p.name for p in tmp_path.iterdir()] == ["snap_000003"]
    assert S.list_snapshots(tmp_path) == [(3, p)]
    with pytest.raises(FileExistsError):
        S.write_snapshot(tables, tmp_path, 3, complete=True)
    assert [p.name for p in tmp_path.iterdir()] == ["snap_000003"]


def test_memory_is_capped_and_reported():
    cfg = NgramConfig(enabled=True, table_log2_size=20)
    per = T.check_memory(cfg)
    assert len(per) == 15 and per[0] == 16 << 20
    with pytest.raises(ValueError, match="max_table_bytes"):
        T.check_memory(replace(cfg, max_table_bytes=100 << 20))
    t = T.NgramTables.from_config(replace(cfg, table_log2_size=8))
    assert t.stats()["bytes_total"] == 15 * 256 * 16


def test_confidence_bucket_range():
    cnt = np.array([1, 1, 2, 10, 99, 0])
    tot = np.array([1, 5, 2, 10, 100, 0])
    assert list(T.confidence_bucket(cnt, tot, 8)) == [4, 1, 5, 7, 7, 0]


FILL = 4 * 8192


def _near_duplicate_stream(copies, chunk=8192, doc_len=300, seed=5):
    """First FILL tokens: fresh (fill a small table with single-count contexts). Then one chunk per copy:
    the same document once, at a different offset, among fresh tokens (a near-duplicate page whose
    copies fall in different chunks). Vocabulary 60000: every context outside the document is unique."""
    rng = np.random.default_rng(seed)
    doc = rng.integers(0, 60000, doc_len).astype(np.uint16)
    parts = [rng.integers(0, 60000, FILL).astype(np.uint16)]
    for _ in range(copies):
        x = rng.integers(0, 60000, chunk).astype(np.uint16)
        at = int(rng.integers(0, chunk - doc_len))
        x[at : at + doc_len] = doc
        parts.append(x)
    return doc, np.concatenate(parts)


def _doc_coverage(tables, doc, n):
    """Fraction of the document's order-n positions whose context is held with the right top token."""
    hit, top, _, tot = T.lookup(tables.rows_OK4, tables.min_order, doc)
    o = n - tables.min_order
    t = np.arange(n - 1, doc.size - 1)
    return float(np.mean(hit[t, o] & (top[t, o] == doc[t + 1])))


@pytest.mark.parametrize("admit_log2, copies, floor", [(0, 6, 0.6), (5, 60, 0.5)])
def test_near_duplicates_across_chunks_displace_stale_singles(admit_log2, copies, floor):
    doc, tokens = _near_duplicate_stream(copies)
    tables = T.NgramTables(2, 8, 12, chunk_tokens=8192, admit_log2=admit_log2)
    tables.consume(tokens[:FILL])
    assert (2 * tables.occupied_O > 4096).all()  # past half full of single-count contexts: suffix rule active
    assert tables.rows_OK4[:, :, T.TOTAL].max() == 1
    tables.consume(tokens[FILL:])
    for n in (6, 7, 8):
        assert _doc_coverage(tables, doc, n) >= floor, n
    # a held document context has been counted once per copy since it got in, never more
    hit, top, cnt, tot = T.lookup(tables.rows_OK4, 2, doc)
    assert (tot[hit] <= copies).all() and (cnt[hit] <= tot[hit]).all()
    assert (tot[:, -1][hit[:, -1]] >= 2).mean() > 0.5  # most were seen again after they got in
    # without admission of single-count contexts (the old policy for them) the document never gets in
    old = T.NgramTables(2, 8, 12, chunk_tokens=8192, admit_log2=32)
    old.consume(tokens)
    assert max(_doc_coverage(old, doc, n) for n in (6, 7, 8)) < 0.05


def test_top_seen_once_yields_to_later_continuation():
    rng = np.random.default_rng(7)
    ctx = rng.integers(100, 60000, 8).astype(np.uint16)
    parts = [np.concatenate([ctx, [11], rng.integers(100, 60000, 500)])]  # ctx -> 11 once
    parts += [np.concatenate([ctx, [22], rng.integers(100, 60000, 500)]) for _ in range(3)]  # then ctx -> 22, once per chunk
    tokens = np.concatenate(parts).astype(np.uint16)
    tables = T.NgramTables(4, 8, 16, chunk_tokens=509)
    tables.consume(tokens)
    hit, top, cnt, tot = T.lookup(tables.rows_OK4, 4, ctx)
    assert hit[-1].all() and (top[-1] == 22).all() and (cnt[-1] == 3).all() and (tot[-1] == 4).all()


def test_allowance_and_admission():
    assert list(T.allowance(np.arange(1, 11))) == [0, 1, 3, 7, 15, 31, 63, 127, 256, 256]
    a = T.admitted(np.arange(1 << 16), 5)
    assert abs(a.mean() - 1 / 32) < 0.003 and T.admitted(np.arange(10), 0).all()
    np.testing.assert_array_equal(a, T.admitted(np.arange(1 << 16), 5))
