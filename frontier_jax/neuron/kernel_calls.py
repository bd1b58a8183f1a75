"""Every NKI kernel call of a training step, read off the traced step itself, and the work between them.

The step is `frontier_jax.neuron.program.trace_steps(cfg, 2, ...).programs["train"]`: the trainer's train step
as it runs on Neuron (the per-device part inside `jax.shard_map`, the micro-batch scan, the optimizer, the
config's n-gram bias, the bounded-shift attention forward), every kernel call a `frontier_<op>_fwd` / `_bwd`
equation with the kernel's operands and static parameters; `program.walk` gives each equation with how many
times it runs per step (the enclosing scans' lengths).

`kernel_calls(cfg)` turns those equations into `KernelCall`s: the op, the direction, the kernel's operands
(the primitive's avals through the op's kernel adapter, as frontier_jax.ops.dispatch.kernel_call passes them),
its static parameters (the kernel's compile-time constants) and calls per step; identical calls are merged.
`glue(cfg)` is the rest of the step: bytes through HBM and matmul MACs of the equations outside kernels
(`Glue`), per jaxpr of the same walk, and the part of it each of the model's named XLA computations runs
(BigramHash, SmearGate, the value embeddings: `model.RECIPE_XLA_OPS`, by their jax.named_scope).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from frontier_jax.ops import dispatch
from frontier_jax.neuron import memory, program as _program
from frontier_jax.config import Config
from frontier_jax.model import RECIPE_XLA_OPS
from frontier_jax.policies.geometry import split_batch

CORES = 2  # trn1.2xlarge: one chip, two NeuronCore-v2, data parallel
PREFIX = _program.KERNEL_PREFIX
# equations that move no data (views, metadata, collectives' bookkeeping) or hold sub-jaxprs, walked instead
FREE = {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose", "copy_p", "pjit", "jit",
        "custom_vjp_call", "custom_jvp_call", "scan", "cond", "while", "shard_map", "closed_call", "remat",
        "checkpoint", "stop_gradient", "iota", "random_wrap", "random_unwrap", "random_seed", "random_bits",
        "axis_index"}


@dataclasses.dataclass(frozen=True)
class KernelCall:
    op: str
    which: str  # "fwd" | "bwd"
    inputs: tuple  # kernel operands: ((shape, dtype name) | None, ...)
    constants: tuple  # ((name, value), ...): static parameters
    calls_per_step: int

    @property
    def label(self) -> str:
        shapes = [("x".join(map(str, s[0])) if s else "-") for s in self.inputs if s is not None][:3]
        return ", ".join(shapes)


def microbatches(cfg: Config) -> tuple[int, int]:
    """(sequences per micro-batch, micro-batches per step) on one core (train.micro_batch_seqs = 0: the largest
    that fits a NeuronCore's HBM, as `program.trace_steps` chooses it)."""
    t = cfg.train
    if not t.micro_batch_seqs:
        traced = _program.trace_steps(cfg, CORES, *_program.on_neuron(cfg))
        return traced.global_micro // CORES, traced.accum
    global_micro, accum = split_batch(t.tokens_per_step // t.seq_len, t.micro_batch_seqs, CORES)
    return global_micro // CORES, accum


def program(cfg: Config):
    """One core's training step as a ClosedJaxpr (frontier_jax.neuron.program, traced as on Neuron)."""
    return _program.trace_steps(cfg, CORES, *_program.on_neuron(cfg)).programs["train"]


def _jaxprs(closed, multiplicity: int = 1, scope: str | None = None, names: tuple[str, ...] = ()):
    """(jaxpr, runs per step, the name of `names` it runs under or None) of `closed` and every sub-jaxpr, as
    `program.walk` descends (a sub-jaxpr runs under its holding equation's name)."""
    jaxpr = getattr(closed, "jaxpr", closed)
    yield jaxpr, multiplicity, scope
    for eqn in jaxpr.eqns:
        for sub, repeat in _program._sub_jaxprs(eqn):
            yield from _jaxprs(sub, multiplicity * repeat, _scope(eqn, scope, names), names)


def _scope(eqn, inherited: str | None, names: tuple[str, ...]) -> str | None:
    """The first of `names` in the equation's name stack (jax.named_scope; JAX keeps a scope's name through
    autodiff: "jvp(name)", "transpose(jvp(name))"), else the name its jaxpr runs under."""
    stack = str(eqn.source_info.name_stack)
    return next((n for n in names if n in stack), inherited)


def _spec(a):
    return None if a is None else (tuple(int(n) for n in a.shape), np.dtype(a.dtype).name)


def kernel_call_of(eqn, calls: int) -> KernelCall:
    op, _, which = eqn.primitive.name[len(PREFIX):].rpartition("_")
    if op not in dispatch.SPECS:  # an op without a backward: the primitive is frontier_<op>
        op, which = eqn.primitive.name[len(PREFIX):], "fwd"
    spec = dispatch.SPECS[op]
    arrays = tuple(np.broadcast_to(np.zeros((), v.aval.dtype), v.aval.shape) for v in eqn.invars)
    operands = tuple(spec.adapter.args(which, arrays))
    static = tuple(sorted((k, v) for k, v in eqn.params.items() if k != "kernel"))
    return KernelCall(op, which, tuple(_spec(a) for a in operands), static, calls)


def kernel_calls(cfg: Config, closed=None) -> list[KernelCall]:
    """The step's kernel calls (merged when identical), in first-seen order."""
    merged: dict = {}
    for site in _program.kernel_sites(closed if closed is not None else program(cfg)):
        c = kernel_call_of(site.eqn, site.multiplicity)
        key = (c.op, c.which, c.inputs, c.constants)
        prev = merged.get(key)
        merged[key] = c if prev is None else dataclasses.replace(prev, calls_per_step=prev.calls_per_step + c.calls_per_step)
    return list(merged.values())


@dataclasses.dataclass(frozen=True)
class Glue:
    """The step's work outside kernels, per core: HBM bytes if XLA fuses every run of element-wise equations
    between kernels into one loop (`fused_bytes`: only values entering from or leaving to kernels, the
    step's inputs and outputs, or another jaxpr cross HBM) and if it fuses nothing (`unfused_bytes`: every
    equation reads its inputs and writes its outputs; views and metadata free), and matmul MACs (dot_general)."""

    fused_bytes: float
    unfused_bytes: float
    dot_macs: float
    equations: int
    # the part of these under each name `glue` was given (the model's named XLA computations, model.RECIPE_XLA_OPS):
    # name -> {"fused_bytes", "unfused_bytes", "dot_macs", "equations"}; a name the step does not run is absent
    named: dict = dataclasses.field(default_factory=dict)


_var, _bytes = memory.is_var, memory.nbytes


def _dot_macs(eqn) -> int:
    (lc, rc), (lb, _) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    contract = math.prod(lhs[i] for i in lc)
    return math.prod(eqn.outvars[0].aval.shape) * contract


def glue(cfg: Config, closed=None, names: tuple[str, ...] = RECIPE_XLA_OPS) -> Glue:
    """The step's work outside kernels (`Glue`), with the part of it that runs under each of `names`."""
    closed = closed if closed is not None else program(cfg)
    keys = ("fused_bytes", "unfused_bytes", "dot_macs", "equations")
    total = dict.fromkeys(keys, 0.0)
    named: dict = {}
    for jaxpr, mult, inherited in _jaxprs(closed, names=names):
        consumers_outside = set(v for v in jaxpr.outvars if _var(v))  # read by kernels, sub-jaxprs or the caller
        work = []
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name.startswith(PREFIX) or name in FREE or any(True for _ in _program._sub_jaxprs(eqn)):
                consumers_outside.update(v for v in eqn.invars if _var(v))
                continue
            work.append(eqn)
        made, read = {}, set()  # made: variable -> the scope of the equation that made it
        for eqn in work:
            scope = _scope(eqn, inherited, names)
            accs = [total] + ([named.setdefault(scope, dict.fromkeys(keys, 0.0))] if scope else [])
            ins = [v for v in eqn.invars if _var(v)]
            fresh = [v for v in ins if v not in made and v not in read]
            add = {"equations": 1, "unfused_bytes": sum(_bytes(v) for v in ins) + sum(_bytes(v) for v in eqn.outvars),
                   "fused_bytes": sum(_bytes(v) for v in fresh),
                   "dot_macs": _dot_macs(eqn) if eqn.primitive.name == "dot_general" else 0}
            for acc in accs:
                for k, n in add.items():
                    acc[k] += mult * n
            read.update(fresh)
            made.update((v, scope) for v in eqn.outvars)
        for v, scope in made.items():  # a value leaving the fused run: written once
            if v in consumers_outside:
                for acc in [total] + ([named[scope]] if scope else []):
                    acc["fused_bytes"] += mult * _bytes(v)
    return Glue(total["fused_bytes"], total["unfused_bytes"], total["dot_macs"], int(total["equations"]),
                {n: {**v, "equations": int(v["equations"])} for n, v in named.items()})
