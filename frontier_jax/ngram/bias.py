"""N-gram logit bias inside the jitted step: the host tables' hashes recomputed in JAX (uint32, no x64).

For a window x_BT, position t predicts x[t+1]; its order-n context is x[t-n+1..t] from the window
itself (positions t < n-1 have no order-n context and get no bias). Per order the lookup returns the
stored top token and a confidence bucket; the bias for that (position, order) is
bias_OC[order, bucket] on the top token's logit, 0 when the context is not in the table. The head
adds the S = num_orders (id, value) pairs to the float32 logits before the softmax, so the result is
still a normalised distribution over the whole vocabulary, and it never reads the target.

Device tables are a pytree of fixed shapes (set by the config), so a new snapshot swaps in between
steps without recompiling: fp_OK uint32 fingerprints, top_OK uint16 tokens, conf_OK int8 confidence
bucket (-1: empty bucket). Confidence buckets are computed on the host from (count, total) by
`tables.confidence_bucket`, in integers, so host analysis and device agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from frontier_jax.ngram import snapshot as S
from frontier_jax.ngram import tables as T


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DeviceTables:
    fp_OK: jax.Array
    top_OK: jax.Array
    conf_OK: jax.Array
    min_order: int = field(default=2, metadata={"static": True})  # static: part of the compiled shape


def _device_tables(fp_OK, top_OK, conf_OK, min_order: int) -> DeviceTables:
    return DeviceTables(jnp.asarray(fp_OK), jnp.asarray(top_OK), jnp.asarray(conf_OK), int(min_order))


def host_arrays(rows_OK4: np.ndarray, num_buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fp_OK uint32, top_OK uint16, conf_OK int8) from host rows [O, K, 4]; conf -1 marks empty buckets."""
    rows_OK4 = np.asarray(rows_OK4)
    total = rows_OK4[..., T.TOTAL]
    conf = T.confidence_bucket(rows_OK4[..., T.COUNT], total, num_buckets)
    conf_OK = np.where(total > 0, conf, -1).astype(np.int8)
    return rows_OK4[..., T.FP].astype(np.uint32), rows_OK4[..., T.TOP].astype(np.uint16), conf_OK


def tables_to_device(snapshot: S.Snapshot, num_buckets: int) -> DeviceTables:
    """Device pytree of a published snapshot (`tables.load_snapshot`)."""
    if num_buckets > 127:
        raise ValueError(f"confidence_buckets must be <= 127 (int8 on device), got {num_buckets}")
    return _device_tables(*host_arrays(snapshot.rows_OK4, num_buckets), snapshot.min_order)


def empty_tables(cfg) -> DeviceTables:
    """All-missing tables with the shapes `cfg` (NgramConfig) fixes: for step 0 and compilation."""
    O = cfg.num_orders
    K = 1 << cfg.table_log2_size
    return _device_tables(
        np.zeros((O, K), np.uint32), np.zeros((O, K), np.uint16), np.full((O, K), -1, np.int8), cfg.min_order
    )


def init_bias_OC(cfg) -> jax.Array:
    """Zero-initialised learned bias table [num_orders, confidence_buckets] (float32)."""
    return jnp.zeros((cfg.num_orders, cfg.confidence_buckets), jnp.float32)


def _hash_step(h, v, mul: int):
    g = (h ^ v) * jnp.uint32(mul)
    return g ^ (g >> jnp.uint32(15))


def context_hashes(x_BT: jax.Array, min_order: int, num_orders: int):
    """Per order min..max: (a_BT, b_BT) uint32 chains as `tables.order_hashes`, and valid_1T (t >= n-1)."""
    v_BT = x_BT.astype(jnp.uint32) + jnp.uint32(1)
    B, Tn = x_BT.shape
    a = jnp.full((B, Tn), T.SEED_A, jnp.uint32)
    b = jnp.full((B, Tn), T.SEED_B, jnp.uint32)
    t_T = jnp.arange(Tn)
    out = []
    for n in range(1, min_order + num_orders):
        k = n - 1
        v_sh = jnp.pad(v_BT, ((0, 0), (k, 0)))[:, :Tn]  # v[t - k], junk (0) before the window
        a = _hash_step(a, v_sh, T.MUL_A)
        b = _hash_step(b, v_sh, T.MUL_B)
        if n >= min_order:
            out.append((a, b, (t_T >= k)[None, :]))
    return out


def ngram_lookup(x_BT: jax.Array, tables: DeviceTables):
    """(hit_BTO bool, top_BTO int32, conf_BTO int32): per position and order, the table's prediction."""
    O, K = tables.fp_OK.shape
    L = K.bit_length() - 1
    F = T.fingerprint_bits(L)
    hits, tops, confs = [], [], []
    for o, (a, b, valid) in enumerate(context_hashes(x_BT, tables.min_order, O)):
        bucket = (a >> jnp.uint32(32 - L)).astype(jnp.int32)
        fp = b >> jnp.uint32(32 - F)
        conf = tables.conf_OK[o][bucket].astype(jnp.int32)
        hit = valid & (conf >= 0) & (tables.fp_OK[o][bucket] == fp)
        hits.append(hit)
        tops.append(jnp.where(hit, tables.top_OK[o][bucket].astype(jnp.int32), 0))
        confs.append(jnp.where(hit, conf, 0))
    return jnp.stack(hits, -1), jnp.stack(tops, -1), jnp.stack(confs, -1)


def ngram_sparse_bias(x_BT: jax.Array, tables: DeviceTables, bias_OC: jax.Array):
    """(ids_BTS int32, vals_BTS float32), S = num_orders: bias_OC[o, conf] on each order's top token, 0 on a miss."""
    hit_BTO, top_BTO, conf_BTO = ngram_lookup(x_BT, tables)
    O = bias_OC.shape[0]
    vals_BTO = bias_OC.astype(jnp.float32)[jnp.arange(O), conf_BTO]
    return top_BTO, jnp.where(hit_BTO, vals_BTO, 0.0)
