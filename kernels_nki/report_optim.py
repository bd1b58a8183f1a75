"""Optimizer section of `python -m kernels_nki.report`: the fused Adam/Muon kernels at a config's shapes.

For every parameter of the model (shapes and dtypes from the config, `report_step.param_specs`,
grouped as frontier_jax.optim labels them): the fused kernel's exact DMA bytes (count-only emulation) against
the minimum (Adam: p, g, m, v read once and p, m, v written once, 7 accesses per element; Muon:
p, g, buf read, p, buf written, 20 B per fp32 element), and its estimated time on the target
(kernels_nki.emulator.cost). Per core: data parallel replicates the optimizer on both cores.

"Before" (the unfused optax chain lowered op by op) is a traffic model, not a measurement: every
optax op is one HBM pass reading its inputs and writing its output (`UNFUSED_ADAM_ACCESSES`,
`_unfused_muon_bytes`), at the cost model's DMA rate, plus the same Newton-Schulz TensorE time.
XLA fusion on Neuron would merge some elementwise passes, so this is an upper bound on "before".
The step share divides by an estimated step = optimizer + model FLOPs at an assumed MFU.
Imports no JAX and no trainer module (only frontier_jax.config).
"""

from __future__ import annotations

import collections
import dataclasses

import ml_dtypes
import numpy as np

from frontier_jax.config import Config
from kernels_nki import emulator, registry
from kernels_nki.emulator import cost
from kernels_nki.report_step import CORES, param_specs

ASSUMED_MFU = (1.0, 0.4)  # model part of the step at the TensorE roofline and at 40% MFU
# optax ops of scale_by_adam + scale_by_scheduled_lr + apply_updates, (reads + writes) per element:
# mu EMA 3, nu EMA 3, mu bias-correct 2, nu bias-correct 2, mu/(sqrt(nu)+eps) 3, x(-lr) 2, p + u 3
UNFUSED_ADAM_ACCESSES = 18


def _unfused_muon_bytes(I: int, O: int, steps: int, ns_bytes: int) -> float:
    """HBM bytes of optim.scale_by_muon + lr + apply as separate passes (fp32 state, NS in ns_bytes)."""
    R = min(I, O)
    n, a = I * O, R * R
    pre = 3 * 4 * n + 3 * 4 * n  # buf EMA, Nesterov
    pre += (4 + ns_bytes) * n + ns_bytes * n + 2 * ns_bytes * n + 2 * ns_bytes * n  # cast, norm, divide, transpose
    # per iteration: X X^T (read X, write A), b*A, A@A, c*AA, add (A-sized), B@X (read B, X, write), a*X, add
    it = ns_bytes * (n + a) + 2 * ns_bytes * a + 2 * ns_bytes * a + 2 * ns_bytes * a + 3 * ns_bytes * a
    it += ns_bytes * (a + 2 * n) + 2 * ns_bytes * n + 3 * ns_bytes * n
    post = 2 * ns_bytes * n + 2 * ns_bytes * n + (ns_bytes + 4) * n + 2 * 4 * n + 3 * 4 * n  # scale, T, cast, lr, apply
    return pre + steps * it + post


