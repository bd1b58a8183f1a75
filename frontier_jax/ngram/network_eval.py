"""Per-token val losses of a trained run's network with its learned n-gram bias, with the bias zeroed,
and with one order's bias zeroed at a time (the same jitted forward for all: only bias_OC changes).

Used by `frontier_jax.ngram.analyze --run`. Windows are the evaluator's: non-overlapping seq_len
windows of the val split, so a context never reaches before its window (as in training's validation).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from frontier_jax.data.files import check_schema, read_json, within
from frontier_jax.ngram import snapshot as S


def restore_run(run_dir):
    """(cfg, graphdef, params, step) of a run's newest intact checkpoint, n-gram bias parameter included."""
    from frontier_jax.interop.state_dict import restore_params

    cfg, graphdef, params, step, _ = restore_params(run_dir)
    return cfg, graphdef, params, step


# runtime.json as its reader needs it (frontier_jax.ngram.runtime writes it): the final snapshot, if any
RECORD_SCHEMA = {"final?": (dict, type(None))}
FINAL_SCHEMA = {"snapshot?": (str, type(None))}


def run_snapshot(run_dir, process_index: int = 0) -> Path | None:
    """The snapshot the run's final evaluation used (runtime.json, checked against its schema; the path it
    names is relative to its directory and must lie inside the run: a copied run is scored with its own
    tables, never with those of the run it was copied from), else the newest published one."""
    from frontier_jax.ngram.runtime import RECORD_FILE, ngram_dir

    d = ngram_dir(run_dir, process_index)
    rec = d / RECORD_FILE
    if os.path.lexists(rec):
        final = read_json(rec, RECORD_SCHEMA, "n-gram runtime record").get("final") or {}
        name = check_schema(final, FINAL_SCHEMA, f"{rec}: final").get("snapshot")
        if name:
            path = within(run_dir, d / name, "a run's n-gram snapshot must lie inside the run")
            if path.is_dir():
                return path
    snaps = S.list_snapshots(d)
    return snaps[-1][1] if snaps else None


def make_loss_fn(graphdef):
    """jitted (params, x_BT, y_BT, tables | None, bias_OC | None) -> per-token nll [B, T] (nats)."""
    from frontier_jax.ngram.bias import ngram_sparse_bias

    @jax.jit
    def loss_fn(params, x_BT, y_BT, tables, bias_OC):
        model = nnx.merge(graphdef, params)
        if tables is None:
            return model(x_BT, y_BT)
        return model(x_BT, y_BT, *ngram_sparse_bias(x_BT, tables, bias_OC))

    return loss_fn


def val_windows(val_tokens: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(x_WT, y_WT) int32: the non-overlapping windows the evaluator scores."""
    n = (val_tokens.size - 1) // seq_len
    x = val_tokens[: n * seq_len].reshape(n, seq_len).astype(np.int32)
    y = val_tokens[1 : n * seq_len + 1].reshape(n, seq_len).astype(np.int32)
    return x, y


def per_token_nll(loss_fn, params, x_WT, y_WT, batch_seqs: int, tables=None, bias_OC=None) -> np.ndarray:
    """nll of every val target, flattened in window order [W * T] (float64); the last batch is padded."""
    out = []
    for a in range(0, x_WT.shape[0], batch_seqs):
        x, y = x_WT[a : a + batch_seqs], y_WT[a : a + batch_seqs]
        n = x.shape[0]
        if n < batch_seqs:
            pad = ((0, batch_seqs - n), (0, 0))
            x, y = np.pad(x, pad), np.pad(y, pad)
        out.append(np.asarray(loss_fn(params, x, y, tables, bias_OC), np.float64)[:n])
    return np.concatenate(out).reshape(-1)


def bias_ablation(run_dir, snapshot_path, x_WT, y_WT, batch_seqs: int | None = None, progress=None) -> dict:
    """nll arrays: 'with_bias', 'network' (bias zeroed), 'without_order' {order: nll}; plus the bias table.
    `progress(line)` hears each pass over the val windows before it starts."""
    from frontier_jax.ngram.bias import tables_to_device

    say = progress or (lambda line: None)
    cfg, graphdef, params, step = restore_run(run_dir)
    loss_fn = make_loss_fn(graphdef)
    batch_seqs = batch_seqs or cfg.train.val_batch_seqs
    out = {"cfg": cfg, "step": step}
    if not cfg.ngram.enabled:
        say(f"scoring the network on {x_WT.shape[0]:,} val windows")
        out["network"] = per_token_nll(loss_fn, params, x_WT, y_WT, batch_seqs)
        return out
    if snapshot_path is None:  # the builder published nothing: empty tables, as the run's final evaluation
        from frontier_jax.ngram.bias import empty_tables

        tables = jax.device_put(empty_tables(cfg.ngram))
    else:
        tables = tables_to_device(S.load_snapshot(snapshot_path), cfg.ngram.confidence_buckets)
    bias_OC = jnp.asarray(params["ngram_bias"][...], jnp.float32)
    out["bias_OC"] = np.asarray(bias_OC)
    passes = bias_OC.shape[0] + 2
    say(f"scoring {x_WT.shape[0]:,} val windows {passes} times: with the bias (1/{passes})")
    out["with_bias"] = per_token_nll(loss_fn, params, x_WT, y_WT, batch_seqs, tables, bias_OC)
    say(f"without the bias (2/{passes})")
    out["network"] = per_token_nll(loss_fn, params, x_WT, y_WT, batch_seqs, tables, jnp.zeros_like(bias_OC))
    out["without_order"] = {}
    for o in range(bias_OC.shape[0]):
        say(f"without order {cfg.ngram.min_order + o}'s bias ({o + 3}/{passes})")
        out["without_order"][cfg.ngram.min_order + o] = per_token_nll(
            loss_fn, params, x_WT, y_WT, batch_seqs, tables, bias_OC.at[o].set(0.0))
    return out
