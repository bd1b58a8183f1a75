"""The hot-path ops the model calls (and only through here), and which implementation each one runs.

Dispatch. An op with an NKI kernel (see `kernels_nki.registry.KERNELS`) is a `jax.custom_vjp`
whose forward and backward each bind one JAX primitive (`frontier_<op>_fwd` / `_bwd`, with
abstract evaluation). The primitive's default lowering is the pure-JAX reference (every platform);
on Neuron, `configure` registers a `platform="neuron"` lowering that calls the NKI kernel. That
registration happens lazily, only after the platform is known to be "neuron", because registering
a lowering for a platform JAX does not know raises. The primitive's `kernel` parameter says whether
the kernel was chosen, so `--kernels reference` lowers to the reference on Neuron too. An op
without a kernel calls its reference directly. A test-only third path, `emulated([...])`, routes
an op's forward and backward through `jax.pure_callback` into the NumPy emulator running the real
kernel source.

The kernel table (`frontier_jax.kernel_table`, re-exported here: `kernel_table()`, one `KernelRow` per
op, impl nki|reference|emulated|unused and the reason) says which path every op takes in this process; `format_kernel_table` prints it at
start-up and `dataclasses.asdict` makes each row JSON for the run directory. `configure("strict")`
raises `KernelUnavailableError` naming every op that would not run its NKI kernel. Call
`configure` before tracing the step: the choice is made at trace time (`configure` and `emulated`
clear JAX's caches so no stale trace survives a change).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from frontier_jax import reference as ref
from frontier_jax.kernel_table import (
    FUSED_OPTIMIZER_OPS, MODES, OPS, KernelRow, KernelUnavailableError, _direct, _impl, _state, configure,
    emulated, format_kernel_table, kernel_table, through_primitives, unused_reason)
from kernels_nki import registry

_neuron_registered: set[str] = set()

__all__ = [  # the kernel table's API is re-exported here: callers use ops.configure, ops.kernel_table, ...
    "FUSED_OPTIMIZER_OPS", "MODES", "OPS", "KernelRow", "KernelUnavailableError", "configure", "emulated",
    "format_kernel_table", "kernel_table", "through_primitives", "unused_reason",
    "rms_norm", "rope", "causal_attention", "mlp", "embed", "head_loss",
]

# ----------------------------------------------------------------------------- primitive machinery


def _primitive(name: str, ref_impl, out_avals, params: tuple[str, ...] = ()):
    """A primitive whose default lowering (all platforms) is `ref_impl`; `kernel` (and `params`, the
    kernel's compile-time constants, e.g. head_loss's softcap) are static parameters."""
    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_abstract_eval(lambda *avals, kernel, **p: tuple(jax.core.ShapedArray(s, d) for s, d in out_avals(*avals, **p)))
    mlir.register_lowering(prim, mlir.lower_fun(ref_impl, multiple_results=True))
    eager = jax.jit(prim.bind, static_argnames=("kernel",) + tuple(params))
    prim.def_impl(lambda *args, kernel, **p: eager(*args, kernel=kernel, **p))
    prim.ref_impl = ref_impl
    return prim


def _register_neuron_lowering(op: str):
    """Add the platform="neuron" rule of `op`'s primitives: the NKI kernel when kernel=True."""
    if op in _neuron_registered:
        return
    if op in ("adam_update", "muon_update"):  # one primitive, no backward: registered by its module
        from frontier_jax import fused_optim

        fused_optim.register_neuron_lowering(op)
        _neuron_registered.add(op)
        return
    spec = registry.KERNELS[op]
    for prim, kernel_name in ((_PRIMS[op][0], spec.fwd), (_PRIMS[op][1], spec.bwd)):
        def nki_impl(*args, kernel, _prim=prim, _name=kernel_name, **params):
            if not kernel:
                return _prim.ref_impl(*args, kernel=False, **params)
            out = getattr(registry.load_nki(op), _name)(*args, **params)
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)

        mlir.register_lowering(prim, mlir.lower_fun(nki_impl, multiple_results=True), platform="neuron")
    _neuron_registered.add(op)


