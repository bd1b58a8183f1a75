"""Judge n-gram tables on the val split, alone or next to a trained network.

    python -m frontier_jax.ngram.analyze --run RUN_DIR [--data DIR] [--tokenizer SPEC] [--tables SNAPSHOT]
    python -m frontier_jax.ngram.analyze --tables SNAPSHOT_DIR --data DIR [--tokenizer SPEC]

--run: the run's config and latest checkpoint, and the snapshot its final evaluation used
(<run>/ngram-p0/runtime.json, else the newest in <run>/ngram-p0/). Val bpb of the network with its
learned bias and with the bias zeroed (the same forward), per order: coverage, top-1 accuracy, and
contribution (bpb lost when only that order's bias is zeroed); the gain on the quarter of the
documents with the most repeated context (mean longest matching order over its positions) vs the rest.
For a run trained without the bias, the network's bpb and (with --tables) the tables' own report.

--tables alone: the n-gram-only model on the val split, backing off to the highest order whose
context is in the table: p(y) = lam [y == top] + (1 - lam) u(y), lam = count / (total + 1) (the same
add-one shrink as the confidence buckets), u the add-one-smoothed unigram of the training tokens
the tables saw; with no hit at any order p = u. That is a normalised distribution over the whole
vocabulary. Val tokens are scored in non-overlapping windows of --seq-len inputs as the evaluator
does, so a context never reaches before its window. Exact bytes (bpb) come from
`frontier_jax.data.tokenizer` when a tokenizer is known; otherwise only bits per token are reported.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from frontier_jax.data.shards import DataError
from frontier_jax.errors import ArgumentParser, exit_on_error, int_in
from frontier_jax.run.rundir import read_json_object
from frontier_jax.ngram import snapshot as S
from frontier_jax.ngram import tables as T

LN2 = math.log(2)


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
        acc = float((pred["top"][h, o] == y_N[h]).mean()) if h.any() else None  # no hit: no accuracy (not NaN)
        out.append({"order": min_order + o, "coverage": float(h.mean()), "top1_acc": acc, "backoff_share": float((best_N == o).mean())})
    return out


def doc_ids(x_N: np.ndarray, bos_id: int) -> np.ndarray:
    """Document index of every position (a new document starts at each BOS)."""
    return np.cumsum(np.asarray(x_N) == bos_id)


def repetition_split(nll_net_N, nll_bias_N, hit_NO, doc_N, bytes_N, top_fraction: float = 0.25) -> dict:
    """Gain (network alone minus with bias, in bits per byte) on the documents with the most repeated
    context vs the rest: documents ranked by the mean over their positions of the longest order hit
    (0 for no hit), the top `top_fraction` of documents (all tied at the cut included) vs the others."""
    docs, inv = np.unique(doc_N, return_inverse=True)
    O = hit_NO.shape[1]
    longest_N = np.where(hit_NO.any(axis=1), O - np.argmax(hit_NO[:, ::-1], axis=1), 0)
    share = np.bincount(inv, weights=longest_N) / np.bincount(inv)
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
    snap = S.load_snapshot(snapshot_path)
    stream = _val_tokens(data_dir, val_pattern, max_tokens)
    n_win = (stream.size - 1) // seq_len
    if n_win == 0:
        raise DataError(f"{data_dir}: fewer than seq_len + 1 = {seq_len + 1} val tokens")
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


def _bpb(nll_N, bytes_N) -> float:
    return float(np.sum(nll_N) / LN2 / np.sum(bytes_N))


def analyze_run(run_dir, data_dir=None, tokenizer=None, snapshot_path=None, max_tokens: int = 0,
                progress=None) -> dict:
    """The network report of a trained run (see the module docstring); `progress(line)` hears each pass over the
    val split before it starts (the command line prints them on stderr)."""
    from frontier_jax.data.tokenizer import count_bytes, load_tokenizer
    from frontier_jax.interop.state_dict import read_run_config
    from frontier_jax.ngram import network_eval as NE

    run_dir = Path(run_dir)
    cfg, _ = read_run_config(run_dir)
    data_dir = data_dir or cfg.data.data_dir
    tok = load_tokenizer(tokenizer or cfg.data.tokenizer)
    seq_len = cfg.train.seq_len
    stream = _val_tokens(data_dir, cfg.data.val_pattern, max_tokens)
    x_WT, y_WT = NE.val_windows(stream, seq_len)
    if x_WT.shape[0] == 0:
        raise DataError(f"{data_dir}: fewer than seq_len + 1 = {seq_len + 1} val tokens")
    x_N, y_N = x_WT.reshape(-1), y_WT.reshape(-1)
    bytes_N = count_bytes(tok.byte_tables(cfg.model.vocab_size), x_N, y_N)
    snapshot_path = snapshot_path or (NE.run_snapshot(run_dir) if cfg.ngram.enabled else None)
    abl = NE.bias_ablation(run_dir, snapshot_path, x_WT, y_WT,  # no snapshot: empty tables (the bias never acted)
                           progress=progress)
    summary_path = run_dir / "summary.json"
    summary = read_json_object(summary_path, "run summary") if summary_path.is_file() else {}
    report = {"run": str(run_dir), "checkpoint_step": abl["step"], "ngram_enabled": cfg.ngram.enabled,
              "val_tokens": int(y_N.size), "val_bytes": int(bytes_N.sum()), "seq_len": seq_len,
              "summary_val_bpb": summary.get("val_bpb"), "bpb_network": _bpb(abl["network"], bytes_N)}
    if snapshot_path is not None:
        if progress is not None:
            progress(f"the tables of {snapshot_path} alone on the val split")
        tables_report = analyze_tables(snapshot_path, data_dir, tokenizer or cfg.data.tokenizer, seq_len,
                                       cfg.data.val_pattern, max_tokens)
        report["tables"] = {k: tables_report[k] for k in ("snapshot", "snapshot_version", "tables_tokens", "ngram_bpb",
                                                          "ngram_bits_per_token", "coverage_any_order")}
    if not cfg.ngram.enabled:
        if snapshot_path is not None:
            report["orders"] = tables_report["orders"]
        return report
    if snapshot_path is None:
        report.update(bpb_with_bias=_bpb(abl["with_bias"], bytes_N), orders=[],
                      note="no n-gram snapshot was published: scored with empty tables (the bias never acted)")
        report["gain_bpb"] = report["bpb_network"] - report["bpb_with_bias"]
        return report
    snap = S.load_snapshot(snapshot_path)
    pred = window_predictions(np.asarray(snap.rows_OK4), snap.min_order, x_N.astype(np.int64), seq_len)
    nll_bias, nll_net = abl["with_bias"], abl["network"]
    report["bpb_with_bias"] = _bpb(nll_bias, bytes_N)
    report["gain_bpb"] = report["bpb_network"] - report["bpb_with_bias"]
    contrib = order_contributions(nll_bias, abl["without_order"], bytes_N)
    rows = []
    for o, order in enumerate(range(snap.min_order, snap.min_order + pred["hit"].shape[1])):
        h = pred["hit"][:, o]
        acc = float((pred["top"][h, o] == y_N[h]).mean()) if h.any() else None
        rows.append({"order": order, "coverage": float(h.mean()), "top1_acc": acc, "contribution_bpb": contrib[order],
                     "bias": [round(float(v), 4) for v in abl["bias_OC"][o]]})
    report["orders"] = rows
    report["by_repetition"] = repetition_split(nll_net, nll_bias, pred["hit"], doc_ids(x_N, tok.bos_id), bytes_N)
    return report


def _num(v, fmt: str = ".5f") -> str:
    """One number format for every bpb in the tables (5 decimals), "-" for a missing value."""
    return "-" if v is None else format(v, fmt)


def _order_lines(orders: list[dict], header: str, cells) -> list[str]:
    """One row per order with a hit; the orders without any hit in one line instead of rows of blanks."""
    lines = [header]
    empty = [o["order"] for o in orders if not o["coverage"]]
    for o in orders:
        if o["coverage"]:
            lines.append(cells(o))
    if empty:
        lines.append(f"  orders {empty[0]}-{empty[-1]}: no hit on the val split" if len(empty) > 1
                     else f"  order {empty[0]}: no hit on the val split")
    return lines


def format_report(r: dict) -> str:
    """A short human-readable table of `analyze_run`'s report (every bpb to 5 decimals)."""
    lines = [f"{r['run']} step {r['checkpoint_step']}: {r['val_tokens']:,} val tokens, {r['val_bytes']:,} bytes",
             f"  network alone    {_num(r['bpb_network'])} bpb"]
    if "bpb_with_bias" in r:
        lines.append(f"  with n-gram bias {_num(r['bpb_with_bias'])} bpb  (gain {_num(r['gain_bpb'], '+.5f')}; "
                     f"run summary {_num(r['summary_val_bpb'])})")
    if "tables" in r:
        t = r["tables"]
        lines.append(f"  tables v{t['snapshot_version']} ({t['tables_tokens']:,} tokens): n-gram alone "
                     f"{_num(t['ngram_bpb'])} bpb, coverage {t['coverage_any_order']:.3f}")
    if r.get("orders") and "contribution_bpb" in r["orders"][0]:
        lines += _order_lines(r["orders"], "  order coverage top1  contribution_bpb  bias[conf buckets]", lambda o: (
            f"  {o['order']:5d} {o['coverage']:8.3f} {_num(o['top1_acc'], '5.3f')} {o['contribution_bpb']:+17.5f}  "
            f"{' '.join(f'{v:+.2f}' for v in o['bias'])}"))
    for name, g in (r.get("by_repetition") or {}).items():
        if g.get("docs"):
            lines.append(f"  {name:9s} {g['docs']:4d} docs {int(g['bytes']):8,d} bytes: network {g['bpb_net']:.5f} "
                         f"with bias {g['bpb_bias']:.5f} gain {g['gain']:+.5f}")
    return "\n".join(lines)


