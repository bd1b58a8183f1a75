"""A NumPy emulator of NKI (aws-neuron-sdk `nki`, 0.6: `rules.NKI_VERSION`, the 0.3 -> 0.6 differences in
`rules.CHANGES`) that enforces AWS's documented rules per target.

Public API:
- `load_kernel_module(name, reading="any")`: the kernel file, first checked by the AST pass (`ast_pass`: the NKI Python
  subset), then executed against the emulated `nki` (never installed in `sys.modules` beyond that load;
  refused if a real `nki` is importable).
- `load_kernel_file(path, root=None)`: a kernel file of a source checkout (e.g. AWS's nki-library) as a module
  of its package tree, its package-relative imports loaded the same way (`checkout`).
- `run(kernel, *arrays, target="trn1", compute=True, reading=None, **constants) -> (outputs, Counters)`;
  `count(kernel, *specs, target="trn1", reading=None, **constants) -> Counters` (count-only mode, cheap at full
  shapes). `target` is one of `TARGETS`: "trn1" (NeuronCore-v2, the default) or "trn2" (NeuronCore-v3); a caller
  with a `--target` flag passes it straight through. Calling a kernel directly (`kernel(*arrays)`) runs on trn1.
  `reading` is one of `READINGS`: "any" (every documented reading of AWS's documents accepted, so AWS's own
  kernels run) or "strict" (a form valid under only one of AWS's conflicting readings refused: the rows with
  strict=True); None: the kernel's, the reading its module was loaded with (`load_kernel_module(name,
  reading="any")`; the project's kernels, `kernels_nki.registry.load_emulated`, are loaded "strict").
- `RULES` (`rules.RULES`): every rule the emulator enforces, one row each (id, what it checks, targets, AWS
  source, reading); list them with `python -m kernels_nki.emulator [--target trn2] [--markdown]`.
- `estimate(counters) -> Estimate` (trn1 time per engine, bounding engine; constants in `cost`): the lower bound.
- `loader.record(kernel, *specs, target=..., **constants) -> Trace` (every instruction with its engine or DMA
  queue, work and tile regions, count-only) and `schedule.schedule(trace, reading)` / `schedule.estimate(trace)`
  (the trace ordered on the engines at the documented costs; unpublished ones bracketed low / central / high).
- Errors: `NkiRuleError` (a rule of the table; message "file:line: [rule.id] detail (rule: ...; source:
  ...)", with `.rule` and `.location`), a subclass of `NkiLimitError`; `NkiEmulatorError` (API misuse or
  an unemulated feature), `EmulatorConflictError` (a real `nki` is present).
"""

from kernels_nki.emulator.checkout import load_kernel_file
from kernels_nki.emulator.cost import Estimate, estimate, pe_utilisation
from kernels_nki.emulator.loader import EmulatedKernel, EmulatorConflictError, count, load_kernel_module, run
from kernels_nki.emulator.machine import Counters, NkiEmulatorError, NkiLimitError, NkiRuleError
from kernels_nki.emulator.rules import READINGS, RULES, RULES_BY_ID, TARGETS

__all__ = [
    "Counters", "EmulatedKernel", "EmulatorConflictError", "Estimate", "NkiEmulatorError", "NkiLimitError",
    "NkiRuleError", "READINGS", "RULES", "RULES_BY_ID", "TARGETS", "count", "estimate", "load_kernel_file", "load_kernel_module",
    "pe_utilisation", "run",
]
