"""Pure-JAX reference of every hot-path op: what runs on CPU/GPU, and the spec the NKI kernels must meet.

Each kernel-backed op has a forward reference `<op>_fwd(*arrays, **static) -> tuple` (outputs, then the
residuals its backward kernel takes) and, when differentiable, `<op>_bwd(inputs..., residuals...,
cotangents...) -> tuple` (the input cotangents), with the kernels' calling convention;
`frontier_jax.ops` declares them with `frontier_jax.ops.dispatch`. The plain functions (`rms_norm`, `mlp`,
...) are what the model runs directly when no kernel is chosen.

Axis letters: B batch, T sequence, D model width, H query heads, G kv heads, K head dim, F MLP hidden,
V vocabulary, N flattened tokens (B*T), S sparse-bias sources, I/O a matrix's in/out sizes stored [in, out];
in attention blocks: C query positions of a block, J key positions, R query heads per kv head (H / G).
Nothing here reads the platform; `frontier_jax.ops.dispatch` decides whether these or a kernel run.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from frontier_jax.config import BIGRAM_HASH

# PyTorch's F.rms_norm without eps uses the epsilon of the op-math type (float32 for bf16/fp32 inputs).
RMS_EPS = float(np.finfo(np.float32).eps)
XSA_EPS = 1e-12  # F.normalize's default eps: v / max(||v||, eps)


def rms_norm_fwd(x_ND: jax.Array):
    """(y in x's dtype, inv_N1 = 1 / rms float32): weightless RMSNorm over the last axis in fp32."""
    x32 = x_ND.astype(jnp.float32)
    inv_N1 = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + RMS_EPS)
    return (x32 * inv_N1).astype(x_ND.dtype), inv_N1


def rms_norm_bwd(x_ND, inv_N1, dy_ND):
    x32, dy32 = x_ND.astype(jnp.float32), dy_ND.astype(jnp.float32)
    c_N1 = -jnp.mean(dy32 * x32, axis=-1, keepdims=True) * inv_N1 * inv_N1
    return ((dy32 + x32 * c_N1) * inv_N1).astype(x_ND.dtype),


def rms_norm(x_ND: jax.Array) -> jax.Array:
    """Weightless RMSNorm over the last axis, computed in fp32, returned in the input dtype."""
    return rms_norm_fwd(x_ND)[0]


