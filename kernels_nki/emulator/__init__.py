"""A NumPy emulator of the NKI subset the project's kernels use, with trn1 limits and work counters.

Public API:
- `load_kernel_module(name)`: the kernel file executed against the emulated `nki` (never installed
  in `sys.modules` beyond that load; refused if a real `nki` is importable).
- `run(kernel, *arrays, **constants) -> (outputs, Counters)`; `count(kernel, *specs) -> Counters`
  (count-only mode, cheap at full shapes).
- `estimate(counters) -> Estimate` (trn1 time per engine, bounding engine; constants in `cost`).
- Errors: `NkiLimitError` (a hardware limit, message starts with the kernel's file:line),
  `NkiEmulatorError` (API misuse), `EmulatorConflictError` (a real `nki` is present).
"""

from kernels_nki.emulator.cost import Estimate, estimate, pe_utilisation
from kernels_nki.emulator.loader import EmulatedKernel, EmulatorConflictError, count, load_kernel_module, run
from kernels_nki.emulator.machine import Counters, NkiEmulatorError, NkiLimitError

__all__ = [
    "Counters", "EmulatedKernel", "EmulatorConflictError", "Estimate", "NkiEmulatorError", "NkiLimitError",
    "count", "estimate", "load_kernel_module", "pe_utilisation", "run",
]
