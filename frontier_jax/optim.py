"""Optimizer (spec baseline.md 1.2-1.3): Muon on block matrices, Adam on the embedding and the rest.

Built from optax pieces: `optax.partition` over labels derived from parameter paths. The learning-rate
multiplier (`lr_scale`) and Muon's momentum arrive as runtime scalars through optax's extra-args
mechanism, so the time-based schedule never recompiles the step.

Labels: "muon" (2-D matrices inside blocks), "embed" (the tied embedding, Adam at embed_lr),
"scalar" (vectors, scalars and control tensors such as resid_mix and skip_weights, Adam at scalar_lr),
"ngram" (the n-gram bias table [orders, confidence buckets], Adam at ngram_lr).
optax.contrib.muon would route every 2-D leaf, the embedding included, to Muon: not used here.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from frontier_jax.config import OptimConfig
from frontier_jax.model import CONTROL_PARAM_NAMES

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def path_names(path) -> list[str]:
    """Attribute names along a pytree path of an nnx.State ('value' leaves dropped)."""
    names = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                names.append(str(getattr(k, attr)))
                break
    return [n for n in names if n != "value"]


def label_for(names: list[str], ndim: int) -> str:
    if names and names[0] == "tok_emb":
        return "embed"
    if names and names[0] == "ngram_bias":
        return "ngram"
    if names and names[0] == "blocks" and ndim == 2 and not any(n in CONTROL_PARAM_NAMES for n in names):
        return "muon"
    return "scalar"


def param_labels(params):
    """Pytree of labels with the structure of `params` (an nnx.State or any pytree of arrays)."""
    return jax.tree_util.tree_map_with_path(lambda p, x: label_for(path_names(p), x.ndim), params)


def newton_schulz(g_RC: jax.Array, steps: int, dtype) -> jax.Array:
    """Orthogonalise a matrix in PyTorch [rows, cols] orientation exactly as the baseline's
    zeropower_via_newtonschulz5: Frobenius-normalise, transpose if tall, 5 quintic iterations."""
    a, b, c = NS_COEFFS
    x = g_RC.astype(dtype)
    x = x / (jnp.linalg.norm(x.astype(jnp.float32)).astype(dtype) + NS_EPS)
    transposed = g_RC.shape[0] > g_RC.shape[1]
    if transposed:
        x = x.T
    for _ in range(steps):
        a_RR = x @ x.T
        b_RR = b * a_RR + c * (a_RR @ a_RR)
        x = a * x + b_RR @ x
    return x.T if transposed else x


class MuonState(NamedTuple):
    momentum_buffer: optax.Updates


def scale_by_muon(ns_steps: int = 5, ns_dtype: str = "bfloat16") -> optax.GradientTransformationExtraArgs:
    """Nesterov momentum + Newton-Schulz + sqrt(max(1, rows/cols)) scale; `momentum` is a runtime arg.

    Parameters are stored [in, out]; the baseline's PyTorch weights are [out, in], so the matrix is
    orthogonalised as g.T (rows = out) to reproduce its transposition choice and scale exactly.
    The update is rounded to `ns_dtype` as the baseline's bf16 update buffer does.
    """
    dtype = jnp.dtype(ns_dtype)

    def init_fn(params):
        return MuonState(jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params))

    def update_fn(updates, state, params=None, *, momentum, **extra):
        del params, extra
        buf = jax.tree_util.tree_map(lambda m, g: momentum * m + g.astype(jnp.float32),
                                     state.momentum_buffer, updates)

        def one(g, m):
            g = g.astype(jnp.float32) + momentum * m  # Nesterov
            o_RC = newton_schulz(g.T, ns_steps, dtype)  # PyTorch orientation [out, in]
            rows, cols = o_RC.shape
            o_RC = o_RC * max(1.0, rows / cols) ** 0.5
            return o_RC.T.astype(dtype).astype(jnp.float32)

        return jax.tree_util.tree_map(one, updates, buf), MuonState(buf)

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


def resolve_ns_dtype(cfg: OptimConfig, platform: str | None = None) -> str:
    """optim.muon_ns_dtype with "auto" resolved: bfloat16 on accelerators (the baseline), float32 on CPU."""
    if cfg.muon_ns_dtype != "auto":
        return cfg.muon_ns_dtype
    return "float32" if (platform or jax.default_backend()) == "cpu" else "bfloat16"


def build_optimizer(cfg: OptimConfig) -> optax.GradientTransformationExtraArgs:
    cfg = dataclasses.replace(cfg, muon_ns_dtype=resolve_ns_dtype(cfg))
    if cfg.fused:  # one kernel per parameter (frontier_jax.fused_optim); same groups and hyper-parameters
        from frontier_jax.fused_optim import build_fused_optimizer

        return build_fused_optimizer(cfg)
    adam = lambda lr: optax.chain(optax.scale_by_adam(b1=cfg.beta1, b2=cfg.beta2, eps=cfg.adam_eps),
                                  scale_by_scheduled_lr(lr))
    return optax.partition(
        {
            "muon": optax.chain(scale_by_muon(cfg.muon_ns_steps, cfg.muon_ns_dtype), scale_by_scheduled_lr(cfg.matrix_lr)),
            "embed": adam(cfg.embed_lr),
            "scalar": adam(cfg.scalar_lr),
            "ngram": adam(cfg.ngram_lr),
        },
        param_labels,
    )


def muon_momentum(cfg: OptimConfig, step: int) -> float:
    """Linear warm-up of Muon's momentum from warmup_start to momentum over warmup_steps."""
    if cfg.muon_momentum_warmup_steps <= 0:
        return cfg.muon_momentum
    frac = min(step / cfg.muon_momentum_warmup_steps, 1.0)
    return (1 - frac) * cfg.muon_momentum_warmup_start + frac * cfg.muon_momentum


def lr_scale(cfg: OptimConfig, step: int, elapsed_s: float, budget_s: float, max_steps: int) -> float:
    """Constant, then linear warmdown to 0 over the last `warmdown_steps` steps (baseline lr_mul).

    time mode: the warmdown length in seconds is warmdown_steps times the measured mean step time,
    and it starts when the remaining budget drops below that. steps mode: by step count.
    """
    w = cfg.warmdown_steps
    if w <= 0:
        return 1.0
    if cfg.warmdown_mode == "steps":
        start = max(max_steps - w, 0)
        return max((max_steps - step) / max(w, 1), 0.0) if start <= step < max_steps else 1.0
    step_s = elapsed_s / max(step, 1)
    warmdown_s = w * step_s
    remaining_s = max(budget_s - elapsed_s, 0.0)
    return remaining_s / max(warmdown_s, 1e-9) if remaining_s <= warmdown_s else 1.0