def rope_tables(seq_len: int, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [T, R/2] in float32 for R = head_dim rotated dims (the whole head, or a partial RoPE's first R),
    computed once per sequence length on the host (constants under jit)."""
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    t = np.arange(seq_len, dtype=np.float32)
    freqs_TK2 = np.outer(t, inv_freq).astype(np.float32)
    return np.cos(freqs_TK2), np.sin(freqs_TK2)


def rope_base(seq_len: int, rotary_dims: int, base: float, rescale_from: int) -> float:
    """The RoPE base of a length-T forward: base * (T / rescale_from)^(R / (R - 2)) when rescale_from > 0 and
    T > rescale_from (the record's NTK-style rescaling, in double precision as Python computes it), else base."""
    if rescale_from and seq_len > rescale_from:
        return base * (seq_len / rescale_from) ** (rotary_dims / (rotary_dims - 2))
    return base


def rope(x_BTHK: jax.Array, cos_TR2: jax.Array, sin_TR2: jax.Array) -> jax.Array:
    """Half-split rotary embedding as the baseline, (x1 cos + x2 sin, -x1 sin + x2 cos), on the first
    R = 2 * cos.shape[-1] dims of each head (dim j paired with j + R/2); dims >= R pass through untouched
    (partial RoPE; R = K: the whole head)."""
    K, R = x_BTHK.shape[-1], 2 * cos_TR2.shape[-1]
    if R < K:
        return jnp.concatenate([rope(x_BTHK[..., :R], cos_TR2, sin_TR2), x_BTHK[..., R:]], axis=-1)
    half = K // 2
    cos = cos_TR2.astype(x_BTHK.dtype)[None, :, None, :]
    sin = sin_TR2.astype(x_BTHK.dtype)[None, :, None, :]
    x1, x2 = x_BTHK[..., :half], x_BTHK[..., half:]
    return jnp.concatenate([x1 * cos + x2 * sin, x2 * cos - x1 * sin], axis=-1)


def rope_bwd(dy_BTHK, cos_TK2, sin_TK2):
    """dx: the rotation by -angle (sin negated); cos/sin are constants (no cotangent)."""
    return (rope(dy_BTHK, cos_TK2, -sin_TK2),)


def rope_gain(x_BTHK: jax.Array, cos_TK2: jax.Array, sin_TK2: jax.Array, gain_H: jax.Array) -> jax.Array:
    """The query side of the baseline: rope(x) * q_gain per head, the gain cast to x's dtype."""
    return rope(x_BTHK, cos_TK2, sin_TK2) * gain_H.astype(x_BTHK.dtype)[None, None, :, None]


def rope_gain_bwd(x_BTHK, cos_TK2, sin_TK2, g_PH, dy_BTHK):
    """(dx, dg_TH): dx = g rope^-1(dy); the gain's gradient as fp32 partials per (t, h), summed over b, k
    of dy . rope(x) (the caller sums over T)."""
    g_H = g_PH[0].astype(x_BTHK.dtype)
    dx = rope(dy_BTHK * g_H[None, None, :, None], cos_TK2, -sin_TK2)
    y = rope(x_BTHK, cos_TK2, sin_TK2).astype(jnp.float32)
    return dx, jnp.sum(dy_BTHK.astype(jnp.float32) * y, axis=(0, 3))


def projection_fwd(x_NI, w_IO):
    """y = x w in x's dtype (w already in it), fp32 accumulation."""
    return (jnp.dot(x_NI, w_IO, preferred_element_type=jnp.float32).astype(x_NI.dtype),)


def projection_bwd(x_NI, w_IO, dy_NO):
    """(dx = dy w^T in x's dtype, dw = x^T dy in fp32, summed over the tokens)."""
    dx = jnp.dot(dy_NO, w_IO.T, preferred_element_type=jnp.float32).astype(x_NI.dtype)
    return dx, jnp.dot(x_NI.T, dy_NO, preferred_element_type=jnp.float32)


def resid_projection_fwd(x_NI, w_IO, r_NO):
    """(y = r + x w in r's dtype,): the attention's output projection with the block's residual add, the
    per-channel scale folded into w's columns (frontier_jax.ops.out_projection); composed of
    projection_fwd. The backward is projection_bwd's (dr = dy passes through)."""
    return (r_NO + projection_fwd(x_NI, w_IO)[0],)


def _normed(x_ND, inv_N1):
    """rms_norm(x) from the forward's inv: exactly rms_norm_fwd's y."""
    return (x_ND.astype(jnp.float32) * inv_N1).astype(x_ND.dtype)


def norm_projection_fwd(x_NI, w_IO):
    """(y = rms_norm(x) w in x's dtype, inv_N1): the block's pre-attention RMSNorm and the q/k/v
    projection as one op, composed of the two references (what the model computed unfused)."""
    xn_NI, inv_N1 = rms_norm_fwd(x_NI)
    return projection_fwd(xn_NI, w_IO)[0], inv_N1


def norm_projection_bwd(x_NI, w_IO, inv_N1, dy_NO):
    """(dx in x's dtype, dw in fp32): the projection's backward at rms_norm(x), then the norm's."""
    dxn_NI, dw_IO = projection_bwd(_normed(x_NI, inv_N1), w_IO, dy_NO)
    return rms_norm_bwd(x_NI, inv_N1, dxn_NI)[0], dw_IO


def resid_mix(x_NI, x0_NI, mix_2I, skip_NI, sw_1I):
    """The block's residual stream in x's dtype: mix[0] * x_in' + mix[1] * x0 with x_in' = x_in + sw * skip
    (a decoder block's U-Net skip add; a skip of width 0 is none), the weights cast to x's dtype and every
    product and sum in it, as the model computes them."""
    m = mix_2I.astype(x_NI.dtype)
    return m[0] * _skip_added(x_NI, skip_NI, sw_1I) + m[1] * x0_NI


def _skip_added(x_NI, skip_NI, sw_1I):
    """x + sw * skip in x's dtype (a decoder block's U-Net skip add); x itself for a skip of width 0."""
    return x_NI + sw_1I[0].astype(x_NI.dtype) * skip_NI if skip_NI.shape[1] else x_NI


def mix_norm_projection_fwd(x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, *, widths):
    """(x = resid_mix(...), q, k, v, inv_N1), [q | k | v] = rms_norm(x) w split at `widths`: the block's residual
    mix (and skip add), pre-attention RMSNorm and q/k/v projection as one op, composed of the references."""
    x = resid_mix(x_NI, x0_NI, mix_2I, skip_NI, sw_1I)
    y, inv_N1 = norm_projection_fwd(x, w_IO)
    return (x, *jnp.split(y, np.cumsum(widths[:-1]).tolist(), axis=1), inv_N1)


def mix_norm_projection_bwd(x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, inv_N1, dxo_NI, dq_NQ, dk_NK, dv_NV):
    """(dx_in, dx0 in x's dtype, dmix [2, I] fp32, dw fp32[, dskip in x's dtype, dsw [1, I] fp32 with a skip]):
    x's gradient is dxo (the written x's, the residual path) plus norm_projection_bwd's of dy = [dq | dk | dv];
    the mix's backward as autodiff takes it, with the weights' gradients summed over the tokens in fp32."""
    dy_NO = jnp.concatenate([dq_NQ, dk_NK, dv_NV], axis=1)
    dt, f32 = x_NI.dtype, lambda a: a.astype(jnp.float32)
    x = resid_mix(x_NI, x0_NI, mix_2I, skip_NI, sw_1I)
    dxn, dw = norm_projection_bwd(x, w_IO, inv_N1, dy_NO)
    dx = dxo_NI + dxn
    m = mix_2I.astype(dt)
    skip = skip_NI.shape[1] > 0
    xs = _skip_added(x_NI, skip_NI, sw_1I)
    dxs = m[0] * dx
    dmix = jnp.stack([jnp.sum(f32(dx) * f32(xs), axis=0), jnp.sum(f32(dx) * f32(x0_NI), axis=0)])
    outs = (dxs, m[1] * dx, dmix, dw)
    return outs + (sw_1I[0].astype(dt) * dxs, jnp.sum(f32(dxs) * f32(skip_NI), axis=0)[None]) if skip else outs


def attention_block(T: int) -> int:
    """Query/key block length of the block-causal schedule: T split into 8, 4 or 2 blocks of >= 64
    positions (measured on CPU: 0.36x the dense masked time at T=1024, 0.66x at T=256), else T."""
    for n in (8, 4, 2):
        if T % n == 0 and T // n >= 64:
            return T // n
    return T


def _attention_layout(x_BTHK: jax.Array, G: int) -> jax.Array:
    """[B, T, H, K] -> [B, G, R, T, K] (R = H/G query heads per kv head): contractions over K batch on (B, G)."""
    B, T, H, K = x_BTHK.shape
    return x_BTHK.reshape(B, T, G, H // G, K).transpose(0, 2, 3, 1, 4)


def _attention_blocks(T: int, block: int | None):
    C = attention_block(T) if block is None else block
    C = C if C and T % C == 0 else T
    for i in range(T // C):  # query block [i*C, (i+1)*C) sees keys [0, (i+1)*C); mask is a host constant
        yield i * C, (i + 1) * C, np.arange((i + 1) * C)[None, :] <= np.arange(i * C, (i + 1) * C)[:, None]


def _scores(q_BGRCK, k_BGJK, mask_CJ, fill):
    """Scaled float32 scores of one query block against its visible keys, `fill` above the diagonal."""
    s_BGRCJ = jnp.einsum("bgrck,bgsk->bgrcs", q_BGRCK, k_BGJK, preferred_element_type=jnp.float32)
    return jnp.where(mask_CJ, s_BGRCJ * (1.0 / np.sqrt(q_BGRCK.shape[-1])), fill)


def causal_attention_fwd(q_BTHK, k_BTGK, v_BTGK, block: int | None = None):
    """(o [B, T, H, K], lse [B, H, T, 1] float32, probabilities per query block [B, G, R, C, J] float32).

    Block-causal: query block i attends to key blocks 0..i only, so the score matmuls skip the fully
    masked upper blocks; each row's softmax still runs over exactly its unmasked keys (the dense masked
    formulation up to summation order). `block`: the block length (None: `attention_block(T)`; 0 or T:
    dense masked).
    """
    B, T, H, K = q_BTHK.shape
    G = k_BTGK.shape[2]
    q_BGRTK = _attention_layout(q_BTHK, G)
    k_BGJK, v_BGJK = k_BTGK.transpose(0, 2, 1, 3), v_BTGK.transpose(0, 2, 1, 3)
    outs, lses, probs = [], [], []
    for lo, hi, mask_CJ in _attention_blocks(T, block):
        s_BGRCJ = _scores(q_BGRTK[:, :, :, lo:hi], k_BGJK[:, :, :hi], mask_CJ, -jnp.inf)
        m_BGRC1 = jnp.max(s_BGRCJ, axis=-1, keepdims=True)
        e_BGRCJ = jnp.exp(s_BGRCJ - m_BGRC1)
        l_BGRC1 = jnp.sum(e_BGRCJ, axis=-1, keepdims=True)
        p_BGRCJ = e_BGRCJ / l_BGRC1
        outs.append(jnp.einsum("bgrcs,bgsk->bgrck", p_BGRCJ.astype(v_BTGK.dtype), v_BGJK[:, :, :hi]))
        lses.append(m_BGRC1 + jnp.log(l_BGRC1))
        probs.append(p_BGRCJ)
    o_BGRTK = jnp.concatenate(outs, axis=3) if len(outs) > 1 else outs[0]
    lse_BGRT1 = jnp.concatenate(lses, axis=3) if len(lses) > 1 else lses[0]
    return (o_BGRTK.transpose(0, 3, 1, 2, 4).reshape(B, T, H, K).astype(q_BTHK.dtype),
            lse_BGRT1.reshape(B, H, T, 1), probs)


def causal_attention_bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK, block: int | None = None, probs=None):
    """(dq, dk, dv) of causal_attention, flash-style: dS = P * (dP - rowsum(dO * O)), per query block.

    P comes from `probs` (the forward's, saved) or is recomputed as exp(scores - lse). The key-side gradients
    are formed transposed (dK^T = Q^T dS, dV^T = dO^T P, [K, J] per kv head) and accumulated over query
    blocks in float32: on XLA:CPU that contraction runs without transposing the [C, J] blocks (measured
    0.8x the time of plain autodiff at the baseline shape, bench/README.md).
    """
    B, T, H, K = q_BTHK.shape
    G = k_BTGK.shape[2]
    f32 = jnp.float32
    q_BGRTK, do_BGRTK = _attention_layout(q_BTHK, G), _attention_layout(do_BTHK, G)
    k_BGJK, v_BGJK = k_BTGK.transpose(0, 2, 1, 3), v_BTGK.transpose(0, 2, 1, 3)
    delta_BGRT1 = jnp.sum(do_BGRTK.astype(f32) * _attention_layout(o_BTHK, G).astype(f32), axis=-1, keepdims=True)
    lse_BGRT1 = lse_BHT1.reshape(B, G, H // G, T, 1)
    scale = 1.0 / np.sqrt(K)
    dkT_BGKJ = jnp.zeros((B, G, K, T), f32)
    dvT_BGKJ = jnp.zeros((B, G, K, T), f32)
    dqs = []
    for i, (lo, hi, mask_CJ) in enumerate(_attention_blocks(T, block)):
        q_BGRCK, do_BGRCK = q_BGRTK[:, :, :, lo:hi], do_BGRTK[:, :, :, lo:hi]
        if probs is not None:
            p_BGRCJ = probs[i]
        else:
            s_BGRCJ = _scores(q_BGRCK, k_BGJK[:, :, :hi], mask_CJ, -jnp.inf)
            p_BGRCJ = jnp.exp(s_BGRCJ - lse_BGRT1[:, :, :, lo:hi])  # exp(-inf) = 0 above the diagonal
        dvT_BGKJ = dvT_BGKJ.at[..., :hi].add(
            jnp.einsum("bgrck,bgrcs->bgks", do_BGRCK, p_BGRCJ.astype(do_BTHK.dtype), preferred_element_type=f32))
        dp_BGRCJ = jnp.einsum("bgrck,bgsk->bgrcs", do_BGRCK, v_BGJK[:, :, :hi], preferred_element_type=f32)
        ds_BGRCJ = (p_BGRCJ * (dp_BGRCJ - delta_BGRT1[:, :, :, lo:hi]) * scale).astype(q_BTHK.dtype)
        dqs.append(jnp.einsum("bgrcs,bgsk->bgrck", ds_BGRCJ, k_BGJK[:, :, :hi], preferred_element_type=f32))
        dkT_BGKJ = dkT_BGKJ.at[..., :hi].add(jnp.einsum("bgrck,bgrcs->bgks", q_BGRCK, ds_BGRCJ, preferred_element_type=f32))
    dq_BGRTK = jnp.concatenate(dqs, axis=3) if len(dqs) > 1 else dqs[0]
    return (dq_BGRTK.transpose(0, 3, 1, 2, 4).reshape(B, T, H, K).astype(q_BTHK.dtype),
            dkT_BGKJ.transpose(0, 3, 1, 2).astype(k_BTGK.dtype), dvT_BGKJ.transpose(0, 3, 1, 2).astype(v_BTGK.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def causal_attention(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array, block: int | None = None) -> jax.Array:
    """Causal softmax attention with GQA (G kv heads shared by H/G query heads), scale 1/sqrt(K).

    The forward and its gradient are `causal_attention_fwd` / `causal_attention_bwd` (block-causal; the
    backward reuses the forward's probabilities). Equal to autodiff of the dense masked softmax up to
    summation order (tests/test_speed_paths.py).
    """
    return causal_attention_fwd(q_BTHK, k_BTGK, v_BTGK, block)[0]


def _causal_attention_vjp_fwd(q_BTHK, k_BTGK, v_BTGK, block):
    o_BTHK, lse_BHT1, probs = causal_attention_fwd(q_BTHK, k_BTGK, v_BTGK, block)
    return o_BTHK, (q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, probs)


def _causal_attention_vjp_bwd(block, res, do_BTHK):
    q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, probs = res
    return causal_attention_bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK, block, probs)


causal_attention.defvjp(_causal_attention_vjp_fwd, _causal_attention_vjp_bwd)


def attention_fwd(q_BTHK, k_BTGK, v_BTGK):
    """(o, lse [B, H, T, 1]): what the attention kernel saves; its backward recomputes the probabilities."""
    return causal_attention_fwd(q_BTHK, k_BTGK, v_BTGK)[:2]


def attention_bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK):
    return causal_attention_bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK)


def xsa(y_BTHK: jax.Array, v_BTGK: jax.Array) -> jax.Array:
    """Exclusive self attention: each head's output minus its component along its own position's value vector,
    y - (y . vn) vn with vn = v / max(||v||, 1e-12) of the head's kv group (query head h reads kv head h // (H/G),
    consecutive heads share a group); in y's dtype."""
    B, T, H, K = y_BTHK.shape
    G = v_BTGK.shape[2]
    y_BTGRK = y_BTHK.reshape(B, T, G, H // G, K)
    v = v_BTGK.astype(y_BTHK.dtype)
    vn_BTG1K = (v / jnp.maximum(jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True)), XSA_EPS))[:, :, :, None, :]
    return (y_BTGRK - jnp.sum(y_BTGRK * vn_BTG1K, axis=-1, keepdims=True) * vn_BTG1K).reshape(B, T, H, K)


def qk_attention(q_BTHK, k_BTGK, v_BTGK, cos_TR2, sin_TR2, gain_H, xsa_on: bool = False) -> jax.Array:
    """The model's attention after its projections: QK-norm, RoPE (partial when the tables cover R < K dims),
    the query gain, causal GQA attention, then XSA when `xsa_on`."""
    q_BTHK = rope_gain(rms_norm(q_BTHK), cos_TR2, sin_TR2, gain_H)
    o_BTHK = causal_attention(q_BTHK, rope(rms_norm(k_BTGK), cos_TR2, sin_TR2), v_BTGK)
    return xsa(o_BTHK, v_BTGK) if xsa_on else o_BTHK


def qk_attention_fwd(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, exact_max=True, xsa_on=False):
    """(o, lse [B, H, T, 1], qg, qinv [B, T, H, 1], kr, kinv [B, T, G, 1], qgT [B, H, K, T], krT [B, G, K, T], xc)
    of `qk_attention` on raw q/k (g_PH: the gain broadcast over 128 rows, fp32): what the fused kernel saves
    for its backward, the normed, rotated q (times the gain) and k, each row's inverse RMS (fp32) and qg / kr
    transposed (the kernel's backward loads them instead of transposing); the probabilities are recomputed.
    exact_max: which softmax shift the kernel uses (kernels_nki/attention.py); o and lse do not depend on
    it (softmax is shift-invariant), so the reference ignores it. xsa_on: o is `xsa` of the attention's output a and
    xc [B, H, T, 1] fp32 each row's a . u (u: its kv head's unit value vector, `xsa_units`), the backward's
    residual; without, xc is empty [B, H, T, 0]."""
    del exact_max
    qn_BTHK, qinv = rms_norm_fwd(q_BTHK)
    kn_BTGK, kinv = rms_norm_fwd(k_BTGK)
    qg_BTHK = rope_gain(qn_BTHK, cos_TK2, sin_TK2, g_PH[0])
    kr_BTGK = rope(kn_BTGK, cos_TK2, sin_TK2)
    T_last = (0, 2, 3, 1)
    o_BTHK, lse_BHT1 = attention_fwd(qg_BTHK, kr_BTGK, v_BTGK)
    B, T, H, K = o_BTHK.shape
    xc_BHT1 = jnp.zeros((B, H, T, 0), jnp.float32)
    if xsa_on:
        xc_BHT1 = _per_head(o_BTHK, xsa_units(v_BTGK)[0], lambda a, u: jnp.sum(a * u, axis=-1))
        o_BTHK = xsa(o_BTHK, v_BTGK)
    return (o_BTHK, lse_BHT1, qg_BTHK, qinv, kr_BTGK, kinv, jnp.transpose(qg_BTHK, T_last),
            jnp.transpose(kr_BTGK, T_last), xc_BHT1)


def xsa_units(v_BTGK):
    """(u, inv) fp32: each row's unit value vector u = v / max(||v||, 1e-12) [B, T, G, K] (F.normalize, as `xsa`)
    and inv = 1 / max(||v||, 1e-12) [B, T, G, 1]."""
    v = v_BTGK.astype(jnp.float32)
    inv = 1.0 / jnp.maximum(jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True)), XSA_EPS)
    return v * inv, inv


def _per_head(x_BTHK, u_BTGK, f):
    """f(x, u) per query head against its kv head's u (fp32, [B, T, G, R, K] -> [B, T, G, R]) as [B, H, T, 1]."""
    B, T, H, K = x_BTHK.shape
    G = u_BTGK.shape[2]
    out = f(x_BTHK.astype(jnp.float32).reshape(B, T, G, H // G, K), u_BTGK[:, :, :, None, :])
    return out.reshape(B, T, H).transpose(0, 2, 1)[..., None]


def xsa_bwd(y_BTHK, v_BTGK, xc_BHT1, dy_BTHK):
    """(da, dv) of XSA, y = a - c u with c = a . u (xc) and u = v / ||v||, from its output y and its cotangent dy:
    da = dy - (dy . u) u per head, in y's dtype; dv = -(sum over the kv head's query heads of c da + (dy . u) y) /
    ||v|| (fp32; exact for ||v|| >= 1e-12: d u = (I - u u^T) d v / ||v||, and y . u = 0). The attention's own
    backward needs a for rowsum(da . a) only, which equals rowsum(dy . y) (da and y are both orthogonal to u,
    a = y + c u), so y stands in for a."""
    B, T, H, K = y_BTHK.shape
    G = v_BTGK.shape[2]
    u, inv = xsa_units(v_BTGK)
    f32 = lambda x: x.astype(jnp.float32).reshape(B, T, G, H // G, K)
    dy, y, u5 = f32(dy_BTHK), f32(y_BTHK), u[:, :, :, None, :]
    a = jnp.sum(dy * u5, axis=-1, keepdims=True)
    c = xc_BHT1[..., 0].transpose(0, 2, 1).reshape(B, T, G, H // G)[..., None]
    da = dy - a * u5
    dv = -jnp.sum(c * da.astype(y_BTHK.dtype).astype(jnp.float32) + a * y, axis=3) * inv
    return da.reshape(B, T, H, K).astype(y_BTHK.dtype), dv


def qk_attention_bwd(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, o_BTHK, lse_BHT1, qg_BTHK, qinv, kr_BTGK,
                     kinv, qgT_BHKT, krT_BGKT, xc_BHT1, do_BTHK, xsa_on=False):
    """(dq, dk, dv, dg_BH1): through XSA (with xsa_on: o and do are XSA's output and its cotangent, `xsa_bwd`),
    attention, RoPE (+ gain) and QK-norm; dg per (batch, head), fp32 (the transposed qgT / krT are the kernel's;
    the reference reads the rows)."""
    del qgT_BHKT, krT_BGKT
    dv_x = 0.0
    if xsa_on:
        do_BTHK, dv_x = xsa_bwd(o_BTHK, v_BTGK, xc_BHT1, do_BTHK)
    qn_BTHK = _normed(q_BTHK, qinv)
    dqg, dkr, dv = attention_bwd(qg_BTHK, kr_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK)
    dqn = rope_gain_bwd(qn_BTHK, cos_TK2, sin_TK2, g_PH, dqg)[0]
    qr = rope(qn_BTHK, cos_TK2, sin_TK2).astype(jnp.float32)
    dg_BH1 = jnp.sum(dqg.astype(jnp.float32) * qr, axis=(1, 3))[..., None]
    dkn = rope_bwd(dkr, cos_TK2, sin_TK2)[0]
    dv = (dv.astype(jnp.float32) + dv_x).astype(v_BTGK.dtype)
    return rms_norm_bwd(q_BTHK, qinv, dqn)[0], rms_norm_bwd(k_BTGK, kinv, dkn)[0], dv, dg_BH1


def leaky_relu(h: jax.Array, negative_slope: float = 0.0) -> jax.Array:
    """h where h > 0, else negative_slope * h (slope 0: relu, as jnp.maximum(h, 0))."""
    return jnp.maximum(h, 0) if negative_slope == 0 else jnp.where(h > 0, h, h * negative_slope)


def mlp(x_ND: jax.Array, w_fc_DF: jax.Array, w_proj_FD: jax.Array, negative_slope: float = 0.0) -> jax.Array:
    """LeakyReLU(x W_fc, negative_slope)^2 W_proj (slope 0: the baseline's relu^2); weights are cast to the
    activation dtype at use."""
    h_NF = leaky_relu(x_ND @ w_fc_DF.astype(x_ND.dtype), negative_slope)
    return (h_NF * h_NF) @ w_proj_FD.astype(x_ND.dtype)


def mlp_fwd(x_ND, w_fc_DF, w_proj_FD, negative_slope: float = 0.0):
    """(y, rT_FN): y = mlp(x) and r^T [F, N] in x's dtype, r = leaky_relu(h) (h = x W_fc, computed in x's dtype),
    the backward's residual: the hidden layer is stored, not recomputed (docs/kernels/mlp.md says why)."""
    r_NF = leaky_relu(x_ND @ w_fc_DF.astype(x_ND.dtype), negative_slope)
    return (r_NF * r_NF) @ w_proj_FD.astype(x_ND.dtype), r_NF.T


def mlp_bwd(x_ND, w_fc_DF, w_proj_FD, rT_FN, dy_ND, negative_slope: float = 0.0):
    """(dx, dw_fc, dw_proj) from the stored r = leaky_relu(h): what autodiff of `mlp` computes, written out (a = r^2,
    da = dy W_proj^T, dh = 2 m da with m = r leaky_relu'(h) = leaky_relu(r) for a slope >= 0: r where h > 0, slope
    r below, zero where relu's h <= 0 as r is); dw in the weights' dtypes."""
    dt = x_ND.dtype
    r_NF = rT_FN.T.astype(dt)
    w_fc, w_proj = w_fc_DF.astype(dt), w_proj_FD.astype(dt)
    da_NF = dy_ND @ w_proj.T
    dh_NF = 2 * (leaky_relu(r_NF, negative_slope) * da_NF)
    return (dh_NF @ w_fc.T, (x_ND.T @ dh_NF).astype(w_fc_DF.dtype),
            ((r_NF * r_NF).T @ dy_ND).astype(w_proj_FD.dtype))


def ln_scaled(xn: jax.Array, ln_scale: float) -> jax.Array:
    """A normed sublayer input times its layer's LN-scale factor in xn's dtype (factor 1: xn itself)."""
    return xn if ln_scale == 1.0 else xn * ln_scale


def norm_mlp(x, w_fc_DF, w_proj_FD, negative_slope: float = 0.0, ln_scale: float = 1.0):
    """mlp(rms_norm(x) * ln_scale) for x of any leading shape [..., D]: the block's pre-MLP RMSNorm and the MLP
    as one op; the norm on x's own shape and the MLP on [N, D], as the unfused model ran them (the same program)."""
    D = x.shape[-1]
    return mlp(ln_scaled(rms_norm(x), ln_scale).reshape(-1, D), w_fc_DF, w_proj_FD, negative_slope).reshape(x.shape)


def norm_mlp_fwd(x_ND, w_fc_DF, w_proj_FD, negative_slope: float = 0.0):
    """(y in x's dtype, inv_N1, rT_FN = leaky_relu(h)^T in x's dtype), composed of the two references (what the
    model computed unfused)."""
    xn_ND, inv_N1 = rms_norm_fwd(x_ND)
    y_ND, rT_FN = mlp_fwd(xn_ND, w_fc_DF, w_proj_FD, negative_slope)
    return y_ND, inv_N1, rT_FN


def norm_mlp_bwd(x_ND, w_fc_DF, w_proj_FD, inv_N1, rT_FN, dy_ND, negative_slope: float = 0.0):
    """(dx, dw_fc, dw_proj): the MLP's backward at rms_norm(x) from the stored leaky_relu(h)^T, then the norm's."""
    dxn_ND, dw_fc_DF, dw_proj_FD = mlp_bwd(_normed(x_ND, inv_N1), w_fc_DF, w_proj_FD, rT_FN, dy_ND, negative_slope)
    return rms_norm_bwd(x_ND, inv_N1, dxn_ND)[0], dw_fc_DF, dw_proj_FD


def resid_norm_mlp_fwd(x_ND, w_fc_DF, w_proj_FD, *, negative_slope: float = 0.0):
    """(y = x + mlp(rms_norm(x)) in x's dtype, inv_N1, rT_FN = leaky_relu(h)^T [F, N] in x's dtype): the block's
    MLP with its residual add, the per-channel scale folded into W_proj's columns (frontier_jax.ops.norm_mlp);
    composed of norm_mlp_fwd. negative_slope >= 0 (the backward reads the activation's sign off the stored r)."""
    y_ND, inv_N1, rT_FN = norm_mlp_fwd(x_ND, w_fc_DF, w_proj_FD, negative_slope)
    return x_ND + y_ND, inv_N1, rT_FN


def resid_norm_mlp_bwd(x_ND, w_fc_DF, w_proj_FD, inv_N1, rT_FN, dy_ND, *, negative_slope: float = 0.0):
    """(dx = dy + norm_mlp_bwd's dx in x's dtype, dw_fc in x's dtype, dw_proj in fp32)."""
    dx_ND, dw_fc_DF, dw_proj_FD = norm_mlp_bwd(x_ND, w_fc_DF, w_proj_FD, inv_N1, rT_FN, dy_ND, negative_slope)
    return dy_ND + dx_ND, dw_fc_DF, dw_proj_FD.astype(jnp.float32)


def embed(ids_N: jax.Array, emb_VD: jax.Array) -> jax.Array:
    return jnp.take(emb_VD, ids_N, axis=0)


def embed_fwd(ids_N, emb_VD):
    return (embed(ids_N, emb_VD),)


def embed_bwd(ids_N, emb_VD, dy_ND):
    """d emb in float32: a scatter-add, duplicates summed."""
    return (jnp.zeros(emb_VD.shape, jnp.float32).at[ids_N].add(dy_ND.astype(jnp.float32)),)


def head_logits(x_ND: jax.Array, emb_VD: jax.Array, softcap: float) -> jax.Array:
    """Tied projection and logit softcap in the activation dtype, returned as float32 (as the baseline)."""
    z_NV = x_ND @ emb_VD.astype(x_ND.dtype).T
    return (softcap * jnp.tanh(z_NV / softcap)).astype(jnp.float32)


def add_sparse_bias(logits_NV: jax.Array, bias_ids_NS: jax.Array, bias_vals_NS: jax.Array) -> jax.Array:
    """Add one (token id, value) pair per position and source to float32 logits (a scatter-add, so
    sources that name the same token add up)."""
    N = logits_NV.shape[0]
    rows_NS = jnp.broadcast_to(jnp.arange(N)[:, None], bias_ids_NS.shape)
    return logits_NV.at[rows_NS, bias_ids_NS.astype(jnp.int32)].add(bias_vals_NS.astype(jnp.float32))


def head_loss(
    x_ND: jax.Array,
    emb_VD: jax.Array,
    targets_N: jax.Array,
    softcap: float,
    bias_ids_NS: jax.Array | None = None,
    bias_vals_NS: jax.Array | None = None,
) -> jax.Array:
    """Per-token cross-entropy (nats, float32) of softcapped tied logits plus an optional sparse bias."""
    logits_NV = head_logits(x_ND, emb_VD, softcap)
    if bias_ids_NS is not None:
        logits_NV = add_sparse_bias(logits_NV, bias_ids_NS, bias_vals_NS)
    lse_N = jax.nn.logsumexp(logits_NV, axis=-1)
    tgt_N = jnp.take_along_axis(logits_NV, targets_N[:, None].astype(jnp.int32), axis=-1)[:, 0]
    return lse_N - tgt_N


def head_loss_fwd(x_ND, emb_VD, targets_N1, bias_ids_NS, bias_vals_NS, *, softcap):
    """(loss_N1, lse_N1) float32; a bias of S = 0 sources is no bias."""
    logits_NV = head_logits(x_ND, emb_VD, softcap)
    if bias_ids_NS.shape[1]:
        logits_NV = add_sparse_bias(logits_NV, bias_ids_NS, bias_vals_NS)
    lse_N1 = jax.nn.logsumexp(logits_NV, axis=-1, keepdims=True)
    return lse_N1 - jnp.take_along_axis(logits_NV, targets_N1, axis=-1), lse_N1


def head_loss_bwd(x_ND, emb_VD, targets_N1, bias_ids_NS, bias_vals_NS, lse_N1, dloss_N1, *, softcap):
    """(dx, demb[, dvals float32 when S > 0])."""
    loss = lambda x, emb, vals: head_loss_fwd(x, emb, targets_N1, bias_ids_NS, vals, softcap=softcap)[0]
    dx, demb, dvals = jax.vjp(loss, x_ND, emb_VD, bias_vals_NS)[1](dloss_N1)
    return (dx, demb, dvals) if bias_ids_NS.shape[1] else (dx, demb)


# ----------------------------------------------------------------------------- the recipe's embedding stage
# (BigramHash, SmearGate, value embeddings: gathers, small projections and elementwise ops XLA runs on every
# platform; no NKI kernel exists for them)


def bigram_hash(ids_BT: jax.Array, buckets: int) -> jax.Array:
    """BigramHash's bucket of every position, int32 [B, T]: (a * ids[t]) XOR (b * ids[t-1]) mod (buckets - 1) with
    (a, b) = config.BIGRAM_HASH in int32, and bucket buckets - 1 (reserved) at position 0 of every row."""
    t = ids_BT.astype(jnp.int32)
    a, b = BIGRAM_HASH
    mod = buckets - 1
    pairs = jnp.bitwise_xor(a * t[..., 1:], b * t[..., :-1]) % mod
    return jnp.concatenate([jnp.full(t.shape[:-1] + (1,), mod, jnp.int32), pairs], axis=-1)


def smear(x_BTD: jax.Array, gate_D: jax.Array) -> jax.Array:
    """SmearGate: (1 - g) x_t + g x_(t-1), g = sigmoid(gate) per channel in x's dtype, with a zero predecessor at
    position 0 of every row."""
    g = jax.nn.sigmoid(gate_D.astype(x_BTD.dtype))[None, None, :]
    prev_BTD = jnp.concatenate([jnp.zeros_like(x_BTD[:, :1]), x_BTD[:, :-1]], axis=1)
    return (1 - g) * x_BTD + g * prev_BTD


def scaled_table_projection(ids_BT, table_VE, proj_EO, scale, dt) -> jax.Array:
    """(table[ids] w) * scale in dt: a BigramHash or value-embedding lookup, its projection (None: the table
    already has the output width) and its learned scalar scale, weights cast to dt at use."""
    e_BTE = embed(ids_BT, table_VE).astype(dt)
    if proj_EO is not None:
        e_BTE = e_BTE @ proj_EO.astype(dt)
    return e_BTE * scale.astype(dt)


# ----------------------------------------------------------------------------- optimizer updates

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def newton_schulz(g_RC: jax.Array, steps: int, dtype) -> jax.Array:
    """Orthogonalise a matrix in PyTorch [rows, cols] orientation as the record's zeropower_via_newtonschulz5
    computes it in torch: Frobenius-normalise, transpose if tall, 5 quintic iterations, every product and sum
    rounded to `dtype` once, the coefficients and eps in fp32 (torch multiplies a bf16 tensor by a Python float in
    fp32; JAX's weak typing would round them to bf16 first), the matmuls accumulated in fp32. The baseline's
    differs in one rounding point: its `c * A @ A` is (c A) A, here c (A A), the record's."""
    a, b, c = NS_COEFFS
    f32, dt = jnp.float32, jnp.dtype(dtype)
    scaled = lambda k, v: (k * v.astype(f32)).astype(dt)  # a bf16 tensor times a Python float, as torch
    added = lambda u, v: (u.astype(f32) + v.astype(f32)).astype(dt)
    dot = lambda u, v: jnp.dot(u, v, preferred_element_type=f32).astype(dt)
    x = g_RC.astype(dt)
    norm = (jnp.linalg.norm(x.astype(f32)).astype(dt).astype(f32) + NS_EPS).astype(dt)
    x = (x.astype(f32) / norm.astype(f32)).astype(dt)
    transposed = g_RC.shape[0] > g_RC.shape[1]
    if transposed:
        x = x.T
    for _ in range(steps):
        a_RR = dot(x, x.T)
        b_RR = added(scaled(b, a_RR), scaled(c, dot(a_RR, a_RR)))
        x = added(scaled(a, x), dot(b_RR, x))
    return x.T if transposed else x


def muon_momentum(g_IO, buf_IO, momentum):
    """(buf', Nesterov g + momentum buf' as float32) of Muon's momentum, in the buffer's dtype: float32 (the
    baseline: fp32 until Newton-Schulz) or bfloat16 (the record's Muon, train_gpt.py:232-240: the gradient rounded
    to bf16, buf' = bf16(bf16(momentum buf) + g) with a rounding after each op, the Nesterov sum rounded to bf16
    once with the momentum in fp32, as torch's CUDA `g.add(buf, alpha=momentum)` computes it; its CPU kernel
    rounds alpha to bf16 first)."""
    if buf_IO.dtype == jnp.float32:
        g32 = g_IO.astype(jnp.float32)
        buf_IO = momentum * buf_IO + g32
        return buf_IO, g32 + momentum * buf_IO
    dt = buf_IO.dtype
    g32 = g_IO.astype(dt).astype(jnp.float32)
    scaled = (momentum * buf_IO.astype(jnp.float32)).astype(dt).astype(jnp.float32)
    buf_IO = (scaled + g32).astype(dt)
    return buf_IO, (g32 + momentum * buf_IO.astype(jnp.float32)).astype(dt).astype(jnp.float32)


def muon_direction(g_IO, buf_IO, momentum, ns_steps: int, ns_dtype, shape_scale: str = "update"):
    """(u_IO float32, buf') of Muon for one [in, out] matrix: the momentum in the buffer's dtype
    (`muon_momentum`), Newton-Schulz on the PyTorch orientation [out, in] (so the transposition choice and the
    scale sqrt(max(1, out/in)) are the baseline's), and the shape scale: "update" multiplies the Newton-Schulz
    output, rounded to `ns_dtype` (the baseline's update buffer); "lr" multiplies it in float32, as the record
    puts the scale into its learning rate (train_gpt.py:253)."""
    dtype = jnp.dtype(ns_dtype)
    buf_IO, ge_IO = muon_momentum(g_IO, buf_IO, momentum)
    o_RC = newton_schulz(ge_IO.T, ns_steps, dtype)
    rows, cols = o_RC.shape
    scale = max(1.0, rows / cols) ** 0.5
    if shape_scale == "lr":
        return o_RC.T.astype(jnp.float32) * scale, buf_IO
    o_RC = (o_RC.astype(jnp.float32) * scale).astype(dtype)  # the NS dtype's update times a Python float, as torch
    return o_RC.T.astype(jnp.float32), buf_IO


def adam_update(p, g, m, v, scal_P4, *, b1, b2, eps, weight_decay):
    """(p', m', v'): optax.scale_by_adam (+ add_decayed_weights) -> x (-lr) -> apply_updates, op for op.
    scal_P4 rows: [lr, 1 - b1^t, 1 - b2^t, unused] (runtime scalars)."""
    lr, bc1, bc2 = scal_P4[0, 0], scal_P4[0, 1], scal_P4[0, 2]
    m2 = (1 - b1) * g + b1 * m
    v2 = (1 - b2) * (g ** 2) + b2 * v
    u = (m2 / bc1.astype(m2.dtype)) / (jnp.sqrt(v2 / bc2.astype(v2.dtype)) + eps)
    if weight_decay:
        u = u + weight_decay * p
    u = (-lr * u).astype(u.dtype)
    return jnp.asarray(p + u).astype(p.dtype), m2.astype(m.dtype), v2.astype(v.dtype)


def muon_update(p_IO, g_IO, buf_IO, scal_P2, *, ns_steps, ns_dtype, weight_decay=0.0, shape_scale="update"):
    """(p', buf'): optim.scale_by_muon -> add_decayed_weights -> x (-lr) -> apply_updates, op for op; scal_P2
    rows [lr, momentum]; the buffer's dtype is the momentum's (`muon_momentum`)."""
    lr, mom = scal_P2[0, 0], scal_P2[0, 1]
    u, buf_IO = muon_direction(g_IO, buf_IO, mom, ns_steps, ns_dtype, shape_scale)
    if weight_decay:
        u = u + weight_decay * p_IO.astype(jnp.float32)
    u = (-lr * u).astype(u.dtype)
    return jnp.asarray(p_IO + u).astype(p_IO.dtype), buf_IO


# ----------------------------------------------------------------------------- late QAT

QAT_LEVELS = (-32, 31)  # the record's fake-quantization grid (train_gpt.py:548-550: clamp to [-32, 31])
QAT_SCALE_DIV = 31.0  # scale = max |w| of the output row / 31, floored at 1 / 31


def fake_int6(w_IO: jax.Array, dt) -> jax.Array:
    """The record's CastedLinear late QAT (train_gpt.py:541-553) for a weight stored [in, out], in dt: per output
    channel (the record's row of [out, in]) scale = max(max |w| / 31, 1 / 31), w_q = clamp(round(w / scale), -32,
    31) * scale (round half to even, as torch.round), and the straight-through w + stop_gradient(w_q - w)."""
    w32 = w_IO.astype(jnp.float32)
    scale_O = jnp.maximum(jnp.max(jnp.abs(w32), axis=0) / QAT_SCALE_DIV, 1.0 / QAT_SCALE_DIV)
    q = (jnp.clip(jnp.round(w32 / scale_O), *QAT_LEVELS) * scale_O).astype(dt)
    w = w_IO.astype(dt)
    return w + jax.lax.stop_gradient(q - w)
