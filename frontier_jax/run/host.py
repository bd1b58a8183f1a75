"""Host-process tuning that must happen before JAX starts its CPU backend: the C allocator.

XLA:CPU allocates one temporary buffer per executable run (for the train step: every activation the
backward pass keeps, 149 MB at `configs/tiny.py`'s 2,048-token micro-batch, gigabytes at the
baseline shape) and frees it when the run ends. glibc serves any block over its mmap threshold
(at most 32 MiB) with a fresh `mmap` and returns it with `munmap`, so every step page-faults the
whole buffer in again and the kernel zero-fills it: measured 38k minor faults and ~90 ms of system
time per 200 ms tiny step on 2 cores. `allocator="reuse"` sets glibc's `mallopt` so freed blocks stay
in the heap and are reused (no mmap for large blocks, no trimming, one arena so the worker threads
that run XLA share those blocks): 0 faults per step. It costs memory that is never returned to the
OS, which a training process does not want back anyway. `"system"` leaves the C library alone.
`"auto"` (the default) is "reuse" when JAX will run on the CPU (no accelerator PJRT plugin installed, or
`jax_platforms` starting with cpu) and "system" otherwise: with one arena, an accelerator host's
parallel XLA compilation contends on the allocator lock (measured on an H200 host: the baseline's
compile warm-up went from 86 s to over 180 s), and the accelerator step does not use these buffers.

Arena selection happens at a thread's first allocation, so this must run before the first
`jax.devices()` (entry points call it right after reading the config). It is process-wide, applied
once, reported in the run's env.json, and is a no-op (reported as such) off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import pkgutil
import platform
import sys

ALLOCATORS = ("auto", "reuse", "system")
# glibc <malloc.h> parameter numbers
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -2, -4, -8
_REUSE = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1), (_M_TOP_PAD, 64 << 20), (_M_ARENA_MAX, 1))

_applied: dict | None = None


def backend_started() -> bool:
    """True once JAX has created a backend (after which arena choices are already made)."""
    xla_bridge = sys.modules.get("jax._src.xla_bridge")  # not loaded: no backend can exist yet
    try:
        return bool(xla_bridge and xla_bridge.backends_are_initialized())
    except AttributeError:  # pragma: no cover - private API moved
        return False


def accelerator_plugins() -> list[str]:
    """Installed JAX PJRT plugins (cuda, neuron, ...), found without importing them or starting a backend."""
    names = {ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")}
    try:
        import jax_plugins

        names.update(m.name for m in pkgutil.iter_modules(jax_plugins.__path__))
    except ImportError:
        pass
    return sorted(names)


def resolve_allocator(mode: str, plugins: list[str], platforms: str | None) -> str:
    """"auto" -> "reuse" when JAX will run on the CPU, else "system"; other modes unchanged."""
    if mode != "auto":
        return mode
    if platforms:
        return "reuse" if platforms.split(",")[0].strip() == "cpu" else "system"
    return "system" if plugins else "reuse"


def tune_allocator(mode: str, platform_name: str | None = None) -> dict:
    """Apply `mode` ("auto" | "reuse" | "system") once per process; returns what was done (for env.json).

    platform_name: where the computation runs ("cpu", "cuda", ...) when the caller knows it (the
    PyTorch baseline); None: JAX's `jax_platforms` setting decides, when JAX is loaded (this module
    never imports it: the PyTorch baseline must not load JAX)."""
    global _applied
    if mode not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {mode!r}")
    if _applied is not None:
        return _applied
    jax = sys.modules.get("jax")
    if platform_name is None and jax is not None:
        platform_name = jax.config.jax_platforms
    plugins = accelerator_plugins()
    resolved = resolve_allocator(mode, plugins, platform_name)
    info = {"allocator": resolved, "requested": mode, "plugins": plugins, "applied": False,
            "libc": "-".join(platform.libc_ver()) or "unknown", "backend_started_before": backend_started()}
    if resolved == "reuse":
        if platform.libc_ver()[0] != "glibc":
            info["note"] = "not glibc: nothing to tune"
        else:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            ok = [bool(libc.mallopt(param, value)) for param, value in _REUSE]
            info["applied"] = all(ok)
            if not info["applied"]:
                info["note"] = f"mallopt refused some parameters: {ok}"
    _applied = info
    return info


def describe(info: dict) -> str:
    """One line for the run log."""
    text = info["allocator"] + (f" (from {info['requested']})" if info["requested"] != info["allocator"] else "")
    text += "" if info["applied"] or info["allocator"] == "system" else " (not applied)"
    if info.get("backend_started_before") and info["applied"]:
        text += " (applied after the JAX backend started: its threads' arenas were already chosen)"
    return text + (f"; {info['note']}" if info.get("note") else "")
