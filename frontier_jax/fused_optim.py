"""Fused optimizer updates: Adam(W) and Muon with ONE primitive per parameter (NKI kernel on trn1).

Each per-parameter update is a JAX primitive (`frontier_adam_update`, `frontier_muon_update`) in the
style of `frontier_jax.ops`: its default lowering is the pure-JAX reference (`_adam_ref`,
`_muon_ref`, written to compute exactly what the unfused optax chain of `frontier_jax.optim`
computes), a `platform="neuron"` lowering to `kernels_nki.adam` / `kernels_nki.muon` is registered
lazily by `ops.configure` on Neuron, and `ops.emulated(["adam_update", "muon_update"])` routes them
through the NumPy emulator (tests). Both ops are rows of the kernel table (`ops.OPS`).

Interface. A `FusedTransformation` has optax's `init` / `update` (so it composes with optax code
and `optax.apply_updates`: `update` returns updates = new_p - p) and one more function,
`fused_step(grads, state, params, *, lr_scale, momentum) -> (new_params, new_state)`, which writes
the parameters itself. The trainer uses `fused_step` (frontier_jax.steps does when the transform has
it): going through `update` + `apply_updates` would cost one more HBM pass over the parameters and
round twice (p + (p' - p) is not p'). `build_fused_optimizer(cfg)` is the drop-in for
`optim.build_optimizer` with the same labels (muon / embed / scalar / ngram), selected by `optim.fused=True`.

Runtime scalars: the learning rate (base lr x lr_scale), Muon's momentum and Adam's bias corrections
(from the step count in the state) enter each kernel as one small [128, K] fp32 array, never as
compile-time constants, so the schedule and the momentum warm-up do not recompile.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from frontier_jax import ops, optim
from frontier_jax.config import OptimConfig
from kernels_nki import registry

ADAM_OP, MUON_OP = "adam_update", "muon_update"
SCALAR_ROWS = 128  # runtime scalars are passed broadcast over the partitions, as [128, K] fp32
_STATICS = {ADAM_OP: ("b1", "b2", "eps", "weight_decay"), MUON_OP: ("ns_steps", "ns_dtype")}


# ----------------------------------------------------------------------------- references


def _adam_ref(p, g, m, v, scal_P4, *, b1, b2, eps, weight_decay, kernel=False):
    """optax.scale_by_adam (+ add_decayed_weights) -> x (-lr) -> apply_updates, op for op."""
    del kernel
    lr, bc1, bc2 = scal_P4[0, 0], scal_P4[0, 1], scal_P4[0, 2]
    m2 = (1 - b1) * g + b1 * m
    v2 = (1 - b2) * (g ** 2) + b2 * v
    u = (m2 / bc1.astype(m2.dtype)) / (jnp.sqrt(v2 / bc2.astype(v2.dtype)) + eps)
    if weight_decay:
        u = u + weight_decay * p
    u = (-lr * u).astype(u.dtype)
    return jnp.asarray(p + u).astype(p.dtype), m2.astype(m.dtype), v2.astype(v.dtype)


def _muon_ref(p, g, buf, scal_P2, *, ns_steps, ns_dtype, kernel=False):
    """optim.scale_by_muon -> x (-lr) -> apply_updates, op for op (stored [in, out], NS on g.T)."""
    del kernel
    lr, mom = scal_P2[0, 0], scal_P2[0, 1]
    dtype = jnp.dtype(ns_dtype)
    buf2 = mom * buf + g.astype(jnp.float32)
    ge = g.astype(jnp.float32) + mom * buf2  # Nesterov
    o_RC = optim.newton_schulz(ge.T, ns_steps, dtype)
    rows, cols = o_RC.shape
    o_RC = o_RC * max(1.0, rows / cols) ** 0.5
    u = o_RC.T.astype(dtype).astype(jnp.float32)
    u = (-lr * u).astype(u.dtype)
    return jnp.asarray(p + u).astype(p.dtype), buf2


_REFS = {ADAM_OP: _adam_ref, MUON_OP: _muon_ref}


# ----------------------------------------------------------------------------- primitives and dispatch


def _make_primitive(op: str) -> Primitive:
    n_out = 3 if op == ADAM_OP else 2
    prim = Primitive(f"frontier_{op}")
    prim.multiple_results = True
    prim.def_abstract_eval(lambda *avals, **params: tuple(
        jax.core.ShapedArray(a.shape, a.dtype) for a in (avals[0], *avals[2:n_out + 1])))
    mlir.register_lowering(prim, mlir.lower_fun(_REFS[op], multiple_results=True))
    eager = jax.jit(prim.bind, static_argnames=("kernel", *_STATICS[op]))
    prim.def_impl(lambda *args, **params: eager(*args, **params))
    return prim


_PRIMS = {op: _make_primitive(op) for op in (ADAM_OP, MUON_OP)}
_neuron_registered: set[str] = set()


def register_neuron_lowering(op: str) -> None:
    """The platform="neuron" rule of `op`: its NKI kernel when kernel=True (called by ops.configure)."""
    if op in _neuron_registered:
        return
    kernel_name = registry.KERNELS[op].fwd

    def nki_impl(*args, kernel, **static):
        if not kernel:
            return _REFS[op](*args, **static)
        outs = getattr(registry.load_nki(op), kernel_name)(*_kernel_args(op, args), **static)
        return tuple(o.reshape(args[0].shape) for o in outs)

    mlir.register_lowering(_PRIMS[op], mlir.lower_fun(nki_impl, multiple_results=True), platform="neuron")
    _neuron_registered.add(op)


def _kernel_args(op: str, args):
    """The Adam kernel takes flat [N] tensors (the primitive keeps the parameter's shape; reshapes are free)."""
    return [*(x.reshape(-1) for x in args[:4]), args[4]] if op == ADAM_OP else list(args)


def _emulated_call(op: str, args, static: dict):
    from kernels_nki import emulator

    n_out = 3 if op == ADAM_OP else 2
    structs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (args[0], *args[2:n_out + 1]))

    def host(*arrays):
        kernel = getattr(registry.load_emulated(op), registry.KERNELS[op].fwd)
        outs, _ = emulator.run(kernel, *_kernel_args(op, arrays), **static)
        return tuple(np.asarray(o, dtype=s.dtype).reshape(s.shape) for o, s in zip(outs, structs))

    return jax.pure_callback(host, structs, *args)


