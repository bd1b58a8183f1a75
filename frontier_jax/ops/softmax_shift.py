"""The qk_attention forward kernel's softmax shift, chosen on the host (the program holds no control flow).

The fused attention forward's bounded softmax shift (docs/kernels/attention.md, "The bounded-shift forward") is valid
for sequences of at most SHIFT_MAX_T while every head's score bound B_h = sqrt(K) |g_h| (1 + 2^-5) is at
most SHIFT_LIMIT; otherwise the kernel's exact running-max forward must run instead. Which one a traced
step runs is a trace-time constant (`attention_forward`), chosen on the host from the gains the step
will use (`score_bound`, which every train step returns for its updated gains): no data-dependent
control flow in the program, which Neuron does not support for `jax.lax.cond` (aws-neuron-sdk
frameworks/jax/setup/jax-neuronx-known-issues.rst). `frontier_jax.ops` re-exports these names.
"""

from __future__ import annotations

import contextlib

import jax  # noqa: F401 (jax.Array annotations)
import jax.numpy as jnp

SHIFT_LIMIT = 39.0
SHIFT_MAX_T = 4096
SHIFT_MARGIN = 1.0 + 2.0 ** -5

_ATTENTION = {"exact_max": False}


@contextlib.contextmanager
def attention_forward(exact_max: bool):
    """Trace-time choice of the qk_attention forward kernel: the bounded-shift one (exact_max False, valid
    while `bounded_shift_valid`) or the exact running-max one. Enter it inside the traced function."""
    saved = _ATTENTION["exact_max"]
    _ATTENTION["exact_max"] = bool(exact_max)
    try:
        yield
    finally:
        _ATTENTION["exact_max"] = saved


def score_bound(gains, head_dim: int) -> jax.Array:
    """max over heads of sqrt(K) |g_h| (1 + 2^-5) for the query gains `gains` (arrays, traced or not)."""
    top = jnp.max(jnp.stack([jnp.max(jnp.abs(jnp.asarray(g, jnp.float32))) for g in gains]))
    return top * (head_dim ** 0.5) * SHIFT_MARGIN


def bounded_shift_valid(bound: float, seq_len: int) -> bool:
    """Whether the bounded-shift forward is exact for a score bound (host value) and sequence length."""
    return seq_len <= SHIFT_MAX_T and bound <= SHIFT_LIMIT


def attention_forward_kind(bound: float, seq_len: int) -> str:
    """Which qk_attention forward the kernel path runs for this score bound (the run log and summary)."""
    fast = bounded_shift_valid(bound, seq_len)
    return (f"{'bounded shift' if fast else 'exact max (slower)'}: score bound {bound:.1f} (limit {SHIFT_LIMIT:g}), "
            f"T {seq_len} (limit {SHIFT_MAX_T})")
