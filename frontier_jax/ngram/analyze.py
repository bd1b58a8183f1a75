"""Judge n-gram tables on the val split, alone or next to a network.

    python -m frontier_jax.ngram.analyze --tables SNAPSHOT_DIR --data DATA_DIR [--tokenizer SPEC]

Val tokens are scored in non-overlapping windows of --seq-len inputs as the evaluator does, so a
context never reaches before its window. The n-gram-only model backs off to the highest order whose
context is in the table: p(y) = lam [y == top] + (1 - lam) u(y), lam = count / (total + 1) (the same
add-one shrink as the confidence buckets), u the add-one-smoothed unigram of the training tokens
the tables saw; with no hit at any order p = u. That is a normalised distribution over the whole
vocabulary. Exact bytes (bpb) come from `frontier_jax.data.tokenizer` when --tokenizer is given;
without it only bits per token are reported.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from frontier_jax.ngram import tables as T


def window_predictions(rows_OK4: np.ndarray, min_order: int, x_N: np.ndarray, seq_len: int) -> dict:
    """Per input position of x_N (windows of seq_len): hit/top/count/total [N, O], contexts inside the window."""
    hit, top, cnt, tot = T.lookup(rows_OK4, min_order, x_N)
    t_in_window = np.arange(x_N.size) % seq_len
    orders = np.arange(min_order, min_order + rows_OK4.shape[0])
    hit &= t_in_window[:, None] >= (orders[None, :] - 1)
    return {"hit": hit, "top": np.where(hit, top, 0), "count": np.where(hit, cnt, 0), "total": np.where(hit, tot, 0)}


def backoff_nll(pred: dict, y_N: np.ndarray, unigram_V: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(nll_N in nats of the backoff model above, order index used or -1)."""
    uni = np.asarray(unigram_V[:vocab], dtype=np.float64) + 1.0
    u_N = uni[y_N] / uni.sum()
    hit = pred["hit"]
    O = hit.shape[1]
    any_hit = hit.any(axis=1)
    best = np.where(any_hit, O - 1 - np.argmax(hit[:, ::-1], axis=1), -1)
    rows = np.arange(y_N.size)
    b = np.maximum(best, 0)
    lam = np.where(any_hit, pred["count"][rows, b] / (pred["total"][rows, b] + 1.0), 0.0)
    p = lam * (pred["top"][rows, b] == y_N) + (1.0 - lam) * u_N
    return -np.log(p), best


def order_stats(pred: dict, y_N: np.ndarray, min_order: int, best_N: np.ndarray) -> list[dict]:
    """Per order: coverage (fraction of positions with a hit), top-1 accuracy on hits, share chosen by backoff."""
    out = []
    for o in range(pred["hit"].shape[1]):
        h = pred["hit"][:, o]
        acc = float((pred["top"][h, o] == y_N[h]).mean()) if h.any() else float("nan")
        out.append({"order": min_order + o, "coverage": float(h.mean()), "top1_acc": acc, "backoff_share": float((best_N == o).mean())})
    return out


def doc_ids(x_N: np.ndarray, bos_id: int) -> np.ndarray:
    """Document index of every position (a new document starts at each BOS)."""
    return np.cumsum(np.asarray(x_N) == bos_id)


def repetition_split(nll_net_N, nll_bias_N, hit_NO, doc_N, bytes_N, top_fraction: float = 0.25) -> dict:
    """Gain (network alone minus with bias, in bits per byte) on the documents with the most repeated
    context (highest share of positions hit at the highest order, top `top_fraction` of documents) vs the rest."""
    docs, inv = np.unique(doc_N, return_inverse=True)
    share = np.bincount(inv, weights=hit_NO[:, -1]) / np.bincount(inv)
    cut = np.quantile(share, 1.0 - top_fraction)
    repeated = share[inv] >= cut if share.max() > share.min() else np.zeros(inv.size, bool)
    out = {}
    for name, m in (("repeated", repeated), ("rest", ~repeated)):
        nb = float(bytes_N[m].sum())
        if nb == 0:
            out[name] = {"docs": 0, "bytes": 0}
            continue
        bpb_net = float(nll_net_N[m].sum() / math.log(2) / nb)
        bpb_bias = float(nll_bias_N[m].sum() / math.log(2) / nb)
        out[name] = {"docs": int(np.unique(inv[m]).size), "bytes": nb, "bpb_net": bpb_net, "bpb_bias": bpb_bias, "gain": bpb_net - bpb_bias}
    return out