def format_tables_report(r: dict) -> str:
    """`analyze_tables`'s report as a table (every bpb to 5 decimals)."""
    bits = f"{r['ngram_bits_per_token']:.5f} bits/token"
    lines = [f"{r['snapshot']} (v{r['snapshot_version']}, {r['tables_tokens']:,} tokens): {r['val_tokens']:,} val "
             f"tokens, n-gram alone {_num(r['ngram_bpb'])} bpb ({bits}), coverage {r['coverage_any_order']:.3f}"]
    if r.get("note"):
        lines.append(f"  {r['note']}")
    lines += _order_lines(r["orders"], "  order coverage top1  backoff_share", lambda o: (
        f"  {o['order']:5d} {o['coverage']:8.3f} {_num(o['top1_acc'], '5.3f')} {o['backoff_share']:13.3f}"))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m frontier_jax.ngram.analyze", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="a run directory (config.json, checkpoints/, ngram-p0/)")
    ap.add_argument("--tables", help="a published snapshot directory (snap_NNNNNN); with --run it replaces the run's")
    ap.add_argument("--data", help="directory holding the val shards (default: the run's data.data_dir)")
    ap.add_argument("--tokenizer", help="SentencePiece .model path or 'bytes' (default: the run's)")
    ap.add_argument("--seq-len", type=int_in(1), default=1024, help="window length for --tables alone")
    ap.add_argument("--val-pattern", default="*_val_*.bin",
                    help="glob of the val shards in --data (default *_val_*.bin, data.val_pattern's default)")
    ap.add_argument("--max-tokens", type=int_in(0), default=0, help="score at most this many val tokens (0: all)")
    ap.add_argument("--json", action="store_true", help="print JSON only")
    args = ap.parse_args(argv)
    if not (args.run or (args.tables and args.data)):
        ap.error("give --run RUN_DIR, or --tables SNAPSHOT --data DIR")
    with exit_on_error():
        if args.run:
            say = lambda line: print(f"ngram.analyze: {line}", file=sys.stderr, flush=True)  # a minute otherwise silent
            report = analyze_run(args.run, args.data, args.tokenizer, args.tables, args.max_tokens, progress=say)
            print(json.dumps(report, indent=1) if args.json else format_report(report))
        else:
            report = analyze_tables(args.tables, args.data, args.tokenizer or "", args.seq_len, args.val_pattern,
                                    args.max_tokens)
            print(json.dumps(report, indent=1) if args.json else format_tables_report(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
