"""The trainer's jitted programs as they run on Neuron, as jaxprs, and a walk over every equation in them.

`trace_steps(cfg, num_devices, dtypes, tx)` traces the train step (both qk_attention forwards), the eval step and
the optimizer update exactly as the trainer builds them (`frontier_jax.steps`, the config's model,
optimizer, n-gram bias and batch split), for a mesh of `num_devices` NeuronCores (an abstract mesh:
no device is needed), with Neuron's dtype policy (or the run's) and every kernel call standing where it is
on Neuron (`dispatch.kernel_primitives`: a `frontier_<op>_fwd/_bwd` equation with the kernel's
operands and static parameters). Nothing is compiled or run.

`walk(closed_jaxpr)` yields a `Site` per equation, descending into every sub-jaxpr (jit, custom_vjp,
scan, while, cond, shard_map, ...), with how many times the equation runs per call of the program
(the product of the enclosing scans' lengths) and whether it is inside a per-device (shard_map) region.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh

from frontier_jax import ops, optim
from frontier_jax.config import Config
from frontier_jax.data.tokenizer import ByteTables
from frontier_jax.model import build
from frontier_jax.ngram import bias as ngram_bias
from frontier_jax.ngram import runtime as ngram_runtime
from frontier_jax.parallel import state_specs
from frontier_jax.policies import dtypes as dtype_policy
from frontier_jax.policies.geometry import split_batch
from frontier_jax.steps import AXIS, make_eval_step, make_optimizer_step, make_train_step

KERNEL_PREFIX = "frontier_"  # the kernel-backed ops' primitives (frontier_jax.ops.dispatch)


@dataclasses.dataclass(frozen=True)
class Site:
    eqn: object  # jax.extend.core.JaxprEqn
    multiplicity: int  # times it runs per call of the traced program
    per_device: bool  # inside a shard_map body
    path: tuple[str, ...]  # the enclosing higher-order primitives, outermost first

    @property
    def primitive(self) -> str:
        return self.eqn.primitive.name

    @property
    def is_kernel(self) -> bool:
        return self.primitive.startswith(KERNEL_PREFIX) and bool(self.eqn.params.get("kernel"))


def _sub_jaxprs(eqn) -> Iterator[tuple[object, int]]:
    """(jaxpr, repeat factor) of every jaxpr an equation's parameters hold."""
    repeat = int(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else 1
    for v in eqn.params.values():
        for j in (v if isinstance(v, (tuple, list)) else (v,)):
            inner = getattr(j, "jaxpr", j)  # ClosedJaxpr -> Jaxpr
            if hasattr(inner, "eqns"):
                yield inner, repeat


def walk(closed, multiplicity: int = 1, per_device: bool = False, path: tuple[str, ...] = ()) -> Iterator[Site]:
    """Every equation of `closed` (a ClosedJaxpr or Jaxpr) and of every sub-jaxpr, depth first."""
    jaxpr = getattr(closed, "jaxpr", closed)
    for eqn in jaxpr.eqns:
        yield Site(eqn, multiplicity, per_device, path)
        inside = per_device or eqn.primitive.name == "shard_map"
        for sub, repeat in _sub_jaxprs(eqn):
            yield from walk(sub, multiplicity * repeat, inside, path + (eqn.primitive.name,))


def kernel_sites(closed) -> list[Site]:
    """The kernel calls of a traced program (see `trace_steps`)."""
    return [s for s in walk(closed) if s.is_kernel]


@dataclasses.dataclass(frozen=True)
class Traced:
    """The programs of one config at one device count, and the shapes they were traced at."""

    programs: dict  # name -> ClosedJaxpr: "train", "train (exact-max attention)", "eval", "optimizer"
    num_devices: int
    global_micro: int
    accum: int


def _abstract(tree):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def on_neuron(cfg: Config) -> tuple[dtype_policy.Dtypes, optim.Optimizer]:
    """(dtypes, optimizer) of `cfg` on Neuron: its dtype policy there and the optimizer built for it (the command
    lines trace with these; the trainer hands `trace_steps` the ones it resolved and built itself)."""
    dtypes = dtype_policy.resolve(cfg, "neuron")
    return dtypes, optim.build_optimizer(cfg.optim, dtypes.muon_ns)


def trace_steps(cfg: Config, num_devices: int, dtypes: dtype_policy.Dtypes, tx: optim.Optimizer, *, model_fn=build,
                eval_model_fn=None, only: tuple[str, ...] | None = None) -> Traced:
    """The trainer's steps for `cfg` on `num_devices` NeuronCores (one trn1.2xlarge chip is 2 NeuronCores, 2 JAX
    devices), in `dtypes` with the optimizer `tx`, traced with the kernel calls in place (module docstring).
    `model_fn(cfg, compute_dtype)` builds the model both steps use (the trainer's: `model.build`); `eval_model_fn`,
    when given, the one the eval step uses instead (what the one-forward check compares,
    frontier_jax.submission.forward). `only`: trace just these programs (default all four)."""
    t = cfg.train
    global_micro, accum = split_batch(t.tokens_per_step // t.seq_len, t.micro_batch_seqs, num_devices)
    mesh = AbstractMesh((num_devices,), (AXIS,))
    graphdef, params = nnx.split(nnx.eval_shape(lambda: model_fn(cfg, dtypes.compute)))
    eval_graphdef = graphdef if eval_model_fn is None else nnx.split(
        nnx.eval_shape(lambda: eval_model_fn(cfg, dtypes.compute)))[0]
    params = _abstract(params)
    opt_state = jax.eval_shape(tx.init, params)
    specs = state_specs(opt_state, num_devices, cfg.parallel.zero1)
    bias_fn, aux = None, None
    if cfg.ngram.enabled:
        bias_fn, aux = ngram_runtime.bias_fn, _abstract(ngram_bias.empty_tables(cfg.ngram))
    V, T = cfg.model.vocab_size, t.seq_len
    tables = ByteTables(np.zeros(V, np.int32), np.zeros(V, bool), np.zeros(V, bool))
    tok = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    f32 = jax.ShapeDtypeStruct((), jnp.float32)
    programs = {}
    with ops.kernel_primitives(cfg.model):  # an op whose kernel lacks a model switch traces its reference
        for exact in (False, True):
            name = "train (exact-max attention)" if exact else "train"
            if only is not None and name not in only:
                continue
            step = make_train_step(graphdef, tx, bias_fn, mesh=mesh, state_specs=specs, head_dim=cfg.model.head_dim,
                                   attention_exact=exact).jitted
            programs[name] = jax.make_jaxpr(step)(params, opt_state, tok(accum, global_micro, T),
                                                  tok(accum, global_micro, T), f32, f32, aux)
        if only is None or "eval" in only:
            eval_step = make_eval_step(eval_graphdef, tables, bias_fn, mesh=mesh).jitted
            B = t.val_batch_seqs
            programs["eval"] = jax.make_jaxpr(eval_step)(params, tok(B, T), tok(B, T), tok(B, T), aux)
        if only is None or "optimizer" in only:
            update = make_optimizer_step(tx, mesh=mesh, state_specs=specs).jitted
            programs["optimizer"] = jax.make_jaxpr(update)(params, opt_state, params, f32, f32)
    return Traced(programs, num_devices, global_micro, accum)
