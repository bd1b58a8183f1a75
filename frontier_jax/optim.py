"""Optimizer: Muon on block matrices, Adam on the embedding and the rest (the baseline's split,
docs/model.md), as an optax chain or fused (one kernel-backed update per parameter).

Labels come from parameter paths: "muon" (2-D matrices inside blocks), "embed" (the tied embedding,
Adam at embed_lr), "scalar" (vectors, scalars and control tensors such as resid_mix and skip_weights,
Adam at scalar_lr), "ngram" (the n-gram bias table [orders, confidence buckets], Adam at ngram_lr).
optax.contrib.muon would route every 2-D leaf, the embedding included, to Muon: not used here.

`build_optimizer(cfg)` returns an `Optimizer`: optax's `init` / `update` (updates = p' - p, so it
composes with optax code) and `apply(grads, state, params, *, lr_scale, momentum) -> (params', state')`,
the one entry the train step calls whichever kind it is. Unfused (`optim.fused=False`): an
`optax.partition` of optax pieces, `apply` = update + `optax.apply_updates`. Fused (`optim.fused=True`):
each parameter is updated by one `ops.adam_update` / `ops.muon_update` (an NKI kernel on trn1, a
pure-JAX reference computing what the optax chain computes elsewhere) that writes the parameter
itself; going through update + apply_updates would cost one more HBM pass and round twice. The
learning-rate multiplier (`lr_scale`) and Muon's momentum are runtime scalars (optax's extra args; in
the fused kernels [128, K] fp32 operands, with Adam's bias corrections), so the schedule never
recompiles. The Muon direction (momentum in fp32 or the record's bf16, Nesterov, Newton-Schulz, shape scale)
is `reference.muon_direction`.

The record's settings (docs/recipe.md), each off by default: decoupled weight decay per group
(`optax.add_decayed_weights` before the learning rate, or the fused kernels' `weight_decay`: p' = p - lr (u + wd p),
the record's p *= 1 - lr wd then p -= lr u); global gradient-norm clipping (`clipped`: the whole gradient, before
any group's update); the weight averages (`averaged`: EMA and SWA, their state `AveragedState` around the
optimizer's, updated after every update from the new parameters); `final_params` is what a run scores.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from frontier_jax import ops
from frontier_jax.config import OptimConfig
from frontier_jax.policies.dtypes import AUTO
from frontier_jax.policies.groups import param_label as label_for
from frontier_jax.ops.reference import muon_direction


def path_names(path) -> list[str]:
    """Attribute names along a pytree path of an nnx.State ('value' leaves dropped)."""
    names = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                names.append(str(getattr(k, attr)))
                break
    return [n for n in names if n != "value"]


def param_labels(params):
    """Pytree of labels with the structure of `params` (an nnx.State or any pytree of arrays)."""
    return jax.tree_util.tree_map_with_path(lambda p, x: label_for(path_names(p), x.ndim), params)


class Optimizer(NamedTuple):
    """optax's init/update plus `apply`, which returns the new parameters (see the module doc)."""

    init: Callable
    update: Callable
    apply: Callable


def _unzip(tree, out, n: int):
    """A tree of n-tuples (structure of `tree`) -> n trees (an empty group gives n empty trees)."""
    treedef = jax.tree_util.tree_structure(tree)
    cols = list(zip(*treedef.flatten_up_to(out))) or [()] * n
    return tuple(jax.tree_util.tree_unflatten(treedef, list(c)) for c in cols)


# ----------------------------------------------------------------------------- the optax chain


class MuonState(NamedTuple):
    momentum_buffer: optax.Updates  # optim.muon_momentum_dtype (fp32: the baseline; bf16: the record)


def scale_by_muon(ns_steps: int = 5, ns_dtype: str = "bfloat16", momentum_dtype: str = "float32",
                  shape_scale: str = "update") -> optax.GradientTransformationExtraArgs:
    """Muon's direction (reference.muon_direction) per matrix; `momentum` is a runtime arg."""

    def init_fn(params):
        return MuonState(jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, momentum_dtype), params))

    def update_fn(updates, state, params=None, *, momentum, **extra):
        del params, extra
        out = jax.tree_util.tree_map(lambda g, m: muon_direction(g, m, momentum, ns_steps, ns_dtype, shape_scale),
                                     updates, state.momentum_buffer)
        u, buf = _unzip(updates, out, 2)
        return u, MuonState(buf)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def scale_by_scheduled_lr(base_lr: float) -> optax.GradientTransformationExtraArgs:
    """Multiply by -base_lr * lr_scale, where lr_scale is a runtime scalar (the schedule)."""

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None, *, lr_scale, **extra):
        del params, extra
        return jax.tree_util.tree_map(lambda u: (-base_lr * lr_scale * u).astype(u.dtype), updates), state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def build_optimizer(cfg: OptimConfig, ns_dtype: str | None = None) -> Optimizer:
    """Muon / Adam by label, unfused or fused (`optim.fused`): same groups, learning rates and hyper-parameters.
    `ns_dtype`: Newton-Schulz's dtype as the run resolved it (`policies.dtypes.resolve(cfg, platform).muon_ns`);
    None: `cfg.muon_ns_dtype`, which must then name a dtype ("auto" is resolved per platform, once, by the run)."""
    ns_dtype = ns_dtype or cfg.muon_ns_dtype
    if ns_dtype == AUTO:
        raise ValueError('optim.muon_ns_dtype="auto" depends on the platform: pass the run\'s resolved dtype '
                         "(frontier_jax.policies.dtypes.resolve(cfg, platform).muon_ns)")
    cfg = dataclasses.replace(cfg, muon_ns_dtype=ns_dtype)
    tx = _fused_groups(cfg) if cfg.fused else _optax_groups(cfg)
    if cfg.grad_clip_norm:
        tx = clipped(tx, cfg.grad_clip_norm)
    if cfg.ema_decay or cfg.swa_every:
        tx = averaged(tx, cfg.ema_decay, cfg.swa_every, cfg.swa_threshold)
    return tx


