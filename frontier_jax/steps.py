"""Pure step functions: train_step and eval_step, jitted, with parameters and optimizer state donated.

Both call the same model forward (`GPT.__call__`, per-token losses): evaluation has no branch of its
own, it only weights the per-token losses by a score mask and sums them with the byte counts.

Each step is one `jax.shard_map` over the mesh's `data` axis: the body runs per device on its own
shard of the batch, so every kernel-backed op is traced and called at the per-device shape (an NKI
kernel is an opaque call that XLA's partitioner would otherwise replicate on the global batch, its
operands all-gathered: the remedy JAX documents is shard_map, docs.jax.dev "Foreign function
interface", "Sharding"). `check_vma=False`: inside the body a replicated parameter's gradient is this
device's own (JAX's varying-value typing would psum it in the transpose, and it cannot type the
kernels' custom VJPs); the collectives are explicit: the gradient and loss means (`pmean`), the
evaluation sums (`psum`), and, with ZeRO-1 state, the optimizer state gathered before the update
and each device's slice kept after it.

An optional `bias_fn(model, x_BT, aux) -> (ids_BTS, vals_BTS)` adds a sparse logit bias (the n-gram
bias); `aux` (e.g. n-gram tables) is an ordinary, replicated argument, so swapping it does not recompile.
`attention_exact` picks the qk_attention forward kernel at trace time (`ops.attention_forward`); the
train step's metrics carry `score_bound` of the updated gains, from which the caller picks the next.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from frontier_jax import ops
from frontier_jax.data.tokenizer import ByteTables
from frontier_jax.optim import Optimizer

AXIS = "data"


def single_device_mesh() -> jax.sharding.Mesh:
    return jax.sharding.Mesh(np.asarray(jax.devices()[:1]), (AXIS,))


def _forward(graphdef, params, x_BT, y_BT, bias_fn, aux, qat=None):
    model = nnx.merge(graphdef, params)
    bias = bias_fn(model, x_BT, aux) if bias_fn is not None else (None, None)
    return model(x_BT, y_BT, *bias, qat=qat)


def _shardings(mesh, specs):
    """The shardings matching shard_map in_specs."""
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, P))


class Placed:
    """A jitted step whose arguments are first placed with the shardings its shard_map expects (a no-op for
    arrays already there, the trainer's case): an uncommitted first argument would otherwise compile the
    step a second time when the step's own, committed outputs come back in. `.lower` etc. pass through."""

    def __init__(self, jitted, shardings):
        self.jitted, self.shardings = jitted, shardings

    def __call__(self, *args):
        return self.jitted(*jax.device_put(args, self.shardings))

    def __getattr__(self, name):
        return getattr(self.jitted, name)


def _sharded_axis(spec: P) -> int | None:
    return next((i for i, name in enumerate(spec) if name == AXIS), None)


def gather_state(state, specs):
    """Each leaf sharded along `data` (ZeRO-1) all-gathered to its full value (explicit collective)."""
    if isinstance(specs, P):
        return state

    def one(x, spec):
        a = _sharded_axis(spec)
        return x if a is None else jax.lax.all_gather(x, AXIS, axis=a, tiled=True)

    return jax.tree_util.tree_map(one, state, specs)


def slice_state(state, specs):
    """This device's slice of each leaf that `specs` shards along `data` (inverse of gather_state)."""
    if isinstance(specs, P):
        return state

    def one(x, spec):
        a = _sharded_axis(spec)
        if a is None:
            return x
        n = jax.lax.axis_size(AXIS)
        size = x.shape[a] // n
        return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(AXIS) * size, size, axis=a)

    return jax.tree_util.tree_map(one, state, specs)


def q_gains(params) -> list:
    """The attention blocks' query-gain leaves of a parameter tree (the inputs of ops.score_bound)."""
    return [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
            if "q_gain" in jax.tree_util.keystr(path)]


