"""The cost model (kernels_nki/emulator/cost.py) and the schedule (schedule.py) against every figure AWS
publishes for its own kernels: `python -m bench.cost_calibration [--target trn2] [--markdown]`. Tables and
discussion: bench/README.md ("Cost model calibration"); tests/test_emulator_cost.py keeps them in sync.

Published, checked (nothing here is fitted to them):
- aws-neuron-sdk nki/guides/tutorials/kernel-optimization.rst, profiled with NEURON_PLATFORM_TARGET_OVERRIDE=trn2,
  fp32 4096 x 8192 @ 8192 x 8192: the share of the kernel's time each engine was active, for four versions of
  its matmul. Ours (bench/calibration_kernels.py) run at M = 2048, N = 4096 (K = 2048 for the first three: their
  whole-K strips do not fit SBUF at 8192; the last at K = 8192 with 4 x 2 x 8 blocks), a quarter of the
  tutorial's M x N, to keep the test that checks these tables short; the schedule's shares are of its
  makespan (busy time, for DMA any of its 16 engines busy, over the call's time).
- nki/get-started/about/nki-dma-overview.rst, Example 1 (trn2): one 32 KiB transfer took 1416 ns on one DMA
  engine; bench/probe_kernels.dma_example_1.
- the same page's figure (relative DMA throughput by bytes per partition): the schedule's throughput of
  bench/probe_kernels.copy_in_chunks loads at those widths, relative to its 32 KiB point. The central reading
  takes its rate from this figure, so there it only checks that the schedule keeps 16 engines fed.
- nki/deep-dives/nki_perf_guide.rst, Opt #5a: dependent one-element ScalarE instructions issue every 189 ns on
  NC-v2 (trn1). The schedule charges that interval as documented: an input, shown for completeness.
- nki/guides/tutorials/fused_mamba.rst: the device latency of its three Mamba kernels (fp32, batch 1, 16
  states): mamba_v1 at 256 and 4096 channels (seq_len 512), mamba_v2 and mamba_v3 at 4096 channels and
  seq_len 512 - 8192 (its scaling table): the 20 NeuronCore-v2 kernel latencies AWS publishes (the page
  first appeared in Neuron SDK 2.20.0, before Trn2 support; it names no instance). Ours are
  bench/calibration_kernels.py's mamba_v1 / mamba_v2 (seq_tile=512: mamba_v3), written from the page's text;
  each point is predicted on trn1 under every reading (`MAMBA`). mamba_v3 past 1024 is extrapolated from 2
  and 3 sequence tiles, as the step estimate extrapolates qk_attention (tests/test_bench_cost_calibration.py bounds it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kernels_nki import emulator
from kernels_nki.emulator import loader, schedule, timing

SHAPE = (2048, 2048, 4096)  # K, M, N
# schedule, kernel, (K, M, N), constants, {engine: published active share}
PUBLISHED = (
    ("tiled", "matmul_schedule", SHAPE, {"schedule": "tiled"}, {"tensor": 0.8728, "dma": 0.9993}),
    ("hoisted", "matmul_schedule", SHAPE, {"schedule": "hoisted"}, {"tensor": 0.9985, "dma": 0.9973}),
    ("blocked", "matmul_schedule", SHAPE, {"schedule": "blocked", "block_m": 2, "block_n": 2},
     {"tensor": 0.9952, "dma": 0.9570}),
    # the tutorial's blocks are 16 x 2 x 8 tiles, which fill trn2's 224 KiB SBUF to the byte; 4 x 2 x 8 fits
    # both targets and moves the same bytes (lhsT traffic = N / block_n x K x M, whatever block_m)
    ("blocked_k", "matmul_blocked_k", (8192, 2048, 4096), {"block_m": 4, "block_n": 2, "block_k": 8},
     {"tensor": 0.9950, "dma": 0.2154, "vector": 0.1055}),
)
ENGINES = ("tensor", "dma", "vector")
TENSOR_TOLERANCE = 0.05  # |predicted - published| TensorE active share (tests/test_emulator_cost.py)
EXAMPLE_1_NS = 1416.0  # nki-dma-overview.rst, Example 1
SCALAR_II_NS = 189.0  # nki_perf_guide.rst, Opt #5a
CURVE_WIDTHS = (128, 512, 2048, 8192)  # bytes per partition: points of the DMA overview's figure checked
READINGS = tuple(timing.ASSUMPTIONS)
ORDERS = READINGS + ("in_order",)  # the list schedule's readings, then program order (central assumptions)
# fused_mamba.rst: "Performance Check" (v1, 256 channels), "Increasing input channels size" (v1, 4096 channels),
# the table after "Mitigate spilling by tiling seq_len" (v2 and v3, 4096 channels); ms
MAMBA_SEQ = (512, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192)
MAMBA_V2_MS = (1.6, 4.4, 8.9, 13.1, 17.6, 23.7, 27.5, 41.3, 52.2)
MAMBA_V3_MS = (1.6, 3.3, 6.6, 10.1, 13.3, 17.3, 19.6, 24.2, 27.8)
MAMBA_STATES, MAMBA_SEQ_TILE = 16, 512
# (version, channels, seq_len, published ms)
MAMBA = ((("v1", 256, 512, 0.17293), ("v1", 4096, 512, 2.34))
         + tuple(("v2", 4096, L, ms) for L, ms in zip(MAMBA_SEQ, MAMBA_V2_MS))
         + tuple(("v3", 4096, L, ms) for L, ms in zip(MAMBA_SEQ, MAMBA_V3_MS)))
MISS = 0.25  # |predicted / published - 1| beyond this is a miss whose cause bench/README.md gives
# The matrix multiplication tutorial as published up to Neuron SDK 2.26 (aws-neuron-sdk commit 1db4d74e,
# nki/tutorials/matrix_multiplication.rst, "Testing Correctness and Benchmarking": "[4096,8192] @ [8192,8192]",
# "BF16", "Trn1.32xlarge"): its four kernels, the same steps as kernel-optimization.rst's; ms
MATMUL_TRN1 = (("tiled", "matmul_schedule", {"schedule": "tiled"}, 51.80),
               ("hoisted", "matmul_schedule", {"schedule": "hoisted"}, 42.96),
               ("blocked", "matmul_schedule", {"schedule": "blocked", "block_m": 2, "block_n": 2}, 22.07),
               ("blocked_k", "matmul_blocked_k", {"block_m": 16, "block_n": 2, "block_k": 8}, 6.97))
MATMUL_TRN1_SHAPE = (8192, 4096, 8192)  # K, M, N
# the emulator's reading of AWS's rules (kernels_nki.emulator.rules.READINGS) that the bench kernels run under:
# the strict one, as the project's kernels (their loops are range(), not the deprecated nl aliases)
KERNEL_READING = "strict"


def kernels(module: str):
    """A bench kernel module (bench.calibration_kernels, bench.probe_kernels) under KERNEL_READING."""
    return emulator.load_kernel_module(module, reading=KERNEL_READING)


def calibrate(target: str = "trn2") -> list[dict]:
    """The tutorial matmuls: busiest-engine shares and the schedule's active shares under each reading."""
    module = kernels("bench.calibration_kernels")
    rows = []
    for name, kernel, (K, M, N), consts, published in PUBLISHED:
        tr = loader.record(getattr(module, kernel), ((K, M), "float32"), ((K, N), "float32"), target=target,
                          **consts)
        c = tr.counters
        est = emulator.estimate(c, target)
        rows.append({"schedule": name, "bound": est.bound, "published": published, "est_s": est.total_s,
                     "predicted": {e: est.engine_s[e] / est.total_s for e in est.engine_s},
                     "scheduled": {a: schedule.best(tr, a)[0].active_share() for a in READINGS},
                     "dma_bytes": c.dma_bytes, "dma_bytes_per_buffer": c.dma_bytes / c.dma_buffers})
    return rows


