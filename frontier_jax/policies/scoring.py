"""The validation score both trainers and `frontier_jax.evaluate` report: exact bits per byte from the
evaluation sums (nats, tokens, bytes; evaluation returns sums, never means), the val result with its mean
loss, and the val window a capped validation scores (whole windows of the sequence length). No JAX."""

from __future__ import annotations

import numpy as np

from frontier_jax.errors import BadInput


def bpb(nll_nats: float, n_bytes: int) -> float:
    """Bits per byte of `nll_nats` over `n_bytes` scored bytes; BadInput when there are none (a split whose
    targets carry no bytes has no bpb: the start-up check, frontier_jax.data.dataset.check_scored_bytes,
    refuses such a split before anything trains)."""
    if n_bytes <= 0:
        raise BadInput(f"bits per byte of {n_bytes} scored bytes: the scored targets carry no bytes (BOS, <unk> "
                       "or control ids only), so there is no score")
    return float(nll_nats / np.log(2.0) / n_bytes)


def val_result(sums: dict) -> dict:
    """Evaluation sums (nll_sum_nats, tokens, bytes) plus the mean loss per token and bits per byte."""
    return {**sums, "loss": sums["nll_sum_nats"] / max(sums["tokens"], 1), "bpb": bpb(sums["nll_sum_nats"], sums["bytes"])}


def val_window_tokens(tokens: np.ndarray, max_tokens: int, seq_len: int) -> np.ndarray:
    """The val tokens a validation of at most `max_tokens` targets scores (0: all), cut to whole windows."""
    toks = tokens if not max_tokens else tokens[: min(tokens.size, max_tokens + 1)]
    return toks[: ((toks.size - 1) // seq_len) * seq_len + 1]
