"""An op's `jax.custom_vjp`, generated from its declaration (`dispatch.declare(..., vjp=Vjp(...))`).

A `Vjp` names the values of the op's two directions, and that is the whole rule:

    Vjp("x -> y, inv", "x, inv, dy -> dx")

- `forward` "operands -> outputs": what the forward primitive takes and returns, by position. An output
  whose cotangent `d<output>` the backward takes is one of the op's outputs (they come first); the
  others exist only to be saved (residuals such as inv, the per-row inverse RMS).
- `backward` "operands -> outputs": every operand that is not a cotangent is saved by the forward (an
  argument, a forward operand or a forward output, by name); the output `d<arg>` is the cotangent of
  the argument `arg`.
- An argument without a backward output gets a zero cotangent (None for an integer argument, ids and
  targets); every cotangent is cast to its argument's dtype (the kernels return fp32 weight gradients).
- `args`, `prepare`, `keep`, `grads`: where the op's arguments are not the forward's operands (the
  output projection folds its scale into its weight): `prepare(*args)` gives the forward operands,
  `keep` names values saved for `grads` only, and `grads(values)` returns {arg: cotangent} for the
  arguments whose cotangent is not `d<arg>` as is (`values`: every saved value and backward output by
  name, the cotangents among them).

`build(run, vjp)` returns the op's differentiable function `(*args, **static) -> output(s)`, where
`run(which, *operands, **static)` runs one direction of the declared op (`dispatch.OpSpec.__call__`).
The custom_vjp is built at each call (at trace time under jit), closing over the arguments' shapes and
dtypes and the static parameters (compile-time constants, never differentiated; both directions take
them but those named in `forward_only`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _arrow(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    left, right = text.split("->")
    return _names(left), _names(right)


@dataclasses.dataclass(frozen=True)
class Vjp:
    forward: str  # "operands -> outputs" of the forward primitive
    backward: str  # "operands -> outputs" of the backward primitive
    args: str = ""  # the op's arguments, where they differ from the forward's operands
    prepare: Callable | None = None  # (*args) -> the forward's operands
    keep: str = ""  # values saved for `grads` besides the backward's operands
    grads: Callable | None = None  # (values by name) -> {arg: cotangent}
    forward_only: str = ""  # static parameters only the forward takes (qk_attention's softmax shift)

    def __post_init__(self):
        fwd_in, fwd_out = _arrow(self.forward)
        bwd_in, _ = _arrow(self.backward)
        known = set(self.arg_names) | set(fwd_in) | set(fwd_out) | {f"d{o}" for o in self.outputs}
        unknown = [n for n in bwd_in + _names(self.keep) if n not in known]
        if unknown or fwd_out[:len(self.outputs)] != self.outputs:
            raise ValueError(f"Vjp({self.forward!r}, {self.backward!r}): the backward takes unknown {unknown}, or "
                             "the outputs with a cotangent are not the forward's first outputs")

    @property
    def arg_names(self) -> tuple[str, ...]:
        return _names(self.args) or _arrow(self.forward)[0]

    @property
    def outputs(self) -> tuple[str, ...]:
        """The op's outputs: the forward outputs whose cotangent the backward takes."""
        bwd_in = _arrow(self.backward)[0]
        return tuple(o for o in _arrow(self.forward)[1] if f"d{o}" in bwd_in)

    @property
    def saved(self) -> tuple[str, ...]:
        """What the forward saves for the backward (the residuals), in order."""
        cotangents = {f"d{o}" for o in self.outputs}
        bwd_in = _arrow(self.backward)[0]
        return tuple(n for n in bwd_in if n not in cotangents) + tuple(
            n for n in _names(self.keep) if n not in bwd_in)


def _cotangent(value, aval):
    if value is None:
        return None if jnp.issubdtype(aval.dtype, jnp.integer) else jnp.zeros(aval.shape, aval.dtype)
    return value.astype(aval.dtype)


def build(run: Callable, vjp: Vjp) -> Callable:
    """The op's differentiable function: a custom_vjp whose forward and backward each `run` one direction."""
    args, (fwd_in, fwd_out), (bwd_in, bwd_out) = vjp.arg_names, _arrow(vjp.forward), _arrow(vjp.backward)
    outputs, saved = vjp.outputs, vjp.saved
    cotangents = tuple(f"d{o}" for o in outputs)

    def apply(*arrays, **static):
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]

        def forward(*a) -> dict:
            values = dict(zip(args, a))
            operands = vjp.prepare(*a) if vjp.prepare else a
            values.update(zip(fwd_in, operands))
            values.update(zip(fwd_out, run("fwd", *operands, **static)))
            return values

        def pick(values):
            outs = tuple(values[o] for o in outputs)
            return outs if len(outs) > 1 else outs[0]

        def op_fwd(*a):
            values = forward(*a)
            return pick(values), tuple(values[n] for n in saved)

        def op_bwd(residuals, cts):
            values = dict(zip(saved, residuals))
            values.update(zip(cotangents, cts if len(outputs) > 1 else (cts,)))
            bwd_static = {k: v for k, v in static.items() if k not in _names(vjp.forward_only)}
            values.update(zip(bwd_out, run("bwd", *(values[n] for n in bwd_in), **bwd_static)))  # a kernel may
            special = vjp.grads(values) if vjp.grads else {}  # return fewer (head_loss without a bias)
            return tuple(_cotangent(special[n] if n in special else values.get(f"d{n}"), aval)
                         for n, aval in zip(args, avals))

        op = jax.custom_vjp(lambda *a: pick(forward(*a)))
        op.defvjp(op_fwd, op_bwd)
        return op(*arrays)

    return apply
