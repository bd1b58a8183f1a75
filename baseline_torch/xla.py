"""The PyTorch/XLA device for the baseline: what torch-neuronx trains on (docs/comparison.md, "The PyTorch baseline on trn1").

torch-neuronx is PyTorch/XLA with a Neuron PJRT plugin: the default XLA device is one (logical)
NeuronCore per process, tensors on it are lazy, and the recorded graph is compiled (neuronx-cc, with
an in-memory JIT cache and the on-disk Neuron Persistent Cache keyed by the graph) and executed when
the step is marked (`torch_xla.sync()`) or a value is read on the host (aws-neuron-sdk
archive/nxd-training/pytorch-neuron-programming-guide.rst, "Neuron XLA device", "Understand the lazy
mode", "Minimize the number of compilation-and-executions"; about-neuron/arch/neuron-features/
neuron-caching.rst). PyTorch 2.9 is the last PyTorch on PyTorch/XLA (release-notes/components/
pytorch.rst); `torch_xla.device()` / `torch_xla.sync()` replace the deprecated `xm.xla_device()` /
`xm.mark_step()` there (archive/appnotes/torch-neuronx/introducing-pytorch-2-9.rst). The same lazy
program runs on a CPU with `PJRT_DEVICE=CPU`, which is how the tests exercise this path.

torch_xla is imported inside these functions only, so the CPU and CUDA paths (and machines without
torch_xla) never load it. `neuron_host` finds a Neuron host without importing anything: torch-neuronx
installed and Neuron devices present (`ls /dev/neuron*`, aws-neuron-sdk deploy/environments/
docker-setup.rst, about-neuron/security.rst).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from frontier_jax.run.interface import RunHook, RunState

DEV = Path("/dev")


def available() -> bool:
    """torch_xla is installed (checked without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def neuron_host(dev: Path = DEV) -> bool:
    """torch-neuronx and torch_xla are installed and the machine has Neuron devices (/dev/neuron0, ...)."""
    return (importlib.util.find_spec("torch_neuronx") is not None and available()
            and any(p.name[len("neuron"):].isdigit() for p in dev.glob("neuron*")))


def device() -> torch.device:
    """The default XLA device (xla:0): one NeuronCore under torch-neuronx, the host under PJRT_DEVICE=CPU.
    Call it before the process's first backward pass: PyTorch's autograd engine sizes its per-device
    queues then, and an XLA device started later fails its backward (`resolve_device` runs first)."""
    import torch_xla

    return torch.device(torch_xla.device())


def platform() -> str:
    """The PJRT device type in lower case: "neuron" on trn1, "cpu" under PJRT_DEVICE=CPU, "cuda", "tpu"."""
    import torch_xla.runtime as xr

    return xr.device_type().lower()


def sync(wait: bool = False) -> None:
    """Mark the step: compile (or take from the cache) and launch the graph recorded so far; `wait`
    blocks until the device has finished it."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync()
    if wait:
        xm.wait_device_ops()


def compile_count() -> int:
    """Graphs compiled so far in this process (torch_xla.debug.metrics' CompileTime samples; cache hits
    are not compiles)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def versions() -> dict:
    """torch_xla's version and the PJRT device type, for env.json."""
    import torch_xla

    return {"torch_xla": torch_xla.__version__, "pjrt_device": platform().upper()}


class CompileWatch(RunHook):
    """Logs how many graphs were compiled in the timed loop: 0 when every step reused the warm-up's graph
    (a recompilation is a shape, dtype or constant that changed between steps)."""

    def __init__(self, log):
        self.log, self.start = log, 0

    def on_start(self, state: RunState) -> None:
        self.start = compile_count()

    def on_end(self, state: RunState) -> None:
        n = compile_count() - self.start
        self.log(f"xla: {n} graph compilation(s) in {state.step - state.start_step} timed step(s)"
                 + ("" if n == 0 else " (WARNING: the step recompiled after the warm-up)"))
