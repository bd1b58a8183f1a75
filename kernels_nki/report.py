"""Cost report of every NKI kernel at a config's shapes: `python -m kernels_nki.report --config configs/baseline.py`.

For each kernel call shape of one training micro-batch (model.model_dim, heads, train.seq_len x
train.micro_batch_seqs tokens per core): TensorE useful/issued MACs (n/a without matmuls),
Vector/Scalar useful/issued lane-elements, DMA bytes against the minimum the op must move,
estimated trn1 time and its bounding engine (`kernels_nki.emulator.cost`). Work is counted exactly
by running the kernel source in the emulator's count-only mode (every instruction issued, checked
and counted, no arithmetic), not sampled. The whole-step section multiplies by the calls per step
and is marked incomplete while some op has no kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import ml_dtypes
import numpy as np

from frontier_jax.config import Config, load_config
from kernels_nki import emulator, registry
from kernels_nki.emulator import cost

CORES = 2  # trn1.2xlarge: one chip, 2 NeuronCore-v2, data parallel (nki.md 2 and design implication 7)
OPS = ("rms_norm", "rope", "causal_attention", "mlp", "embed", "head_loss")  # = frontier_jax.ops.OPS


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
    N, D, K, L = t.seq_len * t.micro_batch_seqs, m.model_dim, m.head_dim, m.num_layers
    dt = _compute_dtype(cfg)
    s, f32 = dt.itemsize, np.dtype(np.float32)
    calls = []
    # weightless RMSNorm: embedding output, 2 pre-norms per block, final norm; QK-norm per layer
    for label, rows, width, count in (
        (f"[N={N}, D={D}] embed/pre/final norms", N, D, 2 * L + 2),
        (f"[N*H={N * m.num_heads}, K={K}] q-norm", N * m.num_heads, K, L),
        (f"[N*G={N * m.num_kv_heads}, K={K}] k-norm", N * m.num_kv_heads, K, L),
    ):
        x = ((rows, width), dt.name)
        calls.append(KernelCall("rms_norm", "fwd", label, (x,), 2 * rows * width * s, count))
        calls.append(KernelCall("rms_norm", "bwd", label, (x, ((rows, 1), f32.name), x), 3 * rows * width * s, count))
    return calls + part2_calls(cfg) + attention_calls(cfg)


def attention_calls(cfg: Config) -> list[KernelCall]:
    """causal_attention fwd/bwd, counted on one sequence (B=1) and multiplied by the micro-batch's B:
    exact, since the kernel's work is the same for every sequence, and B times cheaper to count."""
    m, t = cfg.model, cfg.train
    B, T, H, G, K, L = t.micro_batch_seqs, t.seq_len, m.num_heads, m.num_kv_heads, m.head_dim, m.num_layers
    dt = _compute_dtype(cfg)
    s, dn = dt.itemsize, dt.name
    q, kv, lse = ((1, T, H, K), dn), ((1, T, G, K), dn), ((1, H, T, 1), "float32")
    label = f"[B=1 (x{B}), T={T}, H={H}, G={G}, K={K}]"
    fwd_min = (2 * H + 2 * G) * T * K * s + 4 * H * T  # q, k, v in; o, lse out
    bwd_min = (4 * H + 4 * G) * T * K * s + 4 * H * T  # q, k, v, o, dO, lse in; dq, dk, dv out
    return [KernelCall("causal_attention", "fwd", label, (q, kv, kv), fwd_min, L * B),
            KernelCall("causal_attention", "bwd", label, (q, kv, kv, q, lse, q), bwd_min, L * B)]