def dma_checks() -> dict:
    """Example 1 (trn2) and the payload curve, predicted under each reading."""
    probes = kernels("bench.probe_kernels")
    ex1 = loader.record(probes.dma_example_1, ((4, 4096), "bfloat16"), target="trn2")
    example = {a: (lambda s: (s.end[0] - s.start[0]) * 1e9)(schedule.best(ex1, a)[0]) for a in READINGS}
    curve = {}
    for a in READINGS:
        rate = {}
        for width in CURVE_WIDTHS + (32768,):
            elems = width // 2
            tr = loader.record(probes.copy_in_chunks, ((128, elems * 8), "bfloat16"), target="trn2", chunk=elems)
            s = schedule.best(tr, a)[0]
            rate[width] = tr.counters.dma_bytes / s.makespan_s
        curve[a] = {w: rate[w] / rate[32768] for w in CURVE_WIDTHS}
    published = {w: timing.payload_share(w) for w in CURVE_WIDTHS}
    return {"example_1_ns": example, "curve": curve, "curve_published": published}


def scalar_ii_ns() -> float:
    probes = kernels("bench.probe_kernels")
    s = schedule.schedule(loader.record(probes.scalar_tiny_chain, ((128, 1), "float32"), steps=16))
    st = [a for a, i in zip(s.start, s.instrs) if i.engine == "scalar"]
    return (st[-1] - st[1]) / (len(st) - 2) * 1e9


