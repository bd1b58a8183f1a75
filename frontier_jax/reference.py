"""Pure-JAX reference of every hot-path op: what runs on CPU/GPU, and the spec the NKI kernels must meet.

Axis letters: B batch, T sequence, D model width, H query heads, G kv heads, K head dim, F MLP hidden,
V vocabulary, N flattened tokens (B*T), S sparse-bias sources.
Nothing here reads the platform; `frontier_jax.ops` decides whether these or a kernel run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# PyTorch's F.rms_norm without eps uses the epsilon of the op-math type (float32 for bf16/fp32 inputs).
RMS_EPS = float(np.finfo(np.float32).eps)


def rms_norm(x_ND: jax.Array) -> jax.Array:
    """Weightless RMSNorm over the last axis, computed in fp32, returned in the input dtype."""
    x32 = x_ND.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + RMS_EPS)
    return (x32 * inv).astype(x_ND.dtype)


def rope_tables(seq_len: int, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [T, K/2] in float32, computed once per sequence length on the host (constants under jit)."""
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    t = np.arange(seq_len, dtype=np.float32)
    freqs_TK2 = np.outer(t, inv_freq).astype(np.float32)
    return np.cos(freqs_TK2), np.sin(freqs_TK2)


def rope(x_BTHK: jax.Array, cos_TK2: jax.Array, sin_TK2: jax.Array) -> jax.Array:
    """Half-split rotary embedding as the baseline: (x1 cos + x2 sin, -x1 sin + x2 cos)."""
    half = x_BTHK.shape[-1] // 2
    cos = cos_TK2.astype(x_BTHK.dtype)[None, :, None, :]
    sin = sin_TK2.astype(x_BTHK.dtype)[None, :, None, :]
    x1, x2 = x_BTHK[..., :half], x_BTHK[..., half:]
    return jnp.concatenate([x1 * cos + x2 * sin, x2 * cos - x1 * sin], axis=-1)


def attention_block(T: int) -> int:
    """Query/key block length of the block-causal schedule: T split into 8, 4 or 2 blocks of >= 64
    positions (measured on CPU: 0.36x the dense masked time at T=1024, 0.66x at T=256), else T."""
    for n in (8, 4, 2):
        if T % n == 0 and T // n >= 64:
            return T // n
    return T


def causal_attention(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array, block: int | None = None) -> jax.Array:
    """Causal softmax attention with GQA (G kv heads shared by H/G query heads), scale 1/sqrt(K).

    Computed block-causally: query block i attends to key blocks 0..i only, so the score matmuls skip
    the fully masked upper blocks (about half the work for many blocks); each row's softmax still runs
    over exactly its unmasked keys, so the result is the dense masked formulation up to summation
    order. `block`: the block length (dividing T; None: `attention_block(T)`; 0 or T: dense masked).
    """
    B, T, H, K = q_BTHK.shape
    G = k_BTGK.shape[2]
    C = attention_block(T) if block is None else block
    C = C if C and T % C == 0 else T
    # [B, G, R, T, K] / [B, G, S, K]: contraction over K with (B, G) batch dims and no further transposes.
    q_BGRTK = q_BTHK.reshape(B, T, G, H // G, K).transpose(0, 2, 3, 1, 4)
    k_BGSK, v_BGSK = k_BTGK.transpose(0, 2, 1, 3), v_BTGK.transpose(0, 2, 1, 3)
    outs = []
    for i in range(T // C):
        S = (i + 1) * C  # keys visible to this query block
        s_BGRCS = jnp.einsum("bgrck,bgsk->bgrcs", q_BGRTK[:, :, :, i * C:S], k_BGSK[:, :, :S],
                             preferred_element_type=jnp.float32)
        s_BGRCS = s_BGRCS * (1.0 / np.sqrt(K))
        mask_CS = np.arange(S)[None, :] <= np.arange(i * C, S)[:, None]  # host constant
        s_BGRCS = jnp.where(mask_CS, s_BGRCS, -jnp.inf)
        p_BGRCS = jax.nn.softmax(s_BGRCS, axis=-1).astype(v_BTGK.dtype)
        outs.append(jnp.einsum("bgrcs,bgsk->bgrck", p_BGRCS, v_BGSK[:, :, :S]))
    o_BGRTK = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=3)
    return o_BGRTK.transpose(0, 3, 1, 2, 4).reshape(B, T, H, K)


def mlp(x_ND: jax.Array, w_fc_DF: jax.Array, w_proj_FD: jax.Array) -> jax.Array:
    """relu(x W_fc)^2 W_proj; weights are cast to the activation dtype at use."""
    h_NF = jnp.maximum(x_ND @ w_fc_DF.astype(x_ND.dtype), 0)
    return (h_NF * h_NF) @ w_proj_FD.astype(x_ND.dtype)


def embed(ids_N: jax.Array, emb_VD: jax.Array) -> jax.Array:
    return jnp.take(emb_VD, ids_N, axis=0)


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
