"""The standalone ops whose work the model runs inside a fused op (`frontier_jax.ops`), declared as the
production ops are (`dispatch.declare` with a `Vjp`): rope and rope_gain (inside qk_attention; kernels
kernels_nki/experimental/rope.py), causal_attention (qk_attention without the QK-norm, RoPE and gain;
kernels_nki/attention.py `attention_fwd` / `_bwd`) and norm_projection (mix_norm_projection without
the residual mix; kernels_nki/projection/kernels.py `norm_projection_fwd` / `_bwd`). The kernel table lists
them "unused" (`kernels_nki.registry`); tests route them through the emulator with `ops.emulated`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from frontier_jax.ops import reference as ref
from frontier_jax.ops.dispatch import declare, public
from frontier_jax.ops import gain_PH, gain_rows, qkv_reference
from frontier_jax.ops.vjp import Vjp

__all__ = ["rope", "rope_gain", "causal_attention", "norm_qkv_projection", "OPS"]

def _rope_fwd(x_BTHK, cos_TK2, sin_TK2):
    return (ref.rope(x_BTHK, cos_TK2, sin_TK2),)


def _rope_gain_fwd(x_BTHK, cos_TK2, sin_TK2, g_PH):
    """g_PH: the gain broadcast over 128 rows, fp32 (every row the same; row 0 is used)."""
    return (ref.rope_gain(x_BTHK, cos_TK2, sin_TK2, g_PH[0]),)


# the backward rotates dy back (the kernel needs cos and sin only); cos, sin: zero cotangents
ROPE = declare("rope", _rope_fwd, ref.rope_bwd, vjp=Vjp("x, cos, sin -> y", "dy, cos, sin -> dx"))
# dg: fp32 partials per (t, h), summed over the rows (`ops.gain_rows`)
ROPE_GAIN = declare("rope_gain", _rope_gain_fwd, ref.rope_gain_bwd,
                    vjp=Vjp("x, cos, sin, g -> y", "x, cos, sin, g, dy -> dx, dg",
                            grads=lambda d: {"g": gain_rows(d["dg"], d["g"])}))
# the forward saves o and the per-row log-sum-exp [B, H, T, 1]; the kernel's backward recomputes the
# probabilities from them
ATTENTION = declare("causal_attention", ref.attention_fwd, ref.attention_bwd,
                    vjp=Vjp("q, k, v -> o, lse", "q, k, v, o, lse, do -> dq, dk, dv"))
NORM_PROJECTION = declare("norm_projection", ref.norm_projection_fwd, ref.norm_projection_bwd,
                          vjp=Vjp("x, w -> y, inv", "x, w, inv, dy -> dx, dw"))  # dw: fp32 token sums

OPS = tuple(s.name for s in (ROPE, ROPE_GAIN, ATTENTION, NORM_PROJECTION))


def _rope_reference(x_BTHK, cos_TK2, sin_TK2):
    return ref.rope(x_BTHK, jnp.asarray(cos_TK2), jnp.asarray(sin_TK2))


@public(ROPE, _rope_reference)
def rope(x_BTHK: jax.Array, cos_TK2, sin_TK2) -> jax.Array:
    """Half-split RoPE (reference.rope); cos/sin [T, K/2] host constants, cast to x's dtype as the reference."""
    dt = x_BTHK.dtype
    return ROPE.apply(x_BTHK, jnp.asarray(cos_TK2).astype(dt), jnp.asarray(sin_TK2).astype(dt))


def _rope_gain_reference(x_BTHK, cos_TK2, sin_TK2, gain_H):
    return ref.rope_gain(x_BTHK, jnp.asarray(cos_TK2), jnp.asarray(sin_TK2), gain_H)


@public(ROPE_GAIN, _rope_gain_reference)
def rope_gain(x_BTHK: jax.Array, cos_TK2, sin_TK2, gain_H: jax.Array) -> jax.Array:
    """rope(x) * gain per head (reference.rope_gain), the query side of attention as one op: the kernel
    applies the gain on chip, no extra HBM pass (kernels_nki/experimental/rope.py)."""
    dt = x_BTHK.dtype
    return ROPE_GAIN.apply(x_BTHK, jnp.asarray(cos_TK2).astype(dt), jnp.asarray(sin_TK2).astype(dt),
                           gain_PH(gain_H, dt))


@public(ATTENTION, ref.causal_attention)
def causal_attention(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array) -> jax.Array:
    """Causal GQA attention (reference.causal_attention); k and v cast to q's dtype on the kernel path."""
    dt = q_BTHK.dtype
    return ATTENTION.apply(q_BTHK, k_BTGK.astype(dt), v_BTGK.astype(dt))


def split_qkv(y, w_q, w_k, w_v):
    """y [..., O_q + O_k + O_v] of the fused [I, O_q + O_k + O_v] weight -> (q, k, v)."""
    oq, ok = w_q.shape[1], w_k.shape[1]
    return y[..., :oq], y[..., oq:oq + ok], y[..., oq + ok:]


@public(NORM_PROJECTION, qkv_reference)
def norm_qkv_projection(x, w_q, w_k, w_v):
    """(xn w_q, xn w_k, xn w_v) with xn = rms_norm(x): the pre-attention RMSNorm fused into the q/k/v
    projection, the weights cast to x's dtype at use. On a kernel the three run as one
    [I, O_q + O_k + O_v] `norm_projection` (kernels_nki/projection/); the weights stay separate
    parameters (Muon updates each matrix on its own) and each gets its slice of the fp32 dw."""
    dt, I = x.dtype, x.shape[-1]
    w = jnp.concatenate([w_q.astype(dt), w_k.astype(dt), w_v.astype(dt)], axis=1)
    y = NORM_PROJECTION.apply(x.reshape(-1, I), w)
    return split_qkv(y.reshape(x.shape[:-1] + (w.shape[1],)), w_q, w_k, w_v)
