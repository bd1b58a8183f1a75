"""JAX n-gram bias: bit-identical hashes, lookups equal to numpy, normalisation, causality, snapshot swap."""

import jax
import jax.numpy as jnp
import numpy as np

from frontier_jax.ops import reference
from frontier_jax.config import NgramConfig
from frontier_jax.ngram import bias as B
from frontier_jax.ngram import snapshot as S
from frontier_jax.ngram import tables as T

CFG = NgramConfig(enabled=True, min_order=2, max_order=7, table_log2_size=12, confidence_buckets=8)


def _streams():
    rng = np.random.default_rng(0)
    return {
        "random": rng.integers(0, 65536, 700),
        "zeros": np.zeros(300, np.int64),
        "max_id": np.full(300, 65535),
        "period2": np.tile([7, 65535], 150),
        "period1_then_random": np.concatenate([np.full(100, 3), rng.integers(0, 1024, 200)]),
        "long": rng.integers(0, 1024, 8192),
    }


def test_hashes_bit_identical():
    streams = _streams()
    width = max(x.size for x in streams.values())
    x_BT = np.stack([np.pad(x, (0, width - x.size)) for x in streams.values()]).astype(np.int32)
    got = jax.jit(B.context_hashes, static_argnums=(1, 2))(jnp.asarray(x_BT), 1, 16)
    assert len(got) == 16
    for r, x in enumerate(streams.values()):
        want = [(n, a.copy(), b.copy()) for n, a, b in T.order_hashes(x.astype(np.uint16), 16)]
        for (n, a_np, b_np), (a, b, valid) in zip(want, got):
            v = np.asarray(valid[0])[: x.size]
            assert v.sum() == x.size - n + 1
            np.testing.assert_array_equal(np.asarray(a[r])[: x.size][v], a_np[v])
            np.testing.assert_array_equal(np.asarray(b[r])[: x.size][v], b_np[v])


def _snapshot(tmp_path, tokens, version=1):
    tables = T.NgramTables.from_config(CFG)
    tables.consume(tokens)
    return S.load_snapshot(S.write_snapshot(tables, tmp_path, version, complete=True))


def test_lookup_matches_numpy(tmp_path):
    rng = np.random.default_rng(1)
    train = rng.integers(0, 50, 6000).astype(np.uint16)
    snap = _snapshot(tmp_path, train)
    dev = B.tables_to_device(snap, CFG.confidence_buckets)
    x_BT = np.stack([train[:256], rng.integers(0, 50, 256)]).astype(np.int32)
    hit, top, conf = jax.jit(B.ngram_lookup)(jnp.asarray(x_BT), dev)
    for r in range(2):
        h, tp, cnt, tot = T.lookup(np.asarray(snap.rows_OK4), 2, x_BT[r].astype(np.uint16))
        np.testing.assert_array_equal(np.asarray(hit[r]), h)
        np.testing.assert_array_equal(np.asarray(top[r]), tp)
        np.testing.assert_array_equal(np.asarray(conf[r])[h], T.confidence_bucket(cnt, tot, 8)[h])
    assert np.asarray(hit[0]).mean() > 0.5  # train text is found (4096 buckets: many collisions)


def test_bias_normalised_and_ignores_targets(tmp_path):
    rng = np.random.default_rng(2)
    train = rng.integers(0, 64, 4000).astype(np.uint16)
    dev = B.tables_to_device(_snapshot(tmp_path, train), 8)
    bias_OC = jnp.asarray(rng.normal(size=(6, 8)) * 3, jnp.float32)
    x_BT = jnp.asarray(train[:512].reshape(2, 256).astype(np.int32))
    f = jax.jit(B.ngram_sparse_bias)
    ids, vals = f(x_BT, dev, bias_OC)
    assert ids.shape == vals.shape == (2, 256, 6) and vals.dtype == jnp.float32
    assert float(jnp.abs(vals).sum()) > 0
    logits = jnp.asarray(rng.normal(size=(512, 64)), jnp.float32)
    biased = jax.jit(reference.add_sparse_bias)(logits, ids.reshape(512, 6), vals.reshape(512, 6))
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(biased, -1).sum(-1)), 1.0, rtol=1e-5)
    # changing the token at t+1 (the target of t) never changes the bias at positions <= t
    for t in (0, 17, 100, 254):
        x2 = np.array(x_BT)
        x2[:, t + 1] = (x2[:, t + 1] + 1) % 64
        ids2, vals2 = f(jnp.asarray(x2), dev, bias_OC)
        np.testing.assert_array_equal(np.asarray(ids2[:, : t + 1]), np.asarray(ids[:, : t + 1]))
        np.testing.assert_array_equal(np.asarray(vals2[:, : t + 1]), np.asarray(vals[:, : t + 1]))


def test_bias_gradient_reaches_table_only_through_hits(tmp_path):
    train = np.random.default_rng(3).integers(0, 32, 3000).astype(np.uint16)
    dev = B.tables_to_device(_snapshot(tmp_path, train), 8)
    x_BT = jnp.asarray(train[:128][None].astype(np.int32))
    emb = jnp.asarray(np.random.default_rng(4).normal(size=(32, 16)), jnp.float32)
    h = jnp.asarray(np.random.default_rng(5).normal(size=(128, 16)), jnp.float32)
    y = jnp.asarray(train[1:129].astype(np.int32))

    def loss(bias_OC):
        ids, vals = B.ngram_sparse_bias(x_BT, dev, bias_OC)
        return reference.head_loss(h, emb, y, 30.0, ids.reshape(128, -1), vals.reshape(128, -1)).mean()

    g = jax.jit(jax.grad(loss))(B.init_bias_OC(CFG))
    assert g.shape == (6, 8) and float(jnp.abs(g).sum()) > 0
    hit, _, conf = jax.jit(B.ngram_lookup)(x_BT, dev)
    used = np.zeros((6, 8), bool)
    for o in range(6):
        used[o, np.unique(np.asarray(conf[0, :, o])[np.asarray(hit[0, :, o])])] = True
    assert np.all(np.asarray(g)[~used] == 0)


def test_empty_tables_give_zero_bias():
    x_BT = jnp.asarray(np.random.default_rng(6).integers(0, 100, (2, 64)), jnp.int32)
    ids, vals = jax.jit(B.ngram_sparse_bias)(x_BT, B.empty_tables(CFG), jnp.ones((6, 8)))
    assert float(jnp.abs(vals).sum()) == 0.0


def test_snapshot_swap_without_recompiling(tmp_path):
    rng = np.random.default_rng(7)
    traces = []

    @jax.jit
    def step(x_BT, tables, bias_OC):
        traces.append(1)
        return B.ngram_sparse_bias(x_BT, tables, bias_OC)

    a = rng.integers(0, 40, 3000).astype(np.uint16)
    b = rng.integers(0, 40, 3000).astype(np.uint16)
    x_BT = jnp.asarray(b[:256][None].astype(np.int32))
    bias_OC = jnp.ones((6, 8))
    _, v0 = step(x_BT, B.empty_tables(CFG), bias_OC)
    _, v1 = step(x_BT, B.tables_to_device(_snapshot(tmp_path / "a", a), 8), bias_OC)
    _, v2 = step(x_BT, B.tables_to_device(_snapshot(tmp_path / "b", b), 8), bias_OC)
    assert len(traces) == 1
    assert float(jnp.abs(v0).sum()) == 0
    assert float(jnp.abs(v2).sum()) > float(jnp.abs(v1).sum()) > 0