def _mamba_specs(channels: int, seq_len: int) -> tuple:
    f = "float32"
    return (((1, channels, seq_len), f), ((1, channels, seq_len), f), ((channels, MAMBA_STATES), f),
            ((1, MAMBA_STATES, seq_len), f), ((1, MAMBA_STATES, seq_len), f))


def _mamba_estimate(version: str, channels: int, seq_len: int, hoist: bool = False) -> dict:
    """Seconds under every reading (ORDERS) and the busiest-engine bound, on trn1."""
    module = kernels("bench.calibration_kernels")
    kernel = module.mamba_v1 if version == "v1" else module.mamba_v2
    consts = {} if version == "v1" else {"seq_tile": MAMBA_SEQ_TILE if version == "v3" else 0, "hoist_delta_u": hoist}

    def at(L):
        return schedule.estimate(loader.record(kernel, *_mamba_specs(channels, L), target="trn1", **consts))

    tiles = seq_len // MAMBA_SEQ_TILE
    if version == "v3" and tiles > 2:  # the sequence tiles after the first cost the same: extrapolated
        two, three = at(2 * MAMBA_SEQ_TILE), at(3 * MAMBA_SEQ_TILE)
        lin = lambda x, y: x + (tiles - 2) * (y - x)
        by = {o: {a: lin(two["by_order"][o][a], three["by_order"][o][a]) for a in READINGS} for o in two["by_order"]}
        return {**schedule.combined(by), "busiest_engine": lin(two["busiest_engine"], three["busiest_engine"])}
    return {k: v for k, v in at(seq_len).items() if k in ORDERS + ("busiest_engine",)}


def matmul_trn1() -> list[dict]:
    """The matrix multiplication tutorial's trn1 latencies beside the schedule's predictions."""
    module = kernels("bench.calibration_kernels")
    K, M, N = MATMUL_TRN1_SHAPE
    rows = []
    for name, kernel, consts, ms in MATMUL_TRN1:
        tr = loader.record(getattr(module, kernel), ((K, M), "bfloat16"), ((K, N), "bfloat16"), target="trn1",
                           input_dtype_result=True, **consts)
        est = {k: v for k, v in schedule.estimate(tr).items() if k in ORDERS + ("busiest_engine",)}
        rows.append({"kernel": f"matmul {name}", "shape": f"{M}x{K} @ {K}x{N} bf16", "published_s": ms / 1e3,
                     "predicted_s": est, "hoisted_s": None})
    return rows


def mamba(points=MAMBA) -> list[dict]:
    """The fused-Mamba tutorial's published latencies beside the schedule's predictions (and, for v2 / v3, the
    same with delta * u computed once per channel tile)."""
    rows = []
    for version, channels, seq_len, ms in points:
        est = _mamba_estimate(version, channels, seq_len)
        hoisted = _mamba_estimate(version, channels, seq_len, hoist=True)["central"] if version != "v1" else None
        rows.append({"kernel": f"mamba_{version}", "shape": f"{channels} ch, seq {seq_len}", "published_s": ms / 1e3,
                     "predicted_s": est, "hoisted_s": hoisted})
    return rows


