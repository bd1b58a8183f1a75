"""The trn1 step estimate from the program: `python -m frontier_jax.kernel_report --config configs/baseline.py`.

Every kernel call, its shapes, static parameters and calls per step come from the traced training step
(`frontier_jax.neuron.kernel_calls`); each distinct call's kernel source runs in the emulator's count-only mode with
its instruction trace on (`kernels_nki.emulator.trace`) and is priced twice: by the busiest-engine model
(`kernels_nki.emulator.cost`: each engine's work at its documented rate, engines overlapped perfectly: the
lower bound) and by the schedule (`kernels_nki.emulator.schedule`: the instruction graph ordered by its list
scheduler, as the compiler may reorder it, with the dependencies, DMA engines and queues, shared ports, on-chip
memory and documented fixed costs) under its low / central / high readings of what AWS leaves unpublished,
and in program order (the in-order reading, beside it). The work outside kernels comes from the same jaxpr
(`kernel_calls.glue`): HBM bytes at the DMA rate (fused element-wise runs; the high end: nothing fused) plus
matmul MACs at the TensorE peak. Kernels run one after another; the step is their sum plus the glue, per
core. MFU is reported as the range of the readings, beside how the central reading predicts the kernel
latencies AWS publishes (VALIDATION, written by bench.cost_calibration) and AWS's published trn1 training
MFUs (AWS_TRN1_MFU).

qk_attention's calls run B independent sequences: traced at B = 1 and 2 and extrapolated, m(B) = m(1) +
(B - 1) (m(2) - m(1)), counters and makespans alike (exact for the counters, whose per-call set-up and
per-sequence work this separates; tests/test_neuron_kernel_report.py bounds the schedule's error against a full trace).
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import functools
import json
import math
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np

from frontier_jax import ops
from frontier_jax.neuron import kernel_calls as kc
from frontier_jax.config import Config, load_config
from frontier_jax.errors import ArgumentParser, BadInput, exit_on_error, int_in
from kernels_nki import emulator, registry
from kernels_nki.emulator import cost, loader, schedule, timing
from kernels_nki.emulator.machine import Counters

FRONTIER14 = Path(__file__).resolve().parents[2] / "configs" / "frontier14.py"
# the published NeuronCore-v2 kernel latencies and the schedule's predictions of them
# (`python -m bench.cost_calibration --part latencies --save docs/kernels/published-latencies.json`)
VALIDATION = Path(__file__).resolve().parents[2] / "docs" / "kernels" / "published-latencies.json"
READINGS = tuple(timing.ASSUMPTIONS)
IN_ORDER = "in_order"  # program order, central assumptions (schedule.estimate)
BATCHED = {"qk_attention"}  # ops whose 4-D operands lead with independent sequences
# aws-neuron-sdk about-neuron/benchmarks/trn1/trn1_trn1n_nlp_data.csv, column MFU[%]: every trn1 training run
# that reports one (BERT-Large pre-training phase 1 / 2 on 1 and 16 nodes, GPT3-23B / 46B / 175B, Llama2-7B /
# 13B on 16-32 nodes, Neuron 2.13-2.15): the lowest and the highest
AWS_TRN1_MFU = (0.1383, 0.3314)


# The fused optimizers' minimum HBM traffic, as their kernels state it: each state read once and each result
# written once (kernels_nki/adam.py: p, g, m, v read, p', m', v' written, "7 accesses per element, the minimum";
# kernels_nki/muon.py: p, g, buf read, p', buf' written). (operand indices read, operand indices written back)
MINIMUM_ACCESSES = {"adam_update": ((0, 1, 2, 3), (0, 2, 3)), "muon_update": ((0, 1, 2), (0, 2))}


def min_bytes(call: kc.KernelCall) -> int | None:
    """The bytes a fused optimizer call must move at the least (MINIMUM_ACCESSES), None for other ops."""
    if call.op not in MINIMUM_ACCESSES:
        return None
    reads, writes = MINIMUM_ACCESSES[call.op]
    size = lambda i: math.prod(call.inputs[i][0]) * np.dtype(call.inputs[i][1]).itemsize
    return sum(size(i) for i in reads) + sum(size(i) for i in writes)


def kernel_of(call: kc.KernelCall):
    return getattr(registry.load_emulated(call.op), getattr(registry.KERNELS[call.op], call.which))


BASE = 2  # qk_attention is traced at BASE and BASE + 1 sequences: past the first, each sequence costs the same


def _extrapolated(c1: Counters, c2: Counters, b: int) -> Counters:
    """Counters of b sequences from those of BASE and BASE + 1: per-call set-up plus per-sequence work."""
    peak = ("sbuf_peak_bytes", "psum_peak_banks")
    one, two = c1.as_dict(), c2.as_dict()
    return Counters(**{f: max(one[f], two[f]) if f in peak else one[f] + (b - BASE) * (two[f] - one[f]) for f in one})


def _batch(call: kc.KernelCall) -> int:
    return call.inputs[0][0][0] if call.op in BATCHED else 1


def with_batch(call: kc.KernelCall, b: int) -> tuple:
    return tuple(None if s is None else ((b,) + s[0][1:], s[1]) if len(s[0]) == 4 else s for s in call.inputs)


def measure(call: kc.KernelCall, target: str = "trn1") -> dict:
    """One call: counters, the busiest-engine time and the schedule's makespan under each reading (a call of
    the same operands and constants is priced once per process: two configs share most of their calls)."""
    return {**copy.deepcopy(_priced(dataclasses.replace(call, calls_per_step=0), target)),
            "calls_per_step": call.calls_per_step}


def _traced_calls(call: kc.KernelCall, target: str) -> list[tuple]:
    """The traces `call` is priced from, as _trace's keys: the call itself, or (BATCHED) the call at BASE and
    BASE + 1 sequences, which is the same for every B and config."""
    if _batch(call) > BASE + 1:
        return [(call.op, call.which, with_batch(call, b), call.constants, target) for b in (BASE, BASE + 1)]
    return [(call.op, call.which, call.inputs, call.constants, target)]


def _trace(key: tuple) -> tuple[dict, Counters]:
    """One kernel call (a _traced_calls key) traced and scheduled: (schedule.estimate, its counters)."""
    op, which, inputs, constants, target = key
    tr = loader.record(kernel_of(kc.KernelCall(op, which, inputs, constants, 0)), *inputs, target=target,
                       **dict(constants))
    return schedule.estimate(tr), tr.counters


_TRACED: dict = {}  # _trace's answers: each distinct kernel call is traced and scheduled once per process


def _traced(key: tuple) -> tuple[dict, Counters]:
    if key not in _TRACED:
        _TRACED[key] = _trace(key)
    return _TRACED[key]


def _operand_elements(key: tuple) -> int:
    return sum(math.prod(s[0]) for s in key[2] if s is not None)


MAX_DEFAULT_WORKERS = 8  # each worker imports JAX (~2 s, 300-400 MB): more than 8 gains little for ~15 distinct calls


def cpus() -> int:
    """The CPUs this process may run on, at most MAX_DEFAULT_WORKERS (the command line's default --workers)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(n, MAX_DEFAULT_WORKERS)


def trace_calls(calls, target: str = "trn1", workers: int = 1, progress=None) -> None:
    """Trace and schedule, in `workers` processes, every distinct kernel call that `calls` are priced from and
    this process has not traced (what takes a report its time: each call independent of the others; a spawned
    process, as this one runs JAX's threads; the largest operands first, so that no large call runs last
    alone). With one worker each call is traced in this process when it is first priced."""
    keys = list(dict.fromkeys(k for c in calls for k in _traced_calls(c, target) if k not in _TRACED))
    if workers < 2 or len(keys) < 2:
        return
    keys.sort(key=_operand_elements, reverse=True)
    n = min(workers, len(keys))
    say = progress or (lambda line: None)
    say(f"kernel_report: tracing and scheduling {len(keys)} distinct kernel calls in {n} processes")
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        for i, (key, got) in enumerate(zip(keys, pool.map(_trace, keys)), 1):
            _TRACED[key] = got
            say(f"kernel_report: traced {i}/{len(keys)}, {key[0]} {key[1]} [{kc.KernelCall(*key[:4], 0).label}]")


@functools.lru_cache(maxsize=None)
def _priced(call: kc.KernelCall, target: str) -> dict:
    traced = [_traced(k) for k in _traced_calls(call, target)]
    if len(traced) == 2:  # BATCHED: extrapolated from BASE and BASE + 1 sequences
        B, ((m1, c1), (m2, c2)) = _batch(call), traced
        by = {o: {a: m1["by_order"][o][a] + (B - BASE) * (m2["by_order"][o][a] - m1["by_order"][o][a])
                  for a in READINGS} for o in m1["by_order"]}  # each order extrapolated, then combined
        sched = schedule.combined(by)
        shares = m2["shares"]
        counters = _extrapolated(c1, c2, B)
    else:
        ((m, counters),) = traced
        sched, shares = {a: m[a] for a in READINGS + (IN_ORDER,)}, m["shares"]
    est = emulator.estimate(counters, target)
    c = counters
    return {"op": call.op, "which": call.which, "shape": call.label, "calls_per_step": call.calls_per_step,
            "constants": dict(call.constants), "batch_extrapolated": len(traced) == 2,
            "pe_useful_over_issued": emulator.pe_utilisation(c), "dma_bytes": c.dma_bytes,
            "dma_bytes_per_buffer": c.dma_bytes / c.dma_buffers if c.dma_buffers else None,
            "dma_share_under_2k": c.dma_bytes_under_2k / c.dma_bytes if c.dma_bytes else 0.0,
            "dma_transfers": c.dma_transfers,
            "busiest_s": est.total_s, "bound": est.bound, "schedule_s": sched, "shares": shares,
            "busiest_lane": max(shares, key=shares.get), "counters": c.as_dict()}


def glue_times(g: kc.Glue | dict, target: str = "trn1") -> dict:
    """Seconds per step of work outside kernels (a `Glue`, or one of its `named` parts): the fused bytes at the DMA
    rate plus the matmuls at the TensorE peak; the high end nothing fused."""
    g = dataclasses.asdict(g) if isinstance(g, kc.Glue) else g
    t = cost.target(target)
    dots = g["dot_macs"] / t.tensor_macs_per_s
    fused = g["fused_bytes"] / t.dma_bytes_per_s + dots
    return {"busiest": fused, "low": fused, "central": fused, "high": g["unfused_bytes"] / t.dma_bytes_per_s + dots,
            IN_ORDER: fused}


def build_report(cfg: Config, target: str = "trn1", progress=None, workers: int = 1) -> dict:
    """The report of `cfg` on `target`; `progress(line)` hears where it is (the command line prints it on stderr);
    `workers`: processes tracing the kernel calls (trace_calls)."""
    return build_reports([cfg], target, progress, workers)[0]


def build_reports(cfgs, target: str = "trn1", progress=None, workers: int = 1) -> list[dict]:
    """The report of each config; the kernel calls of all of them traced first, together (trace_calls)."""
    say = progress or (lambda line: None)
    steps = []
    for cfg in cfgs:
        say(f"kernel_report: {cfg.name}: tracing the train step as it runs on Neuron")
        closed = kc.program(cfg)
        calls = kc.kernel_calls(cfg, closed)
        steps.append((cfg, closed, calls, [dataclasses.replace(c, constants=tuple(
            (k, True if k == "exact_max" else v) for k, v in c.constants)) for c in calls
            if c.op == "qk_attention" and c.which == "fwd" and not dict(c.constants)["exact_max"]]))
    trace_calls([c for step in steps for c in step[2] + step[3]], target, workers, say)
    return [_report(*step, target, say) for step in steps]


def _report(cfg: Config, closed, calls, fallback_calls, target: str, say) -> dict:
    rows = []
    for i, call in enumerate(calls, 1):
        say(f"kernel_report: {cfg.name}: pricing kernel call {i}/{len(calls)}, {call.op} {call.which} [{call.label}]")
        rows.append(measure(call, target))
        least = min_bytes(call)
        if least is not None:  # a fused optimizer: its DMA against the least it must move
            rows[-1].update(min_bytes=least, bytes_over_min=rows[-1]["dma_bytes"] / least)
    # the exact-max attention forward, the fallback the program does not run while the gains allow the bounded
    # one (frontier_jax.ops.softmax_shift): priced beside it, outside the step
    fallback = [measure(c, target) for c in fallback_calls]
    g = kc.glue(cfg, closed)
    glue = glue_times(g, target)
    named = {n: glue_times(part, target) for n, part in g.named.items()}  # the model's XLA ops, part of the glue
    kern = {"busiest": sum(r["busiest_s"] * r["calls_per_step"] for r in rows)}
    kern.update({a: sum(r["schedule_s"][a] * r["calls_per_step"] for r in rows) for a in READINGS + (IN_ORDER,)})
    step = {k: kern[k] + glue[k] for k in kern}
    dma = {f: sum(r["counters"][f] * r["calls_per_step"] for r in rows)
           for f in ("dma_bytes", "dma_transfers", "dma_bytes_under_2k", "dma_bytes_under_256")}
    flops = cfg.model.flops_per_token(cfg.train.seq_len) * cfg.train.tokens_per_step / kc.CORES
    peak = 2 * cost.target(target).tensor_macs_per_s
    mfu = {k: flops / (v * peak) for k, v in step.items()}
    return {"config": cfg.name, "target": target, "cores": kc.CORES, "num_layers": cfg.model.num_layers,
            "kernels": rows, "glue": dataclasses.asdict(g), "glue_s": glue, "glue_named_s": named, "kernel_s": kern,
            "step_s": step,
            "dma_per_step": dma, "exact_max_forward": fallback,
            # ops whose kernel lacks the model's settings: traced as their reference, priced in the glue
            "reference_fallbacks": [{"op": r.op, "reason": r.reason} for r in ops.switch_fallbacks(cfg.model)],
            "flops_per_step_per_core": flops, "mfu": mfu, "aws_trn1_mfu": AWS_TRN1_MFU,
            "validation": validation(),
            "tokens_per_30min": {k: 1800.0 / v * cfg.train.tokens_per_step for k, v in step.items()}}


def validation(path: Path = VALIDATION) -> dict | None:
    """The spread of predicted / published over AWS's published kernel latencies, per reading (None without
    the file: an installed package carries no docs)."""
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return {"points": len(record["rows"]), **record["spread"]}


def mfu_range(rep: dict) -> str:
    """The MFU range (the schedule's high reading to its low one), never one central figure."""
    m = rep["mfu"]
    return f"{m['high']:.1%} - {m['low']:.1%}"


def validation_line(rep: dict) -> str:
    v = rep.get("validation")
    if not v:
        return "(no validation file: docs/kernels/published-latencies.json)"
    c = v["central"]
    return (f"the central reading predicts the {v['points']} NeuronCore-v2 kernel latencies AWS publishes at "
            f"{c['min']:.2f} - {c['max']:.2f}x (median {c['median']:.2f}x, {c['within']} within 25%; bench/README.md, "
            "\"Cost model calibration\")")


def aws_line() -> str:
    lo, hi = AWS_TRN1_MFU
    return (f"AWS's published trn1 training runs report {lo:.1%} - {hi:.1%} MFU (BERT-Large, GPT3, Llama2 on 1-32 "
            "nodes with tensor and pipeline parallelism; aws-neuron-sdk about-neuron/benchmarks/trn1/"
            "trn1_trn1n_nlp_data.csv): a different regime from this data-parallel 17 M-parameter step, not a ceiling")


def _r(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def format_report(rep: dict) -> str:
    us = lambda s: f"{s * 1e6:>9.1f}"
    lines = [f"trn1 step estimate from the traced program: config {rep['config']}, target {rep['target']}, per "
             f"core ({rep['cores']} cores, data parallel)", "",
             f"{'op':<19} {'pass':<4} {'operands':<34} {'calls':>5} {'PE u/i':>6} {'DMA MB':>8} {'B/buf':>6} "
             f"{'<2K%':>5} {'x min':>5} {'busiest':>9} {'sch low':>9} {'central':>9} {'high':>9} {'in-order':>9} "
             f"{'bound':<6} {'busiest lane':<14}"]
    for r in rep["kernels"]:
        s = r["schedule_s"]
        over = f"{r['bytes_over_min']:.3f}" if "bytes_over_min" in r else "-"
        lines.append(f"{r['op']:<19} {r['which']:<4} {r['shape'][:34]:<34} {r['calls_per_step']:>5} "
                     f"{_r(r['pe_useful_over_issued']):>6} {r['dma_bytes'] / 1e6:>8.2f} "
                     f"{r['dma_bytes_per_buffer'] or 0:>6.0f} {100 * r['dma_share_under_2k']:>5.1f} {over:>5} "
                     f"{us(r['busiest_s'])} {us(s['low'])} {us(s['central'])} {us(s['high'])} {us(s[IN_ORDER])} "
                     f"{r['bound']:<6} {r['busiest_lane']} {r['shares'][r['busiest_lane']]:.0%}")
    g, gs = rep["glue"], rep["glue_s"]
    lines += ["", "(us per call; x min: a fused optimizer's DMA bytes over the least it must move, each state read and "
              "written once; busiest: the busiest-engine lower bound, bound: its engine; sch: the schedule, low / "
              "central / high, and in program order; busiest lane: the central schedule's most active engine and its "
              "share)",
              *sequences_lines(rep), *optimizer_lines(rep),
              "ms per step by op (busiest-engine / schedule low, central, high / in program order):"]
    lines += [f"  {op:<19} {v['busiest'] * 1e3:>7.1f} / {v['low'] * 1e3:>7.1f} {v['central'] * 1e3:>8.1f} "
              f"{v['high'] * 1e3:>8.1f} / {v[IN_ORDER] * 1e3:>8.1f}" for op, v in _per_op_ms(rep).items()]
    lines += [
              f"outside kernels ({g['equations']:,} equation runs per step): {g['fused_bytes'] / 1e9:.2f} GB through "
              f"HBM fused ({g['unfused_bytes'] / 1e9:.2f} GB unfused), {2 * g['dot_macs'] / 1e12:.3f} TFLOP of "
              f"matmuls: {gs['central'] * 1e3:.1f} ms ({gs['high'] * 1e3:.1f} ms unfused)"]
    lines += [f"  of which {n} (XLA, no kernel): {v['central'] * 1e3:.2f} ms ({v['high'] * 1e3:.2f} ms unfused)"
              for n, v in rep["glue_named_s"].items()]
    lines += [f"  of which the reference path of {r['op']} (no kernel call: {r['reason']})"
              for r in rep.get("reference_fallbacks", [])]
    lines.append(dma_line(rep["dma_per_step"]))
    k, st, mfu = rep["kernel_s"], rep["step_s"], rep["mfu"]
    lines += [f"kernels per step: busiest-engine {k['busiest'] * 1e3:.1f} ms; schedule {k['central'] * 1e3:.1f} ms "
              f"(range {k['low'] * 1e3:.1f} - {k['high'] * 1e3:.1f}; in program order {k[IN_ORDER] * 1e3:.1f})",
              f"step per core: schedule {st['central'] * 1e3:.1f} ms (range {st['low'] * 1e3:.1f} - "
              f"{st['high'] * 1e3:.1f}; in program order {st[IN_ORDER] * 1e3:.1f}); busiest-engine lower bound "
              f"{st['busiest'] * 1e3:.1f} ms",
              f"MFU range {mfu_range(rep)} (schedule high - low reading; busiest-engine bound {mfu['busiest']:.1%}; "
              f"{rep['flops_per_step_per_core'] / 1e12:.1f} TFLOP per core per step); {validation_line(rep)}",
              aws_line()]
    return "\n".join(lines)


def sequences_lines(rep: dict) -> list[str]:
    """What one qk_attention call is: its B sequences (python -m frontier_jax.profile draws one of them)."""
    seqs = sorted({r["shape"].split("x")[0] for r in rep["kernels"] if r["op"] in BATCHED})
    return [f"qk_attention: a call runs {' / '.join(seqs)} sequences (priced from {BASE} and {BASE + 1}, extrapolated); "
            "python -m frontier_jax.profile draws one sequence of a call, so its time is about 1/B of this one's"] \
        if seqs else []


def optimizer_lines(rep: dict) -> list[str]:
    """Each fused optimizer's DMA bytes per step over the least it must move (every call of the op)."""
    out = []
    for op in MINIMUM_ACCESSES:
        mine = [r for r in rep["kernels"] if r["op"] == op]
        if mine:
            moved = sum(r["dma_bytes"] * r["calls_per_step"] for r in mine)
            least = sum(r["min_bytes"] * r["calls_per_step"] for r in mine)
            out.append(f"{op}: {moved / 1e6:.1f} MB of DMA per step, {moved / least:.3f}x the least it must move "
                       f"({least / 1e6:.1f} MB: each state read and written once)")
    return out


def dma_line(d: dict) -> str:
    return (f"kernel DMA per step: {d['dma_bytes'] / 1e9:.2f} GB in {d['dma_transfers'] / 1e6:.3f} M transfers; "
            f"{d['dma_bytes_under_2k'] / d['dma_bytes']:.1%} of the bytes in buffers under 2 KiB per partition, "
            f"{d['dma_bytes_under_256'] / d['dma_bytes']:.1%} under 256 B")


def _per_op_ms(rep: dict) -> dict:
    per_op: dict = {}
    for r in rep["kernels"]:
        acc = per_op.setdefault(r["op"], dict.fromkeys(("busiest",) + READINGS + (IN_ORDER,), 0.0))
        acc["busiest"] += r["busiest_s"] * r["calls_per_step"]
        for a in READINGS + (IN_ORDER,):  # a saved report of an older version may lack the in-order reading
            acc[a] += r["schedule_s"].get(a, 0.0) * r["calls_per_step"]
    return dict(sorted(per_op.items(), key=lambda kv: -kv[1]["central"]))


def format_markdown(reps: list[dict]) -> str:
    """The report as the tables docs/kernels/step-estimate.md carries verbatim (tests/test_neuron_kernel_report.py):
    the first report per kernel call and per op, then every report side by side."""
    rep = reps[0]
    ms = lambda v: f"{v * 1e3:.1f}"
    us = lambda v: f"{v * 1e6:.1f}"
    lines = [f"Per kernel call (config `{rep['config']}`, {rep['target']}, per core, {rep['cores']} cores data "
             "parallel; us per call):", "",
             "| op | pass | calls per step | DMA MB | DMA / least | transfers | B per buffer | bytes in buffers < 2 KiB "
             "| PE useful/issued | busiest-engine | schedule low | central | high | in-order | bound | busiest lane |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|"]
    for r in rep["kernels"]:
        s, lane = r["schedule_s"], r["busiest_lane"]
        over = f"{r['bytes_over_min']:.3f}x" if "bytes_over_min" in r else "-"
        lines.append(f"| {r['op']} | {r['which']} | {r['calls_per_step']} | {r['dma_bytes'] / 1e6:.2f} | {over} | "
                     f"{r['dma_transfers']:,} | {r['dma_bytes_per_buffer'] or 0:.0f} | "
                     f"{r['dma_share_under_2k']:.1%} | {_r(r['pe_useful_over_issued'])} | {us(r['busiest_s'])} | "
                     f"{us(s['low'])} | {us(s['central'])} | {us(s['high'])} | {us(s[IN_ORDER])} | {r['bound']} | "
                     f"{lane} {r['shares'][lane]:.0%} |")
    for note in sequences_lines(rep) + optimizer_lines(rep):
        lines += ["", note]
    lines += ["", "Per op, ms per step:", "", "| op | busiest-engine | schedule low | central | high | in-order |",
              "|---|--:|--:|--:|--:|--:|"]
    lines += [f"| {op} | {ms(v['busiest'])} | {ms(v['low'])} | {ms(v['central'])} | {ms(v['high'])} | "
              f"{ms(v[IN_ORDER])} |" for op, v in _per_op_ms(rep).items()]
    g, gs, k = rep["glue"], rep["glue_s"], rep["kernel_s"]
    lines += [f"| outside kernels ({g['equations']:,} equation runs) | {ms(gs['busiest'])} | {ms(gs['low'])} | "
              f"{ms(gs['central'])} | {ms(gs['high'])} | {ms(gs[IN_ORDER])} |"]
    lines += [f"| of which {n} (XLA, no kernel) | {ms(v['busiest'])} | {ms(v['low'])} | {ms(v['central'])} | "
              f"{ms(v['high'])} | {ms(v[IN_ORDER])} |" for n, v in rep["glue_named_s"].items()]
    lines += [
              f"| **step** | {ms(rep['step_s']['busiest'])} | {ms(rep['step_s']['low'])} | "
              f"{ms(rep['step_s']['central'])} | {ms(rep['step_s']['high'])} | {ms(rep['step_s'][IN_ORDER])} |", "",
              dma_line(rep["dma_per_step"]) + "; kernels "
              f"{ms(k['busiest'])} ms busiest-engine, {ms(k['central'])} ms scheduled (central), "
              f"{ms(k[IN_ORDER])} ms in program order.", ""]
    for f in rep["exact_max_forward"]:
        lines += [f"The exact-max qk_attention forward (the fallback, not in the step) at the same call: busiest-engine "
                  f"{us(f['busiest_s'])} us, schedule {us(f['schedule_s']['low'])} / {us(f['schedule_s']['central'])} / "
                  f"{us(f['schedule_s']['high'])} us (low / central / high).", ""]
    lines += ["Side by side (per core; MFU against the TensorE peak, model FLOPs only, as the range of the schedule's "
              "high and low readings):", "",
              "| config | layers | schedule (central) ms | range ms | in-order ms | busiest-engine ms | MFU range "
              "| busiest-engine MFU | DMA transfers per step | bytes < 2 KiB | tokens per 30 min |",
              "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in reps:
        st, m, d = r["step_s"], r["mfu"], r["dma_per_step"]
        lines.append(f"| {r['config']} | {r['num_layers']} | {ms(st['central'])} | {ms(st['low'])} - "
                     f"{ms(st['high'])} | {ms(st[IN_ORDER])} | {ms(st['busiest'])} | {mfu_range(r)} | "
                     f"{m['busiest']:.1%} | {d['dma_transfers'] / 1e6:.3f} M | "
                     f"{d['dma_bytes_under_2k'] / d['dma_bytes']:.1%} | {r['tokens_per_30min']['central'] / 1e9:.2f} B |")
    lines += ["", f"Validation: {validation_line(rep)}. {aws_line()}."]
    return "\n".join(lines)


def _keyed(rep: dict) -> dict:
    """The report's kernel rows by (op, pass, occurrence): the same calls of two versions of the kernels."""
    seen: dict = {}
    out = {}
    for r in rep["kernels"]:
        n = seen[(r["op"], r["which"])] = seen.get((r["op"], r["which"]), -1) + 1
        out[(r["op"], r["which"], n)] = r
    return out


def format_against(rep: dict, old: dict) -> str:
    """Markdown: every kernel call of `rep` beside the same call of `old` (a saved `--json` report of other
    kernels at the same config), and the step's totals, old -> new."""
    arrow = lambda a, b, f: f"{f(a)} -> {f(b)}"
    us = lambda v: f"{v * 1e6:.0f}"
    pct = lambda v: f"{v:.1%}"
    lines = [f"Per kernel call, the saved report -> this one (config `{rep['config']}`, {rep['target']}, per core; "
             "us per call, the schedule's central reading):", "",
             "| op | pass | calls per step | transfers | B per buffer | bytes in buffers < 2 KiB | busiest-engine "
             "| schedule | bound |", "|---|---|--:|--:|--:|--:|--:|--:|---|"]
    before = _keyed(old)
    for key, r in _keyed(rep).items():
        o = before.get(key)
        if o is None:
            lines.append(f"| {r['op']} | {r['which']} | {r['calls_per_step']} | (new call) |||||")
            continue
        lines.append(f"| {r['op']} | {r['which']} | {r['calls_per_step']} | "
                     f"{arrow(o['counters']['dma_transfers'], r['dma_transfers'], lambda v: f'{v:,}')} | "
                     f"{arrow(o['dma_bytes_per_buffer'] or 0, r['dma_bytes_per_buffer'] or 0, lambda v: f'{v:.0f}')} | "
                     f"{arrow(o['dma_share_under_2k'], r['dma_share_under_2k'], pct)} | "
                     f"{arrow(o['busiest_s'], r['busiest_s'], us)} | "
                     f"{arrow(o['schedule_s']['central'], r['schedule_s']['central'], us)} | "
                     f"{o['bound']} -> {r['bound']} |")
    ms = lambda v: f"{v * 1e3:.1f}"
    old_ops, new_ops = _per_op_ms(old), _per_op_ms(rep)
    lines += ["", "Per step, ms (schedule, central reading):", "", "| | saved report | this one |", "|---|--:|--:|"]
    lines += [f"| {op} | {ms(old_ops[op]['central']) if op in old_ops else ''} | {ms(v['central'])} |"
              for op, v in new_ops.items()]
    lines += [f"| outside kernels | {ms(old['glue_s']['central'])} | {ms(rep['glue_s']['central'])} |",
              f"| **step** | {ms(old['step_s']['central'])} | {ms(rep['step_s']['central'])} |",
              f"| MFU range | {mfu_range(old)} | {mfu_range(rep)} |",
              f"| busiest-engine step | {ms(old['step_s']['busiest'])} | {ms(rep['step_s']['busiest'])} |"]
    return "\n".join(lines)


def format_comparison(reps: list[dict]) -> str:
    lines = ["side by side (per core; MFU of the TensorE peak, model FLOPs only, as the range of the schedule's high "
             "and low readings):",
             f"{'config':<12} {'layers':>6} {'schedule ms':>12} {'range ms':>17} {'in-order ms':>11} "
             f"{'busiest ms':>10} {'MFU range':>15} {'busiest MFU':>11} {'tokens/30min':>13}"]
    for r in reps:
        st, m = r["step_s"], r["mfu"]
        lines.append(f"{r['config']:<12} {r['num_layers']:>6} {st['central'] * 1e3:>12.1f} "
                     f"{st['low'] * 1e3:>8.1f}-{st['high'] * 1e3:<8.1f} {st[IN_ORDER] * 1e3:>11.1f} "
                     f"{st['busiest'] * 1e3:>10.1f} {mfu_range(r):>15} {m['busiest']:>11.1%} "
                     f"{r['tokens_per_30min']['central'] / 1e9:>11.2f} B")
    return "\n".join(lines)


def _saved_report(path: Path, config: str, target: str) -> dict:
    """The report of a saved `--json` output (its "report"), checked to be one of `config` on `target`."""
    try:
        rep = json.loads(path.read_text())["report"]
        missing = [k for k in ("config", "target", "kernels", "step_s", "glue_s", "mfu") if k not in rep]
    except (ValueError, KeyError, TypeError) as e:
        raise BadInput(f"{path}: not a saved `kernel_report --json` output ({type(e).__name__}: {e})") from None
    if missing:
        raise BadInput(f"{path}: not a saved `kernel_report --json` output (no {', '.join(missing)})")
    if (rep["config"], rep["target"]) != (config, target):
        raise BadInput(f"{path}: a report of {rep['config']} on {rep['target']}, not {config} on {target}")
    return rep


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m frontier_jax.kernel_report", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a configs/*.py file")
    ap.add_argument("--target", default="trn1", choices=sorted(cost.TARGETS),
                    help="the NeuronCore the kernels are priced on: trn1 (NeuronCore-v2, default) or trn2 (v3)")
    ap.add_argument("--compare", action="append", default=None,
                    help="another configs/*.py side by side (repeatable; default configs/frontier14.py)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    ap.add_argument("--markdown", action="store_true",
                    help="print the tables as Markdown (what docs/kernels/step-estimate.md carries)")
    ap.add_argument("--against", type=Path, default=None,
                    help="a saved --json report of other kernels at the same config: with --markdown, each kernel "
                         "call and the step's totals beside it")
    ap.add_argument("--workers", type=int_in(1), default=cpus(),
                    help="processes tracing and scheduling the kernel calls (default: the CPUs this process may use, at most 8)")
    args = ap.parse_args(argv)
    with exit_on_error():  # a bad config: one line, exit 2, before anything is traced
        cfg = load_config(args.config)
        others = [load_config(p) for p in (args.compare if args.compare is not None else
                                            ([str(FRONTIER14)] if FRONTIER14.exists() else []))]
        old = _saved_report(args.against, cfg.name, args.target) if args.against else None
    say = lambda line: print(line, file=sys.stderr, flush=True)  # progress: minutes of silence otherwise
    side = build_reports([cfg] + [o for o in others if o.name != cfg.name], args.target, say, args.workers)
    rep = side[0]
    if args.json:
        print(json.dumps({"report": rep, "comparison": side[1:]}, indent=1, default=str))
    elif args.markdown:
        print(format_markdown(side) + ("\n\n" + format_against(rep, old) if old else ""))
    else:
        print(format_report(rep) + "\n\n" + format_comparison(side))
    return 0
