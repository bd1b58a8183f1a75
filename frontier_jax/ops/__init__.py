"""The hot-path ops the model and the fused optimizer call (and only through here), declared in this package's
`__init__` (the op table below); beside it the rules of the kernel table and the call paths (`dispatch`), an
op's custom_vjp generated from its `Vjp` (`vjp`), the pure-JAX reference of every op, the kernels' spec
(`reference`), the host's choice of the attention forward's softmax shift (`softmax_shift`) and the ops no
production path calls (`experimental`). A module here imports `frontier_jax.config`, `frontier_jax.errors` and
`kernels_nki` only: never the model, the optimizer or anything that runs them.

Every kernel-backed op is declared the same way, once, below: `dispatch.declare(name, forward
reference, backward reference, static parameters, kernel adapter, vjp)` (the references live in
`frontier_jax.ops.reference`, the kernel in `kernels_nki.registry.KERNELS[name]`). A differentiable op's
`vjp` (`frontier_jax.ops.vjp.Vjp`) names what its forward saves and what its backward returns; the op's
`apply` is the `jax.custom_vjp` generated from it, whose forward and backward each run one direction of
the declared op: the NKI kernel on Neuron, the reference elsewhere, or the kernel source under the
emulator in tests (`frontier_jax.ops.dispatch` has the rules and the AWS documents behind them). Each
public function is `@public(op, reference)`: when the op's row says "reference" it calls the
reference directly under plain autodiff (`dispatch.direct`); its body is the kernel path, the
genuine adapters only (reshapes to rows, dtype casts, the scale folded into a weight, the gain
broadcast over the partitions). Ops no production path calls live in `frontier_jax.ops.experimental`.

The model's switches (the recipe, docs/recipe.md) are keyword arguments of the ops they change. The kernels
compute them: the LeakyReLU slope is the MLP kernel's compile-time constant, XSA the attention kernel's epilogue
(both directions), and the kernel path adapts the rest exactly (the LN-scale factor folded into the projection's
and the MLP's first weight; partial RoPE as a fixed permutation of q's and k's head dims with cos = 1, sin = 0 at
the passed-through pairs); a setting no kernel computes (a negative slope) is an op's declared `Switch`: for a
model that sets it the kernel table shows the op as "reference" with the switch named, strict mode fails naming
it, and the op's calls run its reference. BigramHash, SmearGate and the value embeddings are not ops: small XLA
computations of the model (frontier_jax.model) on every platform, which the trn1 step estimate prices by name
(frontier_jax.neuron.kernel_report).

The kernel table's API is re-exported here: `configure`, `kernel_table`, `format_kernel_table`, `run_log_table`,
`emulated`, `through_primitives`, `switch_fallbacks`, `KernelRow`, `KernelUnavailableError`, `Switch`, `OPS`,
`FUSED_OPTIMIZER_OPS`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from frontier_jax.ops import reference as ref
from frontier_jax.ops.softmax_shift import (  # noqa: F401 (re-exported: the trainer and tests use ops.*)
    SHIFT_LIMIT, SHIFT_MARGIN, SHIFT_MAX_T, _ATTENTION, attention_forward, attention_forward_kind, bounded_shift_valid,
    score_bound)
from frontier_jax.ops.dispatch import (
    MODES, KernelAdapter, KernelRow, KernelUnavailableError, Switch, configure, declare, direct, emulated,
    format_kernel_table, kernel_primitives, kernel_table, public, run_log_table, switch_fallbacks, through_primitives)
from frontier_jax.ops.vjp import Vjp

__all__ = [
    "FUSED_OPTIMIZER_OPS", "unused_ops", "MODES", "OPS", "KernelRow", "KernelUnavailableError", "Switch",
    "configure", "emulated", "switch_fallbacks",
    "format_kernel_table", "kernel_table", "run_log_table", "through_primitives",
    "rms_norm", "qk_attention", "norm_mlp", "embed", "head_loss", "mix_norm_qkv_projection",
    "out_projection", "adam_update", "muon_update", "scalars_PK", "kernel_primitives",
    "attention_forward", "score_bound", "bounded_shift_valid", "attention_forward_kind", "attention_variants_differ",
]


def _head_loss_kernel_args(which, arrays):
    """A run without a sparse bias has S = 0 sources; a zero-size kernel operand is invalid (see
    frontier_jax.ops.dispatch), so the kernel gets None for both bias operands (its no-bias form, which
    returns no d(bias values))."""
    x_ND, emb_VD, tg_N1, ids_NS, vals_NS, *rest = arrays
    return arrays if ids_NS.shape[1] else (x_ND, emb_VD, tg_N1, None, None, *rest)


def _mix_kernel_args(which, arrays):
    """No skip (a decoder block without one, every encoder block) is a skip of width 0 in the primitive; the
    kernel gets None for skip_NI and sw_1I instead (no zero-size operand: frontier_jax.ops.dispatch)."""
    x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, *rest = arrays
    return arrays if skip_NI.shape[1] else (x_NI, x0_NI, mix_2I, w_IO, None, None, *rest)


def _attention_kernel_args(which, arrays):
    """Without XSA the backward's xc is empty ([B, H, T, 0]): the kernel gets None (no zero-size operand,
    frontier_jax.ops.dispatch)."""
    if which == "bwd" and arrays[14].shape[-1] == 0:
        return arrays[:14] + (None,) + arrays[15:]
    return arrays


def _attention_kernel_outs(which, outs, arrays):
    """The forward kernel without XSA returns no xc: the primitive's is empty, [B, H, T, 0]."""
    if which == "fwd" and len(outs) == 8:
        B, H, T, _ = outs[1].shape
        return outs + (np.zeros((B, H, T, 0), np.float32),)
    return outs