def make_train_step(graphdef, tx: Optimizer, bias_fn: Callable | None = None, donate: bool = True,
                    mesh: jax.sharding.Mesh | None = None, state_specs=None, head_dim: int | None = None,
                    attention_exact: bool = False, late_qat: bool = False):
    """step(params, opt_state, x_MBT, y_MBT, lr_scale, momentum, aux) -> (params, opt_state, metrics); with
    `late_qat` (optim.late_qat_threshold > 0) one more argument, `qat` (a bool scalar: the late-QAT flag of the
    model's forward, traced, so its switch does not recompile).

    Per device: M micro-batches of its rows are accumulated with lax.scan (gradients summed in float32),
    averaged over M and over the devices (one `pmean`: the baseline's loss * 1/grad_accum_steps on the
    global batch), then one `tx.apply` (unfused or fused alike) on the full optimizer state. x/y are
    sharded along `data` on axis 1 (the rows), parameters replicated, the optimizer state as `state_specs`
    (PartitionSpecs; default replicated). `head_dim` adds metrics["score_bound"] of the updated gains;
    metrics["grad_norm"] is the gradient's L2 norm before the optimizer (and its clipping, optim.grad_clip_norm).
    """
    mesh = mesh or single_device_mesh()

    def loss_fn(params, x_BT, y_BT, aux, qat):
        return jnp.mean(_forward(graphdef, params, x_BT, y_BT, bias_fn, aux, qat))

    grad_fn = jax.value_and_grad(loss_fn)

    def per_device(params, opt_state, x_MBT, y_MBT, lr_scale, momentum, aux, *qat):
        M = x_MBT.shape[0]
        qat = qat[0] if qat else None

        def micro(carry, xy):
            gsum, lsum = carry
            loss, g = grad_fn(params, xy[0], xy[1], aux, qat)
            gsum = jax.tree_util.tree_map(lambda a, b: a + b.astype(jnp.float32), gsum, g)
            return (gsum, lsum + loss), None

        with ops.attention_forward(attention_exact):
            zeros = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
            if M == 1:
                (gsum, lsum), _ = micro((zeros, jnp.float32(0)), (x_MBT[0], y_MBT[0]))
            else:
                (gsum, lsum), _ = jax.lax.scan(micro, (zeros, jnp.float32(0)), (x_MBT, y_MBT))
        gsum, lsum = jax.lax.pmean((gsum, lsum), AXIS)
        grads = jax.tree_util.tree_map(lambda g, p: (g / M).astype(p.dtype), gsum, params)
        params, opt_state = _update(tx, specs, grads, opt_state, params, lr_scale, momentum)
        metrics = {"loss": lsum / M, "grad_norm": optax.tree.norm(grads)}
        if head_dim is not None:
            metrics["score_bound"] = ops.score_bound(q_gains(params), head_dim)
        return params, opt_state, metrics

    specs = state_specs if state_specs is not None else P()  # P(): the whole state replicated
    in_specs = (P(), specs, P(None, AXIS), P(None, AXIS), P(), P(), P()) + ((P(),) if late_qat else ())
    step = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=(P(), specs, P()), check_vma=False)
    return Placed(jax.jit(step, donate_argnums=(0, 1) if donate else ()), _shardings(mesh, in_specs))


def _update(tx: Optimizer, specs, grads, opt_state, params, lr_scale, momentum):
    """Per device: the optimizer state gathered where ZeRO-1 shards it, one `tx.apply` (every device computes
    the same replicated parameters), and this device's slice of the new state kept."""
    params, full = tx.apply(grads, gather_state(opt_state, specs), params, lr_scale=lr_scale, momentum=momentum)
    return params, slice_state(full, specs)


def make_optimizer_step(tx: Optimizer, mesh: jax.sharding.Mesh | None = None, state_specs=None):
    """update(params, opt_state, grads, lr_scale, momentum) -> (params, opt_state): the train step's update
    alone, per device as the train step runs it (the kernel report and the program check trace it)."""
    mesh = mesh or single_device_mesh()
    specs = state_specs if state_specs is not None else P()
    in_specs = (P(), specs, P(), P(), P())
    body = jax.shard_map(lambda p, s, g, lr, mom: _update(tx, specs, g, s, p, lr, mom), mesh=mesh,
                         in_specs=in_specs, out_specs=(P(), specs), check_vma=False)
    return Placed(jax.jit(body), _shardings(mesh, in_specs))


