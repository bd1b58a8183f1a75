"""Causal GQA attention (flash style) for trn1: the @nki.jit kernels of the qk_attention op (`qk_attention_fwd` /
`_bwd`: QK-norm, RoPE and the query gain fused in, optionally XSA; what the model runs) and of the experimental
causal_attention op (`attention_fwd` / `_bwd`: the same kernels without them).

Spec: frontier_jax.ops.reference.causal_attention and reference.qk_attention. Shapes: q [B, T, H, K], k / v
[B, T, G, K] (the model's layout), K <= 128, R = H / G query heads per kv head. The forwards:
kernels_nki/attention/forward.py; the backward: kernels_nki/attention/backward.py; the per-tile steps:
kernels_nki/attention/steps.py. Layouts, the score bound, engine and port choices: docs/kernels/attention.md.
"""

import nki

from kernels_nki.attention.backward import bwd
from kernels_nki.attention.forward import BOUND_MARGIN, SHIFT_OFFSET, forward_bounded, forward_exact
from kernels_nki.attention.state import Rope, Saved

__all__ = ["BOUND_MARGIN", "SHIFT_OFFSET", "attention_bwd", "attention_fwd", "qk_attention_bwd", "qk_attention_fwd"]


@nki.jit
def attention_fwd(q_BTHK, k_BTGK, v_BTGK):
    """Causal GQA attention.

    Returns:
        (o_BTHK in q's dtype, lse_BHT1 fp32: each row's log-sum-exp, the backward's residual).
    """
    return forward_exact(q_BTHK, k_BTGK, v_BTGK, ())


@nki.jit
def qk_attention_fwd(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, exact_max=False, xsa_on=False):
    """Attention over rope(qk_norm(q)) * gain and rope(qk_norm(k)).

    Args:
        q_BTHK, k_BTGK, v_BTGK: raw q / k (the projection's output) and v.
        cos_TK2, sin_TK2: [T, K / 2] fp32 (values rounded to q's dtype by the caller, as the reference casts them).
        g_PH: the query gain broadcast over 128 rows, fp32.
        exact_max: compile-time; the running-row-max softmax (`forward_exact`) instead of the bounded shift
            (`forward_bounded`, valid while every head's bound B_h <= frontier_jax.ops.SHIFT_LIMIT: ops chooses).
        xsa_on: compile-time; o is XSA's output (reference.xsa), applied to each query tile's o as it leaves PSUM.

    Returns:
        (o_BTHK, lse_BHT1, qg_BTHK, qinv_BTH1, kr_BTGK, kinv_BTG1, qgT_BHKT, krT_BGKT[, xc_BHT1]): the normed,
        rotated q / k, their rows' inverse RMS and transposes, and with XSA each row's o . u before it: the
        backward's residuals.
    """
    if exact_max:
        return forward_exact(q_BTHK, k_BTGK, v_BTGK, Rope(cos=cos_TK2, sin=sin_TK2, gain=g_PH), xsa_on)
    return forward_bounded(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, xsa_on)


@nki.jit
def attention_bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK):
    """The gradients of `attention_fwd`.

    Returns:
        (dq_BTHK, dk_BTGK, dv_BTGK) in the inputs' dtype; dk / dv summed over the R query heads of each kv head.
    """
    return bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK, ())


@nki.jit
def qk_attention_bwd(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, o_BTHK, lse_BHT1, qg_BTHK, qinv_BTH1,
                     kr_BTGK, kinv_BTG1, qgT_BHKT, krT_BGKT, xc_BHT1, do_BTHK, xsa_on=False):
    """The gradients of `qk_attention_fwd`.

    Args:
        the forward's inputs, its residuals (xc_BHT1 None without XSA) and do_BTHK, the cotangent of o.
        xsa_on: compile-time; o is XSA's output and do its cotangent.

    Returns:
        (dq, dk, dv, dg_BH1): w.r.t. the raw q and k, v, and the query gain per (batch, head), fp32 (the caller
        sums over the batch).
    """
    saved = Saved(qg=qg_BTHK, qinv=qinv_BTH1, kr=kr_BTGK, kinv=kinv_BTG1, qgT=qgT_BHKT, krT=krT_BGKT)
    return bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK,
               Rope(cos=cos_TK2, sin=sin_TK2, gain=g_PH, saved=saved), xc_BHT1 if xsa_on else None)
