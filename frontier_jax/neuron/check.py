"""python -m frontier_jax.neuron_check: the trainer's programs checked against AWS's documented JAX limits.

The train (both qk_attention forwards), eval and optimizer steps of a config are traced as they run on
Neuron (`frontier_jax.neuron.program.trace_steps`: kernel calls in place, the platform's dtype policy, an
abstract mesh of NeuronCores) and every equation, in every sub-jaxpr, is checked against one rule per
item of AWS's JAX-on-Neuron known issues (aws-neuron-sdk `frameworks/jax/setup/jax-neuronx-known-issues.rst`,
repeated in `release-notes/components/jax.rst`, 2.26.0 "Known Issues"), plus the project's own rule that
every kernel call is inside a per-device region (`jax.shard_map`; frontier_jax.steps says why). `RULES`
is the table, each rule with its source; `STEP_RULES` checks the config's step as a whole: its estimated peak
memory per NeuronCore (`frontier_jax.neuron.memory`, printed for every config) against the HBM AWS documents.
Items the jaxpr cannot show are listed in `NOT_CHECKED`.

On Neuron the trainer runs the check at start-up (`frontier_jax.trainer._setup`): it logs every finding, and
`--kernels strict` refuses a program that fails it, in one line naming the rule and the op.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from frontier_jax import ops
from frontier_jax.errors import ArgumentParser, int_in
from frontier_jax.neuron.memory import NEURON_SOURCE, gb
from frontier_jax.neuron.program import Site

KNOWN_ISSUES = "aws-neuron-sdk frameworks/jax/setup/jax-neuronx-known-issues.rst"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # checked when no --config is given


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    source: str  # the document and the item it states
    check: Callable[[Site], str | None]  # a finding (what is wrong) or None


def _prim(*names: str) -> Callable[[Site], str | None]:
    return lambda s: f"{s.primitive} in the program" if s.primitive in names else None


def _avals(s: Site):
    return [v.aval for v in (*s.eqn.invars, *s.eqn.outvars) if hasattr(v, "aval")]


def _dtypes(s: Site) -> set[str]:
    return {str(a.dtype) for a in _avals(s) if hasattr(a, "dtype")}


_STATIC_WHILE_CMP = {"lt", "le", "gt", "ge", "ne"}


def _dynamic_while(s: Site) -> str | None:
    """A while passes only when its condition compares a loop counter with a literal (a static trip count)."""
    if s.primitive != "while":
        return None
    cond = s.eqn.params["cond_jaxpr"].jaxpr
    last = cond.eqns[-1] if cond.eqns else None
    static = (last is not None and len(cond.eqns) == 1 and last.primitive.name in _STATIC_WHILE_CMP
              and any(type(v).__name__ == "Literal" for v in last.invars))
    return None if static else "while loop whose trip count is not a literal"


def _variadic_reduce(s: Site) -> str | None:
    if s.primitive in ("argmax", "argmin"):  # lowered to a two-operand (value, index) reduce
        return f"{s.primitive} (a variadic reduce in HLO)"
    if s.primitive in ("reduce", "reduce_p") and len(s.eqn.invars) > 2:
        return f"reduce over {len(s.eqn.invars) // 2} operands"
    return None


def _integer_dot(s: Site) -> str | None:
    if s.primitive != "dot_general":
        return None
    ints = [str(v.aval.dtype) for v in s.eqn.invars if np.issubdtype(np.dtype(v.aval.dtype), np.integer)]
    return f"dot_general on {'/'.join(ints)}" if ints else None


def _complex(s: Site) -> str | None:
    bad = sorted(d for d in _dtypes(s) if d.startswith("complex"))
    return f"{s.primitive} on {', '.join(bad)}" if bad else None


_FP8_OK = {"float8_e4m3", "float8_e5m2"}


def _fp8(s: Site) -> str | None:
    bad = sorted(d for d in _dtypes(s) if (d.startswith("float8") or d.startswith("float4")) and d not in _FP8_OK)
    return f"{s.primitive} on {', '.join(bad)}" if bad else None


_CMP = re.compile(r"stablehlo\.compare\s+([A-Z]+)")


def _sort_comparator(s: Site) -> str | None:
    """The comparison directions in the sort's lowered comparator (JAX's float comparator canonicalises
    NaN and -0 with EQ / NE comparisons, so a float sort fails this rule)."""
    if s.primitive != "sort":
        return None
    avals = [v.aval for v in s.eqn.invars]
    text = jax.jit(lambda *a: s.eqn.primitive.bind(*a, **s.eqn.params)).lower(
        *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals)).as_text()
    bad = sorted(set(_CMP.findall(text)) - {"LT", "LE", "GT", "GE"})
    return f"sort comparator uses {', '.join(bad)}" if bad else None


def _threefry(s: Site) -> str | None:
    if s.primitive == "threefry2x32":
        return "threefry2x32"
    keys = [d for d in _dtypes(s) if d.startswith("key<") and "fry" in d]
    return f"{s.primitive} on a threefry key" if keys else None


def _preset(s: Site) -> str | None:
    if s.primitive != "dot_general":
        return None
    precision = s.eqn.params.get("precision")
    return f"dot_general with algorithm {precision}" if type(precision).__name__ == "DotAlgorithmPreset" else None


def _outside_device_region(s: Site) -> str | None:
    return f"kernel call {s.primitive} outside shard_map" if s.is_kernel and not s.per_device else None


RULES: tuple[Rule, ...] = (
    Rule("cond", f"{KNOWN_ISSUES}: \"jax.lax.cond is not supported\"", _prim("cond")),
    Rule("while.dynamic", f"{KNOWN_ISSUES}: \"Dynamic loops are not supported for jax.lax.while_loop. Only static "
                          "while loops are supported\"", _dynamic_while),
    Rule("host_callback", f"{KNOWN_ISSUES}: \"Host callbacks are not supported\" (jax.debug, checkify)",
         _prim("pure_callback", "io_callback", "debug_callback", "debug_print", "check", "frontier_emulated_kernel")),
    Rule("reduce_precision", f"{KNOWN_ISSUES}: \"jax.lax.reduce_precision is not supported\"",
         _prim("reduce_precision")),
    Rule("reduce.variadic", f"{KNOWN_ISSUES}: \"Variadic reductions are not supported\"", _variadic_reduce),
    Rule("dot.integer", f"{KNOWN_ISSUES}: \"Dot operations on int dtypes are not supported\"", _integer_dot),
    Rule("dtype.complex", f"{KNOWN_ISSUES}: \"Complex dtypes (jnp.complex64 and jnp.complex128) are not supported\"",
         _complex),
    Rule("dtype.fp8", f"{KNOWN_ISSUES}: \"Neuron only supports float8_e4m3 and float8_e5m2 for FP8 dtypes\"", _fp8),
    Rule("sort.comparator", f"{KNOWN_ISSUES}: \"jax.lax.sort only supports comparators with LE, GE, LT and GT "
                            "operations\"", _sort_comparator),
    Rule("rng.threefry", f"{KNOWN_ISSUES}: \"Threefry RNG algorithm is not completely supported. Use rbg\"",
         _threefry),
    Rule("sparse", f"{KNOWN_ISSUES}: \"jax.experimental.sparse is not supported\"",
         lambda s: f"{s.primitive} in the program" if s.primitive.startswith(("bcoo_", "bcsr_")) else None),
    Rule("dot.algorithm", f"{KNOWN_ISSUES}: \"lax.DotAlgorithmPreset is not always respected\"", _preset),
    Rule("kernel.per_device", "frontier_jax.steps: an NKI kernel is an opaque call that XLA's partitioner replicates "
                              "on the global batch (docs.jax.dev FFI guide, \"Sharding\"); it must run inside "
                              "jax.shard_map", _outside_device_region),
)

NOT_CHECKED = (
    "jax.random.randint's distribution (no step draws random numbers; initialisation runs on the host CPU)",
    "jax.dlpack (host-side API, not part of a traced program)",
    "out-of-bounds scatter/gather (token ids are checked against the vocabulary when the data is loaded)",
    "mesh configurations over non-connected NeuronCores (a property of the devices, neuron-ls --topology)",
    "slow compilation of RNG initialisation (initialisation runs on the host CPU)",
)


@dataclasses.dataclass(frozen=True)
class Finding:
    program: str
    rule: str
    op: str
    detail: str
    source: str

    def line(self) -> str:
        return f"{self.program}: rule {self.rule} ({self.source}): {self.detail} [{self.op}]"


def _where(s: Site) -> str:
    return "/".join(s.path + (s.primitive,))


def check_program(name: str, closed) -> list[Finding]:
    """Every finding of every rule in one traced program (one per distinct (rule, detail, place))."""
    from frontier_jax.neuron.program import walk

    seen, out = set(), []
    for site in walk(closed):
        for rule in RULES:
            detail = rule.check(site)
            key = (rule.name, detail, _where(site))
            if detail is not None and key not in seen:
                seen.add(key)
                out.append(Finding(name, rule.name, _where(site), detail, rule.source))
    return out


def _over_hbm(traced) -> str | None:
    m = traced.memory
    return None if m.fits else (f"step peak estimated {gb(m.estimate)} per NeuronCore at {m.micro_seqs} sequences "
                                f"per micro-batch, over its {gb(m.limit.bytes)} of HBM")


# Rules on a traced config as a whole (`program.Traced`), not on one equation.
STEP_RULES: tuple[Rule, ...] = (
    Rule("memory.hbm", f"{NEURON_SOURCE}; the estimate: frontier_jax.neuron.memory", _over_hbm),
)


def check_traced(traced) -> list[Finding]:
    """The findings for a config's traced programs (`program.trace_steps`): every equation rule on every
    program, then the step rules (the estimated peak per NeuronCore against its HBM)."""
    found = [f for name, closed in traced.programs.items() for f in check_program(name, closed)]
    for rule in STEP_RULES:
        detail = rule.check(traced)
        if detail is not None:
            found.append(Finding("train", rule.name, "step", detail, rule.source))
    return found


def check_config(cfg, num_devices: int, dtypes, tx) -> list[Finding]:
    """The findings for the trainer's programs of `cfg` on `num_devices` NeuronCores (empty: it passes), in the
    run's resolved `dtypes` with its optimizer `tx` (`program.trace_steps`; `program.on_neuron` gives Neuron's)."""
    from frontier_jax.neuron.program import trace_steps

    return check_traced(trace_steps(cfg, num_devices, dtypes, tx))


def format_report(cfg_name: str, num_devices: int, findings: list[Finding], fallbacks=(),
                  memory_line: str | None = None, ttt: bool = False) -> str:
    """One line per rule (ok / FAIL and, for a failure, its source and up to five findings), then the ops the
    program runs as their reference because their kernel lacks a model switch (`ops.switch_fallbacks`: traced
    as plain JAX, checked by the same rules; `--kernels strict` refuses them); `memory_line`, the step's
    estimated peak per NeuronCore (`memory.Fit.line`), after the first; `ttt`: test-time training's SGD step was
    checked too."""
    rules = RULES + STEP_RULES
    steps = "train / eval / optimizer" + (" / TTT" if ttt else "")
    lines = [f"Neuron program check: {cfg_name} on {num_devices} NeuronCore(s): "
             f"{'FAIL' if findings else 'pass'} ({len(rules)} rules, {steps} steps)"]
    if memory_line:
        lines.append(f"  {memory_line}")
    for rule in rules:
        hits = [f for f in findings if f.rule == rule.name]
        lines.append(f"  {'FAIL' if hits else 'ok'}  {rule.name}" + (f"  ({rule.source})" if hits else ""))
        lines += [f"        {f.program}: {f.detail} [{f.op}]" for f in hits[:5]]
        if len(hits) > 5:
            lines.append(f"        ... {len(hits) - 5} more")
    lines += [f"  reference fallback: {r.op} ({r.reason})" for r in fallbacks]
    return "\n".join(lines)


def rules_markdown() -> str:
    """The rule table with its sources, and what is not checked (docs; kept in sync by a test)."""
    rows = ["| rule | source |", "|---|---|"] + [f"| `{r.name}` | {r.source} |" for r in RULES + STEP_RULES]
    return "\n".join(rows + ["", "Not checked (not visible in a jaxpr): " + "; ".join(NOT_CHECKED) + "."])


def strict_error(findings: list[Finding]) -> str:
    """The one line `--kernels strict` refuses a failing program with."""
    f = findings[0]
    more = f" (and {len(findings) - 1} more finding(s))" if len(findings) > 1 else ""
    return f"Neuron program check failed: {f.line()}{more}"


def main(argv=None) -> int:
    from frontier_jax.config import apply_overrides, load_config
    from frontier_jax.errors import exit_on_error
    from frontier_jax.neuron.program import on_neuron, trace_steps

    p = ArgumentParser(prog="python -m frontier_jax.neuron_check", description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append", default=[], metavar="PATH",
                   help="a configs/*.py file (repeatable; default: every one of the repository's configs/*.py)")
    p.add_argument("--devices", type=int_in(1), default=2, help="NeuronCores in the mesh (a trn1.2xlarge chip: 2)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--markdown", action="store_true", help="print the rule table (with sources) as markdown and exit")
    a = p.parse_args(argv)
    if a.markdown:
        print(rules_markdown())
        return 0
    failed = False
    with exit_on_error():
        for path in a.config or sorted(str(f) for f in CONFIGS.glob("*.py") if f.name != "__init__.py"):
            cfg = apply_overrides(load_config(path), a.set)
            traced = trace_steps(cfg, a.devices, *on_neuron(cfg))
            findings = check_traced(traced)
            print(format_report(cfg.name, a.devices, findings, ops.switch_fallbacks(cfg.model), traced.memory.line(),
                                "ttt" in traced.programs), flush=True)
            failed |= bool(findings)
    return 1 if failed else 0