def spread(rows: list[dict], reading: str = "central") -> dict:
    """Predicted / published over the rows: min, median, max, and how many lie within MISS."""
    ratios = sorted(r["predicted_s"][reading] / r["published_s"] for r in rows)
    return {"n": len(ratios), "min": ratios[0], "median": ratios[len(ratios) // 2], "max": ratios[-1],
            "within": sum(abs(x - 1) <= MISS for x in ratios)}


def latency_table(rows: list[dict]) -> str:
    """The published NeuronCore-v2 kernel latencies as Markdown (bench/README.md carries it verbatim)."""
    ms = lambda v: f"{v * 1e3:.3g}"
    out = ["AWS's published NeuronCore-v2 kernel latencies beside the schedule on trn1 (ms; ratio: predicted / "
           "published under the central reading)", "",
           "| kernel | shape | published | busiest-engine | low | central | high | in-order | ratio "
           "| central, delta * u once per tile (ratio) |", "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        p, pub = r["predicted_s"], r["published_s"]
        hoisted = "-" if r["hoisted_s"] is None else f"{ms(r['hoisted_s'])} ({r['hoisted_s'] / pub:.2f})"
        out.append(f"| {r['kernel']} | {r['shape']} | {ms(pub)} | {ms(p['busiest_engine'])} | "
                   + " | ".join(ms(p[a]) for a in ORDERS) + f" | {p['central'] / pub:.2f} | {hoisted} |")
    out.append("")
    for name, sel in (("all", rows), ("fused-Mamba", [r for r in rows if r["kernel"].startswith("mamba")])):
        cells = []
        for a in ORDERS:
            sp = spread(sel, a)
            cells.append(f"{a} {sp['min']:.2f}-{sp['max']:.2f} ({sp['within']} within {MISS:.0%})")
        out.append(f"- {name} ({len(sel)} points), predicted / published: " + "; ".join(cells) + ".")
    mamba_rows = [r for r in rows if r["kernel"].startswith("mamba")]
    within_h = sum(abs((r["hoisted_s"] if r["hoisted_s"] is not None else r["predicted_s"]["central"])
                       / r["published_s"] - 1) <= MISS for r in mamba_rows)
    out.append(f"- fused-Mamba with delta * u once per channel tile in v2 / v3 (central): {within_h} of "
               f"{len(mamba_rows)} within {MISS:.0%}.")
    return "\n".join(out)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def measure(target: str = "trn2") -> dict:
    return {"target": target, "rows": calibrate(target), "dma": dma_checks(), "scalar_ii_ns": scalar_ii_ns()}


def tables(m: dict) -> str:
    """The calibration tables as Markdown (bench/README.md carries them verbatim)."""
    target, rows, dma = m["target"], m["rows"], m["dma"]
    out = [f"Tutorial matmuls ({target}): active share, published vs busiest-engine model vs schedule "
           "(low / central / high)", "",
           "| kernel | engine | published | busiest-engine | schedule low | central | high |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        for e in ENGINES:
            cells = [_pct(r["published"].get(e)), _pct(r["predicted"][e])]
            cells += [_pct(r["scheduled"][a][e]) for a in READINGS]
            out.append(f"| {r['schedule']} | {e} | " + " | ".join(cells) + " |")
    ex = dma["example_1_ns"]
    out += ["", "DMA and ScalarE figures: published vs the schedule (low / central / high)", "",
            "| figure | published | low | central | high |", "|---|---|---|---|---|",
            f"| Example 1: one 32 KiB transfer (trn2), ns | {EXAMPLE_1_NS:.0f} | "
            + " | ".join(f"{ex[a]:.0f} ({ex[a] / EXAMPLE_1_NS - 1:+.0%})" for a in READINGS) + " |"]
    for w in CURVE_WIDTHS:
        pub = dma["curve_published"][w]
        out.append(f"| payload curve, {w} B per partition (share of the 32 KiB point) | {_pct(pub)} | "
                   + " | ".join(_pct(dma["curve"][a][w]) for a in READINGS) + " |")
    ii = m["scalar_ii_ns"]
    out.append(f"| ScalarE dependent 1-element interval (trn1), ns (charged as documented) | {SCALAR_II_NS:.0f} | "
               + " | ".join(f"{ii:.0f}" for _ in READINGS) + " |")
    return "\n".join(out)


LATENCIES_JSON = Path(__file__).resolve().parents[1] / "docs" / "kernels" / "published-latencies.json"
SAVE_COMMAND = "python -m bench.cost_calibration --part latencies --save docs/kernels/published-latencies.json"


def latency_record(rows: list[dict]) -> dict:
    """What --save writes: the rows and their spread per reading (kernel_report quotes the spread beside MFU)."""
    return {"command": SAVE_COMMAND, "rows": rows, "spread": {a: spread(rows, a) for a in ORDERS}}


def _save(record: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="trn2", choices=("trn1", "trn2"),
                    help="the target of the tutorial matmuls' profiles (the published latencies are trn1's)")
    ap.add_argument("--part", default="all", choices=("all", "profiles", "latencies"))
    ap.add_argument("--save", type=Path, default=None,
                    help="write the published latencies and the predictions (JSON) to this file as well")
    args = ap.parse_args(argv)
    parts = []
    if args.part in ("all", "profiles"):
        parts.append(tables(measure(args.target)))
    if args.part in ("all", "latencies"):
        rows = matmul_trn1() + mamba()
        if args.save:
            _save(latency_record(rows), args.save)
        parts.append(latency_table(rows))
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
