"""Timelines of kernel calls on one NeuronCore, in the manner of neuron-profile: `python -m frontier_jax.profile
--op qk_attention --config configs/baseline.py --out prof/` (`--all`: every kernel call of the step).

For each call of the op in the traced training step (`frontier_jax.neuron.kernel_calls`), the instruction trace is
scheduled (`kernels_nki.emulator.schedule`, `--reading` low | central | high) and drawn as one PNG,
`<out>/<op>_<pass>[_<n>].png`: one lane per compute engine and one per DMA engine, each instruction a bar
(DMA bars coloured by queue: loads, stores, other), and before every bar the time its engine sat idle waiting
for its inputs or a shared port (grey). It prints each engine's active share (busy time over the call's
time; `dma`: any DMA engine busy). qk_attention is drawn for one sequence of its B.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from frontier_jax import ops
from frontier_jax.neuron import kernel_calls as kc
from frontier_jax.config import load_config
from frontier_jax.errors import ArgumentParser, BadInput, exit_on_error
from frontier_jax.neuron.kernel_report import BATCHED, kernel_of, with_batch
from kernels_nki.emulator import loader, schedule, timing
from kernels_nki.emulator.trace import DMA_ENGINES

COLOURS = {"tensor": "#1f77b4", "vector": "#2ca02c", "scalar": "#ff7f0e", "gpsimd": "#9467bd",
           "dma.load": "#17becf", "dma.store": "#d62728", "dma.other": "#8c564b"}
WAIT = "#c7c7c7"
DESCRIPTION = ("Timelines of the step's kernel calls on one NeuronCore, in the manner of neuron-profile: one PNG per "
               "call (one lane per engine), each engine's active share printed. qk_attention is drawn for one "
               "sequence of its call; kernel_report prices the whole call.")


def schedule_call(call: kc.KernelCall, reading: str = "central", target: str = "trn1") -> schedule.Schedule:
    inputs = with_batch(call, 1) if call.op in BATCHED else call.inputs
    tr = loader.record(kernel_of(call), *inputs, target=target, **dict(call.constants))
    return schedule.best(tr, reading)[0]


def lanes(s: schedule.Schedule) -> dict:
    """{lane: [(start, duration, colour, waited)]}: compute engines, then dma0 .. dma15."""
    out = {e: [] for e in timing.LANES}
    out.update({f"dma{i}": [] for i in range(DMA_ENGINES)})
    for ins, a, b, w in zip(s.instrs, s.start, s.end, s.wait):
        if ins.engine == "dma":
            for e in range(*ins.engines):
                out[f"dma{e}"].append((a, b - a, COLOURS[ins.stream], w))
        else:
            out[ins.engine].append((a, b - a, COLOURS[ins.engine], w))
    return out


def shares(s: schedule.Schedule) -> dict:
    share = s.active_share()
    per_dma = {lane: sum(d for _, d, _, _ in bars) / s.makespan_s for lane, bars in lanes(s).items()
               if lane.startswith("dma") and s.makespan_s}
    return {**share, **per_dma}


def draw(s: schedule.Schedule, title: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ln = lanes(s)
    names = list(ln)
    fig, ax = plt.subplots(figsize=(16, 0.35 * len(names) + 1.6))
    for row, name in enumerate(names):
        bars = ln[name]
        y = len(names) - 1 - row
        waits = [(a - w, w) for a, _, _, w in bars if w > 0]
        if waits:
            ax.broken_barh(waits, (y - 0.12, 0.24), facecolors=WAIT)
        for colour in {c for _, _, c, _ in bars}:
            ax.broken_barh([(a, d) for a, d, c, _ in bars if c == colour], (y - 0.4, 0.8), facecolors=colour)
    ax.set_yticks(range(len(names)), [n for n in reversed(names)])
    ax.set_xlim(0, s.makespan_s)
    ticks = ax.get_xticks()
    ax.set_xticks(ticks, [f"{t * 1e6:.0f}" for t in ticks])
    ax.set_xlim(0, s.makespan_s)
    ax.set_xlabel("us")
    ax.set_title(title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in list(COLOURS.values()) + [WAIT]]
    ax.legend(handles, list(COLOURS) + ["waiting (inputs or a shared port)"], loc="upper right", fontsize=7,
              ncol=4)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is for the temporary name only
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def profile(cfg_path: str, ops: list[str] | None, out: Path, reading: str = "central") -> list[dict]:
    cfg = load_config(cfg_path)
    calls = kc.kernel_calls(cfg)
    known = sorted({c.op for c in calls})
    if ops is not None:
        unknown = [op for op in ops if op not in known]
        if unknown:
            raise BadInput(f"--op {', '.join(unknown)}: not called by config {cfg.name} (its kernel ops: "
                           f"{', '.join(known)})")
    rows, seen = [], {}
    for call in calls:
        if ops is not None and call.op not in ops:
            continue
        key = f"{call.op}_{call.which}"
        seen[key] = seen.get(key, 0) + 1
        name = key if seen[key] == 1 else f"{key}_{seen[key]}"
        s = schedule_call(call, reading)
        sh = shares(s)
        batch = call.inputs[0][0][0] if call.op in BATCHED else None
        one = f" (one sequence of the call's {batch})" if batch else ""
        title = (f"{call.op} {call.which} [{call.label}]{one}, config {cfg.name}, trn1, schedule {reading}: "
                 f"{s.makespan_s * 1e6:.1f} us; active: " + ", ".join(f"{e} {sh[e]:.0%}" for e in
                                                                    timing.LANES + ("dma",)))
        path = out / f"{name}.png"
        draw(s, title, path)
        rows.append({"name": name, "path": str(path), "makespan_s": s.makespan_s, "shares": sh, "sequences_of": batch})
    return rows


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m frontier_jax.profile", description=DESCRIPTION)
    ap.add_argument("--config", required=True, help="a configs/*.py file")
    ap.add_argument("--op", action="append", metavar="OP",
                    help=f"a kernel op of the step (repeatable): {', '.join(ops.OPS)}")
    ap.add_argument("--all", action="store_true", help="every kernel call of the step")
    ap.add_argument("--out", required=True, help="directory for the PNGs")
    ap.add_argument("--reading", default="central", choices=sorted(timing.ASSUMPTIONS),
                    help="the schedule's reading of the costs AWS leaves unpublished: low, central (default) or high "
                         "(bench/README.md, \"Cost model calibration\")")
    args = ap.parse_args(argv)
    if not args.all and not args.op:
        ap.error("give --op OP or --all")
    with exit_on_error():  # a bad config or op: one line, exit 2
        rows = profile(args.config, None if args.all else args.op, Path(args.out), args.reading)
    for r in rows:
        sh = r["shares"]
        one = f" ({'one sequence of ' + str(r['sequences_of']) if r['sequences_of'] else 'the whole call'})"
        print(f"{r['name']:<28} {r['makespan_s'] * 1e6:>9.1f} us{one:<27}" + "  ".join(
            f"{e} {sh[e]:>5.1%}" for e in timing.LANES + ("dma",)) + f"  -> {r['path']}")
    if any(r["sequences_of"] for r in rows):
        print("qk_attention is drawn for one sequence of its call; python -m frontier_jax.kernel_report prices the "
              "whole call (all its sequences)")
    return 0
