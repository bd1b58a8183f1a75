"""The kernel-dispatch layer: each kernel-backed op is declared once, and this module decides, reports
and wires which implementation it runs (its NKI kernel, its pure-JAX reference, or, in tests, the
kernel source under the NumPy emulator, as a host callback).

Declaring an op. `declare(name, fwd, bwd=None, static=(), adapter=None, vjp=None)` (called in
`frontier_jax.ops`) takes the op's pure-JAX references (`frontier_jax.ops.reference`: forward, and the
backward for a differentiable op) and the names of its static parameters (compile-time constants
such as head_loss's softcap). It builds one JAX primitive per direction (`frontier_<op>_fwd` /
`_bwd`; a single `frontier_<op>` for an op without backward, the optimizer updates) whose abstract
output shapes are those of the reference (`jax.eval_shape`) and whose only lowering, on every
platform, is the reference. The kernel lives in `kernels_nki.registry.KERNELS[name]` (module and
function names); `adapter` (a `KernelAdapter`) maps the primitive's operands to the kernel's
calling convention and its outputs back, where the two differ. `vjp` (a `frontier_jax.ops.vjp.Vjp`) names
what a differentiable op's forward saves and what its backward returns; the declaration's `apply` is
then the op's `jax.custom_vjp`, generated from it (`frontier_jax.ops.vjp`). `public(spec, reference)`
makes an op's public function call `reference` instead when its row says "reference" (`direct`).

On Neuron an op whose row says "nki" calls its `@nki.jit` kernel directly on the JAX operands inside
the jitted program, the path AWS documents for JAX (aws-neuron-sdk `nki/guides/framework_custom_op.rst`,
"JAX" and "Using NKI in training graphs"; `nki.jit` picks its JAX integration from the argument type,
`nki/api/nki/__init__.py`, `jit`): compile-time constants are keyword arguments, the kernel allocates
and returns its own outputs, and training pairs the forward and backward kernels in a `jax.custom_vjp`
(`frontier_jax.ops.vjp`). (`jax_neuronx.nki_call` is gone since Neuron 2.23,
`release-notes/components/jax.rst`.) The primitives carry the reference everywhere else: their only
lowering is the reference, and a primitive bound with kernel=True (`kernel_primitives()`, the program
check's trace) refuses to lower, so it can never stand in for a kernel silently. No operand handed to
a kernel may be zero-size: a kernel argument becomes an `NkiTensor`, whose shape is "a tuple of
positive integers" (`nki/api/nki/language/__init__.py`, `NkiTensor.__init__`); adapters pad such
operands to a valid shape and `kernel_call` refuses any left.

Data parallelism does not change any of this: the steps (`frontier_jax.steps`) run the model and the
optimizer inside `jax.shard_map`, so each kernel is traced and called at its own device's shard.

The kernel table (`kernel_table()`: one `KernelRow` per declared op and per experimental kernel of the
registry, impl nki | reference | emulated | unused and the reason; an experimental kernel is always
"unused" but where a test emulates it) says which path every op takes in this process; `format_kernel_table`
prints it at start-up and `dataclasses.asdict` makes each row JSON. `configure("strict")` raises
`KernelUnavailableError` naming every op that would not run its NKI kernel. Call `configure` before
tracing: the choice is made at trace time (`configure` and `emulated` clear JAX's caches).

Model switches. An op declares the switches its kernel does not compute for every value (`Switch`: a `ModelConfig`
field, the op's keyword argument it sets and which of its values the kernel computes).
`configure(..., model=cfg.model)` evaluates them for the run's model (`switch_fallbacks`): an op whose kernel
cannot compute the model's setting is "reference" in the table with the setting named in the reason, whatever the
platform (strict mode therefore fails naming it), and its calls run the reference. A call with such a setting on an
op the table says runs its kernel is an error, never a silent reference (the table was configured for another
model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from frontier_jax.ops import vjp as vjp_rules
from frontier_jax.errors import BadInput
from kernels_nki import registry

from frontier_jax.config import KERNEL_MODES as MODES  # auto, reference, strict: spelled once, in config


class KernelUnavailableError(BadInput):
    """`--kernels strict` and some op would not run its NKI kernel."""


@dataclasses.dataclass(frozen=True)
class KernelRow:
    op: str
    impl: str  # "nki" | "reference" | "emulated" | "unused"
    reason: str


@dataclasses.dataclass(frozen=True)
class KernelAdapter:
    """The kernel's calling convention where it differs from the primitive's (identity by default).

    args(which, arrays) -> the kernel's operands; outs(which, kernel_outputs, arrays) -> the
    primitive's outputs. `which` is "fwd" or "bwd"; arrays are JAX values under the Neuron lowering
    and NumPy arrays under the emulator.
    """

    args: Callable = lambda which, arrays: arrays
    outs: Callable = lambda which, outs, arrays: outs


@dataclasses.dataclass(frozen=True)
class Switch:
    """A model setting that changes an op and whose every value its kernel does not compute: `ModelConfig.<field>`
    is passed to the op as keyword `param`; the kernel computes the values for which `computes(value)` holds
    (`what` says which)."""

    field: str
    param: str
    computes: Callable[[object], bool]
    what: str


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    refs: dict  # {"fwd": fn, "bwd": fn}: the pure-JAX references, (*arrays, **static) -> tuple
    static: tuple[str, ...]
    adapter: KernelAdapter
    prims: dict  # {"fwd": Primitive, "bwd": Primitive}
    unused_reason: str  # the table's reason when the run never calls it
    vjp: vjp_rules.Vjp | None = None  # what the forward saves and the backward returns
    apply: Callable | None = None  # (*args, **static) -> outputs: the op's custom_vjp, built from `vjp`
    switches: tuple[Switch, ...] = ()  # model settings its kernel does not compute

    def __call__(self, which: str, *arrays, **static) -> tuple:
        """Run direction `which` ("fwd" | "bwd") with the implementation the table chose."""
        if _state["kernel_primitives"]:  # the Neuron program as traced for its check (kernel_primitives)
            return tuple(self.prims[which].bind(*arrays, kernel=self.name in registry.KERNELS, **static))
        impl = _impl(self.name)
        if impl == "emulated":
            return _emulated_call(self, which, arrays, static)
        if impl == "nki":  # AWS's documented JAX path: the @nki.jit kernel called on the JAX arrays
            return kernel_call(self, which, _nki_kernel(self.name, which), arrays, static)
        return tuple(self.prims[which].bind(*arrays, kernel=False, **static))


SPECS: dict[str, OpSpec] = {}  # declaration order = the kernel table's row order


def declare(name: str, fwd: Callable, bwd: Callable | None = None, static: tuple[str, ...] = (),
            adapter: KernelAdapter | None = None, unused_reason: str = "not used by this run",
            vjp: vjp_rules.Vjp | None = None, switches: tuple[Switch, ...] = ()) -> OpSpec:
    """Declare a kernel-backed op: its references, static parameters, kernel adapter, the model switches its
    kernel does not compute and, for a differentiable op, its residual and cotangent rules (module doc)."""
    refs = {"fwd": fwd} if bwd is None else {"fwd": fwd, "bwd": bwd}
    prims = {w: _primitive(f"frontier_{name}" + (f"_{w}" if bwd is not None else ""), ref, static)
             for w, ref in refs.items()}
    spec = OpSpec(name, refs, tuple(static), adapter or KernelAdapter(), prims, unused_reason, vjp,
                  switches=tuple(switches))
    if vjp is not None:
        spec = dataclasses.replace(spec, apply=vjp_rules.build(spec, vjp))
    SPECS[name] = spec
    return spec


def public(spec: OpSpec, reference: Callable) -> Callable:
    """Decorator of an op's public function: it calls `reference` (same arguments) when the op's row says
    "reference" (`direct`: plain autodiff, no custom_vjp) or the call sets a switch its kernel does not compute
    (`_switched`), its own body (the kernel path) otherwise."""
    def wrap(kernel_path: Callable) -> Callable:
        @functools.wraps(kernel_path)
        def op(*args, **kwargs):
            if _switched(spec, kwargs) or direct(spec.name):
                return reference(*args, **kwargs)
            return kernel_path(*args, **kwargs)
        return op
    return wrap


class SwitchNotConfiguredError(RuntimeError):
    """An op was called with a switch its kernel does not compute while its table row says the kernel runs."""


def _switched(spec: OpSpec, kwargs: dict) -> bool:
    """Whether this call sets a switch the op's kernel does not compute (it then runs the reference): allowed
    where the table shows the op as reference (for this switch, `configure(model=...)`, or for any other reason
    outside a kernel trace); an error where the table says the kernel runs."""
    on = [f"{s.param}={kwargs[s.param]!r}" for s in SPECS[spec.name].switches
          if s.param in kwargs and not s.computes(kwargs[s.param])]
    if not on:
        return False
    if spec.name in _state["switched"]:
        return True
    if not _state["kernel_primitives"] and _impl(spec.name) in ("reference", "unused"):
        return True
    raise SwitchNotConfiguredError(
        f"{spec.name} called with {', '.join(on)}, which its kernel does not compute, but the kernel table was "
        "configured for a model without it: configure the table (and kernel_primitives) with the run's model")


def _primitive(name: str, ref: Callable, static: tuple[str, ...]) -> Primitive:
    prim = Primitive(name)
    prim.multiple_results = True
    shapes = jax.jit(lambda *a, **s: tuple(ref(*a, **s)), static_argnames=static)
    prim.def_abstract_eval(lambda *avals, kernel, **s: tuple(
        jax.core.ShapedArray(o.shape, o.dtype) for o in shapes.eval_shape(*avals, **s)))

    def lower(*a, kernel, **s):
        if kernel:
            raise KernelPrimitiveLoweredError(
                f"{name}: a kernel=True primitive (a program-check trace) was lowered; kernels are called, "
                "not lowered (frontier_jax.ops.dispatch)")
        return tuple(ref(*a, **s))

    mlir.register_lowering(prim, mlir.lower_fun(lower, multiple_results=True))
    eager = jax.jit(prim.bind, static_argnames=("kernel",) + tuple(static))
    prim.def_impl(lambda *args, kernel, **s: eager(*args, kernel=kernel, **s))
    return prim


class KernelPrimitiveLoweredError(RuntimeError):
    """A primitive standing for a kernel call (kernel=True) reached XLA: it has no lowering but the reference."""


# ----------------------------------------------------------------------------- calling a kernel


class ZeroSizeOperandError(ValueError):
    """A kernel would receive a zero-size operand (an NkiTensor's shape is positive integers)."""


def kernel_call(spec: OpSpec, which: str, kernel: Callable, arrays, static: dict) -> tuple:
    """Call `kernel` (an `@nki.jit` function, or its emulated twin) the documented way: operands through
    the adapter, compile-time constants as keyword arguments, outputs back through the adapter."""
    operands = tuple(spec.adapter.args(which, tuple(arrays)))
    for i, a in enumerate(operands):  # None: an optional operand the kernel takes as absent
        if a is not None and 0 in tuple(a.shape):
            raise ZeroSizeOperandError(
                f"{spec.name} {which}: kernel operand {i} has shape {tuple(a.shape)}; NKI tensors need positive "
                "sizes (aws-neuron-sdk nki/api/nki/language/__init__.py, NkiTensor): adapt it in ops.py")
    outs = kernel(*operands, **static)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    return tuple(spec.adapter.outs(which, outs, tuple(arrays)))


def _kernel_name(op: str, which: str) -> str:
    return getattr(registry.KERNELS[op], which)


_nki_modules: dict[str, object] = {}  # op -> its kernel module imported against the real nki (configure)


def _load_nki(op: str) -> None:
    """Import `op`'s kernel module against the real `nki` (raises if it does not import; every configure)."""
    _nki_modules[op] = registry.load_nki(op)


def _nki_kernel(op: str, which: str) -> Callable:
    return getattr(_nki_modules[op], _kernel_name(op, which))


def _emulated_call(spec: OpSpec, which: str, arrays, static: dict) -> tuple:
    """The kernel source under the NumPy emulator, as a host callback in the program (tests only)."""
    structs = tuple((tuple(a.shape), str(a.dtype))
                    for a in jax.eval_shape(lambda *a: tuple(spec.refs[which](*a, **static)), *arrays))

    def host(*host_arrays):
        kernel = getattr(registry.load_emulated(spec.name), _kernel_name(spec.name, which))
        outs = kernel_call(spec, which, kernel, list(host_arrays), static)
        return tuple(np.asarray(o, dtype=np.dtype(d)).reshape(shape) for o, (shape, d) in zip(outs, structs))

    return tuple(_emulated_p.bind(*arrays, host=host, structs=structs))


# The emulated kernel's host callback. jax.pure_callback hands its callback jax.Arrays placed on the CPU
# device; reading them (np.asarray) waits on the CPU client's threads, so with several simulated devices
# in one shard_map, all inside callbacks, the program deadlocks (seen on 4 devices, 2 cores). This
# primitive lowers to the same XLA host-callback custom call through JAX's callback emitter, whose
# callback receives the operands as NumPy arrays (jax._src.callback: JAX's own, not public, API; the
# test-only path depends on it and fails loudly if it changes).
_emulated_p = Primitive("frontier_emulated_kernel")
_emulated_p.multiple_results = True
_emulated_p.def_abstract_eval(lambda *avals, host, structs: tuple(
    jax.core.ShapedArray(shape, np.dtype(d)) for shape, d in structs))


def _emulated_lowering(ctx, *args, host, structs):
    from jax._src import callback

    sharding = callback._callback_op_sharding(ctx.module_context.axis_context, None, ctx.avals_out)
    results, _, _ = callback.emit_python_callback(ctx, host, None, list(args), ctx.avals_in, ctx.avals_out,
                                                  has_side_effect=False, returns_token=False, sharding=sharding)
    return results


mlir.register_lowering(_emulated_p, _emulated_lowering, cacheable=False)


# ----------------------------------------------------------------------------- the kernel table

_state = {"mode": "auto", "platform": None, "rows": None, "emulated": frozenset(), "unused": frozenset(),
          "direct": True, "kernel_primitives": False, "model": None, "switched": frozenset()}


def table_ops() -> list[str]:
    """The kernel table's ops: the declared ones (declaration order), then the registry's experimental
    kernels (`kernels_nki.registry`; no production op calls them), declared or not."""
    experimental = [op for op, k in registry.KERNELS.items() if k.experimental]
    return [op for op in SPECS if op not in experimental] + experimental


def switch_fallbacks(model) -> list[KernelRow]:
    """The "reference" rows of the declared ops whose kernel cannot compute `model`'s settings (a `ModelConfig`;
    None: the baseline's, none), each reason naming the settings: what such a model runs instead of the kernels
    on every platform (the kernel table, strict mode, the Neuron program check)."""
    rows = []
    for op, spec in SPECS.items():
        off = [s for s in spec.switches if model is not None and not s.computes(getattr(model, s.field))]
        if off and op in registry.KERNELS:
            rows.append(KernelRow(op, "reference", "; ".join(f"model.{s.field}={getattr(model, s.field)!r}: {s.what}"
                                                             for s in off)))
    return rows


def _resolve(op: str, mode: str, platform: str, unused: frozenset, switched: dict) -> KernelRow:
    if op in unused:
        return KernelRow(op, "unused", SPECS[op].unused_reason)
    experimental = op in registry.KERNELS and registry.KERNELS[op].experimental
    if experimental and not (op in _state["emulated"] and op in SPECS):
        return KernelRow(op, "unused", f"experimental: {experimental}")
    if op in switched:
        return switched[op]
    if op in _state["emulated"]:
        return KernelRow(op, "emulated", "NumPy emulator of the NKI kernel via a host callback (tests only)")
    kspec = registry.KERNELS.get(op)
    if kspec is None:
        return KernelRow(op, "reference", "no kernel")
    if mode == "reference":
        return KernelRow(op, "reference", "kernels=reference")
    if platform != "neuron":
        return KernelRow(op, "reference", f"platform {platform}")
    try:
        _load_nki(op)
    except Exception as e:  # every failure becomes a visible row (and a strict-mode error)
        return KernelRow(op, "reference", f"kernel unavailable: {type(e).__name__}: {e}")
    return KernelRow(op, "nki", f"{kspec.module}." + "/".join(n for n in (kspec.fwd, kspec.bwd) if n))


def configure(mode: str = "auto", platform: str | None = None, unused=(), model=None) -> list[KernelRow]:
    """Decide every op's implementation for this process; strict raises if any op misses its kernel.

    `unused`: ops this run never calls (e.g. the fused optimizer ops when optim.fused is off); they are
    listed as such and do not count for strict mode. `model`: the run's `ModelConfig` (None: the baseline's);
    an op whose kernel cannot compute its settings is "reference" with them named (`switch_fallbacks`).
    """
    rows = _configure(mode, platform, frozenset(unused), model)
    jax.clear_caches()
    return rows


def _configure(mode: str, platform: str | None, unused: frozenset = frozenset(), model=None) -> list[KernelRow]:
    if mode not in MODES:
        raise BadInput(f"kernels mode must be one of {'|'.join(MODES)}, got {mode!r}")
    platform = platform or jax.default_backend()
    switched = {r.op: r for r in switch_fallbacks(model) if r.op not in unused}
    rows = [_resolve(op, mode, platform, unused, switched) for op in table_ops()]
    if mode == "strict":
        missing = [r for r in rows if r.impl not in ("nki", "unused")]
        if missing:
            raise KernelUnavailableError(
                "strict kernels: no NKI kernel will run for " + ", ".join(f"{r.op} ({r.reason})" for r in missing))
    _state.update(mode=mode, platform=platform, rows={r.op: r for r in rows}, unused=unused, model=model,
                  switched=frozenset(switched))
    return rows


def kernel_table() -> list[KernelRow]:
    """The current table (configured with mode "auto" on first use)."""
    if _state["rows"] is None or list(_state["rows"]) != table_ops():
        _configure(_state["mode"], _state["platform"], _state["unused"], _state["model"])
    return [_state["rows"][op] for op in table_ops()]


def format_kernel_table(rows: list[KernelRow]) -> str:
    width = max(len(r.op) for r in rows)
    return "\n".join(["kernel table:"] + [f"  {r.op:<{width}}  {r.impl:<9}  {r.reason}" for r in rows])


def run_log_table(rows: list[KernelRow], platform: str) -> str:
    """The kernel table as a run's log shows it: on Neuron, or where a kernel or its emulator runs, the whole
    table; elsewhere (every op on its pure-JAX reference) one line, the ops a run does not call and the
    kernels that are Neuron's only counted (the whole table is the run directory's kernels.json)."""
    if platform == "neuron" or any(r.impl in ("nki", "emulated") for r in rows):
        return format_kernel_table(rows)
    called = [r for r in rows if r.impl != "unused"]
    return (f"kernel table: the {len(called)} ops this run calls run their pure-JAX references (platform {platform}: "
            f"NKI kernels run on Neuron); the whole table, with the {len(rows) - len(called)} it does not call, is "
            "kernels.json")


@contextlib.contextmanager
def emulated(op_names):
    """Test-only: route these ops through the NumPy emulator of their NKI kernels (table: "emulated")."""
    names = frozenset(op_names)
    for op in names:
        if op not in registry.KERNELS or op not in SPECS:
            raise ValueError(f"{op} has no NKI kernel to emulate")
    saved = dict(_state)
    _state["emulated"] = names
    # an op emulated is one the run calls
    configure(_state["mode"], _state["platform"], _state["unused"] - names, _state["model"])
    try:
        yield kernel_table()
    finally:
        _state.update(saved)
        jax.clear_caches()


def _impl(op: str) -> str:
    return next(r.impl for r in kernel_table() if r.op == op)


def direct(op: str) -> bool:
    """An op whose row says "reference" (or "unused": an experimental op) calls its reference function
    directly, under plain JAX autodiff (`public`): the custom_vjp would pin the kernel's residuals (mlp's relu(h)^T) and recompute in the backward (the
    attention forward), and on CPU that measured 10-70% slower per op (bench/README.md). The
    primitives are bound when a kernel (or the emulator) runs, or inside `through_primitives()`."""
    if _state["kernel_primitives"]:
        return op in _state["switched"]
    return _state["direct"] and _impl(op) in ("reference", "unused")


@contextlib.contextmanager
def through_primitives():
    """Tests / benchmarks: route reference ops through their custom_vjp primitives too (the Neuron wiring)."""
    saved = _state["direct"]
    _state["direct"] = False
    jax.clear_caches()
    try:
        yield
    finally:
        _state["direct"] = saved
        jax.clear_caches()


@contextlib.contextmanager
def kernel_primitives(model=None):
    """Trace the program as it runs on Neuron with every kernel available (`--kernels strict`): each op
    binds its primitive with kernel=True where the kernel call would be (an eqn with the kernel's
    operands, shapes and static parameters), and no op takes the CPU shortcut (`direct`), except the ops
    whose kernel cannot compute `model`'s settings (`switch_fallbacks`: the reference, as on Neuron). For
    inspecting jaxprs (frontier_jax.neuron.program, the Neuron program check); such a trace cannot be lowered.
    Yields the switch fallbacks."""
    saved = _state["kernel_primitives"], _state["switched"]
    fallbacks = switch_fallbacks(model)
    _state["kernel_primitives"], _state["switched"] = True, frozenset(r.op for r in fallbacks)
    jax.clear_caches()
    try:
        yield fallbacks
    finally:
        _state["kernel_primitives"], _state["switched"] = saved
        jax.clear_caches()