def _call(op: str, *args, **static):
    impl = ops.kernel_table()[ops.OPS.index(op)].impl  # decided at trace time, as every op
    if impl == "emulated":
        return tuple(_emulated_call(op, args, static))
    return tuple(_PRIMS[op].bind(*args, kernel=impl == "nki", **static))


def adam_update(p, g, m, v, scal_P4, *, b1: float, b2: float, eps: float, weight_decay: float = 0.0):
    """(p', m', v') of one parameter of any shape (the kernel sees it flattened)."""
    return _call(ADAM_OP, p, g, m, v, scal_P4, b1=float(b1), b2=float(b2), eps=float(eps),
                 weight_decay=float(weight_decay))


def muon_update(p_IO, g_IO, buf_IO, scal_P2, *, ns_steps: int, ns_dtype: str):
    """(p', buf') of one [in, out] matrix."""
    return _call(MUON_OP, p_IO, g_IO, buf_IO, scal_P2, ns_steps=int(ns_steps), ns_dtype=str(ns_dtype))


def scalars_PK(*values) -> jax.Array:
    """Runtime scalars as the kernels take them: [128, K] fp32, every row the same."""
    row = jnp.stack([jnp.asarray(v, jnp.float32) for v in values])
    return jnp.broadcast_to(row, (SCALAR_ROWS, row.shape[0]))


# ----------------------------------------------------------------------------- transformations


class FusedTransformation(NamedTuple):
    """optax-compatible init/update plus `fused_step`, which returns new parameters (see module doc)."""

    init: Callable
    update: Callable
    fused_step: Callable

    def as_optax(self) -> optax.GradientTransformationExtraArgs:
        return optax.GradientTransformationExtraArgs(self.init, self.update)


def _with_update(init, fused_step) -> FusedTransformation:
    def update(updates, state, params=None, **extra):
        if params is None:
            raise ValueError("fused optimizers update the parameters themselves: pass params")
        new_params, state = fused_step(updates, state, params, **extra)
        return jax.tree_util.tree_map(lambda n, p: n - p, new_params, params), state

    return FusedTransformation(init, update, fused_step)


def _unzip(params, out, n: int):
    """A tree of n-tuples (structure of `params`) -> n trees (an empty group gives n empty trees)."""
    treedef = jax.tree_util.tree_structure(params)
    cols = list(zip(*treedef.flatten_up_to(out))) or [()] * n
    return tuple(jax.tree_util.tree_unflatten(treedef, list(c)) for c in cols)


