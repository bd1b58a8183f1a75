"""Run unchanged kernel source on CPU: load a kernel module against the emulated `nki`, call its kernels.

`load_kernel_module("kernels_nki.rmsnorm")` executes that file's source in a fresh module object
while `nki`, `nki.language` and `nki.isa` in `sys.modules` are the emulator's; the entries are
removed again as soon as the module body has run (the kernel functions keep their bindings). The
real module of that name is never created or replaced. The emulator refuses to load anything if a
real `nki` package is importable or imported: on a machine with the Neuron SDK, simulate with
`nki.simulate` instead, so the emulator can never silently stand in for the real `nki`.

Readings (`rules.READINGS`): `run` / `count` / `record` take `reading="any"` (every documented reading of AWS's
documents accepted) or `"strict"` (`rules.RULES` rows with `strict=True` checked too); left out (None), a call
runs under its kernel's reading, which is the one its module was loaded with (`load_kernel_module(name,
reading=...)`, default "any").
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import threading
import types

import numpy as np

from kernels_nki.emulator import ast_pass, isa, language, nki_typing, scheduling
from kernels_nki.emulator import machine as _m
from kernels_nki.emulator import rules as _rules
from kernels_nki.emulator import trace as _trace


_lock = threading.Lock()
_modules: dict[tuple[str, str], types.ModuleType] = {}


class EmulatorConflictError(RuntimeError):
    """A real `nki` is importable or imported; the emulator will not shadow it."""


class EmulatedKernel:
    """What `nki.jit` returns under the emulator: call it on NumPy arrays; `kernel[lnc]` sets the launch grid
    (checked against the target when it runs: trn1 has 1 logical NeuronCore, trn2 up to 2). `reading`: the
    reading its calls run under unless they name one (its module's)."""

    def __init__(self, fn, lnc: int = 1, reading: str = "any", schedule: tuple = ()):
        self.fn, self.lnc, self.reading, self.schedule = fn, lnc, _rules.check_reading(reading), schedule
        functools.update_wrapper(self, fn)

    def __getitem__(self, lnc):
        return EmulatedKernel(self.fn, int(lnc[0] if isinstance(lnc, tuple) else lnc), self.reading, self.schedule)

    def with_schedule(self, edges) -> EmulatedKernel:
        """The kernel with extra dependency edges between named instructions (scheduling.py)."""
        return EmulatedKernel(self.fn, self.lnc, self.reading, self.schedule + scheduling.check_schedule(edges))

    def __call__(self, *args, **kwargs):
        outputs, _ = run(self, *args, **kwargs)  # target= selects the NeuronCore (default trn1)
        return outputs


def jit(fn=None, reading: str = "any", **options):
    """`@nki.jit` / `@nki.jit(...)`: options (e.g. debug flags) are accepted and ignored; `reading` is the
    loader's (the module's), not a kernel option."""
    if fn is None:
        return lambda f: EmulatedKernel(f, reading=reading)
    return EmulatedKernel(fn, reading=reading)


def _fake_nki(reading: str = "any") -> types.ModuleType:
    mod = types.ModuleType("nki", "NumPy emulator of nki (kernels_nki.emulator); never the real package")
    mod.__nki_emulator__ = True
    mod.jit = functools.partial(jit, reading=reading)
    mod.simulate = lambda kernel: kernel
    mod.language = language
    mod.isa = isa
    mod.typing = nki_typing
    mod.dtype = np.dtype  # the type of nl.float32, ... (nki.dtype in nki/api/nki/__init__.py annotations)
    return mod


@contextlib.contextmanager
def emulated_nki(reading: str = "any", **extra):
    """`nki`, its submodules (and `extra` modules by name) stand in sys.modules for the duration; `nki.jit`
    makes kernels of `reading`."""
    fake = _fake_nki(reading)
    mods = {"nki": fake, "nki.language": language, "nki.isa": isa, "nki.isa.constants": isa.constants,
            "nki.typing": nki_typing, **nki_typing.legacy_modules(), **extra}
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield fake
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def real_nki_present() -> bool:
    mod = sys.modules.get("nki")
    if mod is not None:
        return not getattr(mod, "__nki_emulator__", False)
    return importlib.util.find_spec("nki") is not None


def load_kernel_module(name: str, reading: str = "any") -> types.ModuleType:
    """The kernel module `name` (e.g. "kernels_nki.rmsnorm") executed against the emulated nki (cached per
    reading), its kernels running under `reading` unless a call names another. The project's kernel-helper
    modules it imports from (`from kernels_nki.tiles import ...`) are loaded the same way first and stand in
    sys.modules under their names only while its body runs."""
    _rules.check_reading(reading)
    with _lock:
        if real_nki_present():
            raise EmulatorConflictError(
                "a real `nki` package is importable: the NumPy emulator refuses to stand in for it "
                "(use nki.simulate with the real package)")
        return _load(name, reading)


def _load(name: str, reading: str) -> types.ModuleType:
    if (name, reading) in _modules:
        return _modules[name, reading]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ImportError(f"kernel module {name} not found")
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    tree = ast_pass.check_source(source, spec.origin)
    helpers = {h: _load(h, reading) for h in ast_pass.helper_modules(tree)}
    module = types.ModuleType(name, f"{name} executed against the NKI emulator")
    module.__file__ = spec.origin
    module.__nki_emulated__ = True
    with emulated_nki(reading, **helpers, **{name: module}):  # the module itself too, while its body runs
        ast_pass.exec_kernel_code(tree, spec.origin, module.__dict__)
    setattr(module, ast_pass.STRICT_SOURCE, sum((getattr(h, ast_pass.STRICT_SOURCE) for h in helpers.values()),
                                                ast_pass.strict_findings(tree, spec.origin)))
    _modules[name, reading] = module
    return module


def _kernel(kernel) -> EmulatedKernel:
    if not isinstance(kernel, EmulatedKernel):
        raise TypeError(f"{kernel!r} is not an emulated @nki.jit kernel (load it with load_kernel_module)")
    return kernel


def _where(kernel) -> str:
    """The kernel's def line: where interface rules (arguments, outputs, launch grid) are reported."""
    code = kernel.fn.__code__
    return f"{code.co_filename}:{code.co_firstlineno}"


def _outputs(result, machine: _m.Machine, where: str, inputs=()):
    """The kernel's returned tensors as arrays: shared_hbm tensors it allocated, or kernel inputs it wrote in
    place (an output aliasing an input, as AWS's nki-library rope_hf returns q_out / k_out)."""
    results = result if isinstance(result, tuple) else (result,)
    aliased = {id(t.alloc) for t in inputs if isinstance(t, _m.Tensor)}
    for t in results:
        if isinstance(t, _m.Tensor) and t.buffer in _m.HBM and id(t.alloc) in aliased:
            continue
        if not isinstance(t, _m.Tensor) or t.buffer != "shared_hbm":
            _m.rule("kernel.output_shared_hbm", f"kernel output {t!r}", where)
    if not machine.compute:
        return None
    arrays = tuple(np.array(t.data) for t in results)
    return arrays if isinstance(result, tuple) else arrays[0]


def _input(machine: _m.Machine, a):
    """An array argument becomes an HBM tensor (a copy); Python values (ints, tuples, None) pass unchanged."""
    if isinstance(a, np.ndarray) or (hasattr(a, "shape") and hasattr(a, "dtype")):
        return machine.wrap_hbm(np.array(a, copy=True))
    return a


def _holds_list(v) -> bool:
    if isinstance(v, list):
        return True
    if isinstance(v, tuple):
        return any(_holds_list(x) for x in v)
    return isinstance(v, dict) and any(_holds_list(x) for x in v.values())


def _launch(kernel, machine: _m.Machine, inputs, constants):
    """Source rules of the call's reading (ast_pass.strict_findings), interface rules (list arguments, the launch
    grid), then the kernel body -> its result."""
    for rule_id, detail, where in kernel.fn.__globals__.get(ast_pass.STRICT_SOURCE, ()):
        _m.rule(rule_id, detail, where)
    for v in list(inputs) + list(constants.values()):
        if _holds_list(v):
            _m.rule("kernel.list_args", f"{kernel.fn.__name__} gets a list argument, or one holding a list (use "
                    "tuples)", _where(kernel))
    if kernel.lnc > machine.spec.max_lnc:
        _m.rule("kernel.lnc", f"{kernel.fn.__name__}[{kernel.lnc}] on {machine.target} (at most "
                f"{machine.spec.max_lnc} logical NeuronCore(s))", _where(kernel))
    if kernel.lnc > 1:
        raise _m.NkiEmulatorError(f"{kernel.fn.__name__}[{kernel.lnc}]: LNC > 1 launches are not emulated")
    result = kernel.fn(*inputs, **constants)
    scheduling.apply_schedule(machine, kernel.schedule, _where(kernel))
    return result


def _reading(kernel: EmulatedKernel, reading: str | None) -> str:
    return kernel.reading if reading is None else reading


def run(kernel, *arrays, compute: bool = True, target: str = "trn1", reading: str | None = None, **constants):
    """Run an emulated kernel on NumPy arrays on `target` (one of TARGETS) under `reading` (one of READINGS;
    None: the kernel's, "any" unless its module was loaded strict) -> (outputs, Counters).

    Keyword args other than compute/target/reading are the kernel's compile-time constants."""
    kernel = _kernel(kernel)
    machine = _m.Machine(compute=compute, target=target, reading=_reading(kernel, reading))
    with _m.running(machine):
        inputs = [_input(machine, a) for a in arrays]
        constants = {k: _input(machine, v) for k, v in constants.items()}  # a tensor may be passed by keyword
        result = _launch(kernel, machine, inputs, constants)
        outputs = _outputs(result, machine, _where(kernel), inputs + list(constants.values()))
    del inputs, result
    return outputs, machine.counters


def count(kernel, *specs, target: str = "trn1", reading: str | None = None, **constants):
    """Counters of one call on inputs described by (shape, dtype) pairs or ShapeDtypeStructs (`reading` as
    `run`'s).

    Count-only mode: every instruction is issued, checked and counted; no arithmetic is done and the
    tensors take no memory, so this is exact and cheap at full training shapes.
    """
    kernel = _kernel(kernel)
    machine = _m.Machine(compute=False, target=target, reading=_reading(kernel, reading))
    with _m.running(machine):
        inputs = []
        for spec in specs:
            if spec is None:  # an optional tensor argument left out, as in run()
                inputs.append(None)
                continue
            shape, dtype = (spec.shape, spec.dtype) if hasattr(spec, "shape") else spec
            zero = np.zeros((), dtype=_m.as_dtype(dtype))
            inputs.append(machine.wrap_hbm(np.broadcast_to(zero, tuple(shape))))
        _outputs(_launch(kernel, machine, inputs, constants), machine, _where(kernel), inputs)
    return machine.counters


def record(kernel, *specs, target: str = "trn1", reading: str | None = None, **constants) -> _trace.Trace:
    """The trace of one call on inputs given as (shape, dtype) pairs (None: an optional input left out), in
    count-only mode, as `emulator.count` runs it (`reading` as `run`'s)."""
    kernel = _kernel(kernel)
    m = _m.Machine(compute=False, target=target, trace=True, reading=_reading(kernel, reading))
    with _m.running(m):
        inputs = []
        for spec in specs:
            if spec is None:
                inputs.append(None)
                continue
            shape, dtype = (spec.shape, spec.dtype) if hasattr(spec, "shape") else spec
            inputs.append(m.wrap_hbm(np.broadcast_to(np.zeros((), dtype=_m.as_dtype(dtype)), tuple(shape))))
        _outputs(_launch(kernel, m, inputs, constants), m, _where(kernel))
    return _trace.Trace(m.trace, m.counters, target, m.order.edges, m.allocations,
                        {"sbuf": m.spec.sbuf_partition_bytes, "psum": m.spec.psum_banks})
