"""The kernel table: which implementation (nki / reference / emulated / unused) every hot-path op runs
in this process, the `--kernels {auto,reference,strict}` decision, and the test-only switches.

`frontier_jax.ops` owns the primitives and registers the Neuron lowering through the hook below; this
module only decides and reports (it is re-exported by `frontier_jax.ops`).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax

from kernels_nki import registry

OPS = ("rms_norm", "rope", "causal_attention", "mlp", "embed", "head_loss",
       "adam_update", "muon_update")  # the last two: fused optimizer primitives in frontier_jax.fused_optim
MODES = ("auto", "reference", "strict")


@dataclasses.dataclass(frozen=True)
class KernelRow:
    op: str
    impl: str  # "nki" | "reference" | "emulated"
    reason: str


class KernelUnavailableError(RuntimeError):
    """`--kernels strict` and some op would not run its NKI kernel."""


_state = {"mode": "auto", "platform": None, "rows": None, "emulated": frozenset(), "unused": frozenset(),
          "direct": True, "register_neuron": None}  # register_neuron: set by frontier_jax.ops


# ----------------------------------------------------------------------------- kernel table


def _resolve(op: str, mode: str, platform: str, unused: frozenset) -> KernelRow:
    spec = registry.KERNELS.get(op)
    if op in unused:
        return KernelRow(op, "unused", unused_reason(op))
    if op in _state["emulated"]:
        return KernelRow(op, "emulated", "NumPy emulator of the NKI kernel via jax.pure_callback (tests only)")
    if spec is None:
        return KernelRow(op, "reference", "no kernel")
    if mode == "reference":
        return KernelRow(op, "reference", "kernels=reference")
    if platform != "neuron":
        return KernelRow(op, "reference", f"platform {platform}")
    try:
        registry.load_nki(op)
        _state["register_neuron"](op)
    except Exception as e:  # every failure becomes a visible row (and a strict-mode error)
        return KernelRow(op, "reference", f"kernel unavailable: {type(e).__name__}: {e}")
    return KernelRow(op, "nki", f"{spec.module}.{spec.fwd}/{spec.bwd}")


FUSED_OPTIMIZER_OPS = frozenset({"adam_update", "muon_update"})


def unused_reason(op: str) -> str:
    return "optim.fused=False (the optax chain runs)" if op in FUSED_OPTIMIZER_OPS else "not used by this run"


def configure(mode: str = "auto", platform: str | None = None, unused=()) -> list[KernelRow]:
    """Decide every op's implementation for this process; strict raises if any op misses its kernel.

    `unused`: ops this run never calls (e.g. the fused optimizer ops when optim.fused is off); they are
    listed as such and do not count for strict mode.
    """
    rows = _configure(mode, platform, frozenset(unused))
    jax.clear_caches()
    return rows


def _configure(mode: str, platform: str | None, unused: frozenset = frozenset()) -> list[KernelRow]:
    if mode not in MODES:
        raise ValueError(f"kernels mode must be one of {'|'.join(MODES)}, got {mode!r}")
    platform = platform or jax.default_backend()
    rows = [_resolve(op, mode, platform, unused) for op in OPS]
    if mode == "strict":
        missing = [r for r in rows if r.impl not in ("nki", "unused")]
        if missing:
            raise KernelUnavailableError(
                "strict kernels: no NKI kernel will run for " + ", ".join(f"{r.op} ({r.reason})" for r in missing))
    _state.update(mode=mode, platform=platform, rows={r.op: r for r in rows}, unused=unused)
    return rows


def kernel_table() -> list[KernelRow]:
    """The current table (configured with mode "auto" on first use)."""
    if _state["rows"] is None:
        _configure(_state["mode"], _state["platform"], _state["unused"])
    return [_state["rows"][op] for op in OPS]


def format_kernel_table(rows: list[KernelRow]) -> str:
    width = max(len(r.op) for r in rows)
    lines = ["kernel table:"] + [f"  {r.op:<{width}}  {r.impl:<9}  {r.reason}" for r in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def emulated(op_names):
    """Test-only: route these ops through the NumPy emulator of their NKI kernels (table: "emulated")."""
    names = frozenset(op_names)
    for op in names:
        if op not in registry.KERNELS:
            raise ValueError(f"{op} has no NKI kernel to emulate")
    saved = dict(_state)
    _state["emulated"] = names
    configure(_state["mode"], _state["platform"], _state["unused"])
    try:
        yield kernel_table()
    finally:
        _state.update(saved)
        jax.clear_caches()


def _impl(op: str) -> str:
    return kernel_table()[OPS.index(op)].impl


def _direct(op: str) -> bool:
    """An op whose row says "reference" calls its reference function directly, under plain JAX autodiff:
    the custom_vjp would pin the kernel's residuals and recompute in the backward (mlp's hidden layer,
    the attention forward), and on CPU that measured 10-70% slower per op (bench/README.md). The
    primitives are bound when a kernel (or the emulator) runs, or inside `through_primitives()`."""
    return _state["direct"] and _impl(op) == "reference"


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