def make_eval_step(graphdef, tables: ByteTables, bias_fn: Callable | None = None,
                   mesh: jax.sharding.Mesh | None = None, attention_exact: bool = False):
    """eval(params, x_BT, y_BT, mask_BT, aux) -> (nll_sum nats f32, tokens i32, bytes i32), sums only.

    bytes per target y with preceding input x: base_bytes[y] + (leading_space[y] and not boundary[x]).
    Per device on its rows (sharded along `data` on axis 0), the sums `psum`-med over the devices.
    """
    mesh = mesh or single_device_mesh()
    base = jnp.asarray(tables.base_bytes, jnp.int32)
    lead = jnp.asarray(tables.has_leading_space, bool)
    boundary = jnp.asarray(tables.is_boundary, bool)

    def per_device(params, x_BT, y_BT, mask_BT, aux):
        with ops.attention_forward(attention_exact):
            loss_BT = _forward(graphdef, params, x_BT, y_BT, bias_fn, aux)
        bytes_BT = base[y_BT] + (lead[y_BT] & ~boundary[x_BT]).astype(jnp.int32)
        m = mask_BT.astype(bool)
        sums = (jnp.sum(jnp.where(m, loss_BT, 0.0)), jnp.sum(m.astype(jnp.int32)), jnp.sum(jnp.where(m, bytes_BT, 0)))
        return jax.lax.psum(sums, AXIS)

    in_specs = (P(), P(AXIS), P(AXIS), P(AXIS), P())
    body = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=P(), check_vma=False)
    return Placed(jax.jit(body), _shardings(mesh, in_specs))


def evaluate_batches(eval_step, params, batches, aux=None) -> dict:
    """Sum eval_step over (x, y, mask) batches; host accumulation in float64 / Python ints."""
    nll, toks, nbytes = 0.0, 0, 0
    for x_BT, y_BT, mask_BT in batches:
        s = eval_step(params, x_BT, y_BT, mask_BT, aux)
        nll += float(s[0])
        toks += int(s[1])
        nbytes += int(s[2])
    return {"nll_sum_nats": nll, "tokens": toks, "bytes": nbytes}


def make_ttt_step(graphdef, tx: optax.GradientTransformation, bias_fn: Callable | None = None,
                  mesh: jax.sharding.Mesh | None = None, attention_exact: bool = False):
    """step(params, opt_state, x_BT, y_BT, rows_B, lr, aux) -> (params, opt_state, loss): one SGD step of score-first
    test-time training (frontier_jax.ttt). The loss is the mean per-token loss over the rows with rows_B = 1 (rows
    with 0 pad a short batch to the compiled shape: they add nothing), the training forward; the gradient goes
    through `tx` (clipping and momentum over the trained parameters, zero for the frozen ones) and the update is
    params - lr * update (`lr` a traced scalar: the cosine schedule never recompiles). Per device on its rows
    (sharded along `data`), the loss's sum and the gradient `psum`-med: the mean over every device's rows.
    Parameters and optimizer state are donated."""
    mesh = mesh or single_device_mesh()

    def per_device(params, opt_state, x_BT, y_BT, rows_B, lr, aux):
        T = x_BT.shape[1]
        count = jax.lax.psum(jnp.sum(rows_B.astype(jnp.float32)), AXIS) * T

        def loss_fn(p):
            loss_BT = _forward(graphdef, p, x_BT, y_BT, bias_fn, aux)
            return jnp.sum(jnp.where(rows_B.astype(bool)[:, None], loss_BT, 0.0)) / count

        with ops.attention_forward(attention_exact):
            loss, grads = jax.value_and_grad(loss_fn)(params)
        loss, grads = jax.lax.psum((loss, grads), AXIS)
        updates, opt_state = tx.update(grads, opt_state, params)
        updates = jax.tree_util.tree_map(lambda u: -lr * u, updates)
        return optax.apply_updates(params, updates), opt_state, loss

    in_specs = (P(), P(), P(AXIS), P(AXIS), P(AXIS), P(), P())
    step = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=(P(), P(), P()), check_vma=False)
    return Placed(jax.jit(step, donate_argnums=(0, 1)), _shardings(mesh, in_specs))