def _optax_groups(cfg: OptimConfig) -> Optimizer:
    """The unfused optimizer: an optax.partition of optax chains (a weight decay of 0 adds no transformation, so
    the baseline's state is unchanged)."""
    decay = lambda wd: (optax.add_decayed_weights(wd),) if wd else ()
    adam = lambda lr: optax.chain(optax.scale_by_adam(b1=cfg.beta1, b2=cfg.beta2, eps=cfg.adam_eps),
                                  *decay(cfg.adam_weight_decay), scale_by_scheduled_lr(lr))
    muon = scale_by_muon(cfg.muon_ns_steps, cfg.muon_ns_dtype, cfg.muon_momentum_dtype, cfg.muon_shape_scale)
    chain = optax.partition(
        {
            "muon": optax.chain(muon, *decay(cfg.muon_weight_decay), scale_by_scheduled_lr(cfg.matrix_lr)),
            "embed": adam(cfg.embed_lr),
            "scalar": adam(cfg.scalar_lr),
            "ngram": adam(cfg.ngram_lr),
        },
        param_labels,
    )

    def apply(grads, state, params, **extra):
        updates, state = chain.update(grads, state, params, **extra)
        return optax.apply_updates(params, updates), state

    return Optimizer(chain.init, chain.update, apply)


def _fused_groups(cfg: OptimConfig) -> Optimizer:
    """The fused optimizer: the same groups, one kernel-backed update per parameter."""
    adam = lambda lr: fused_adam(lr, cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.adam_weight_decay)
    muon = fused_muon(cfg.matrix_lr, cfg.muon_ns_steps, cfg.muon_ns_dtype, cfg.muon_momentum_dtype,
                      cfg.muon_shape_scale, cfg.muon_weight_decay)
    return fused_partition({"muon": muon, "embed": adam(cfg.embed_lr), "scalar": adam(cfg.scalar_lr),
                            "ngram": adam(cfg.ngram_lr)}, param_labels)


# ----------------------------------------------------------------------------- clipping and weight averages

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_: coefficient max_norm / (total_norm + 1e-6)


def clip_by_global_norm(grads, max_norm: float):
    """torch's clip_grad_norm_ (the record's, train_gpt.py:1695-1696): every gradient times min(1, max_norm /
    (norm + 1e-6)), norm the L2 norm over all of them (optax.clip_by_global_norm divides by the norm instead)."""
    coef = jnp.minimum(1.0, max_norm / (optax.tree.norm(grads) + CLIP_EPS))
    return jax.tree_util.tree_map(lambda g: (g * coef).astype(g.dtype), grads)


def clipped(tx: Optimizer, max_norm: float) -> Optimizer:
    """`tx` on the globally clipped gradient (`clip_by_global_norm`); the state is tx's."""

    def update(grads, state, params=None, **extra):
        return tx.update(clip_by_global_norm(grads, max_norm), state, params, **extra)

    def apply(grads, state, params, **extra):
        return tx.apply(clip_by_global_norm(grads, max_norm), state, params, **extra)

    return Optimizer(tx.init, update, apply)


class SwaState(NamedTuple):
    """The record's SWA (train_gpt.py:1718-1726): the sum of the weights taken (in the parameters' dtypes), how many
    were taken, and the optimizer steps so far (the weights are taken after step s when s % every == 0 and the
    step's lr scale is below the threshold)."""

    total: optax.Params
    count: jax.Array  # int32
    step: jax.Array  # int32


class AveragedState(NamedTuple):
    """The optimizer's state and the weight averages (`averaged`); an average that is off is ()."""

    inner: optax.OptState
    ema: optax.Params  # float32, every parameter
    swa: SwaState | tuple