class FusedAdamState(NamedTuple):
    count: jax.Array  # int32 step count (bias correction), as optax.ScaleByAdamState
    mu: optax.Updates
    nu: optax.Updates


def fused_adam(base_lr: float, b1: float = 0.9, b2: float = 0.95, eps: float = 1e-8,
               weight_decay: float = 0.0) -> FusedTransformation:
    """Adam(W): optax.scale_by_adam (moments in the parameter dtype) with lr = base_lr * lr_scale and
    decoupled weight decay p' = p - lr (u + wd p); one `adam_update` primitive per parameter."""

    def init(params):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return FusedAdamState(jnp.zeros([], jnp.int32), zeros, jax.tree_util.tree_map(jnp.zeros_like, params))

    def fused_step(grads, state, params, *, lr_scale, **extra):
        count = optax.safe_increment(state.count)
        scal = scalars_PK(base_lr * lr_scale, 1 - b1 ** count, 1 - b2 ** count, 0.0)
        out = jax.tree_util.tree_map(
            lambda p, g, m, v: adam_update(p, g, m, v, scal, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
            params, grads, state.mu, state.nu)
        p2, m2, v2 = _unzip(params, out, 3)
        return p2, FusedAdamState(count, m2, v2)

    return _with_update(init, fused_step)


class FusedMuonState(NamedTuple):
    momentum_buffer: optax.Updates  # fp32, as optim.MuonState


def fused_muon(base_lr: float, ns_steps: int = 5, ns_dtype: str = "bfloat16") -> FusedTransformation:
    """Muon (Nesterov, Newton-Schulz, shape scale, lr = base_lr * lr_scale, runtime `momentum`):
    one `muon_update` primitive per 2-D parameter."""

    def init(params):
        return FusedMuonState(jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params))

    def fused_step(grads, state, params, *, lr_scale, momentum, **extra):
        scal = scalars_PK(base_lr * lr_scale, momentum)
        out = jax.tree_util.tree_map(
            lambda p, g, b: muon_update(p, g, b, scal, ns_steps=ns_steps, ns_dtype=ns_dtype),
            params, grads, state.momentum_buffer)
        p2, b2 = _unzip(params, out, 2)
        return p2, FusedMuonState(b2)

    return _with_update(init, fused_step)


def fused_partition(transforms: dict[str, FusedTransformation], param_labels) -> FusedTransformation:
    """optax.partition for fused transformations: each group sees the tuple of its leaves (in tree
    order), so the state is {label: group state over that tuple}."""

    def split(tree, labels):
        leaves = jax.tree_util.tree_leaves(tree)
        return {k: tuple(x for x, lab in zip(leaves, labels) if lab == k) for k in transforms}

    def labels_of(params):
        labels = jax.tree_util.tree_leaves(param_labels(params) if callable(param_labels) else param_labels)
        unknown = set(labels) - set(transforms)
        if unknown:
            raise ValueError(f"parameters labelled {sorted(unknown)} have no transformation")
        return labels

    def init(params):
        groups = split(params, labels_of(params))
        return {k: tx.init(groups[k]) for k, tx in transforms.items()}

    def fused_step(grads, state, params, **extra):
        labels = labels_of(params)
        gp, gg = split(params, labels), split(grads, labels)
        new_state, new_groups = {}, {}
        for k, tx in transforms.items():
            new_groups[k], new_state[k] = tx.fused_step(gg[k], state[k], gp[k], **extra)
        its = {k: iter(v) for k, v in new_groups.items()}
        leaves = [next(its[lab]) for lab in labels]
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), leaves), new_state

    return _with_update(init, fused_step)


def build_fused_optimizer(cfg: OptimConfig) -> FusedTransformation:
    """The fused equivalent of optim.build_optimizer (same labels, learning rates and hyper-parameters)."""
    adam = lambda lr: fused_adam(lr, cfg.beta1, cfg.beta2, cfg.adam_eps)
    return fused_partition(
        {"muon": fused_muon(cfg.matrix_lr, cfg.muon_ns_steps, cfg.muon_ns_dtype),
         "embed": adam(cfg.embed_lr), "scalar": adam(cfg.scalar_lr), "ngram": adam(cfg.ngram_lr)},
        optim.param_labels)