def _emulated_call(op: str, which: str, out_avals, *args, **params):
    from kernels_nki import emulator

    kernel_name = getattr(registry.KERNELS[op], which)
    structs = tuple(jax.ShapeDtypeStruct(s, d) for s, d in out_avals(*args, **params))

    def host(*arrays):
        outs, _ = emulator.run(getattr(registry.load_emulated(op), kernel_name), *arrays, **params)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return tuple(np.asarray(o, dtype=s.dtype) for o, s in zip(outs, structs))

    return jax.pure_callback(host, structs, *args)


def _call(op: str, which: str, *args, **params):
    prim = _PRIMS[op][0 if which == "fwd" else 1]
    out_avals = _AVALS[op][0 if which == "fwd" else 1]
    impl = _impl(op)
    if impl == "emulated":
        return tuple(_emulated_call(op, which, out_avals, *args, **params))
    return tuple(prim.bind(*args, kernel=impl == "nki", **params))


_state["register_neuron"] = _register_neuron_lowering


# ----------------------------------------------------------------------------- rms_norm


def _rms_fwd_ref(x_ND, *, kernel=False):
    x32 = x_ND.astype(jnp.float32)
    inv_N1 = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + ref.RMS_EPS)
    return (x32 * inv_N1).astype(x_ND.dtype), inv_N1


def _rms_bwd_ref(x_ND, inv_N1, dy_ND, *, kernel=False):
    x32, dy32 = x_ND.astype(jnp.float32), dy_ND.astype(jnp.float32)
    c_N1 = -jnp.mean(dy32 * x32, axis=-1, keepdims=True) * inv_N1 * inv_N1
    return ((dy32 + x32 * c_N1) * inv_N1).astype(x_ND.dtype),


def _rms_fwd_avals(x_ND):
    return ((x_ND.shape, x_ND.dtype), ((x_ND.shape[0], 1), jnp.float32))


def _rms_bwd_avals(x_ND, inv_N1, dy_ND):
    return ((x_ND.shape, x_ND.dtype),)


_PRIMS = {
    "rms_norm": (_primitive("frontier_rms_norm_fwd", _rms_fwd_ref, _rms_fwd_avals),
                 _primitive("frontier_rms_norm_bwd", _rms_bwd_ref, _rms_bwd_avals)),
}
_AVALS = {"rms_norm": (_rms_fwd_avals, _rms_bwd_avals)}


@jax.custom_vjp
def _rms_norm_ND(x_ND):
    return _call("rms_norm", "fwd", x_ND)[0]


def _rms_norm_vjp_fwd(x_ND):
    y_ND, inv_N1 = _call("rms_norm", "fwd", x_ND)
    return y_ND, (x_ND, inv_N1)


def _rms_norm_vjp_bwd(res, dy_ND):
    x_ND, inv_N1 = res
    return _call("rms_norm", "bwd", x_ND, inv_N1, dy_ND)


_rms_norm_ND.defvjp(_rms_norm_vjp_fwd, _rms_norm_vjp_bwd)


def rms_norm(x: jax.Array) -> jax.Array:
    """Weightless RMSNorm over the last axis (fp32 math, input dtype out); any leading shape."""
    if _direct("rms_norm"):
        return ref.rms_norm(x)
    D = x.shape[-1]
    return _rms_norm_ND(x.reshape(-1, D)).reshape(x.shape)


# ----------------------------------------------------------------------------- rope, mlp, embed, head_loss
# (NKI kernels part 2: kernels_nki/{rope,mlp,embedding,head_loss,attention}.py)