def _adam_kernel_args(which, arrays):
    """The Adam kernel takes flat [N] tensors (the primitive keeps the parameter's shape; reshapes are free)."""
    return (*(x.reshape(-1) for x in arrays[:4]), arrays[4])


def _adam_kernel_outs(which, outs, arrays):
    return tuple(o.reshape(arrays[0].shape) for o in outs)


_UNFUSED = "optim.fused=False (the optax chain runs)"


def gain_rows(dg_MH, g_PH):
    """The cotangent of g_PH, a per-head gain broadcast over the partitions (`gain_PH`): the kernel's
    fp32 partials [M, H] summed, in row 0."""
    return jnp.zeros_like(g_PH).at[0].set(jnp.sum(dg_MH, axis=0))


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


def _unfolded(d, dwf, w, s):
    """{w: dw, s: ds}, the cotangents of a folded weight's two factors from its fp32 gradient d[dwf] (`_unfold`)."""
    return dict(zip((w, s), _unfold(d[dwf], d[w], d[s])))


def _mlp_operands(x, w_fc, w_proj, s):
    """norm_mlp's kernel operands: W_fc in x's dtype, the scale folded into W_proj (`_fold`)."""
    return x, w_fc.astype(x.dtype), _fold(w_proj, s, x.dtype)


def _ln_folded(w, ln_scale: float):
    """w * ln_scale in w's dtype (fp32 product, one rounding): a sublayer's LN-scale factor folded into its first
    weight, rms_norm(x) * s @ w = rms_norm(x) @ (s w); factor 1: w itself. Autodiff carries the factor to dw."""
    return w if ln_scale == 1.0 else (w.astype(jnp.float32) * ln_scale).astype(w.dtype)


def _projection_operands(x, w, s, r):
    """projection's kernel operands: the scale folded into w (`_fold`)."""
    return x, _fold(w, s, x.dtype), r


# ----------------------------------------------------------------------------- the declarations (table order)
# Each Vjp reads "forward operands -> outputs", "backward operands -> outputs": the forward saves the
# backward's operands that are not cotangents (d<output>); an argument without a d<arg> gets a zero
# cotangent (None for integers); every cotangent is cast to its argument's dtype (frontier_jax.ops.vjp).
RMS_NORM = declare("rms_norm", ref.rms_norm_fwd, ref.rms_norm_bwd,
                   vjp=Vjp("x -> y, inv", "x, inv, dy -> dx"))