def averaged(tx: Optimizer, ema_decay: float, swa_every: int, swa_threshold: float) -> Optimizer:
    """`tx` and, after every update, the weight averages of the new parameters: the EMA (fp32, from the initial
    weights: ema' = decay ema + (1 - decay) p', the record's train_gpt.py:1636-1637, 1712-1715) and the SWA sum
    (`SwaState`, decided in the step from the traced lr scale, so neither recompiles)."""

    def init(params):
        # a copy even of fp32 parameters (astype would alias them: a step donating both would donate one buffer twice)
        ema = jax.tree_util.tree_map(lambda p: jnp.array(p, jnp.float32, copy=True), params) if ema_decay else ()
        swa = SwaState(jax.tree_util.tree_map(jnp.zeros_like, params), jnp.zeros([], jnp.int32),
                       jnp.zeros([], jnp.int32)) if swa_every else ()
        return AveragedState(tx.init(params), ema, swa)

    def apply(grads, state, params, *, lr_scale, **extra):
        new, inner = tx.apply(grads, state.inner, params, lr_scale=lr_scale, **extra)
        ema, swa = state.ema, state.swa
        if ema_decay:
            ema = jax.tree_util.tree_map(lambda e, p: ema_decay * e + (1.0 - ema_decay) * p.astype(jnp.float32),
                                         ema, new)
        if swa_every:
            step = swa.step + 1
            take = (lr_scale < swa_threshold) & (step % swa_every == 0)
            total = jax.tree_util.tree_map(lambda t, p: jnp.where(take, t + p, t), swa.total, new)
            swa = SwaState(total, swa.count + take.astype(jnp.int32), step)
        return new, AveragedState(inner, ema, swa)

    return _fused(init, apply)


def final_params(params, opt_state):
    """The weights a run scores, exports and quantizes: the EMA cast to each parameter's dtype when the optimizer
    keeps one (optim.ema_decay > 0, as the record loads its EMA before the final evaluation, train_gpt.py:
    1761-1765), else `params` themselves."""
    if isinstance(opt_state, AveragedState) and not isinstance(opt_state.ema, tuple):
        return jax.tree_util.tree_map(lambda e, p: e.astype(p.dtype), opt_state.ema, params)
    return params


# ----------------------------------------------------------------------------- fused transformations


def _fused(init, apply) -> Optimizer:
    def update(updates, state, params=None, **extra):
        if params is None:
            raise ValueError("fused optimizers update the parameters themselves: pass params")
        new_params, state = apply(updates, state, params, **extra)
        return jax.tree_util.tree_map(lambda n, p: n - p, new_params, params), state

    return Optimizer(init, update, apply)


class FusedAdamState(NamedTuple):
    count: jax.Array  # int32 step count (bias correction), as optax.ScaleByAdamState
    mu: optax.Updates
    nu: optax.Updates


def fused_adam(base_lr: float, b1: float = 0.9, b2: float = 0.95, eps: float = 1e-8,
               weight_decay: float = 0.0) -> Optimizer:
    """Adam(W): optax.scale_by_adam (moments in the parameter dtype) with lr = base_lr * lr_scale and
    decoupled weight decay p' = p - lr (u + wd p); one `ops.adam_update` per parameter."""

    def init(params):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return FusedAdamState(jnp.zeros([], jnp.int32), zeros, jax.tree_util.tree_map(jnp.zeros_like, params))

    def apply(grads, state, params, *, lr_scale, **extra):
        count = optax.safe_increment(state.count)
        scal = ops.scalars_PK(base_lr * lr_scale, 1 - b1 ** count, 1 - b2 ** count, 0.0)
        out = jax.tree_util.tree_map(
            lambda p, g, m, v: ops.adam_update(p, g, m, v, scal, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
            params, grads, state.mu, state.nu)
        p2, m2, v2 = _unzip(params, out, 3)
        return p2, FusedAdamState(count, m2, v2)

    return _fused(init, apply)


class FusedMuonState(NamedTuple):
    momentum_buffer: optax.Updates  # in the momentum's dtype, as MuonState


def fused_muon(base_lr: float, ns_steps: int = 5, ns_dtype: str = "bfloat16", momentum_dtype: str = "float32",
               shape_scale: str = "update", weight_decay: float = 0.0) -> Optimizer:
    """Muon (lr = base_lr * lr_scale, runtime `momentum`, decoupled weight decay p' = p - lr (u + wd p)): one
    `ops.muon_update` per 2-D parameter."""

    def init(params):
        return FusedMuonState(jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, momentum_dtype), params))

    def apply(grads, state, params, *, lr_scale, momentum, **extra):
        scal = ops.scalars_PK(base_lr * lr_scale, momentum)
        out = jax.tree_util.tree_map(
            lambda p, g, b: ops.muon_update(p, g, b, scal, ns_steps=ns_steps, ns_dtype=ns_dtype,
                                            weight_decay=weight_decay, shape_scale=shape_scale),
            params, grads, state.momentum_buffer)
        p2, b2 = _unzip(params, out, 2)
        return p2, FusedMuonState(b2)

    return _fused(init, apply)


def fused_partition(transforms: dict[str, Optimizer], param_labels) -> Optimizer:
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

    def apply(grads, state, params, **extra):
        labels = labels_of(params)
        gp, gg = split(params, labels), split(grads, labels)
        new_state, new_groups = {}, {}
        for k, tx in transforms.items():
            new_groups[k], new_state[k] = tx.apply(gg[k], state[k], gp[k], **extra)
        its = {k: iter(v) for k, v in new_groups.items()}
        leaves = [next(its[lab]) for lab in labels]
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), leaves), new_state

    return _fused(init, apply)