def optimizer_section(cfg: Config, target: str = cost.DEFAULT_TARGET) -> dict:
    ns = "bfloat16" if cfg.optim.muon_ns_dtype == "auto" else cfg.optim.muon_ns_dtype  # auto: bf16 on accelerators
    o = dataclasses.replace(cfg.optim, muon_ns_dtype=ns)
    ns_bytes = 2 if o.muon_ns_dtype == "bfloat16" else 4
    kernels = {op: getattr(registry.load_emulated(op), registry.KERNELS[op].fwd) for op in ("adam_update", "muon_update")}
    calls = collections.Counter()
    for _, kind, shape, dtn in param_specs(cfg):
        calls[(kind, shape, dtn)] += 1
    rows, tot = [], collections.defaultdict(float)
    for (kind, shape, dtn), k in sorted(calls.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        n = int(np.prod(shape))
        dt = np.dtype(ml_dtypes.bfloat16) if dtn == "bfloat16" else np.dtype(dtn)
        if kind == "adam":
            c = emulator.count(kernels["adam_update"], *[((n,), dtn)] * 4, ((128, 4), "float32"), target=target,
                               b1=o.beta1, b2=o.beta2, eps=o.adam_eps)
            min_b, unfused_b = 7 * n * dt.itemsize, UNFUSED_ADAM_ACCESSES * n * dt.itemsize
        else:
            c = emulator.count(kernels["muon_update"], *[(shape, "float32")] * 3, ((128, 2), "float32"), target=target,
                               ns_steps=o.muon_ns_steps, ns_dtype=o.muon_ns_dtype)
            min_b, unfused_b = 20 * n, _unfused_muon_bytes(shape[0], shape[1], o.muon_ns_steps, ns_bytes)
        est = emulator.estimate(c, target)
        unfused_s = unfused_b / cost.target(target).dma_bytes_per_s + est.engine_s["tensor"]
        rows.append({"optimizer": kind, "shape": list(shape), "dtype": dtn, "calls_per_step": k, "elements": n,
                     "dma_bytes": c.dma_bytes, "min_bytes": min_b, "dma_over_min": c.dma_bytes / min_b,
                     "est_s": est.total_s, "bound": est.bound, "unfused_bytes": unfused_b, "unfused_s": unfused_s})
        for key, val in (("dma", c.dma_bytes), ("min", min_b), ("s", est.total_s), ("unfused_b", unfused_b),
                         ("unfused_s", unfused_s), ("n", n)):
            tot[(kind, key)] += val * k
    t = cfg.train
    flops = cfg.model.flops_per_token(t.seq_len) * t.tokens_per_step / CORES
    summary = {}
    for kind in ("adam", "muon"):
        summary[kind] = {"elements": tot[(kind, "n")], "dma_bytes": tot[(kind, "dma")], "min_bytes": tot[(kind, "min")],
                         "dma_over_min": tot[(kind, "dma")] / tot[(kind, "min")], "est_s": tot[(kind, "s")],
                         "unfused_bytes": tot[(kind, "unfused_b")], "unfused_s": tot[(kind, "unfused_s")]}
    fused_s = sum(summary[k]["est_s"] for k in summary)
    unfused_s = sum(summary[k]["unfused_s"] for k in summary)
    shares = {}
    for mfu in ASSUMED_MFU:
        model_s = flops / (2 * cost.target(target).tensor_macs_per_s * mfu)
        shares[f"mfu_{mfu:g}"] = {"model_s": model_s, "share_before": unfused_s / (unfused_s + model_s),
                                  "share_after": fused_s / (fused_s + model_s)}
    return {"config": cfg.name, "per_core": True, "rows": rows, "summary": summary, "fused_s": fused_s,
            "unfused_s": unfused_s, "step_share": shares, "fused": cfg.optim.fused, "target": target,
            "step_s": fused_s if cfg.optim.fused else unfused_s,
            "note": "the config runs the fused kernels (counted)" if cfg.optim.fused else
                    "the config runs the unfused optax chain: the step uses its traffic model (estimated)"}


def format_optimizer(sec: dict) -> str:
    lines = [f"optimizer (fused kernels, per core, per step; config {sec['config']})",
             f"{'opt':<5} {'shape':<14} {'dtype':<9} {'calls':>5} {'DMA MB':>8} {'min MB':>8} {'x min':>6} "
             f"{'est us':>8} {'bound':<6} {'unfused MB':>10} {'unfused us':>10}"]
    for r in sec["rows"]:
        lines.append(f"{r['optimizer']:<5} {'x'.join(map(str, r['shape'])):<14} {r['dtype']:<9} {r['calls_per_step']:>5} "
                     f"{r['dma_bytes'] / 1e6:>8.3f} {r['min_bytes'] / 1e6:>8.3f} {r['dma_over_min']:>6.3f} "
                     f"{r['est_s'] * 1e6:>8.1f} {r['bound']:<6} {r['unfused_bytes'] / 1e6:>10.2f} {r['unfused_s'] * 1e6:>10.1f}")
    for kind, s in sec["summary"].items():
        lines.append(f"{kind}: {s['elements']:,.0f} elements, {s['dma_bytes'] / s['elements']:.2f} B/element moved vs "
                     f"{s['min_bytes'] / s['elements']:.2f} minimum = {s['dma_over_min']:.4f}x; "
                     f"{s['est_s'] * 1e3:.3f} ms/step fused vs {s['unfused_s'] * 1e3:.3f} ms unfused (traffic model)")
    lines.append(f"whole optimizer: {sec['fused_s'] * 1e3:.3f} ms/step fused, {sec['unfused_s'] * 1e3:.3f} ms unfused")
    for key, sh in sec["step_share"].items():
        lines.append(f"share of a {sec['target']} step (model at {key.replace('mfu_', 'MFU ')}: {sh['model_s'] * 1e3:.1f} ms): "
                     f"{sh['share_before']:.1%} before fusing, {sh['share_after']:.1%} after")
    if sec["note"]:
        lines.append(sec["note"])
    return "\n".join(lines)
