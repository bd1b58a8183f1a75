"""Pure step functions: train_step and eval_step, jitted, with parameters and optimizer state donated.

Both call the same model forward (`GPT.__call__`, per-token losses): evaluation has no branch of its
own, it only weights the per-token losses by a score mask and sums them with the byte counts.

An optional `bias_fn(model, x_BT, aux) -> (ids_BTS, vals_BTS)` adds a sparse logit bias (the n-gram
bias); `aux` (e.g. n-gram tables) is an ordinary argument, so swapping it does not recompile.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from frontier_jax.data.tokenizer import ByteTables
from frontier_jax.optim import Optimizer


def _forward(graphdef, params, x_BT, y_BT, bias_fn, aux):
    model = nnx.merge(graphdef, params)
    bias = bias_fn(model, x_BT, aux) if bias_fn is not None else (None, None)
    return model(x_BT, y_BT, *bias)


def make_train_step(graphdef, tx: Optimizer, bias_fn: Callable | None = None,
                    donate: bool = True, shardings=None, replicated=None):
    """step(params, opt_state, x_MBT, y_MBT, lr_scale, momentum, aux) -> (params, opt_state, metrics).

    M micro-batches are accumulated with lax.scan (gradients summed in float32, then averaged: the
    baseline's loss * 1/grad_accum_steps), then one `tx.apply` (unfused or fused alike). `shardings` =
    (params, opt_state) shardings pin the outputs (data parallel: replicated parameters, optionally ZeRO-1
    state).
    """

    def loss_fn(params, x_BT, y_BT, aux):
        return jnp.mean(_forward(graphdef, params, x_BT, y_BT, bias_fn, aux))

    grad_fn = jax.value_and_grad(loss_fn)

    def step(params, opt_state, x_MBT, y_MBT, lr_scale, momentum, aux):
        M = x_MBT.shape[0]

        def micro(carry, xy):
            gsum, lsum = carry
            loss, g = grad_fn(params, xy[0], xy[1], aux)
            gsum = jax.tree_util.tree_map(lambda a, b: a + b.astype(jnp.float32), gsum, g)
            return (gsum, lsum + loss), None

        zeros = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        if M == 1:
            (gsum, lsum), _ = micro((zeros, jnp.float32(0)), (x_MBT[0], y_MBT[0]))
        else:
            (gsum, lsum), _ = jax.lax.scan(micro, (zeros, jnp.float32(0)), (x_MBT, y_MBT))
        grads = jax.tree_util.tree_map(lambda g, p: (g / M).astype(p.dtype), gsum, params)
        params, opt_state = tx.apply(grads, opt_state, params, lr_scale=lr_scale, momentum=momentum)
        gnorm = optax.tree.norm(grads)
        return params, opt_state, {"loss": lsum / M, "grad_norm": gnorm}

    out_shardings = None if shardings is None else (shardings[0], shardings[1], replicated)
    return jax.jit(step, donate_argnums=(0, 1) if donate else (), out_shardings=out_shardings)


def make_eval_step(graphdef, tables: ByteTables, bias_fn: Callable | None = None):
    """eval(params, x_BT, y_BT, mask_BT, aux) -> (nll_sum nats f32, tokens i32, bytes i32), sums only.

    bytes per target y with preceding input x: base_bytes[y] + (leading_space[y] and not boundary[x]).
    """
    base = jnp.asarray(tables.base_bytes, jnp.int32)
    lead = jnp.asarray(tables.has_leading_space, bool)
    boundary = jnp.asarray(tables.is_boundary, bool)

    def step(params, x_BT, y_BT, mask_BT, aux):
        loss_BT = _forward(graphdef, params, x_BT, y_BT, bias_fn, aux)
        bytes_BT = base[y_BT] + (lead[y_BT] & ~boundary[x_BT]).astype(jnp.int32)
        m = mask_BT.astype(bool)
        return (jnp.sum(jnp.where(m, loss_BT, 0.0)), jnp.sum(m.astype(jnp.int32)),
                jnp.sum(jnp.where(m, bytes_BT, 0)))

    return jax.jit(step)


def evaluate_batches(eval_step, params, batches, aux=None) -> dict:
    """Sum eval_step over (x, y, mask) batches; host accumulation in float64 / Python ints."""
    nll, toks, nbytes = 0.0, 0, 0
    for x_BT, y_BT, mask_BT in batches:
        s = eval_step(params, x_BT, y_BT, mask_BT, aux)
        nll += float(s[0])
        toks += int(s[1])
        nbytes += int(s[2])
    return {"nll_sum_nats": nll, "tokens": toks, "bytes": nbytes}