def _ops2_primitives():
    """Primitives of rope / mlp / embed / head_loss: (fwd, bwd) with the reference as default lowering."""
    f32 = jnp.float32

    def rope_fwd(x, c, s, *, kernel=False):
        return (ref.rope(x, c, s),)

    def rope_bwd(dy, c, s, *, kernel=False):
        return (ref.rope(dy, c, -s),)

    def mlp_fwd(x, w1, w2, *, kernel=False):
        return (ref.mlp(x, w1, w2),)

    def mlp_bwd(x, w1, w2, dy, *, kernel=False):
        return jax.vjp(ref.mlp, x, w1, w2)[1](dy)

    def embed_fwd(ids, emb, *, kernel=False):
        return (ref.embed(ids, emb),)

    def embed_bwd(ids, emb, dy, *, kernel=False):
        return (jnp.zeros(emb.shape, f32).at[ids].add(dy.astype(f32)),)

    def head_fwd(x, emb, tg, ids, vals, *, kernel=False, softcap):
        logits = ref.head_logits(x, emb, softcap)
        if ids.shape[1]:
            logits = ref.add_sparse_bias(logits, ids, vals)
        lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        return lse - jnp.take_along_axis(logits, tg, axis=-1), lse

    def head_bwd(x, emb, tg, ids, vals, lse, dloss, *, kernel=False, softcap):
        fn = lambda x, emb, vals: head_fwd(x, emb, tg, ids, vals, softcap=softcap)[0]
        dx, demb, dvals = jax.vjp(fn, x, emb, vals)[1](dloss)
        return (dx, demb, dvals) if ids.shape[1] else (dx, demb)

    def head_bwd_avals(x, emb, tg, ids, vals, lse, dloss, *, softcap):
        out = ((x.shape, x.dtype), (emb.shape, emb.dtype))
        return out + (((ids.shape, f32),) if ids.shape[1] else ())

    def attn_fwd(q, k, v, *, kernel=False):
        return ref.causal_attention_fwd(q, k, v)[:2]

    def attn_bwd(q, k, v, o, lse, do, *, kernel=False):
        return ref.causal_attention_bwd(q, k, v, o, lse, do)  # probabilities recomputed from lse

    def attn_fwd_avals(q, k, v):
        return (q.shape, q.dtype), ((q.shape[0], q.shape[2], q.shape[1], 1), f32)  # o, lse [B, H, T, 1]

    table = {
        "causal_attention": ((attn_fwd, attn_fwd_avals),
                             (attn_bwd, lambda q, k, v, o, lse, do: ((q.shape, q.dtype), (k.shape, k.dtype),
                                                                     (v.shape, v.dtype))), ()),
        "rope": ((rope_fwd, lambda x, c, s: ((x.shape, x.dtype),)),
                 (rope_bwd, lambda dy, c, s: ((dy.shape, dy.dtype),)), ()),
        "mlp": ((mlp_fwd, lambda x, w1, w2: ((x.shape, x.dtype),)),
                (mlp_bwd, lambda x, w1, w2, dy: ((x.shape, x.dtype), (w1.shape, w1.dtype), (w2.shape, w2.dtype))), ()),
        "embed": ((embed_fwd, lambda ids, emb: (((ids.shape[0], emb.shape[1]), emb.dtype),)),
                  (embed_bwd, lambda ids, emb, dy: ((emb.shape, f32),)), ()),
        "head_loss": ((head_fwd, lambda x, emb, tg, ids, vals, *, softcap: (((x.shape[0], 1), f32),) * 2),
                      (head_bwd, head_bwd_avals), ("softcap",)),
    }
    for op, ((fwd, fwd_av), (bwd, bwd_av), params) in table.items():
        _PRIMS[op] = (_primitive(f"frontier_{op}_fwd", fwd, fwd_av, params),
                      _primitive(f"frontier_{op}_bwd", bwd, bwd_av, params))
        _AVALS[op] = (fwd_av, bwd_av)


_ops2_primitives()


@jax.custom_vjp
def _attention(q_BTHK, k_BTGK, v_BTGK):
    return _call("causal_attention", "fwd", q_BTHK, k_BTGK, v_BTGK)[0]


def _attention_vjp_fwd(q_BTHK, k_BTGK, v_BTGK):
    o_BTHK, lse_BHT1 = _call("causal_attention", "fwd", q_BTHK, k_BTGK, v_BTGK)
    return o_BTHK, (q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1)


_attention.defvjp(_attention_vjp_fwd, lambda res, do_BTHK: _call("causal_attention", "bwd", *res, do_BTHK))


def causal_attention(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array) -> jax.Array:
    """Causal GQA attention (reference.causal_attention); the forward saves o and the per-row log-sum-exp
    [B, H, T, 1] for the backward (kernels_nki/attention.py recomputes the probabilities from them)."""
    if _direct("causal_attention"):
        return ref.causal_attention(q_BTHK, k_BTGK, v_BTGK)
    dt = q_BTHK.dtype
    return _attention(q_BTHK, k_BTGK.astype(dt), v_BTGK.astype(dt))


@jax.custom_vjp
def _rope(x_BTHK, cos_TK2, sin_TK2):
    return _call("rope", "fwd", x_BTHK, cos_TK2, sin_TK2)[0]


_rope.defvjp(lambda x, c, s: (_rope(x, c, s), (c, s)),
             lambda res, dy: (_call("rope", "bwd", dy, *res)[0], jnp.zeros_like(res[0]), jnp.zeros_like(res[1])))