# saved: the inputs, o, lse and the forward's normed, rotated q / k with their inverse RMS and transposes
# (the kernel's backward reads them instead of recomputing the norm and the rotation), and with XSA each row's
# o . u before it (xc; without, an empty [B, H, T, 0] the kernel never sees); cos, sin: zero
QK_ATTENTION = declare(
    "qk_attention", ref.qk_attention_fwd, ref.qk_attention_bwd, static=("exact_max", "xsa_on"),
    adapter=KernelAdapter(_attention_kernel_args, _attention_kernel_outs),
    vjp=Vjp("q, k, v, cos, sin, g -> o, lse, qg, qinv, kr, kinv, qgT, krT, xc",
            "q, k, v, cos, sin, g, o, lse, qg, qinv, kr, kinv, qgT, krT, xc, do -> dq, dk, dv, dg",
            grads=lambda d: {"g": gain_rows(d["dg"][..., 0], d["g"])}, forward_only="exact_max"))
# rT = act(h)^T, saved (docs/kernels/mlp.md says why); dx includes dy (the residual); w_proj and s from the
# folded weight's fp32 gradient (`_unfold`); a negative slope < 0 is the one setting the kernel cannot compute
NORM_MLP = declare(
    "norm_mlp", ref.resid_norm_mlp_fwd, ref.resid_norm_mlp_bwd, static=("negative_slope",),
    switches=(Switch("mlp_negative_slope", "negative_slope", lambda slope: slope >= 0.0,
                     "the kernel reads the activation's sign off the stored LeakyReLU(h), which needs a slope >= 0"),),
    vjp=Vjp("x, w_fc, wpf -> y, inv, rT", "x, w_fc, wpf, inv, rT, dy -> dx, dw_fc, dwpf",
            args="x, w_fc, w_proj, s", prepare=_mlp_operands, keep="w_proj, s",
            grads=lambda d: _unfolded(d, "dwpf", "w_proj", "s")))
EMBED = declare("embed", ref.embed_fwd, ref.embed_bwd,
                vjp=Vjp("ids, emb -> y", "ids, emb, dy -> demb"))  # demb: a scatter-add, fp32
# no dvals from the kernel's no-bias form (S = 0): zero
HEAD_LOSS = declare("head_loss", ref.head_loss_fwd, ref.head_loss_bwd, static=("softcap",),
                    adapter=KernelAdapter(_head_loss_kernel_args),
                    vjp=Vjp("x, emb, tg, ids, vals -> loss, lse",
                            "x, emb, tg, ids, vals, lse, dloss -> dx, demb, dvals"))
# the residual r is not saved: its cotangent is dy itself (no pass); w and s from the folded weight's
PROJECTION = declare(
    "projection", ref.resid_projection_fwd, ref.projection_bwd,
    vjp=Vjp("x, wf, r -> y", "x, wf, dy -> dx, dwf", args="x, w, s, r", prepare=_projection_operands,
            keep="w, s", grads=lambda d: {**_unfolded(d, "dwf", "w", "s"), "r": d["dy"]}))
# the kernel recomputes x; q, k and v leave as three outputs (widths: their columns), their cotangents come
# back as three; no skip (width 0): no dskip, dsw from the kernel, zero
MIX_NORM_PROJECTION = declare(
    "mix_norm_projection", ref.mix_norm_projection_fwd, ref.mix_norm_projection_bwd, static=("widths",),
    adapter=KernelAdapter(_mix_kernel_args),
    vjp=Vjp("x, x0, mix, w, skip, sw -> xo, q, k, v, inv",
            "x, x0, mix, w, skip, sw, inv, dxo, dq, dk, dv -> dx, dx0, dmix, dw, dskip, dsw", forward_only="widths"))
ADAM = declare("adam_update", ref.adam_update, static=("b1", "b2", "eps", "weight_decay"),
               adapter=KernelAdapter(_adam_kernel_args, _adam_kernel_outs), unused_reason=_UNFUSED)
MUON = declare("muon_update", ref.muon_update, static=("ns_steps", "ns_dtype", "weight_decay", "shape_scale"),
               unused_reason=_UNFUSED)

OPS = tuple(s.name for s in (RMS_NORM, QK_ATTENTION, NORM_MLP, EMBED, HEAD_LOSS, PROJECTION, MIX_NORM_PROJECTION,
                             ADAM, MUON))
FUSED_OPTIMIZER_OPS = frozenset({ADAM.name, MUON.name})


