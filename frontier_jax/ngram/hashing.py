"""The context hash and row layout of the n-gram tables, and host-side lookups (numpy only).

`tables.py` documents the hash and the update policy and re-exports these names; `bias.py` computes
the same hashes in JAX (bit-identical, tested)."""

from __future__ import annotations

import numpy as np

SEED_A, SEED_B = 0x9E3779B9, 0x7F4A7C15
MUL_A, MUL_B = 0x85EBCA6B, 0xC2B2AE35
ROW_WORDS = 4  # fingerprint, top token, top count, total count
FP, TOP, COUNT, TOTAL = range(ROW_WORDS)


def fingerprint_bits(log2_size: int) -> int:
    """Fingerprint width F for a table of 2**log2_size buckets (bucket + fingerprint + token <= 64 bits)."""
    return min(32, 48 - log2_size)


def hash_step(h_N: np.ndarray, v_N: np.ndarray, mul: int) -> np.ndarray:
    """One chain step: g = (h ^ v) * mul mod 2**32, then g ^ (g >> 15); all uint32."""
    g_N = (h_N ^ v_N) * np.uint32(mul)
    return g_N ^ (g_N >> np.uint32(15))


def order_hashes(tokens_N: np.ndarray, max_order: int):
    """Yield (n, a_N, b_N) for n = 1..max_order; entries t < n-1 (context before the stream) are junk.

    The yielded arrays are updated in place by the next step: use them before advancing."""
    v_N = tokens_N.astype(np.uint32) + np.uint32(1)
    a_N = np.full(v_N.shape, SEED_A, dtype=np.uint32)
    b_N = np.full(v_N.shape, SEED_B, dtype=np.uint32)
    for n in range(1, max_order + 1):
        k = n - 1
        a_N[k:] = hash_step(a_N[k:], v_N[: v_N.size - k], MUL_A)
        b_N[k:] = hash_step(b_N[k:], v_N[: v_N.size - k], MUL_B)
        yield n, a_N, b_N


def bucket_and_fp(a_N: np.ndarray, b_N: np.ndarray, log2_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Bucket index (top L bits of a) and fingerprint (top F bits of b), both uint32."""
    f = fingerprint_bits(log2_size)
    return a_N >> np.uint32(32 - log2_size), b_N >> np.uint32(32 - f)


# ----------------------------------------------------------------------------- lookups


def lookup(rows_OK4: np.ndarray, min_order: int, tokens_N: np.ndarray):
    """For each position t of `tokens_N` (predicting t+1) and order: (hit, top, count, total), each [N, O].

    Contexts use only tokens_N[..t]; positions with fewer than n tokens of context miss at order n."""
    num_orders, K, _ = rows_OK4.shape
    L = K.bit_length() - 1
    N = tokens_N.size
    hit_NO = np.zeros((N, num_orders), dtype=bool)
    top_NO = np.zeros((N, num_orders), dtype=np.int32)
    cnt_NO = np.zeros((N, num_orders), dtype=np.int64)
    tot_NO = np.zeros((N, num_orders), dtype=np.int64)
    for n, a_N, b_N in order_hashes(np.asarray(tokens_N), min_order + num_orders - 1):
        if n < min_order:
            continue
        o = n - min_order
        bucket_N, fp_N = bucket_and_fp(a_N, b_N, L)
        res = rows_OK4[o][bucket_N.astype(np.int64)]
        h = (res[:, TOTAL] > 0) & (res[:, FP] == fp_N) & (np.arange(N) >= n - 1)
        hit_NO[:, o] = h
        top_NO[:, o] = np.where(h, res[:, TOP], 0)
        cnt_NO[:, o] = np.where(h, res[:, COUNT], 0)
        tot_NO[:, o] = np.where(h, res[:, TOTAL], 0)
    return hit_NO, top_NO, cnt_NO, tot_NO