def rope(x_BTHK: jax.Array, cos_TK2, sin_TK2) -> jax.Array:
    """Half-split RoPE (reference.rope); cos/sin [T, K/2] host constants, cast to x's dtype as the reference."""
    if _direct("rope"):
        return ref.rope(x_BTHK, jnp.asarray(cos_TK2), jnp.asarray(sin_TK2))
    return _rope(x_BTHK, jnp.asarray(cos_TK2).astype(x_BTHK.dtype), jnp.asarray(sin_TK2).astype(x_BTHK.dtype))


@jax.custom_vjp
def _mlp(x_ND, w_fc_DF, w_proj_FD):
    return _call("mlp", "fwd", x_ND, w_fc_DF, w_proj_FD)[0]


_mlp.defvjp(lambda x, w1, w2: (_mlp(x, w1, w2), (x, w1, w2)),  # h is recomputed: see kernels_nki/mlp.py
            lambda res, dy: _call("mlp", "bwd", *res, dy))


def mlp(x_ND: jax.Array, w_fc_DF: jax.Array, w_proj_FD: jax.Array) -> jax.Array:
    """relu(x W_fc)^2 W_proj (reference.mlp); the weights are cast to x's dtype at use."""
    if _direct("mlp"):
        return ref.mlp(x_ND, w_fc_DF, w_proj_FD)
    return _mlp(x_ND, w_fc_DF.astype(x_ND.dtype), w_proj_FD.astype(x_ND.dtype))


@jax.custom_vjp
def _embed(ids_N, emb_VD):
    return _call("embed", "fwd", ids_N, emb_VD)[0]


_embed.defvjp(lambda ids, emb: (_embed(ids, emb), (ids, emb)),
              lambda res, dy: (None, _call("embed", "bwd", res[0], res[1], dy)[0].astype(res[1].dtype)))


def embed(ids_N: jax.Array, emb_VD: jax.Array) -> jax.Array:
    """emb_VD[ids] for ids of any shape (reference.embed); the backward scatter-adds duplicates."""
    out = _embed(ids_N.reshape(-1).astype(jnp.int32), emb_VD)
    return out.reshape(ids_N.shape + (emb_VD.shape[1],))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _head_loss(x_ND, emb_VD, tg_N1, ids_NS, vals_NS, softcap):
    return _call("head_loss", "fwd", x_ND, emb_VD, tg_N1, ids_NS, vals_NS, softcap=softcap)[0]


def _head_loss_vjp_fwd(x_ND, emb_VD, tg_N1, ids_NS, vals_NS, softcap):
    loss_N1, lse_N1 = _call("head_loss", "fwd", x_ND, emb_VD, tg_N1, ids_NS, vals_NS, softcap=softcap)
    return loss_N1, (x_ND, emb_VD, tg_N1, ids_NS, vals_NS, lse_N1)


def _head_loss_vjp_bwd(softcap, res, dloss_N1):
    grads = _call("head_loss", "bwd", *res, dloss_N1.astype(jnp.float32), softcap=softcap)
    dvals = grads[2] if len(grads) == 3 else jnp.zeros_like(res[4])
    return grads[0], grads[1], None, None, dvals


_head_loss.defvjp(_head_loss_vjp_fwd, _head_loss_vjp_bwd)


def head_loss(x_ND, emb_VD, targets_N, softcap, bias_ids_NS=None, bias_vals_NS=None) -> jax.Array:
    """Per-token fp32 cross-entropy of softcapped tied logits plus an optional sparse bias (reference.head_loss)."""
    if _direct("head_loss"):
        return ref.head_loss(x_ND, emb_VD.astype(x_ND.dtype), targets_N, softcap, bias_ids_NS, bias_vals_NS)
    N = x_ND.shape[0]
    if bias_ids_NS is None:
        bias_ids_NS, bias_vals_NS = jnp.zeros((N, 0), jnp.int32), jnp.zeros((N, 0), jnp.float32)
    loss_N1 = _head_loss(x_ND, emb_VD.astype(x_ND.dtype), targets_N.reshape(N, 1).astype(jnp.int32),
                         bias_ids_NS.astype(jnp.int32), bias_vals_NS.astype(jnp.float32), float(softcap))
    return loss_N1[:, 0]
