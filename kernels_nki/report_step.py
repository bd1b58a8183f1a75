"""Whole-step part of `python -m kernels_nki.report`: model shapes from the config, the work outside kernels.

Reads only `frontier_jax.config` (and NumPy): the parameter list and the FLOP count are written here
from the architecture the README describes (tests/test_kernels_report.py checks both against
`frontier_jax.model`). Per core and per training step:

- counted: NKI kernels whose source runs in count-only emulation (report.py, report_optim.py),
  the q/k/v/o projections included (the mix_norm_projection and projection ops, kernels_nki/projection.py;
  the blocks' pre-norms run inside mix_norm_projection and norm_mlp, resid_mix and the U-Net skip adds
  inside mix_norm_projection, the scaled residual adds x + s f(x) inside the output projection and
  norm_mlp).
- estimated, traffic: the element-wise glue between kernels (`glue_passes`), each an HBM pass at the
  DMA rate (XLA fuses each line into one loop; reads + writes counted per element).
"""

from __future__ import annotations

import dataclasses
import math

from frontier_jax.config import Config
from kernels_nki.emulator import cost

CORES = 2  # trn1.2xlarge: one chip, 2 NeuronCore-v2, data parallel
BUDGET_S = 1800.0  # the contest's 30-minute training budget
CONTROL = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights", "ngram_bias")  # Adam, not Muon


def param_specs(cfg: Config) -> list[tuple[str, str, tuple[int, ...], str]]:
    """[(path, optimizer "muon" | "adam", shape, dtype)] of the model's parameters (model.py's GPT)."""
    m = cfg.model
    D, H, G, K, L, V, F = m.model_dim, m.num_heads, m.num_kv_heads, m.head_dim, m.num_layers, m.vocab_size, \
        m.mlp_mult * m.model_dim
    emb_dt = "float32" if m.compute_dtype == "float32" else "bfloat16"  # stored in the compute dtype
    enc = L // 2
    specs = [("tok_emb", "adam", (V, D), emb_dt), ("skip_weights", "adam", (min(enc, L - enc), D), "float32")]
    for i in range(L):
        for name, shape in (("attn.c_q", (D, H * K)), ("attn.c_k", (D, G * K)), ("attn.c_v", (D, G * K)),
                            ("attn.proj", (H * K, D)), ("attn.q_gain", (H,)), ("mlp.fc", (D, F)),
                            ("mlp.proj", (F, D)), ("attn_scale", (D,)), ("mlp_scale", (D,)),
                            ("resid_mix", (2, D))):
            control = name.split(".")[-1] in CONTROL
            specs.append((f"blocks.{i}.{name}", "muon" if len(shape) == 2 and not control else "adam", shape,
                          "float32"))
    if cfg.ngram.bias_orders:
        specs.append(("ngram_bias", "adam", (cfg.ngram.bias_orders, cfg.ngram.confidence_buckets), "float32"))
    return specs


def glue_passes(cfg: Config, dt_bytes: int) -> list[tuple[str, float]]:
    """(what, HBM bytes per micro-batch) of the element-wise work between kernels, forward and backward."""
    m, t = cfg.model, cfg.train
    N, D, L, F = t.seq_len * t.micro_batch_seqs, m.model_dim, m.num_layers, m.mlp_mult * m.model_dim
    x = N * D * dt_bytes
    skips = min(L // 2, L - L // 2)
    n_params = sum(math.prod(shape) for _, _, shape, _ in param_specs(cfg))
    return [
        # resid_mix and the skip adds run inside mix_norm_projection; what is left of them are the gradient sums
        # autodiff forms: x0 feeds every block (and is block 0's input), each kernel returns its share of dx0,
        # summed by one XLA loop (L + 1 in, 1 out); an encoder output's gradient is its next block's dx_in plus
        # the skip's dskip (2 in, 1 out)
        ("x0 gradient sum (blocks' dx0)", (L + 2) * x),
        # x + s * f(x) runs in the kernels (s folded into W_o / W_proj; the output projection passes dy through
        # as the residual's gradient, which mix_norm_projection's backward adds on chip, and norm_mlp's
        # backward adds dy itself); left: per weight dW = dW' s, ds = colsum(W dW') from the fp32 dW' and W
        # (read 2, write 1, fp32)
        ("residual scales: dW = dW' s, ds", L * (m.num_heads * m.head_dim * D + F * D) * 3 * 4),
        ("U-Net skip gradient adds", skips * 3 * x),
        # fp32 parameters read and cast to the compute dtype for the matmuls, once per micro-batch
        ("parameter casts fp32 -> compute dtype", n_params * (4 + dt_bytes)),
        # gradient accumulation over micro-batches: read the fp32 sum and the new gradient, write the sum
        ("gradient accumulation (fp32)", n_params * 3 * 4),
    ]


@dataclasses.dataclass(frozen=True)
class StepTotals:
    counted_s: float  # kernels from count-only emulation
    traffic_s: float  # glue from its HBM traffic
    optimizer_s: float
    optimizer_counted: bool


def whole_step(cfg: Config, t: StepTotals, target: str) -> dict:
    """Step time per core, its counted/estimated shares, MFU and tokens per 30 minutes on one chip."""
    step_s = t.counted_s + t.traffic_s + t.optimizer_s
    counted = t.counted_s + (t.optimizer_s if t.optimizer_counted else 0.0)
    flops = cfg.model.flops_per_token(cfg.train.seq_len) * cfg.train.tokens_per_step
    peak = 2 * cost.target(target).tensor_macs_per_s
    steps = BUDGET_S / step_s
    return {"kernel_s": t.counted_s, "glue_s": t.traffic_s,
            "optimizer_s": t.optimizer_s, "step_s": step_s,
            "share_counted": counted / step_s, "share_estimated": 1 - counted / step_s,
            "model_flops_per_step": flops, "peak_flops_per_core": peak, "mfu": flops / (CORES * step_s * peak),
            "steps_per_30min": steps, "tokens_per_30min": steps * cfg.train.tokens_per_step,
            "note": "kernels serial, engines overlapped within a kernel; glue estimated from its HBM passes; "
                    "30 minutes on 2 NeuronCores (one trn1 chip; a trn2 chip has 8)"}


def format_whole_step(w: dict, cores: int) -> list[str]:
    return [f"estimated step: {w['step_s'] * 1e3:.1f} ms per core = kernels {w['kernel_s'] * 1e3:.1f} "
            f"(q/k/v/o projections included) + glue {w['glue_s'] * 1e3:.1f} (HBM passes) + optimizer "
            f"{w['optimizer_s'] * 1e3:.1f} ms",
            f"counted from kernels: {w['share_counted']:.1%} of the step; estimated: {w['share_estimated']:.1%}",
            f"MFU {w['mfu']:.1%} of {w['peak_flops_per_core'] / 1e12:.0f} TFLOP/s x {cores} cores "
            f"({w['model_flops_per_step'] / 1e12:.1f} TFLOP per step); 30 minutes on {cores} cores: "
            f"{w['steps_per_30min']:,.0f} steps = {w['tokens_per_30min'] / 1e9:.2f} B tokens", w["note"]]
