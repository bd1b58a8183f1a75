"""Cost report of every NKI kernel at a config's shapes: `python -m kernels_nki.report --config configs/baseline.py`.

For each kernel call shape of one training micro-batch (model.model_dim, heads, train.seq_len x
train.micro_batch_seqs tokens per core): TensorE useful/issued MACs (n/a without matmuls),
Vector/Scalar useful/issued lane-elements, DMA bytes against the minimum the op must move,
estimated time on `--target` (trn1 default, trn2) and its bounding engine
(`kernels_nki.emulator.cost`). Work is counted exactly by running the kernel source in the
emulator's count-only mode (every instruction issued, checked and counted, no arithmetic), not
sampled. The whole step adds the element-wise glue and the optimizer
(`report_step`, `report_optim`), says which share is counted and which estimated, and compares
configs side by side (`--compare`, default configs/frontier14.py): tokens per 30 minutes on one chip.
Reads model shapes from the config: imports no trainer module and no JAX.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import ml_dtypes
import numpy as np

from frontier_jax.config import Config, load_config
from pathlib import Path

from kernels_nki import emulator, registry, report_step
from kernels_nki.emulator import cost
from kernels_nki.report_optim import format_optimizer, optimizer_section
from kernels_nki.report_step import CORES

FRONTIER14 = Path(__file__).resolve().parents[1] / "configs" / "frontier14.py"
# the ops the model runs (frontier_jax.model; rope, rope_gain, causal_attention and the QK-norm are inside
# qk_attention, the blocks' pre-norms inside mix_norm_projection / norm_mlp, resid_mix and the U-Net skip adds
# inside mix_norm_projection; the optimizer updates are costed in report_optim)
OPS = ("rms_norm", "qk_attention", "norm_mlp", "embed", "head_loss", "projection", "mix_norm_projection")


@dataclasses.dataclass(frozen=True)
class KernelCall:
    op: str
    which: str  # "fwd" | "bwd"
    label: str
    inputs: tuple  # ((shape, dtype name), ...)
    min_bytes: int  # what the op must move between HBM and the chip at the least
    calls_per_microbatch: int
    constants: tuple = ()  # ((name, value), ...): the kernel's compile-time keyword constants


def _compute_dtype(cfg: Config) -> np.dtype:
    # "auto" is bf16 on accelerators (frontier_jax.model.resolve_compute_dtype); trn1 is one
    return np.dtype(np.float32) if cfg.model.compute_dtype == "float32" else np.dtype(ml_dtypes.bfloat16)


def kernel_calls(cfg: Config) -> list[KernelCall]:
    """Every kernel call of one micro-batch on one core, with the shapes the model passes."""
    m, t = cfg.model, cfg.train
    N, D = t.seq_len * t.micro_batch_seqs, m.model_dim
    dt = _compute_dtype(cfg)
    s, f32 = dt.itemsize, np.dtype(np.float32)
    calls = []
    # weightless RMSNorm: embedding output and final norm (the blocks' pre-norms run inside norm_projection
    # and norm_mlp, the QK-norm inside qk_attention)
    for label, rows, width, count in (
        (f"[N={N}, D={D}] embed/final norms", N, D, 2),
    ):
        x = ((rows, width), dt.name)
        calls.append(KernelCall("rms_norm", "fwd", label, (x,), 2 * rows * width * s, count))
        calls.append(KernelCall("rms_norm", "bwd", label, (x, ((rows, 1), f32.name), x), 3 * rows * width * s, count))
    return calls + model_op_calls(cfg) + attention_calls(cfg) + projection_calls(cfg)


def projection_calls(cfg: Config) -> list[KernelCall]:
    """The attention's q/k/v (one fused [D, (H + 2G) K] weight with the block's resid_mix, the pre-attention
    RMSNorm and, in the decoder blocks that take a U-Net skip, the skip add fused in: the mix_norm_projection
    op, frontier_jax.ops.mix_norm_qkv_projection) and output projection with the block's scaled residual add
    (the projection op, ops.out_projection: the forward reads the residual [N, D] too); both kernels in
    kernels_nki/projection.py."""
    m, t = cfg.model, cfg.train
    N, D, L = t.seq_len * t.micro_batch_seqs, m.model_dim, m.num_layers
    dt = _compute_dtype(cfg)
    s, dn = dt.itemsize, dt.name
    skips = min(L // 2, L - L // 2)  # decoder blocks that add a skip (model.GPT.hidden)
    O = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim
    x, w, y, inv, mix, sw = ((N, D), dn), ((D, O), dn), ((N, O), dn), ((N, 1), "float32"), ((2, D), "float32"), \
        ((1, D), "float32")
    nd, io = N * D * s, (D * O + N * O) * s + 4 * N + 8 * D  # io: w, y or dy, inv, mix (fp32)
    calls = []
    for name, skip, count in (("q/k/v", False, L - skips), ("q/k/v+skip", True, skips)):
        if not count:
            continue
        label = f"{name} [N={N}, {D}->{O}]"
        extra = nd + 4 * D if skip else 0  # the skip in and its weight; the backward writes dskip, dsw too
        # fwd: x_in, x0 in, x out; bwd: x_in, x0, dx out (the written x's gradient) in, dx_in, dx0 out; dmix, dw
        calls.append(KernelCall("mix_norm_projection", "fwd", label, (x, x, mix, w) + ((x, sw) if skip else ()),
                                3 * nd + io + extra, count))
        calls.append(KernelCall("mix_norm_projection", "bwd", label,
                                (x, x, mix, w) + ((x, sw) if skip else (None, None)) + (inv, x, y),
                                5 * nd + io + 8 * D + D * O * 4 + 2 * extra, count))
    I = m.num_heads * m.head_dim
    x, w, y = ((N, I), dn), ((I, D), dn), ((N, D), dn)
    io = (N * I + I * D + N * D) * s
    label = f"out [N={N}, {I}->{D}]"
    # the forward reads the block's residual stream and adds it (x + s (o W), s folded into W)
    calls.append(KernelCall("projection", "fwd", label, (x, w, y), io + N * D * s, L))
    calls.append(KernelCall("projection", "bwd", label, (x, w, y), io + N * I * s + I * D * 4, L))
    return calls


def attention_calls(cfg: Config) -> list[KernelCall]:
    """qk_attention fwd/bwd (QK-norm, RoPE, the query gain and attention in one kernel), counted on one
    sequence (B=1) and multiplied by the micro-batch's B: exact, since the kernel's work is the same for
    every sequence, and B times cheaper to count."""
    m, t = cfg.model, cfg.train
    B, T, H, G, K, L = t.micro_batch_seqs, t.seq_len, m.num_heads, m.num_kv_heads, m.head_dim, m.num_layers
    dt = _compute_dtype(cfg)
    s, dn = dt.itemsize, dt.name
    q, kv, lse = ((1, T, H, K), dn), ((1, T, G, K), dn), ((1, H, T, 1), "float32")
    tabs, g = (((T, K // 2), "float32"),) * 2, ((128, H), "float32")  # cos/sin; the gain over 128 rows
    label = f"[B=1 (x{B}), T={T}, H={H}, G={G}, K={K}]"
    consts = 4 * T * K + 4 * 128 * H  # the cos/sin tables and the gain, fp32
    # the normed, rotated q / k, each row's inverse RMS and q / k transposed: written by the forward, read by
    # the backward
    saved = (q, ((1, T, H, 1), "float32"), kv, ((1, T, G, 1), "float32"), ((1, H, K, T), dn), ((1, G, K, T), dn))
    saved_bytes = (H + G) * T * (2 * K * s + 4)
    fwd_min = (2 * H + 2 * G) * T * K * s + 4 * H * T + consts + saved_bytes  # q, k, v in; o, lse out
    bwd_min = (4 * H + 4 * G) * T * K * s + 4 * H * T + consts + 4 * H + saved_bytes  # + dO in; dq, dk, dv, dg out
    return [KernelCall("qk_attention", "fwd", label, (q, kv, kv) + tabs + (g,), fwd_min, L * B),
            KernelCall("qk_attention", "bwd", label, (q, kv, kv) + tabs + (g, q, lse) + saved + (q,), bwd_min, L * B)]


def model_op_calls(cfg: Config) -> list[KernelCall]:
    """norm_mlp / embed / head_loss calls of one micro-batch on one core."""
    m, t = cfg.model, cfg.train
    B, T, D, L, V = t.micro_batch_seqs, t.seq_len, m.model_dim, m.num_layers, m.vocab_size
    N, F = B * T, m.mlp_mult * m.model_dim
    dt = _compute_dtype(cfg)
    s, dn = dt.itemsize, dt.name
    S = cfg.ngram.bias_orders
    calls = []
    # the MLP with its pre-norm and scaled residual add fused in (norm_mlp): x in, y = x + s mlp, the norm's
    # inv [N, 1] fp32 and relu(h)^T [F, N] out; backward: x, dy, rT in, dx (with dy passed through) out, dW_proj
    # in fp32
    w = (((D, F), dn), ((F, D), dn))
    label = f"[N={N}, D={D}, F={F}]"
    calls.append(KernelCall("norm_mlp", "fwd", label, (((N, D), dn),) + w,
                            2 * N * D * s + 2 * D * F * s + 4 * N + N * F * s, L))
    calls.append(KernelCall("norm_mlp", "bwd", label,
                            (((N, D), dn),) + w + (((N, 1), "float32"), ((F, N), dn), ((N, D), dn)),
                            3 * N * D * s + 3 * D * F * s + 4 * D * F + 4 * N + N * F * s, L))
    ids, emb = ((N,), "int32"), ((V, D), dn)
    # embed: rows gathered/scattered + ids; the backward also writes its fp32 [V, D] output once
    calls.append(KernelCall("embed", "fwd", f"[N={N}] rows of [V={V}, D={D}]", (ids, emb), 4 * N + N * D * s, 1))
    calls.append(KernelCall("embed", "bwd", f"[N={N}] rows of [V={V}, D={D}]", (ids, emb, ((N, D), dn)),
                            4 * N + N * D * s + V * D * 4, 1))
    bias = (((N, S), "int32"), ((N, S), "float32")) if S else (None, None)  # no bias: None (no [N, 0] tensor)
    head = (((N, D), dn), emb, ((N, 1), "int32")) + bias
    label = f"[N={N}, D={D}, V={V}, S={S}]"
    io = N * D * s + V * D * s + 4 * N + 8 * N * S
    const = (("softcap", float(m.logit_softcap)),)
    calls.append(KernelCall("head_loss", "fwd", label, head, io + 8 * N, 1, const))
    calls.append(KernelCall("head_loss", "bwd", label, head + (((N, 1), "float32"),) * 2,
                            io + 8 * N + N * D * s + V * D * s + 4 * N * S, 1, const))
    return calls


def kernel_of(call: KernelCall):
    """The emulated kernel function a call runs."""
    return getattr(registry.load_emulated(call.op), getattr(registry.KERNELS[call.op], call.which))


def measure(call: KernelCall, target: str = cost.DEFAULT_TARGET) -> dict:
    c = emulator.count(kernel_of(call), *call.inputs, target=target, **dict(call.constants))
    return _row(call.op, call.which, call.label, c, target, call.min_bytes,
                inputs=[None if spec is None else [list(spec[0]), spec[1]] for spec in call.inputs])


def _row(op, which, label, c, target, min_bytes, inputs=None) -> dict:
    est = emulator.estimate(c, target)
    ve = c.vector_elems_useful / c.vector_elems_issued if c.vector_elems_issued else None
    act = c.scalar_elems_useful / c.scalar_elems_issued if c.scalar_elems_issued else None
    return {
        "op": op, "which": which, "shape": label, "inputs": inputs,
        "pe_useful_over_issued": emulator.pe_utilisation(c),
        "vector_useful_over_issued": ve, "scalar_useful_over_issued": act,
        "dma_bytes": c.dma_bytes, "dma_min_bytes": min_bytes, "dma_over_min": c.dma_bytes / min_bytes,
        "dma_bytes_per_buffer": c.dma_bytes / c.dma_buffers if c.dma_buffers else None,
        "dma_share_under_256": c.dma_bytes_under_256 / c.dma_bytes if c.dma_bytes else 0.0,
        "dma_share_under_2k": c.dma_bytes_under_2k / c.dma_bytes if c.dma_bytes else 0.0,
        "est_s": est.total_s, "serial_s": est.serial_s, "bound": est.bound, "engine_s": est.engine_s,
        "calls_per_step": None, "counters": c.as_dict(),
    }


def build_report(cfg: Config, target: str = cost.DEFAULT_TARGET) -> dict:
    t = cfg.train
    n_micro = t.tokens_per_step / (CORES * t.seq_len * t.micro_batch_seqs)
    rows = []
    for call in kernel_calls(cfg):
        row = measure(call, target)
        row["calls_per_step"] = call.calls_per_microbatch * n_micro
        rows.append(row)
    dt_bytes = _compute_dtype(cfg).itemsize
    dma_rate = cost.target(target).dma_bytes_per_s
    glue = [{"what": what, "bytes_per_step": b * n_micro, "est_s": b * n_micro / dma_rate}
            for what, b in report_step.glue_passes(cfg, dt_bytes)]
    missing = [op for op in OPS if op not in registry.KERNELS]
    kernel_s = sum(r["est_s"] * r["calls_per_step"] for r in rows)
    opt = optimizer_section(cfg, target)
    totals = report_step.StepTotals(
        counted_s=kernel_s, traffic_s=sum(g["est_s"] for g in glue), optimizer_s=opt["step_s"], optimizer_counted=opt["fused"])
    return {
        "config": cfg.name, "target": target,
        "method": "exact work counts from count-only emulation of the kernel source (no sampling)",
        "cores": CORES, "microbatches_per_core_per_step": n_micro,
        "kernels": rows, "glue": glue, "optimizer": opt,
        "ops_without_kernel": missing,
        "step": {"complete": not missing, "kernel_s_per_step": kernel_s, "covers": sorted({r["op"] for r in rows}),
                 "note": ("INCOMPLETE: no NKI kernel yet for " + ", ".join(missing)) if missing else "all ops covered"},
        "whole_step": report_step.whole_step(cfg, totals, target),
    }


def _fmt_ratio(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _fmt_row(r: dict) -> str:
    return (f"{r['op']:<19} {r['which']:<4} {r['shape']:<40} {_fmt_ratio(r['pe_useful_over_issued']):>6} "
            f"{_fmt_ratio(r['vector_useful_over_issued']):>6} {_fmt_ratio(r['scalar_useful_over_issued']):>7} "
            f"{r['dma_bytes'] / 1e6:>8.2f} {r['dma_min_bytes'] / 1e6:>8.2f} {r['dma_over_min']:>5.2f} "
            f"{r['dma_bytes_per_buffer'] or 0:>6.0f} {100 * r['dma_share_under_2k']:>5.1f} "
            f"{r['est_s'] * 1e6:>9.1f} {r['bound']:<6} {r['calls_per_step']:>10g}")


def format_report(rep: dict) -> str:
    lines = [f"NKI kernel report: config {rep['config']}, target {rep['target']} ({rep['method']})",
             f"per core, {rep['cores']} cores, {rep['microbatches_per_core_per_step']:g} micro-batches per core per step",
             "", f"{'op':<19} {'pass':<4} {'shape':<40} {'PE u/i':>6} {'VE u/i':>6} {'ACT u/i':>7} "
                 f"{'DMA MB':>8} {'min MB':>8} {'x min':>5} {'B/buf':>6} {'<2K %':>5} {'est us':>9} {'bound':<6} {'calls/step':>10}"]
    lines += [_fmt_row(r) for r in rep["kernels"]]
    lines += [f"{op:<19} no NKI kernel (runs the pure-JAX reference)" for op in rep["ops_without_kernel"]]
    lines += ["", "element-wise glue between kernels (estimated: HBM passes at the DMA rate, per step):"]
    lines += [f"  {g['what']:<40} {g['bytes_per_step'] / 1e9:>7.2f} GB {g['est_s'] * 1e3:>8.2f} ms" for g in rep["glue"]]
    st = rep["step"]
    lines += ["", f"kernels: {st['kernel_s_per_step'] * 1e3:.2f} ms per step per core (covers {', '.join(st['covers'])}); "
                  f"{st['note']}"]
    lines += report_step.format_whole_step(rep["whole_step"], rep["cores"])
    lines += [_payload_line(rep)]
    return "\n".join(lines)


def _payload_line(rep: dict) -> str:
    """How much of the step's kernel DMA traffic moves in buffers below the DMA bandwidth guide's marks,
    which the cost model still charges at peak (`Machine.count_dma`)."""
    total = sum(r["dma_bytes"] * r["calls_per_step"] for r in rep["kernels"])
    under = {k: sum(r["dma_bytes"] * r[f"dma_share_under_{k}"] * r["calls_per_step"] for r in rep["kernels"]) / total
             for k in ("2k", "256")}
    dma_bound = sorted({r["op"] for r in rep["kernels"] if r["bound"] == "dma" and r["dma_share_under_2k"] > 0.5})
    return (f"DMA payloads: {100 * under['2k']:.1f}% of the kernels' DMA bytes move in buffers < 2 KiB, "
            f"{100 * under['256']:.1f}% in buffers < 256 B (AWS's DMA bandwidth guide: below peak / severely "
            f"overhead-bound; charged at peak here, so optimistic for DMA-bound kernels"
            + (f": {', '.join(dma_bound)}" if dma_bound else "") + ")")


def format_comparison(reps: list[dict]) -> str:
    lines = [f"side by side (target {reps[0]['target']}, per core):",
             f"{'config':<12} {'layers':>6} {'step ms':>8} {'counted':>8} {'MFU':>6} {'steps/30min':>11} {'tokens/30min':>13}"]
    for r in reps:
        w = r["whole_step"]
        lines.append(f"{r['config']:<12} {r['num_layers']:>6} {w['step_s'] * 1e3:>8.1f} {w['share_counted']:>8.1%} "
                     f"{w['mfu']:>6.1%} {w['steps_per_30min']:>11,.0f} {w['tokens_per_30min'] / 1e9:>11.2f} B")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels_nki.report", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a configs/*.py file")
    ap.add_argument("--target", default=cost.DEFAULT_TARGET, choices=sorted(cost.TARGETS),
                    help="trn1 (NeuronCore-v2, default) or trn2 (NeuronCore-v3)")
    ap.add_argument("--compare", action="append", default=None,
                    help="another configs/*.py to estimate side by side (repeatable; default configs/frontier14.py)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    rep = build_report(cfg, args.target)
    rep["num_layers"] = cfg.model.num_layers
    others = args.compare if args.compare is not None else ([str(FRONTIER14)] if FRONTIER14.exists() else [])
    side = [rep]
    for path in others:
        other = load_config(path)
        if other.name != cfg.name:
            side.append(dict(build_report(other, args.target), num_layers=other.model.num_layers))
    rep["comparison"] = [{"config": r["config"], "num_layers": r["num_layers"], **r["whole_step"]} for r in side]
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print(format_report(rep) + "\n\n" + format_optimizer(rep["optimizer"]) + "\n\n" + format_comparison(side))
    return 0


if __name__ == "__main__":
    sys.exit(main())
