"""Which op has an NKI kernel, where its forward/backward live, and how to load them.

An op is declared once in `frontier_jax.ops` (its references, static parameters and kernel adapter);
its kernel is one row here. `frontier_jax.ops.dispatch` reads `KERNELS` to build the kernel table: a
declared op absent here runs its pure-JAX reference everywhere (and the table says "no kernel").
`load_nki(op)` imports the kernel module against the real `nki` package (a Neuron DLAMI);
`load_emulated(op)` runs the same source under the NumPy emulator's strict reading (a form valid under only one
of AWS's conflicting documented readings is refused: the rows of `kernels_nki.emulator.rules` with strict=True);
the kernels' tests, the dispatch's emulated path and the step estimate all load kernels here. Each kernel takes
the op's operands positionally and its static parameters as keyword arguments (compile-time constants).
A row with `experimental` set is a kernel no production op calls (its op, declared in
`frontier_jax.ops.experimental`, exists for tests and benchmarks): the kernel table lists it "unused" with
that reason and strict mode does not require it.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    op: str
    module: str  # importable module holding the @nki.jit kernels
    fwd: str  # forward kernel: returns (outputs..., residuals...)
    bwd: str  # backward kernel: (inputs, residuals, cotangents) -> input cotangents
    experimental: str = ""  # why no production op calls it (its op is declared in frontier_jax.ops.experimental)


_INSIDE = "the model runs it fused, inside {}"

KERNELS: dict[str, KernelSpec] = {s.op: s for s in (
    KernelSpec("rms_norm", "kernels_nki.rmsnorm", "rmsnorm_fwd", "rmsnorm_bwd"),
    KernelSpec("qk_attention", "kernels_nki.attention.kernels", "qk_attention_fwd", "qk_attention_bwd"),
    KernelSpec("norm_mlp", "kernels_nki.mlp", "norm_mlp_fwd", "norm_mlp_bwd"),
    KernelSpec("embed", "kernels_nki.embedding", "embed_fwd", "embed_bwd"),
    KernelSpec("head_loss", "kernels_nki.head_loss.kernels", "head_loss_fwd", "head_loss_bwd"),
    KernelSpec("projection", "kernels_nki.projection.kernels", "projection_fwd", "projection_bwd"),
    KernelSpec("mix_norm_projection", "kernels_nki.projection.kernels", "mix_norm_projection_fwd", "mix_norm_projection_bwd"),
    # the fused optimizer updates: one kernel each, no backward ("")
    KernelSpec("adam_update", "kernels_nki.adam", "adam_update", ""),
    KernelSpec("muon_update", "kernels_nki.muon", "muon_update", ""),
    # experimental: standalone kernels of work the model runs inside a fused op (the table lists them "unused")
    KernelSpec("rope", "kernels_nki.experimental.rope", "rope_fwd", "rope_bwd",
               experimental=_INSIDE.format("qk_attention")),
    KernelSpec("rope_gain", "kernels_nki.experimental.rope", "rope_gain_fwd", "rope_gain_bwd",
               experimental=_INSIDE.format("qk_attention")),
    KernelSpec("causal_attention", "kernels_nki.attention.kernels", "attention_fwd", "attention_bwd",
               experimental=_INSIDE.format("qk_attention") + " (attention_fwd/_bwd: its kernels without the QK-norm, "
               "RoPE and gain)"),
    KernelSpec("norm_projection", "kernels_nki.projection.kernels", "norm_projection_fwd", "norm_projection_bwd",
               experimental=_INSIDE.format("mix_norm_projection") + " (norm_projection_fwd/_bwd: its kernels "
               "without the residual mix)"),
)}


class NkiUnavailableError(ImportError):
    """The real `nki` package (Neuron SDK) cannot be imported here."""


def load_nki(op: str) -> types.ModuleType:
    """The kernel module of `op` imported against the real `nki` (raises NkiUnavailableError without it)."""
    spec = KERNELS[op]
    current = sys.modules.get("nki")
    if current is not None and getattr(current, "__nki_emulator__", False):
        raise NkiUnavailableError("sys.modules['nki'] is the NumPy emulator, not the Neuron SDK")
    try:
        importlib.import_module("nki")
        importlib.import_module("nki.language")
        importlib.import_module("nki.isa")
    except ImportError as e:
        raise NkiUnavailableError(f"nki not importable ({e})") from e
    return importlib.import_module(spec.module)


def load_emulated(op: str) -> types.ModuleType:
    from kernels_nki import emulator

    return emulator.load_kernel_module(KERNELS[op].module, reading="strict")