def part2_calls(cfg: Config) -> list[KernelCall]:
    """rope / mlp / embed / head_loss calls of one micro-batch on one core (NKI kernels part 2)."""
    m, t = cfg.model, cfg.train
    B, T, D, K, L, V = t.micro_batch_seqs, t.seq_len, m.model_dim, m.head_dim, m.num_layers, m.vocab_size
    N, F = B * T, m.mlp_mult * m.model_dim
    dt = _compute_dtype(cfg)
    s, dn = dt.itemsize, dt.name
    S = cfg.ngram.max_order - cfg.ngram.min_order + 1 if cfg.ngram.enabled else 0  # = ngram.runtime.num_orders
    calls = []
    for label, heads in ((f"q [B={B}, T={T}, H={m.num_heads}, K={K}]", m.num_heads),
                         (f"k [B={B}, T={T}, G={m.num_kv_heads}, K={K}]", m.num_kv_heads)):
        ins = (((B, T, heads, K), dn), ((T, K // 2), dn), ((T, K // 2), dn))
        for which in ("fwd", "bwd"):
            calls.append(KernelCall("rope", which, label, ins, 2 * N * heads * K * s + T * K * s, L))
    w = (((D, F), dn), ((F, D), dn))
    label = f"[N={N}, D={D}, F={F}]"
    calls.append(KernelCall("mlp", "fwd", label, (((N, D), dn),) + w, 2 * N * D * s + 2 * D * F * s, L))
    calls.append(KernelCall("mlp", "bwd", label, (((N, D), dn),) + w + (((N, D), dn),),
                            3 * N * D * s + 4 * D * F * s, L))
    ids, emb = ((N,), "int32"), ((V, D), dn)
    # embed: rows gathered/scattered + ids; the backward also writes its fp32 [V, D] output once
    calls.append(KernelCall("embed", "fwd", f"[N={N}] rows of [V={V}, D={D}]", (ids, emb), 4 * N + N * D * s, 1))
    calls.append(KernelCall("embed", "bwd", f"[N={N}] rows of [V={V}, D={D}]", (ids, emb, ((N, D), dn)),
                            4 * N + N * D * s + V * D * 4, 1))
    head = (((N, D), dn), emb, ((N, 1), "int32"), ((N, S), "int32"), ((N, S), "float32"))
    label = f"[N={N}, D={D}, V={V}, S={S}]"
    io = N * D * s + V * D * s + 4 * N + 8 * N * S
    const = (("softcap", float(m.logit_softcap)),)
    calls.append(KernelCall("head_loss", "fwd", label, head, io + 8 * N, 1, const))
    calls.append(KernelCall("head_loss", "bwd", label, head + (((N, 1), "float32"),) * 2,
                            io + 8 * N + N * D * s + V * D * s + 4 * N * S, 1, const))
    return calls


def measure(call: KernelCall) -> dict:
    spec = registry.KERNELS[call.op]
    kernel = getattr(registry.load_emulated(call.op), getattr(spec, call.which))
    c = emulator.count(kernel, *call.inputs, **dict(call.constants))
    est = emulator.estimate(c)
    ve = c.vector_elems_useful / c.vector_elems_issued if c.vector_elems_issued else None
    act = c.scalar_elems_useful / c.scalar_elems_issued if c.scalar_elems_issued else None
    return {
        "op": call.op, "which": call.which, "shape": call.label,
        "inputs": [[list(shape), dtype] for shape, dtype in call.inputs],
        "pe_useful_over_issued": emulator.pe_utilisation(c),
        "vector_useful_over_issued": ve, "scalar_useful_over_issued": act,
        "dma_bytes": c.dma_bytes, "dma_min_bytes": call.min_bytes, "dma_over_min": c.dma_bytes / call.min_bytes,
        "est_s": est.total_s, "serial_s": est.serial_s, "bound": est.bound, "engine_s": est.engine_s,
        "calls_per_step": None, "counters": c.as_dict(),
    }


def build_report(cfg: Config) -> dict:
    t = cfg.train
    n_micro = t.tokens_per_step / (CORES * t.seq_len * t.micro_batch_seqs)
    rows = []
    for call in kernel_calls(cfg):
        row = measure(call)
        row["calls_per_step"] = call.calls_per_microbatch * n_micro
        rows.append(row)
    missing = [op for op in OPS if op not in registry.KERNELS]
    step_s = sum(r["est_s"] * r["calls_per_step"] for r in rows)
    whole = whole_step(cfg, step_s)
    return {
        "whole_step": whole,
        "config": cfg.name,
        "method": "exact work counts from count-only emulation of the kernel source (no sampling)",
        "cores": CORES, "microbatches_per_core_per_step": n_micro,
        "kernels": rows,
        "ops_without_kernel": missing,
        "step": {
            "complete": not missing,
            "kernel_s_per_step": step_s,
            "covers": sorted({r["op"] for r in rows}),
            "note": ("whole-step estimate INCOMPLETE: no NKI kernel yet for " + ", ".join(missing) +
                     "; the time shown covers only the kernels listed, MFU n/a") if missing else "all ops covered",
        },
    }


def _fmt_ratio(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def format_report(rep: dict) -> str:
    lines = [f"NKI kernel report: config {rep['config']} ({rep['method']})",
             f"per core, {rep['cores']} cores, {rep['microbatches_per_core_per_step']:g} micro-batches per core per step",
             "", f"{'op':<16} {'pass':<4} {'shape':<40} {'PE u/i':>6} {'VE u/i':>6} {'ACT u/i':>7} "
                 f"{'DMA MB':>8} {'min MB':>8} {'x min':>5} {'est us':>9} {'bound':<6} {'calls/step':>10}"]
    for r in rep["kernels"]:
        lines.append(
            f"{r['op']:<16} {r['which']:<4} {r['shape']:<40} {_fmt_ratio(r['pe_useful_over_issued']):>6} "
            f"{_fmt_ratio(r['vector_useful_over_issued']):>6} {_fmt_ratio(r['scalar_useful_over_issued']):>7} "
            f"{r['dma_bytes'] / 1e6:>8.2f} {r['dma_min_bytes'] / 1e6:>8.2f} {r['dma_over_min']:>5.2f} "
            f"{r['est_s'] * 1e6:>9.1f} {r['bound']:<6} {r['calls_per_step']:>10g}")
    lines.append("")
    for op in rep["ops_without_kernel"]:
        lines.append(f"{op:<16} no NKI kernel (runs the pure-JAX reference)")
    st = rep["step"]
    lines += ["", f"whole step: {st['kernel_s_per_step'] * 1e3:.2f} ms of kernel time per core "
                  f"(covers {', '.join(st['covers'])})", st["note"]]
    w = rep.get("whole_step")
    if w:
        lines += [f"estimated trn1 step: {w['step_s'] * 1e3:.1f} ms = kernels {w['kernel_s'] * 1e3:.1f} ms + "
                  f"q/k/v/o projections {w['projection_s'] * 1e3:.1f} ms (XLA, no NKI kernel, at TensorE peak: "
                  "optimistic); "
                  f"MFU {w['mfu']:.1%} of {w['peak_flops_per_core'] / 1e12:.0f} TFLOP/s x {rep['cores']} cores "
                  f"({w['model_flops_per_step'] / 1e12:.1f} TFLOP per step)", w["note"]]
    return "\n".join(lines)


def whole_step(cfg: Config, kernel_s: float) -> dict:
    """Step time per core = kernel time (causal attention included, from its kernel's counts) + the
    matmul work that runs outside NKI kernels (the attention q/k/v/o projections, fwd + bwd = 3x fwd
    MACs) at TensorE peak, and the MFU that implies. Elementwise glue outside the kernels and the
    optimizer update (unless its kernels appear in the rows above) are not counted, so the time is a
    lower bound."""
    from frontier_jax.model import model_flops_per_token

    m, t = cfg.model, cfg.train
    D, H, G, K, L, T = m.model_dim, m.num_heads, m.num_kv_heads, m.head_dim, m.num_layers, t.seq_len
    tokens_per_core = t.tokens_per_step / CORES
    proj_macs = 3 * L * (D * H * K + 2 * D * G * K + H * K * D) * tokens_per_core
    proj_s = proj_macs / cost.TENSOR_MACS_PER_S
    step_s = kernel_s + proj_s
    flops = model_flops_per_token(m, T) * t.tokens_per_step
    peak = 2 * cost.TENSOR_MACS_PER_S
    return {"kernel_s": kernel_s, "projection_s": proj_s, "step_s": step_s,
            "model_flops_per_step": flops, "peak_flops_per_core": peak, "mfu": flops / (CORES * step_s * peak),
            "note": "step estimate: NKI kernels from exact counts (engines overlapped within a kernel, kernels "
                    "serial); projections at peak; elementwise glue and optimizer not counted"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels_nki.report", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a configs/*.py file")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    rep = build_report(cfg)
    from kernels_nki.report_optim import format_optimizer, optimizer_section

    rep["optimizer"] = optimizer_section(cfg)
    print(json.dumps(rep, indent=1) if args.json else format_report(rep) + "\n\n" + format_optimizer(rep["optimizer"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
