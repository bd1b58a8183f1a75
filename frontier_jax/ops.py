"""The hot-path ops the model and the fused optimizer call (and only through here).

Every kernel-backed op is declared the same way, once, below: `dispatch.declare(name, forward
reference, backward reference, static parameters, kernel adapter)` (the references live in
`frontier_jax.reference`, the kernel in `kernels_nki.registry.KERNELS[name]`). A differentiable op is
then a `jax.custom_vjp` whose forward and backward each run one direction of the declared op: the NKI
kernel on Neuron, the reference elsewhere, or the kernel source under the emulator in tests
(`frontier_jax.dispatch` has the rules and the AWS documents behind them). When an op's row says
"reference" the public function calls the reference directly under plain autodiff
(`dispatch.direct`).

The kernel table's API is re-exported here: `configure`, `kernel_table`, `format_kernel_table`,
`emulated`, `through_primitives`, `KernelRow`, `KernelUnavailableError`, `OPS`, `FUSED_OPTIMIZER_OPS`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from frontier_jax import reference as ref
from frontier_jax.attention_forward import (  # noqa: F401 (re-exported: the trainer and tests use ops.*)
    SHIFT_LIMIT, SHIFT_MARGIN, SHIFT_MAX_T, _ATTENTION, attention_forward, attention_forward_kind, bounded_shift_valid,
    score_bound)
from frontier_jax.dispatch import (
    MODES, KernelAdapter, KernelRow, KernelUnavailableError, configure, declare, direct, emulated,
    format_kernel_table, kernel_primitives, kernel_table, through_primitives)

__all__ = [
    "FUSED_OPTIMIZER_OPS", "STANDALONE_OPS", "unused_ops", "MODES", "OPS", "KernelRow", "KernelUnavailableError",
    "configure", "emulated",
    "format_kernel_table", "kernel_table", "through_primitives",
    "rms_norm", "rope", "rope_gain", "causal_attention", "qk_attention", "norm_mlp", "embed", "head_loss",
    "norm_qkv_projection", "mix_norm_qkv_projection",
    "out_projection", "adam_update", "muon_update", "scalars_PK", "kernel_primitives",
    "attention_forward", "score_bound", "bounded_shift_valid", "attention_forward_kind", "attention_variants_differ",
]


def _head_loss_kernel_args(which, arrays):
    """A run without a sparse bias has S = 0 sources; a zero-size kernel operand is invalid (see
    frontier_jax.dispatch), so the kernel gets None for both bias operands (its no-bias form, which
    returns no d(bias values))."""
    x_ND, emb_VD, tg_N1, ids_NS, vals_NS, *rest = arrays
    return arrays if ids_NS.shape[1] else (x_ND, emb_VD, tg_N1, None, None, *rest)


def _mix_kernel_args(which, arrays):
    """No skip (a decoder block without one, every encoder block) is a skip of width 0 in the primitive; the
    kernel gets None for skip_NI and sw_1I instead (no zero-size operand: frontier_jax.dispatch)."""
    x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, *rest = arrays
    return arrays if skip_NI.shape[1] else (x_NI, x0_NI, mix_2I, w_IO, None, None, *rest)


def _adam_kernel_args(which, arrays):
    """The Adam kernel takes flat [N] tensors (the primitive keeps the parameter's shape; reshapes are free)."""
    return (*(x.reshape(-1) for x in arrays[:4]), arrays[4])


def _adam_kernel_outs(which, outs, arrays):
    return tuple(o.reshape(arrays[0].shape) for o in outs)


_UNFUSED = "optim.fused=False (the optax chain runs)"
_IN = "the model calls it fused, inside {}"  # a standalone op whose work the model runs in a fused op

# ----------------------------------------------------------------------------- the declarations (table order)
RMS_NORM = declare("rms_norm", ref.rms_norm_fwd, ref.rms_norm_bwd)
ROPE = declare("rope", ref.rope_fwd, ref.rope_bwd, unused_reason=_IN.format("qk_attention"))
ROPE_GAIN = declare("rope_gain", ref.rope_gain_fwd, ref.rope_gain_bwd, unused_reason=_IN.format("qk_attention"))
ATTENTION = declare("causal_attention", ref.attention_fwd, ref.attention_bwd, unused_reason=_IN.format("qk_attention"))
QK_ATTENTION = declare("qk_attention", ref.qk_attention_fwd, ref.qk_attention_bwd, static=("exact_max",))
NORM_MLP = declare("norm_mlp", ref.resid_norm_mlp_fwd, ref.resid_norm_mlp_bwd)
EMBED = declare("embed", ref.embed_fwd, ref.embed_bwd)
HEAD_LOSS = declare("head_loss", ref.head_loss_fwd, ref.head_loss_bwd, static=("softcap",),
                    adapter=KernelAdapter(_head_loss_kernel_args))
PROJECTION = declare("projection", ref.resid_projection_fwd, ref.projection_bwd)  # bwd: (x, w, dy)
NORM_PROJECTION = declare("norm_projection", ref.norm_projection_fwd, ref.norm_projection_bwd,
                          unused_reason=_IN.format("mix_norm_projection"))
MIX_NORM_PROJECTION = declare("mix_norm_projection", ref.mix_norm_projection_fwd, ref.mix_norm_projection_bwd,
                              adapter=KernelAdapter(_mix_kernel_args))
ADAM = declare("adam_update", ref.adam_update, static=("b1", "b2", "eps", "weight_decay"),
               adapter=KernelAdapter(_adam_kernel_args, _adam_kernel_outs), unused_reason=_UNFUSED)
MUON = declare("muon_update", ref.muon_update, static=("ns_steps", "ns_dtype"), unused_reason=_UNFUSED)

OPS = tuple(s.name for s in (RMS_NORM, ROPE, ROPE_GAIN, ATTENTION, QK_ATTENTION, NORM_MLP, EMBED, HEAD_LOSS,
                             PROJECTION, NORM_PROJECTION, MIX_NORM_PROJECTION, ADAM, MUON))
FUSED_OPTIMIZER_OPS = frozenset({ADAM.name, MUON.name})
# standalone ops the model (frontier_jax.model) does not call: their work runs inside a fused op
STANDALONE_OPS = frozenset({ROPE.name, ROPE_GAIN.name, ATTENTION.name, NORM_PROJECTION.name})


def unused_ops(fused_optimizer: bool) -> frozenset:
    """What a training run never calls: the standalone ops, and the fused updates when optim.fused is off
    (the kernel table marks them "unused" with the reason, and strict mode does not require them)."""
    return STANDALONE_OPS | (frozenset() if fused_optimizer else FUSED_OPTIMIZER_OPS)


# ----------------------------------------------------------------------------- model ops


@jax.custom_vjp
def _rms_norm_ND(x_ND):
    return RMS_NORM("fwd", x_ND)[0]


def _rms_norm_vjp_fwd(x_ND):
    y_ND, inv_N1 = RMS_NORM("fwd", x_ND)
    return y_ND, (x_ND, inv_N1)


_rms_norm_ND.defvjp(_rms_norm_vjp_fwd, lambda res, dy_ND: RMS_NORM("bwd", *res, dy_ND))


def rms_norm(x: jax.Array) -> jax.Array:
    """Weightless RMSNorm over the last axis (fp32 math, input dtype out); any leading shape."""
    if direct("rms_norm"):
        return ref.rms_norm(x)
    D = x.shape[-1]
    return _rms_norm_ND(x.reshape(-1, D)).reshape(x.shape)


@jax.custom_vjp
def _attention(q_BTHK, k_BTGK, v_BTGK):
    return ATTENTION("fwd", q_BTHK, k_BTGK, v_BTGK)[0]


def _attention_vjp_fwd(q_BTHK, k_BTGK, v_BTGK):
    o_BTHK, lse_BHT1 = ATTENTION("fwd", q_BTHK, k_BTGK, v_BTGK)
    return o_BTHK, (q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1)


_attention.defvjp(_attention_vjp_fwd, lambda res, do_BTHK: ATTENTION("bwd", *res, do_BTHK))


def causal_attention(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array) -> jax.Array:
    """Causal GQA attention (reference.causal_attention); the forward saves o and the per-row log-sum-exp
    [B, H, T, 1] for the backward (kernels_nki/attention.py recomputes the probabilities from them)."""
    if direct("causal_attention"):
        return ref.causal_attention(q_BTHK, k_BTGK, v_BTGK)
    dt = q_BTHK.dtype
    return _attention(q_BTHK, k_BTGK.astype(dt), v_BTGK.astype(dt))


def attention_variants_differ() -> bool:
    """Whether the two forwards are different programs in this process (a kernel or its emulator runs
    qk_attention); on the reference path both trace to the same computation."""
    return not direct("qk_attention")


def _qk_attention_forward(*arrays) -> tuple:
    """QK_ATTENTION's forward with the softmax shift chosen at trace time (`attention_forward`); sequences
    longer than SHIFT_MAX_T always take the exact forward."""
    T = arrays[0].shape[1]
    return QK_ATTENTION("fwd", *arrays, exact_max=_ATTENTION["exact_max"] or T > SHIFT_MAX_T)


@jax.custom_vjp
def _qk_attention(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH):
    return _qk_attention_forward(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH)[0]


def _qk_attention_vjp_fwd(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH):
    """Residuals: the inputs, o, lse and the forward's normed, rotated q / k with their inverse RMS (the
    kernel's backward reads them instead of recomputing the norm and the rotation)."""
    o_BTHK, *saved = _qk_attention_forward(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH)
    return o_BTHK, (q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, o_BTHK, *saved)


def _qk_attention_vjp_bwd(res, do_BTHK):
    dq, dk, dv, dg_BH1 = QK_ATTENTION("bwd", *res, do_BTHK)
    cos_TK2, sin_TK2, g_PH = res[3:6]
    dg_PH = jnp.zeros_like(g_PH).at[0].set(jnp.sum(dg_BH1[..., 0], axis=0))  # g_PH is a broadcast: its rows' sum
    return dq, dk, dv, jnp.zeros_like(cos_TK2), jnp.zeros_like(sin_TK2), dg_PH


_qk_attention.defvjp(_qk_attention_vjp_fwd, _qk_attention_vjp_bwd)


def qk_attention(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array, cos_TK2, sin_TK2,
                 gain_H: jax.Array) -> jax.Array:
    """The model's attention on the raw projections (reference.qk_attention): QK-norm, RoPE, the query
    gain and causal GQA attention as one op, so that q and k are normed and rotated on chip inside the
    attention kernel (kernels_nki/attention.py) instead of by three HBM-bound kernels."""
    if direct("qk_attention"):
        return ref.qk_attention(q_BTHK, k_BTGK, v_BTGK, jnp.asarray(cos_TK2), jnp.asarray(sin_TK2), gain_H)
    dt = q_BTHK.dtype  # the reference casts cos/sin and the gain to dt
    return _qk_attention(q_BTHK, k_BTGK.astype(dt), v_BTGK.astype(dt), _in_dtype(cos_TK2, dt),
                         _in_dtype(sin_TK2, dt), _gain_PH(gain_H, dt))


def _in_dtype(t, dt) -> jax.Array:
    """t's values rounded to dt (as the reference casts them), held in fp32: how the kernels take them."""
    return jnp.asarray(t).astype(dt).astype(jnp.float32)


def _gain_PH(gain_H, dt) -> jax.Array:
    """A per-head gain as the kernels take it: rounded to dt, fp32, broadcast over the 128 partitions."""
    return jnp.broadcast_to(_in_dtype(gain_H, dt)[None, :], (SCALAR_ROWS, gain_H.shape[0]))


@jax.custom_vjp
def _rope(x_BTHK, cos_TK2, sin_TK2):
    return ROPE("fwd", x_BTHK, cos_TK2, sin_TK2)[0]


_rope.defvjp(lambda x, c, s: (_rope(x, c, s), (c, s)),
             lambda res, dy: (ROPE("bwd", dy, *res)[0], jnp.zeros_like(res[0]), jnp.zeros_like(res[1])))


def rope(x_BTHK: jax.Array, cos_TK2, sin_TK2) -> jax.Array:
    """Half-split RoPE (reference.rope); cos/sin [T, K/2] host constants, cast to x's dtype as the reference."""
    if direct("rope"):
        return ref.rope(x_BTHK, jnp.asarray(cos_TK2), jnp.asarray(sin_TK2))
    return _rope(x_BTHK, jnp.asarray(cos_TK2).astype(x_BTHK.dtype), jnp.asarray(sin_TK2).astype(x_BTHK.dtype))


@jax.custom_vjp
def _rope_gain(x_BTHK, cos_TK2, sin_TK2, g_PH):
    return ROPE_GAIN("fwd", x_BTHK, cos_TK2, sin_TK2, g_PH)[0]


def _rope_gain_vjp_bwd(res, dy_BTHK):
    x_BTHK, cos_TK2, sin_TK2, g_PH = res
    dx_BTHK, dg_TH = ROPE_GAIN("bwd", x_BTHK, cos_TK2, sin_TK2, g_PH, dy_BTHK)
    dg_PH = jnp.zeros_like(g_PH).at[0].set(jnp.sum(dg_TH, axis=0))  # g_PH is a broadcast: its rows' sum
    return dx_BTHK, jnp.zeros_like(cos_TK2), jnp.zeros_like(sin_TK2), dg_PH


_rope_gain.defvjp(lambda x, c, s, g: (_rope_gain(x, c, s, g), (x, c, s, g)), _rope_gain_vjp_bwd)


def rope_gain(x_BTHK: jax.Array, cos_TK2, sin_TK2, gain_H: jax.Array) -> jax.Array:
    """rope(x) * gain per head (reference.rope_gain), the query side of attention as one op: the kernel
    applies the gain on chip, no extra HBM pass (kernels_nki/rope.py)."""
    if direct("rope_gain"):
        return ref.rope_gain(x_BTHK, jnp.asarray(cos_TK2), jnp.asarray(sin_TK2), gain_H)
    dt = x_BTHK.dtype
    return _rope_gain(x_BTHK, jnp.asarray(cos_TK2).astype(dt), jnp.asarray(sin_TK2).astype(dt), _gain_PH(gain_H, dt))


def _fold(w, s_O, dt):
    """w diag(s) in dt: a residual branch's per-channel scale folded into its last weight's columns (fp32
    product, one rounding), so that the kernel's epilogue is a plain add: x + s * (a w) = x + a (w diag s)."""
    return (w.astype(jnp.float32) * s_O.astype(jnp.float32)).astype(dt)


def _unfold(dwf, w, s_O):
    """(dw, ds) from the fp32 gradient of the folded weight dwf = a^T dy (the kernel's, summed over the tokens):
    dw = dwf s and ds = sum over rows of w * dwf, which equals sum over tokens of dy * (a w) in fp32 without
    a pass over the tokens."""
    dwf, s32 = dwf.astype(jnp.float32), s_O.astype(jnp.float32)
    return (dwf * s32).astype(w.dtype), jnp.sum(dwf * w.astype(jnp.float32), axis=0).astype(s_O.dtype)


@jax.custom_vjp
def _norm_mlp(x_ND, w_fc_DF, w_proj_FD, s_D):
    return _norm_mlp_vjp_fwd(x_ND, w_fc_DF, w_proj_FD, s_D)[0]


def _norm_mlp_vjp_fwd(x_ND, w_fc_DF, w_proj_FD, s_D):
    wfc, wpf = w_fc_DF.astype(x_ND.dtype), _fold(w_proj_FD, s_D, x_ND.dtype)
    y_ND, inv_N1, rT_FN = NORM_MLP("fwd", x_ND, wfc, wpf)  # rT = relu(h)^T, stored: see kernels_nki/mlp.py
    return y_ND, (x_ND, wfc, wpf, inv_N1, rT_FN, w_fc_DF, w_proj_FD, s_D)


def _norm_mlp_vjp_bwd(res, dy_ND):
    x_ND, wfc, wpf, inv_N1, rT_FN, w_fc_DF, w_proj_FD, s_D = res
    dx_ND, dwfc, dwpf = NORM_MLP("bwd", x_ND, wfc, wpf, inv_N1, rT_FN, dy_ND)  # dx includes dy (the residual)
    return (dx_ND, dwfc.astype(w_fc_DF.dtype), *_unfold(dwpf, w_proj_FD, s_D))


_norm_mlp.defvjp(_norm_mlp_vjp_fwd, _norm_mlp_vjp_bwd)


def norm_mlp(x: jax.Array, w_fc_DF: jax.Array, w_proj_FD: jax.Array, scale_D: jax.Array) -> jax.Array:
    """x + scale * relu(rms_norm(x) W_fc)^2 W_proj for x of any leading shape [..., D]: the block's MLP branch
    with its pre-norm and its scaled residual add (kernels_nki/mlp.py). The reference path computes what
    the unfused block did (weights and scale cast to x's dtype at use, the product and add in x's dtype);
    the kernel path folds the scale into W_proj's columns (`_fold`) and adds x as y leaves PSUM."""
    D = x.shape[-1]
    if direct("norm_mlp"):
        return x + scale_D.astype(x.dtype) * ref.norm_mlp(x, w_fc_DF, w_proj_FD)
    return _norm_mlp(x.reshape(-1, D), w_fc_DF, w_proj_FD, scale_D).reshape(x.shape)


@jax.custom_vjp
def _embed(ids_N, emb_VD):
    return EMBED("fwd", ids_N, emb_VD)[0]


_embed.defvjp(lambda ids, emb: (_embed(ids, emb), (ids, emb)),
              lambda res, dy: (None, EMBED("bwd", res[0], res[1], dy)[0].astype(res[1].dtype)))


def embed(ids_N: jax.Array, emb_VD: jax.Array) -> jax.Array:
    """emb_VD[ids] for ids of any shape (reference.embed); the backward scatter-adds duplicates."""
    out = _embed(ids_N.reshape(-1).astype(jnp.int32), emb_VD)
    return out.reshape(ids_N.shape + (emb_VD.shape[1],))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _head_loss(x_ND, emb_VD, tg_N1, ids_NS, vals_NS, softcap):
    return HEAD_LOSS("fwd", x_ND, emb_VD, tg_N1, ids_NS, vals_NS, softcap=softcap)[0]


def _head_loss_vjp_fwd(x_ND, emb_VD, tg_N1, ids_NS, vals_NS, softcap):
    loss_N1, lse_N1 = HEAD_LOSS("fwd", x_ND, emb_VD, tg_N1, ids_NS, vals_NS, softcap=softcap)
    return loss_N1, (x_ND, emb_VD, tg_N1, ids_NS, vals_NS, lse_N1)


def _head_loss_vjp_bwd(softcap, res, dloss_N1):
    grads = HEAD_LOSS("bwd", *res, dloss_N1.astype(jnp.float32), softcap=softcap)
    dvals = grads[2] if len(grads) == 3 else jnp.zeros_like(res[4])
    return grads[0], grads[1], None, None, dvals


_head_loss.defvjp(_head_loss_vjp_fwd, _head_loss_vjp_bwd)


def head_loss(x_ND, emb_VD, targets_N, softcap, bias_ids_NS=None, bias_vals_NS=None) -> jax.Array:
    """Per-token fp32 cross-entropy of softcapped tied logits plus an optional sparse bias (reference.head_loss)."""
    if direct("head_loss"):
        return ref.head_loss(x_ND, emb_VD.astype(x_ND.dtype), targets_N, softcap, bias_ids_NS, bias_vals_NS)
    N = x_ND.shape[0]
    if bias_ids_NS is None:  # S = 0 sources; the kernel adapter above gives the kernel a valid shape
        bias_ids_NS, bias_vals_NS = jnp.zeros((N, 0), jnp.int32), jnp.zeros((N, 0), jnp.float32)
    loss_N1 = _head_loss(x_ND, emb_VD.astype(x_ND.dtype), targets_N.reshape(N, 1).astype(jnp.int32),
                         bias_ids_NS.astype(jnp.int32), bias_vals_NS.astype(jnp.float32), float(softcap))
    return loss_N1[:, 0]


@jax.custom_vjp
def _resid_projection(x_NI, w_IO, s_O, r_NO):
    return _resid_projection_vjp_fwd(x_NI, w_IO, s_O, r_NO)[0]


def _resid_projection_vjp_fwd(x_NI, w_IO, s_O, r_NO):
    wf = _fold(w_IO, s_O, x_NI.dtype)
    return PROJECTION("fwd", x_NI, wf, r_NO)[0], (x_NI, wf, w_IO, s_O)


def _resid_projection_vjp_bwd(res, dy_NO):
    x_NI, wf, w_IO, s_O = res
    dx_NI, dwf = PROJECTION("bwd", x_NI, wf, dy_NO)  # dwf summed over the tokens in fp32
    return (dx_NI, *_unfold(dwf, w_IO, s_O), dy_NO)  # the residual's cotangent is dy itself: no pass


_resid_projection.defvjp(_resid_projection_vjp_fwd, _resid_projection_vjp_bwd)


@jax.custom_vjp
def _norm_projection(x_NI, w_IO):
    return NORM_PROJECTION("fwd", x_NI, w_IO)[0]


def _norm_projection_vjp_fwd(x_NI, w_IO):
    y_NO, inv_N1 = NORM_PROJECTION("fwd", x_NI, w_IO)
    return y_NO, (x_NI, w_IO, inv_N1)


def _norm_projection_vjp_bwd(res, dy_NO):
    dx_NI, dw_IO = NORM_PROJECTION("bwd", *res, dy_NO)  # dw summed over the tokens in fp32
    return dx_NI, dw_IO.astype(res[1].dtype)


_norm_projection.defvjp(_norm_projection_vjp_fwd, _norm_projection_vjp_bwd)


def _qkv_reference(x, w_q, w_k, w_v):
    """(xn w_q, xn w_k, xn w_v), xn = rms_norm(x), the weights cast to x's dtype: the unfused model's."""
    xn, dt = ref.rms_norm(x), x.dtype
    return xn @ w_q.astype(dt), xn @ w_k.astype(dt), xn @ w_v.astype(dt)


def _split_qkv(y, w_q, w_k, w_v):
    """y [..., O_q + O_k + O_v] of the fused [I, O_q + O_k + O_v] weight -> (q, k, v)."""
    oq, ok = w_q.shape[1], w_k.shape[1]
    return y[..., :oq], y[..., oq:oq + ok], y[..., oq + ok:]


def norm_qkv_projection(x, w_q, w_k, w_v):
    """(xn w_q, xn w_k, xn w_v) with xn = rms_norm(x): the block's pre-attention RMSNorm fused into the
    q/k/v projection, the weights cast to x's dtype at use. On a kernel the three run as one
    [I, O_q + O_k + O_v] `norm_projection` (kernels_nki/projection.py); the weights stay separate
    parameters (Muon updates each matrix on its own) and each gets its slice of the fp32 dw."""
    if direct("norm_projection"):
        return _qkv_reference(x, w_q, w_k, w_v)
    dt, I = x.dtype, x.shape[-1]
    w = jnp.concatenate([w_q.astype(dt), w_k.astype(dt), w_v.astype(dt)], axis=1)
    return _split_qkv(_norm_projection(x.reshape(-1, I), w).reshape(x.shape[:-1] + (w.shape[1],)), w_q, w_k, w_v)


@jax.custom_vjp
def _mix_norm_projection(x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I):
    return MIX_NORM_PROJECTION("fwd", x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I)[:2]


def _mix_norm_projection_vjp_fwd(x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I):
    x_mixed, y_NO, inv_N1 = MIX_NORM_PROJECTION("fwd", x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I)
    return (x_mixed, y_NO), (x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, inv_N1)  # the kernel recomputes x


def _mix_norm_projection_vjp_bwd(res, cotangents):
    dxo_NI, dy_NO = cotangents
    dx, dx0, dmix, dw, *skip = MIX_NORM_PROJECTION("bwd", *res, dxo_NI, dy_NO)  # dmix, dw: fp32 token sums
    dskip, dsw = skip or (jnp.zeros_like(res[4]), jnp.zeros_like(res[5]))
    return dx, dx0, dmix, dw.astype(res[3].dtype), dskip, dsw


_mix_norm_projection.defvjp(_mix_norm_projection_vjp_fwd, _mix_norm_projection_vjp_bwd)


def mix_norm_qkv_projection(x_in, x0, mix_2D, w_q, w_k, w_v, skip=None, skip_w=None):
    """(x, q, k, v) with x = mix[0] * x_in' + mix[1] * x0, x_in' = x_in + skip_w * skip (a decoder block's U-Net
    skip add; none when skip is None), and q/k/v = norm_qkv_projection(x, ...): the block's residual mix
    fused into its q/k/v projection; x is the residual stream the block continues with. The weights are
    cast to x_in's dtype at use, as the unfused model did (reference.resid_mix). On a kernel it is one
    `mix_norm_projection` call (kernels_nki/projection.py) that writes x once and returns the gradients
    of the mix and skip weights as fp32 sums over the tokens."""
    dt = x_in.dtype
    if direct("mix_norm_projection"):  # exactly the unfused model's expressions, under plain autodiff
        if skip is not None:
            x_in = x_in + skip_w.astype(dt) * skip
        mix = mix_2D.astype(dt)
        x = mix[0] * x_in + mix[1] * x0
        return (x, *_qkv_reference(x, w_q, w_k, w_v))
    D = x_in.shape[-1]
    rows = lambda t: t.reshape(-1, D)
    if skip is None:  # width 0: no skip (the kernel adapter above passes None)
        skip_NI, sw_1I = jnp.zeros((rows(x_in).shape[0], 0), dt), jnp.zeros((1, 0), jnp.float32)
    else:
        skip_NI, sw_1I = rows(skip), _in_dtype(skip_w, dt).reshape(1, D)
    w = jnp.concatenate([w_q.astype(dt), w_k.astype(dt), w_v.astype(dt)], axis=1)
    x_NI, y_NO = _mix_norm_projection(rows(x_in), rows(x0), _in_dtype(mix_2D, dt), w, skip_NI, sw_1I)
    return (x_NI.reshape(x_in.shape), *_split_qkv(y_NO.reshape(x_in.shape[:-1] + (w.shape[1],)), w_q, w_k, w_v))


def out_projection(x, w_IO, resid, scale_O):
    """resid + scale * (x w): the attention's output projection with the block's scaled residual add. The
    reference path computes what the unfused block did (w and scale cast to x's dtype at use, the product
    and add in x's dtype); the kernel path folds the scale into w's columns (`_fold`) and adds the residual
    as y leaves PSUM (kernels_nki/projection.py)."""
    if direct("projection"):
        return resid + scale_O.astype(resid.dtype) * (x @ w_IO.astype(x.dtype))
    I, O = x.shape[-1], w_IO.shape[1]
    return _resid_projection(x.reshape(-1, I), w_IO, scale_O, resid.reshape(-1, O)).reshape(resid.shape)


# ----------------------------------------------------------------------------- fused optimizer updates

SCALAR_ROWS = 128  # runtime scalars are passed broadcast over the partitions, as [128, K] fp32


def scalars_PK(*values) -> jax.Array:
    """Runtime scalars as the kernels take them: [128, K] fp32, every row the same."""
    row = jnp.stack([jnp.asarray(v, jnp.float32) for v in values])
    return jnp.broadcast_to(row, (SCALAR_ROWS, row.shape[0]))


def adam_update(p, g, m, v, scal_P4, *, b1: float, b2: float, eps: float, weight_decay: float = 0.0):
    """(p', m', v') of one parameter of any shape (the kernel sees it flattened); reference.adam_update."""
    return ADAM("fwd", p, g, m, v, scal_P4, b1=float(b1), b2=float(b2), eps=float(eps),
                weight_decay=float(weight_decay))


def muon_update(p_IO, g_IO, buf_IO, scal_P2, *, ns_steps: int, ns_dtype: str):
    """(p', buf') of one [in, out] matrix; reference.muon_update."""
    return MUON("fwd", p_IO, g_IO, buf_IO, scal_P2, ns_steps=int(ns_steps), ns_dtype=str(ns_dtype))
