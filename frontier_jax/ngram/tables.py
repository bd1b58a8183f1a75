"""Hashed n-gram count tables built on the host from training tokens (numpy only, no JAX).

Context and hash. Position t of a token stream predicts x[t+1]; its order-n context is x[t-n+1..t]
(never the predicted token). Two independent 32-bit chains walk the context from the newest token
back to the oldest, with v = x + 1 as uint32:
    a_0 = SEED_A,  a_k = step(a_{k-1}, v[t-k+1], MUL_A);  b likewise with SEED_B, MUL_B
    step(h, v, M) = g ^ (g >> 15)  where g = (h ^ v) * M  (mod 2**32)
so a_n extends a_{n-1} by one older token and every order costs two steps per position. The bucket
is the top L = table_log2_size bits of a_n, the fingerprint the top F = min(32, 48 - L) bits of b_n:
a context is identified by L + F >= 48 bits, so a lookup of an unseen context hits a wrong entry
with probability about 2**-F per occupied bucket. `bias.py` computes the same values in JAX.

Table. Per order, 2**L buckets of four uint32 words: fingerprint, top token, top count, total count
(total == 0 marks an empty bucket); one 16-byte row per bucket so a lookup touches one cache line.

Update policy, per chunk of tokens and per order (exact counts within the chunk by sorting keys).
A bucket is contested in a chunk when another context lands in it (at a position that reaches this
order); each bucket's contest is settled once per chunk. Each bucket also has a builder-only `debt`
(uint8, not published): the chunks since its resident was installed in which it was contested
while absent. It expires when debt >= allowance(total) = 2**(total-1) - 1 (0 for a context seen
once, 1 for twice, 3, 7, ...; never from total 9 on), so protection grows exponentially with evidence.
  1. the resident context, if it occurs in the chunk, adds its chunk total to `total` and its top
     token's chunk count to `count`;
  2. top token: the chunk's most frequent token y of the context (ties: smallest id) becomes the top
     with `count` = its chunk count when that count exceeds the updated `count`, or equals it while
     the old top did not occur in this chunk (a top seen once yields to a later continuation);
  3. other contexts in the bucket: the ones that repeat in the chunk settle the contest if any (the
     largest chunk total challenges, ties: smallest fingerprint), else the ones seen once at an
     admitted position: 1 in 2**admit_log2 (default 32) stream positions, by a hash of the position
     (deterministic, the same positions at every order; several in a bucket: the earliest wins).
     The resident is replaced when the challenger's chunk total exceeds its `total` ("larger total
     wins"), or when it expired and did not occur in this chunk (for a repeating challenger: did not
     repeat in it). A replacement starts with its exact chunk counts and debt 0; a resident that
     stays while absent gets one more debt. Contexts seen once at other positions are dropped and
     change nothing (as before: they cost only their lookup);
  4. empty buckets take the strongest repeating context, else the earliest single one;
  5. suffix rule: a position goes on to order n+1 only if its order-n context repeats in the chunk,
     is now held by its bucket (matched or installed), or the order-n table is still less than
     half full (a blocked context's longer extension probably finds a free bucket then). Once
     tables fill up this skips most new text at high orders (it could not be installed anyway);
     the cost is an order-n+1 context that would have fitted while its order-n suffix was blocked.
     An admitted position that replaces expired residents climbs through all its orders, so the
     admission rate bounds the extra work (bench/ngram_build.py measures it).
Why: near-duplicate pages whose copies fall in different chunks are the n-gram's main gain. With
"larger total wins" alone, a full table of single-count residents never let them in. Now about one
position in 32 of each copy installs its contexts over expired residents, the next copy finds them
(total 2: protected), and after m copies about 1 - (31/32)**m of the page is held; residents that
are not seen again expire, so no stale resident blocks its bucket forever.
Guarantees: `total` never exceeds the true count of the resident context and equals its count since
it was installed (the true count when it was never displaced, blocked or expired); `count` <=
`total` and never exceeds the true count of (context, top), and is exact since the chunk the top
became top. When the data fits one chunk the top is the exact argmax (ties: smallest id) with exact
counts. Without bucket collisions (a table large enough) no bucket is ever contested, so nothing
expires: totals are exact, and the top is exact whenever the same token is the chunk's top (ties:
smallest id) in every chunk where the context occurs (near-duplicate text). Bigger chunks are closer
to exact.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from frontier_jax.ngram.hashing import (  # noqa: F401 (re-exported: the hash is part of the table format)
    COUNT, FP, MUL_A, MUL_B, ROW_WORDS, SEED_A, SEED_B, TOP, TOTAL, bucket_and_fp, fingerprint_bits, hash_step,
    lookup, order_hashes,
)

VOCAB_LIMIT = 1 << 16
_U32_MAX = np.uint64(0xFFFFFFFF)
_TOTAL_ONE = np.uint64(1 << 32)
_NO_OWNER = np.iinfo(np.int64).max
NEVER_EXPIRES = 9  # residents with this total or more never expire (their allowance would pass 255)
_ADMIT_MUL = np.uint64(0x9E3779B97F4A7C15)  # stream position -> admission hash (Fibonacci hashing)
if sys.byteorder != "little":
    raise ImportError("frontier_jax.ngram.tables assumes a little-endian host (uint64 views of uint32 rows)")


_ALLOWANCE_LUT = np.array([0] + [(1 << (t - 1)) - 1 for t in range(1, NEVER_EXPIRES)] + [256], dtype=np.uint16)


def allowance(total):
    """Absent contested chunks a resident with this `total` survives: 2**(total-1) - 1 (0 for a context
    seen once), and for ever (256 > any uint8 debt) from NEVER_EXPIRES on."""
    t = np.minimum(np.asarray(total, dtype=np.uint64), np.uint64(NEVER_EXPIRES))
    return np.take(_ALLOWANCE_LUT, t.astype(np.intp))


def admitted(stream_pos, admit_log2: int) -> np.ndarray:
    """Positions where a context seen once may replace an expired resident: 1 in 2**admit_log2,
    decided by a hash of the position in the stream (deterministic, the same at every order)."""
    pos = np.asarray(stream_pos).astype(np.uint64)
    if admit_log2 == 0:
        return np.ones(pos.shape, dtype=bool)
    return ((pos + np.uint64(1)) * _ADMIT_MUL) >> np.uint64(64 - admit_log2) == 0


def confidence_bucket(count, total, num_buckets: int):
    """Integer confidence floor(C * count / (total + 1)) clipped to C-1: add-one-shrunk top frequency.

    Works on numpy and jnp integer arrays alike (no floats, so host and device agree exactly)."""
    c = (count.astype(np.int64) * num_buckets) // (total.astype(np.int64) + 1)
    return np.minimum(c, num_buckets - 1)


def table_bytes_per_order(log2_size: int) -> int:
    return (1 << log2_size) * ROW_WORDS * 4


def check_memory(cfg) -> list[int]:
    """Bytes per order for `cfg` (an NgramConfig); ValueError when the total exceeds max_table_bytes."""
    if not 1 <= cfg.table_log2_size <= 30:
        raise ValueError(f"ngram.table_log2_size must be in [1, 30], got {cfg.table_log2_size}")
    if not 1 <= cfg.min_order <= cfg.max_order:
        raise ValueError(f"ngram orders must satisfy 1 <= min_order <= max_order, got {cfg.min_order}..{cfg.max_order}")
    per = [table_bytes_per_order(cfg.table_log2_size)] * cfg.num_orders
    if sum(per) > cfg.max_table_bytes:
        raise ValueError(
            f"ngram tables need {sum(per)} bytes ({len(per)} orders x {per[0]}), over max_table_bytes={cfg.max_table_bytes}"
        )
    return per


@dataclass
class NgramTables:
    """Mutable tables for orders min_order..max_order, fed by `consume` in stream order."""

    min_order: int
    max_order: int
    log2_size: int
    chunk_tokens: int = 1 << 20
    admit_log2: int = 5  # a context seen once may replace an expired resident at 1 position in 2**admit_log2
    rows_OK4: np.ndarray = field(init=False)
    unigram_V: np.ndarray = field(init=False)
    tokens_consumed: int = 0
    sources: list = field(default_factory=list)
    dropped_O: np.ndarray = field(init=False)  # chunk contexts dropped on a collision, per order
    _tail: np.ndarray = field(init=False)

    @classmethod
    def from_config(cls, cfg, chunk_tokens: int = 1 << 20) -> "NgramTables":
        check_memory(cfg)
        return cls(cfg.min_order, cfg.max_order, cfg.table_log2_size, chunk_tokens)

    def __post_init__(self):
        num_orders = self.max_order - self.min_order + 1
        self.rows_OK4 = np.zeros((num_orders, 1 << self.log2_size, ROW_WORDS), dtype=np.uint32)
        self.unigram_V = np.zeros(VOCAB_LIMIT, dtype=np.uint64)
        self.dropped_O = np.zeros(num_orders, dtype=np.int64)
        self.occupied_O = np.zeros(num_orders, dtype=np.int64)  # non-empty buckets
        self.replaced_O = np.zeros(num_orders, dtype=np.int64)  # residents replaced (larger total or expired)
        self.debt_OK = np.zeros((num_orders, 1 << self.log2_size), dtype=np.uint8)  # builder-only, see policy
        if not 0 <= self.admit_log2 <= 32:
            raise ValueError(f"admit_log2 must be in [0, 32], got {self.admit_log2}")
        self._tail = np.zeros(0, dtype=np.uint16)
        self._owner_K = np.full(1 << self.log2_size, _NO_OWNER, dtype=np.int64)
        self._mark_K = np.zeros(1 << self.log2_size, dtype=np.uint64)
        self._gen = 0
        self._touch_K = np.zeros(1 << self.log2_size, dtype=np.uint64)  # 2*tick: resident seen, 2*tick+1: contested
        self._tick = 0  # one per (chunk, order) merge
        self._admit_N = np.zeros(0, dtype=bool)  # per position of the current chunk buffer: admitted (policy 3)

    @property
    def orders(self) -> list[int]:
        return list(range(self.min_order, self.max_order + 1))

    def bytes_per_order(self) -> list[int]:
        return [int(self.rows_OK4[o].nbytes) for o in range(self.rows_OK4.shape[0])]

    def consume(self, tokens_N: np.ndarray) -> None:
        """Count every next-token event of `tokens_N`, continuing the stream fed so far."""
        tokens_N = np.asarray(tokens_N)
        for start in range(0, tokens_N.size, self.chunk_tokens):
            self._consume_chunk(np.asarray(tokens_N[start : start + self.chunk_tokens], dtype=np.uint16))

    def _consume_chunk(self, chunk_N: np.ndarray) -> None:
        # Hot path. numpy's np.take / np.compress are used instead of fancy / boolean indexing:
        # measured 2-3x faster on 1M-element arrays (bench/ngram_build.py reports the throughput).
        if self.tokens_consumed + chunk_N.size >= 1 << 32:
            raise ValueError("ngram tables count at most 2**32 - 1 tokens (uint32 counts)")
        buf_N = np.concatenate([self._tail, chunk_N])
        self._admit_N = admitted(np.arange(buf_N.size, dtype=np.uint64) + np.uint64(self.tokens_consumed - self._tail.size), self.admit_log2)
        first = max(self._tail.size - 1, 0)  # first position whose target is new
        self.tokens_consumed += chunk_N.size
        self._tail = buf_N[-self.max_order :].copy()
        if buf_N.size < 2:
            return
        self.unigram_V += np.bincount(buf_N[first + 1 :], minlength=VOCAB_LIMIT).astype(np.uint64)
        x_N = buf_N.astype(np.uint32)
        v_N = x_N + np.uint32(1)
        # compacted per-position state: positions still alive, their two chains, "repeats in chunk" flag
        pos_P = np.arange(first, buf_N.size - 1)
        a_P = np.full(pos_P.size, SEED_A, dtype=np.uint32)
        b_P = np.full(pos_P.size, SEED_B, dtype=np.uint32)
        rep_P = np.ones(pos_P.size, dtype=bool)
        contiguous = True  # pos_P is still an arange: gathers are slices
        for n in range(1, self.max_order + 1):
            if pos_P.size and pos_P[0] < n - 1:  # too little context at the start of the stream
                keep = pos_P >= n - 1
                pos_P, a_P, b_P, rep_P = (np.compress(keep, z) for z in (pos_P, a_P, b_P, rep_P))
            if pos_P.size == 0:
                return
            lo, hi = int(pos_P[0]), int(pos_P[-1]) + 1
            v_P = v_N[lo - n + 1 : hi - n + 1] if contiguous else np.take(v_N, pos_P - (n - 1))
            a_P = hash_step(a_P, v_P, MUL_A)
            b_P = hash_step(b_P, v_P, MUL_B)
            if n < self.min_order:
                continue
            y_P = x_N[lo + 1 : hi + 1] if contiguous else np.take(x_N, pos_P + 1)
            keep, rep_P = self._update_order(n - self.min_order, a_P, b_P, y_P, rep_P, pos_P)
            if keep is not None:
                pos_P, a_P, b_P, rep_P = (np.compress(keep, z) for z in (pos_P, a_P, b_P, rep_P))
                contiguous = False

    def _update_order(self, o, a_P, b_P, y_P, cand_P, pos_P):
        """Merge one order's events; return (alive for the next order or None for all, repeats-in-chunk flags)."""
        L = self.log2_size
        F = fingerprint_bits(L)
        rows_K4 = self.rows_OK4[o]
        bucket_P, fp_P = bucket_and_fp(a_P, b_P, L)
        everyone = bool(cand_P.all())  # low orders: every context may repeat, no gathers needed
        c = None if everyone else np.flatnonzero(cand_P)
        in_multi_P = np.zeros(y_P.size, dtype=bool)
        self._tick += 1
        if everyone or c.size:
            bucket_C = bucket_P if everyone else np.take(bucket_P, c)
            ctx_C = (bucket_C.astype(np.uint64) << np.uint64(F)) | (fp_P if everyone else np.take(fp_P, c))
            keys = (ctx_C << np.uint64(16)) | (y_P if everyone else np.take(y_P, c))
            keys.sort()
            new_run = np.empty(keys.size, dtype=bool)
            new_run[0] = True
            np.not_equal(keys[1:], keys[:-1], out=new_run[1:])
            starts = np.flatnonzero(new_run)
            ukeys = np.take(keys, starts)
            ucount = np.diff(np.append(starts, keys.size)).astype(np.uint64)
            uctx = ukeys >> np.uint64(16)
            new_ctx = np.empty(uctx.size, dtype=bool)
            new_ctx[0] = True
            np.not_equal(uctx[1:], uctx[:-1], out=new_ctx[1:])
            gstart = np.flatnonzero(new_ctx)
            gtotal = np.add.reduceat(ucount, gstart)
            multi = gtotal >= 2
            mctx = np.compress(multi, np.take(uctx, gstart))
            if everyone:
                in_multi_P = self._member(mctx, ctx_C, bucket_C, F)
            else:
                in_multi_P[c] = self._member(mctx, ctx_C, bucket_C, F)
            if mctx.size:
                best = np.maximum.reduceat((ucount << np.uint64(16)) | (np.uint64(0xFFFF) - (ukeys & np.uint64(0xFFFF))), gstart)
                self._merge_multi(o, rows_K4, mctx, np.compress(multi, gtotal), np.compress(multi, best), ukeys, ucount, F)
        s = np.flatnonzero(~in_multi_P)
        kept_S = self._merge_singles(o, rows_K4, np.take(bucket_P, s), np.take(fp_P, s), np.take(y_P, s), np.take(pos_P, s))
        if 2 * self.occupied_O[o] < rows_K4.shape[0]:  # table under half full: everything goes on
            return None, in_multi_P
        alive_P = in_multi_P.copy()
        alive_P[np.compress(kept_S, s)] = True
        return alive_P, in_multi_P

    def _member(self, mctx, ctx_C, bucket_C, F):
        """ctx_C in mctx (sorted), through a per-bucket scratch tagged with a fresh generation."""
        if mctx.size == 0:
            return np.zeros(ctx_C.size, dtype=bool)
        self._gen += 1
        gen = np.uint64(self._gen << 33)
        mb = (mctx >> np.uint64(F)).astype(np.intp)
        dup = np.zeros(mb.size, dtype=np.uint64)
        same_b = mb[1:] == mb[:-1]
        dup[1:][same_b] = 1
        dup[:-1][same_b] = 1
        fmask = np.uint64((1 << F) - 1)
        mark = self._mark_K
        np.put(mark, mb, gen | (dup << np.uint64(32)) | (mctx & fmask))
        m = np.take(mark, bucket_C.astype(np.intp))
        tagged = (m >> np.uint64(33)) == np.uint64(self._gen)
        in_multi = tagged & ((m & _U32_MAX) == (ctx_C & fmask))
        shared = np.flatnonzero(tagged & ((m >> np.uint64(32)) & np.uint64(1)).astype(bool))
        if shared.size:  # buckets holding several repeating contexts: exact search
            q = np.take(ctx_C, shared)
            qi = np.minimum(np.searchsorted(mctx, q), mctx.size - 1)
            in_multi[shared] = np.take(mctx, qi) == q
        return in_multi

    def _merge_multi(self, o, rows_K4, mctx, total_G, best_G, ukeys, ucount, F):
        """Policy steps 1-3 for the contexts that repeat in the chunk (mctx sorted, so by bucket)."""
        debt_K = self.debt_OK[o]
        b_G = (mctx >> np.uint64(F)).astype(np.intp)
        f_G = (mctx & np.uint64((1 << F) - 1)).astype(np.uint32)
        top_G = (np.uint64(0xFFFF) - (best_G & np.uint64(0xFFFF))).astype(np.uint32)
        cnt_G = best_G >> np.uint64(16)
        res = np.take(rows_K4, b_G, axis=0)
        same = (res[:, TOTAL] > 0) & (res[:, FP] == f_G)
        # 1. the resident context: add its totals and its top's chunk count; 2. the chunk's top takes
        # over with more evidence, or equal evidence while the old top is absent from the chunk
        bs = b_G[same]
        res_s = res[same]
        q = (mctx[same] << np.uint64(16)) | res_s[:, TOP].astype(np.uint64)
        qi = np.minimum(np.searchsorted(ukeys, q), ukeys.size - 1)
        c_res = np.where(np.take(ukeys, qi) == q, np.take(ucount, qi), 0)
        new_total = np.minimum(res_s[:, TOTAL].astype(np.uint64) + total_G[same], _U32_MAX)
        new_cnt = np.minimum(res_s[:, COUNT].astype(np.uint64) + c_res, _U32_MAX)
        take = (cnt_G[same] > new_cnt) | ((cnt_G[same] == new_cnt) & (c_res == 0))
        res_s[:, TOTAL] = new_total
        res_s[:, COUNT] = np.where(take, cnt_G[same], new_cnt)
        res_s[:, TOP] = np.where(take, top_G[same], res_s[:, TOP])
        rows_K4[bs] = res_s
        # 3. other contexts: per bucket the largest chunk total challenges the resident
        other = ~same
        if not other.any():
            return
        bo, fo, to, co, yo = b_G[other], f_G[other], total_G[other], cnt_G[other], top_G[other]
        run = np.flatnonzero(np.concatenate([[True], bo[1:] != bo[:-1]]))
        order_key = (to << np.uint64(32)) | (_U32_MAX - np.arange(bo.size, dtype=np.uint64))
        win = (_U32_MAX - (np.maximum.reduceat(order_key, run) & _U32_MAX)).astype(np.intp)
        bw = bo[win]
        resident_total = rows_K4[bw, TOTAL].astype(np.uint64)
        present = np.zeros(bw.size, dtype=bool)  # the resident repeats in this chunk too (bs is sorted)
        if bs.size:
            present = np.take(bs, np.minimum(np.searchsorted(bs, bw), bs.size - 1)) == bw
        absent = (resident_total > 0) & ~present
        d = debt_K[bw]
        expired = absent & (d >= allowance(resident_total))
        replace = (to[win] > resident_total) | expired
        stay = absent & ~replace  # contested while absent: one more chunk of debt
        debt_K[bw[stay]] = np.minimum(d[stay], 254) + 1
        self._touch_K[bw[absent]] = np.uint64(2 * self._tick + 1)  # contest settled for this chunk
        self.dropped_O[o] += bo.size - int(replace.sum())
        self.occupied_O[o] += int((resident_total[replace] == 0).sum())
        self.replaced_O[o] += int((resident_total[replace] > 0).sum())
        w = win[replace]
        rows_K4[bo[w]] = np.stack(
            [fo[w], yo[w], np.minimum(co[w], _U32_MAX).astype(np.uint32), np.minimum(to[w], _U32_MAX).astype(np.uint32)], axis=1
        )
        debt_K[bo[w]] = 0

    def _merge_singles(self, o, rows_K4, b_S, f_S, y_S, pos_S):
        """Policy steps 1-4 for the contexts seen once in the chunk; return which are now held."""
        debt_K, touch_K = self.debt_OK[o], self._touch_K
        seen = np.uint64(2 * self._tick)
        # rows viewed as two little-endian uint64 words per bucket: w0 = fp | top << 32, w1 = count | total << 32
        w_2K = rows_K4.reshape(-1).view(np.uint64)  # flat: bucket k's words at 2k, 2k + 1
        bi = b_S.astype(np.intp)
        i0 = bi << 1
        i1 = i0 + 1
        w0, w1 = np.take(w_2K, i0), np.take(w_2K, i1)
        occupied = w1 >= _TOTAL_ONE
        same = occupied & ((w0 & _U32_MAX) == f_S)
        # 1./2. the resident seen once more (each such bucket once: a context seen once is one position)
        sm = np.flatnonzero(same)
        w0_m, w1_m, y_m = np.take(w0, sm), np.take(w1, sm), np.take(y_S, sm).astype(np.uint64)
        match = (w0_m >> np.uint64(32)) == y_m
        w1_m = w1_m + _TOTAL_ONE + match
        np.put(w_2K, np.take(i1, sm), w1_m)
        flip = np.flatnonzero(~match & ((w1_m & _U32_MAX) == 1))  # a top of count 1, absent here: y takes over
        np.put(w_2K, np.take(i0, sm[flip]), (np.take(w0_m, flip) & _U32_MAX) | (np.take(y_m, flip) << np.uint64(32)))
        np.put(touch_K, np.take(bi, sm), seen)
        # 3. admitted single challengers on occupied buckets whose contest is not settled in this chunk
        # (the resident did not occur, no repeating challenger); the others are dropped without effect
        fo = np.flatnonzero(occupied & ~same & np.take(self._admit_N, pos_S))
        bo = np.take(bi, fo)
        fresh = np.take(touch_K, bo) < seen
        fo, bo = np.compress(fresh, fo), np.compress(fresh, bo)
        d = np.take(debt_K, bo)
        live = d < allowance(np.take(w1, fo) >> np.uint64(32))
        np.put(debt_K, np.compress(live, bo), np.minimum(np.compress(live, d), 254) + np.uint8(1))  # once per bucket
        ex = np.compress(~live, fo)  # challengers of expired residents
        # 3./4. expired and empty buckets: the earliest admitted (expired) or any (empty) single wins
        empty = np.flatnonzero(~occupied)
        cand = np.concatenate([empty, ex])
        cb = np.take(bi, cand)
        owner = self._owner_K
        np.minimum.at(owner, cb, cand)
        e = np.compress(np.take(owner, cb) == cand, cand)
        owner[cb] = _NO_OWNER
        n_empty = int(np.count_nonzero(~np.take(occupied, e)))
        be = np.take(i0, e)
        np.put(w_2K, be, np.take(f_S, e).astype(np.uint64) | (np.take(y_S, e).astype(np.uint64) << np.uint64(32)))
        np.put(w_2K, be + 1, _TOTAL_ONE + np.uint64(1))
        np.put(debt_K, np.take(bi, e), 0)
        self.dropped_O[o] += b_S.size - sm.size - e.size
        self.occupied_O[o] += n_empty
        self.replaced_O[o] += e.size - n_empty
        kept = same
        kept[e] = True
        return kept

    def stats(self) -> dict:
        occupied = (self.rows_OK4[:, :, TOTAL] > 0).sum(axis=1)
        return {
            "orders": self.orders,
            "buckets_per_order": 1 << self.log2_size,
            "occupied_per_order": [int(v) for v in occupied],
            "dropped_contexts_per_order": [int(v) for v in self.dropped_O],
            "replaced_residents_per_order": [int(v) for v in self.replaced_O],
            "builder_debt_bytes": int(self.debt_OK.nbytes),
            "bytes_per_order": self.bytes_per_order(),
            "bytes_total": int(sum(self.bytes_per_order())),
        }