def unused_ops(fused_optimizer: bool) -> frozenset:
    """What a training run never calls: the fused updates when optim.fused is off (the kernel table marks
    them "unused" with the reason, and strict mode does not require them; the experimental kernels are
    always listed unused, `kernels_nki.registry`)."""
    return frozenset() if fused_optimizer else FUSED_OPTIMIZER_OPS


# ----------------------------------------------------------------------------- model ops


@public(RMS_NORM, ref.rms_norm)
def rms_norm(x: jax.Array) -> jax.Array:
    """Weightless RMSNorm over the last axis (fp32 math, input dtype out); any leading shape."""
    D = x.shape[-1]
    return RMS_NORM.apply(x.reshape(-1, D)).reshape(x.shape)


def attention_variants_differ() -> bool:
    """Whether the two forwards are different programs in this process (a kernel or its emulator runs
    qk_attention); on the reference path both trace to the same computation."""
    return not direct("qk_attention")


def _qk_attention_reference(q_BTHK, k_BTGK, v_BTGK, cos_TR2, sin_TR2, gain_H, *, xsa: bool = False):
    return ref.qk_attention(q_BTHK, k_BTGK, v_BTGK, jnp.asarray(cos_TR2), jnp.asarray(sin_TR2), gain_H, xsa)


def rope_permutation(K: int, R: int) -> list[tuple[int, int]]:
    """Partial RoPE (dim j paired with j + R/2 for j < R/2, dims >= R passed through) as the whole-head rotation
    (j paired with j + K/2): the [start, stop) ranges of the original head dims that, concatenated, give the
    permuted head. Positions j < R/2 hold dims j and their partners (position j + K/2) dims j + R/2; the other
    pairs hold the passed-through dims, which a cos = 1, sin = 0 table leaves exactly as they are (x * 1 + y * 0
    = x). q . k, the per-head RMS norm and the per-head gain do not change under a permutation applied to both
    q's and k's head dims; v and the output keep the natural order."""
    P = (K - R) // 2
    return [(0, R // 2), (R, R + P), (R // 2, R), (R + P, K)]


def _whole_head_rope(q_BTHK, k_BTGK, cos_TR2, sin_TR2):
    """(q, k, cos, sin) for the whole-head rotation kernel that compute a partial RoPE's rotation exactly
    (`rope_permutation`): q's and k's head dims permuted, the tables [T, K/2] with cos 1 and sin 0 past R/2."""
    K, R = q_BTHK.shape[-1], 2 * cos_TR2.shape[-1]
    if R == K:
        return q_BTHK, k_BTGK, cos_TR2, sin_TR2
    perm = lambda x: jnp.concatenate([x[..., a:b] for a, b in rope_permutation(K, R)], axis=-1)
    T, fill = cos_TR2.shape[0], (K - R) // 2
    cos = jnp.concatenate([jnp.asarray(cos_TR2, jnp.float32), jnp.ones((T, fill), jnp.float32)], axis=1)
    sin = jnp.concatenate([jnp.asarray(sin_TR2, jnp.float32), jnp.zeros((T, fill), jnp.float32)], axis=1)
    return perm(q_BTHK), perm(k_BTGK), cos, sin


@public(QK_ATTENTION, _qk_attention_reference)
def qk_attention(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array, cos_TR2, sin_TR2,
                 gain_H: jax.Array, *, xsa: bool = False) -> jax.Array:
    """The model's attention on the raw projections (reference.qk_attention): QK-norm, RoPE, the query
    gain and causal GQA attention as one op, so that q and k are normed and rotated on chip inside the
    attention kernel (kernels_nki/attention.py) instead of by three HBM-bound kernels. The softmax shift
    is chosen at trace time (`attention_forward`); sequences longer than SHIFT_MAX_T always take the
    exact forward. Tables [T, R/2] with R < K: partial RoPE, which the kernel path computes with the whole-head
    rotation on permuted heads (`rope_permutation`); `xsa`: XSA (reference.xsa), the kernel's epilogue (a static
    parameter of both directions)."""
    dt, T = q_BTHK.dtype, q_BTHK.shape[1]  # the reference casts cos/sin and the gain to dt
    q_BTHK, k_BTGK, cos_TK2, sin_TK2 = _whole_head_rope(q_BTHK, k_BTGK, cos_TR2, sin_TR2)
    return QK_ATTENTION.apply(q_BTHK, k_BTGK.astype(dt), v_BTGK.astype(dt), _in_dtype(cos_TK2, dt),
                              _in_dtype(sin_TK2, dt), gain_PH(gain_H, dt),
                              exact_max=_ATTENTION["exact_max"] or T > SHIFT_MAX_T, xsa_on=bool(xsa))


def _in_dtype(t, dt) -> jax.Array:
    """t's values rounded to dt (as the reference casts them), held in fp32: how the kernels take them."""
    return jnp.asarray(t).astype(dt).astype(jnp.float32)


def gain_PH(gain_H, dt) -> jax.Array:
    """A per-head gain as the kernels take it: rounded to dt, fp32, broadcast over the 128 partitions."""
    return jnp.broadcast_to(_in_dtype(gain_H, dt)[None, :], (SCALAR_ROWS, gain_H.shape[0]))


def _norm_mlp_reference(x, w_fc_DF, w_proj_FD, scale_D, *, negative_slope: float = 0.0, ln_scale: float = 1.0):
    """What the unfused block computed: weights and scale cast to x's dtype at use, product and add in it."""
    return x + scale_D.astype(x.dtype) * ref.norm_mlp(x, w_fc_DF, w_proj_FD, negative_slope, ln_scale)


@public(NORM_MLP, _norm_mlp_reference)
def norm_mlp(x: jax.Array, w_fc_DF: jax.Array, w_proj_FD: jax.Array, scale_D: jax.Array, *,
             negative_slope: float = 0.0, ln_scale: float = 1.0) -> jax.Array:
    """x + scale * act(rms_norm(x) * ln_scale W_fc)^2 W_proj for x of any leading shape [..., D], act =
    LeakyReLU(negative_slope) (0: relu): the block's MLP half with its pre-norm and its scaled residual add
    (kernels_nki/mlp.py; a slope < 0 is the op's declared switch). The kernel path folds ln_scale into W_fc
    (`_ln_folded`) and the scale into W_proj's columns (`_fold`) and adds x as y leaves PSUM."""
    D = x.shape[-1]
    return NORM_MLP.apply(x.reshape(-1, D), _ln_folded(w_fc_DF, ln_scale), w_proj_FD, scale_D,
                          negative_slope=float(negative_slope)).reshape(x.shape)


def embed(ids_N: jax.Array, emb_VD: jax.Array) -> jax.Array:
    """emb_VD[ids] for ids of any shape (reference.embed); the backward scatter-adds duplicates. It always
    runs its declared forward and backward (no direct path)."""
    out = EMBED.apply(ids_N.reshape(-1).astype(jnp.int32), emb_VD)
    return out.reshape(ids_N.shape + (emb_VD.shape[1],))


def _head_loss_reference(x_ND, emb_VD, targets_N, softcap, bias_ids_NS=None, bias_vals_NS=None):
    return ref.head_loss(x_ND, emb_VD.astype(x_ND.dtype), targets_N, softcap, bias_ids_NS, bias_vals_NS)


@public(HEAD_LOSS, _head_loss_reference)
def head_loss(x_ND, emb_VD, targets_N, softcap, bias_ids_NS=None, bias_vals_NS=None) -> jax.Array:
    """Per-token fp32 cross-entropy of softcapped tied logits plus an optional sparse bias (reference.head_loss)."""
    N = x_ND.shape[0]
    if bias_ids_NS is None:  # S = 0 sources; the kernel adapter above gives the kernel a valid shape
        bias_ids_NS, bias_vals_NS = jnp.zeros((N, 0), jnp.int32), jnp.zeros((N, 0), jnp.float32)
    loss_N1 = HEAD_LOSS.apply(x_ND, emb_VD.astype(x_ND.dtype), targets_N.reshape(N, 1).astype(jnp.int32),
                              bias_ids_NS.astype(jnp.int32), bias_vals_NS.astype(jnp.float32), softcap=float(softcap))
    return loss_N1[:, 0]


def qkv_reference(x, w_q, w_k, w_v, ln_scale: float = 1.0):
    """(xn w_q, xn w_k, xn w_v), xn = rms_norm(x) * ln_scale, the weights cast to x's dtype: the unfused model's."""
    xn, dt = ref.ln_scaled(ref.rms_norm(x), ln_scale), x.dtype
    return xn @ w_q.astype(dt), xn @ w_k.astype(dt), xn @ w_v.astype(dt)


def _mix_reference(x_in, x0, mix_2D, w_q, w_k, w_v, skip=None, skip_w=None, *, ln_scale: float = 1.0):
    """Exactly the unfused model's expressions (the skip add, resid_mix in x_in's dtype, the q/k/v projection)."""
    dt = x_in.dtype
    if skip is not None:
        x_in = x_in + skip_w.astype(dt) * skip
    mix = mix_2D.astype(dt)
    x = mix[0] * x_in + mix[1] * x0
    return (x, *qkv_reference(x, w_q, w_k, w_v, ln_scale))


@public(MIX_NORM_PROJECTION, _mix_reference)
def mix_norm_qkv_projection(x_in, x0, mix_2D, w_q, w_k, w_v, skip=None, skip_w=None, *, ln_scale: float = 1.0):
    """(x, q, k, v) with x = mix[0] * x_in' + mix[1] * x0, x_in' = x_in + skip_w * skip (a decoder block's U-Net
    skip add; none when skip is None), and (q, k, v) = rms_norm(x) * ln_scale (w_q, w_k, w_v): the block's
    residual mix fused into its pre-attention norm and q/k/v projection; x is the residual stream the block
    continues with. The weights are cast to x_in's dtype at use, as the unfused model did (reference.resid_mix).
    On a kernel it is one `mix_norm_projection` call with q/k/v as one [I, O_q + O_k + O_v] weight
    (kernels_nki/projection/), ln_scale folded into it (`_ln_folded`), that writes x, q, k and v once each and
    returns the gradients of the mix and skip weights as fp32 sums over the tokens; each weight gets its slice of
    the fp32 dw."""
    dt, D = x_in.dtype, x_in.shape[-1]
    rows = lambda t: t.reshape(-1, D)
    if skip is None:  # width 0: no skip (the kernel adapter above passes None)
        skip_NI, sw_1I = jnp.zeros((rows(x_in).shape[0], 0), dt), jnp.zeros((1, 0), jnp.float32)
    else:
        skip_NI, sw_1I = rows(skip), _in_dtype(skip_w, dt).reshape(1, D)
    w = jnp.concatenate([_ln_folded(w.astype(jnp.float32), ln_scale).astype(dt) for w in (w_q, w_k, w_v)], axis=1)
    widths = (w_q.shape[1], w_k.shape[1], w_v.shape[1])
    outs = MIX_NORM_PROJECTION.apply(rows(x_in), rows(x0), _in_dtype(mix_2D, dt), w, skip_NI, sw_1I, widths=widths)
    lead = x_in.shape[:-1]
    return tuple(o.reshape(lead + (o.shape[-1],)) for o in outs)


def _out_projection_reference(x, w_IO, resid, scale_O):
    """What the unfused block computed: w and scale cast to x's dtype at use, product and add in it."""
    return resid + scale_O.astype(resid.dtype) * (x @ w_IO.astype(x.dtype))


@public(PROJECTION, _out_projection_reference)
def out_projection(x, w_IO, resid, scale_O):
    """resid + scale * (x w): the attention's output projection with the block's scaled residual add; the
    kernel path folds the scale into w's columns (`_fold`) and adds the residual as y leaves PSUM
    (kernels_nki/projection/)."""
    I, O = x.shape[-1], w_IO.shape[1]
    return PROJECTION.apply(x.reshape(-1, I), w_IO, scale_O, resid.reshape(-1, O)).reshape(resid.shape)


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


def muon_update(p_IO, g_IO, buf_IO, scal_P2, *, ns_steps: int, ns_dtype: str, weight_decay: float = 0.0,
                shape_scale: str = "update"):
    """(p', buf') of one [in, out] matrix, the momentum in buf's dtype (float32 or bfloat16); reference.muon_update."""
    return MUON("fwd", p_IO, g_IO, buf_IO, scal_P2, ns_steps=int(ns_steps), ns_dtype=str(ns_dtype),
                weight_decay=float(weight_decay), shape_scale=str(shape_scale))