def order_contributions(nll_full_N, nll_without_by_order: dict, bytes_N) -> dict:
    """Per order: bpb lost when that order's bias is removed (nll arrays from the lead's ablation runs)."""
    nb = float(np.sum(bytes_N)) * math.log(2)
    base = float(np.sum(nll_full_N)) / nb
    return {int(o): float(np.sum(nll)) / nb - base for o, nll in nll_without_by_order.items()}


def _val_tokens(data_dir, pattern: str, max_tokens: int) -> np.ndarray:
    from frontier_jax.data.shards import list_shards, read_shard

    parts = [np.asarray(read_shard(f)) for f in list_shards(data_dir, pattern)]
    x = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
    return x[: max_tokens + 1] if max_tokens else x


def analyze_tables(snapshot_path, data_dir, tokenizer: str = "", seq_len: int = 1024, val_pattern: str = "*_val_*.bin", max_tokens: int = 0) -> dict:
    """The n-gram-only report on the val split (see the module docstring)."""
    snap = T.load_snapshot(snapshot_path)
    stream = _val_tokens(data_dir, val_pattern, max_tokens)
    n_win = (stream.size - 1) // seq_len
    if n_win == 0:
        raise ValueError(f"{data_dir}: fewer than seq_len + 1 = {seq_len + 1} val tokens")
    x_N = stream[: n_win * seq_len].astype(np.int64)
    y_N = stream[1 : n_win * seq_len + 1].astype(np.int64)
    vocab = int(max(stream.max(), np.flatnonzero(snap.unigram_V).max(initial=0))) + 1
    bytes_N = None
    if tokenizer:
        from frontier_jax.data.tokenizer import count_bytes, load_tokenizer

        tok = load_tokenizer(tokenizer)
        vocab = max(vocab, int(tok.vocab_size))
        bytes_N = count_bytes(tok.byte_tables(), x_N, y_N)
    pred = window_predictions(np.asarray(snap.rows_OK4), snap.min_order, x_N, seq_len)
    nll_N, best_N = backoff_nll(pred, y_N, snap.unigram_V, vocab)
    report = {
        "snapshot": str(snapshot_path),
        "snapshot_version": snap.version,
        "tables_tokens": snap.header["tokens_consumed"],
        "val_tokens": int(y_N.size),
        "seq_len": seq_len,
        "vocab": vocab,
        "ngram_bits_per_token": float(nll_N.mean() / math.log(2)),
        "coverage_any_order": float((best_N >= 0).mean()),
        "orders": order_stats(pred, y_N, snap.min_order, best_N),
    }
    if bytes_N is not None:
        report["ngram_bpb"] = float(nll_N.sum() / math.log(2) / bytes_N.sum())
    else:
        report["ngram_bpb"] = None
        report["note"] = "no --tokenizer: bits per token only (bpb needs the tokenizer's byte tables)"
    return report


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m frontier_jax.ngram.analyze", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", required=True, help="a published snapshot directory (snap_NNNNNN)")
    ap.add_argument("--data", required=True, help="directory holding the val shards")
    ap.add_argument("--tokenizer", default="", help="SentencePiece .model path or 'bytes' (for exact bpb)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--val-pattern", default="*_val_*.bin")
    ap.add_argument("--max-tokens", type=int, default=0, help="score at most this many val tokens (0: all)")
    args = ap.parse_args(argv)
    report = analyze_tables(args.tables, args.data, args.tokenizer, args.seq_len, args.val_pattern, args.max_tokens)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
