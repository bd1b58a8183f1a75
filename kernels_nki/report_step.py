"""Whole-step part of `python -m kernels_nki.report`: model shapes from the config, the work outside kernels.

Reads only `frontier_jax.config` (and NumPy): the parameter list and the FLOP count are written here
from the architecture the README describes (tests/test_kernels_report.py checks both against
`frontier_jax.model`). Per core and per training step:

- counted: NKI kernels whose source runs in count-only emulation (report.py, report_optim.py).
- estimated, tiling: the q/k/v/o projections (XLA matmuls today, no NKI kernel): the instructions a
  128-row tiling issues (`projection_counters`), costed by the same cost model as the kernels.
- estimated, traffic: the element-wise glue between kernels (`glue_passes`), each an HBM pass at the
  DMA rate (XLA fuses each line into one loop; reads + writes counted per element).
"""

from __future__ import annotations

import dataclasses
import math

from frontier_jax.config import Config
from kernels_nki.emulator import cost
from kernels_nki.emulator.machine import PMAX, Counters

CORES = 2  # trn1.2xlarge: one chip, 2 NeuronCore-v2, data parallel
BUDGET_S = 1800.0  # the contest's 30-minute training budget
CONTROL = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights", "ngram_bias")  # Adam, not Muon


def num_bias_orders(cfg: Config) -> int:
    n = cfg.ngram
    return n.max_order - n.min_order + 1 if n.enabled else 0


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
    if num_bias_orders(cfg):
        specs.append(("ngram_bias", "adam", (num_bias_orders(cfg), cfg.ngram.confidence_buckets), "float32"))
    return specs


def model_flops_per_token(cfg: Config) -> float:
    """Training FLOPs per token (3x forward), attention's causal triangle as T/2 keys per query."""
    m, T = cfg.model, cfg.train.seq_len
    D, H, G, K, F = m.model_dim, m.num_heads, m.num_kv_heads, m.head_dim, m.mlp_mult * m.model_dim
    per_layer = 2 * (D * H * K + 2 * D * G * K + H * K * D + 2 * D * F) + 2 * 2 * H * K * (T / 2)
    return 3.0 * (m.num_layers * per_layer + 2 * D * m.vocab_size)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def matmul_tiling(N: int, I: int, O: int, dt_bytes: int, transpose_in: bool) -> Counters:
    """Counters of y[N, O] = x[N, I] @ w[I, O] on a 128-row tiling: per 128-token tile, I/128 TensorE
    transposes of x when it arrives token-major (`transpose_in`) with their PSUM->SBUF copies,
    ceil(I/128) x ceil(O/512) matmuls (stationary x^T [128, 128], moving w [128, <= 512]) accumulating
    in PSUM, a PSUM->SBUF copy with the cast, x in and y out once, w loaded once."""
    c = Counters()
    nt, it, ot = _cdiv(N, PMAX), _cdiv(I, PMAX), _cdiv(O, 512)
    for i in range(it):
        ki = min(PMAX, I - i * PMAX)
        for o in range(ot):
            n = min(512, O - o * 512)
            c.pe_instructions += nt
            c.pe_macs_issued += nt * PMAX * PMAX * n
            c.pe_macs_useful += N * ki * n
        if transpose_in:
            c.pe_instructions += nt
            c.pe_macs_issued += nt * PMAX * PMAX * PMAX
            c.scalar_instructions += nt
            c.scalar_elems_issued += nt * PMAX * max(64, PMAX)
            c.scalar_elems_useful += N * ki
    for o in range(ot):
        n = min(512, O - o * 512)
        c.vector_instructions += nt
        c.vector_elems_issued += nt * PMAX * max(64, n)
        c.vector_elems_useful += N * n
    c.dma_transfers = 2 * nt + it
    c.dma_bytes = (N * I + N * O + I * O) * dt_bytes
    return c


def projection_calls(cfg: Config, dt_bytes: int) -> list[tuple[str, Counters, int]]:
    """(label, counters of one call, calls per micro-batch): q/k/v as one fused [D, (H + 2G) K] matmul and
    the output projection, forward (x w) and backward (dx = dy w^T, dw = x^T dy: token-major operands
    already hold the contraction on partitions, so only dy^T is transposed)."""
    m, t = cfg.model, cfg.train
    N, D, L = t.seq_len * t.micro_batch_seqs, m.model_dim, m.num_layers
    QKV, HK = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim, m.num_heads * m.head_dim
    rows = []
    for name, I, O in (("qkv", D, QKV), ("o", HK, D)):
        fwd = matmul_tiling(N, I, O, dt_bytes, transpose_in=True)
        dx = matmul_tiling(N, O, I, dt_bytes, transpose_in=True)  # dy^T transposed, w^T once (negligible)
        dw = matmul_tiling(I, N, O, dt_bytes, transpose_in=False)  # contraction over tokens
        dw.dma_bytes = (N * I + N * O) * dt_bytes + I * O * 4  # x, dy in; fp32 dw out
        rows.append((f"{name} proj fwd [N={N}, {I}->{O}]", fwd, L))
        rows.append((f"{name} proj bwd [N={N}, {I}->{O}]", dx + dw, L))
    return rows


def glue_passes(cfg: Config, dt_bytes: int) -> list[tuple[str, float]]:
    """(what, HBM bytes per micro-batch) of the element-wise work between kernels, forward and backward."""
    m, t = cfg.model, cfg.train
    N, D, L = t.seq_len * t.micro_batch_seqs, m.model_dim, m.num_layers
    x = N * D * dt_bytes
    skips = min(L // 2, L - L // 2)
    H, K = m.num_heads, m.head_dim
    n_params = sum(math.prod(shape) for _, _, shape, _ in param_specs(cfg))
    return [
        # fwd: a*x + b*x0 (2 in, 1 out); bwd: dx, dx0 from dy, x, x0 (3 in, 2 out) + the [2, D] reduction
        ("resid_mix", L * (3 + 5) * x),
        # x + s * f(x) twice per block; bwd: dx passes through, d f = s * dy, ds = sum(dy * f): 2 in, 1 out each
        ("attn/mlp scaled residual adds", L * 2 * (3 + 3) * x),
        ("U-Net skip adds", skips * (3 + 5) * x),
        ("q gain (q * g per head)", L * (2 + 4) * N * H * K * dt_bytes),
        # fp32 parameters read and cast to the compute dtype for the matmuls, once per micro-batch
        ("parameter casts fp32 -> compute dtype", n_params * (4 + dt_bytes)),
        # gradient accumulation over micro-batches: read the fp32 sum and the new gradient, write the sum
        ("gradient accumulation (fp32)", n_params * 3 * 4),
    ]


@dataclasses.dataclass(frozen=True)
class StepTotals:
    counted_s: float  # kernels from count-only emulation
    tiling_s: float  # projections from their tiling
    traffic_s: float  # glue from its HBM traffic
    optimizer_s: float
    optimizer_counted: bool


def whole_step(cfg: Config, t: StepTotals, target: str) -> dict:
    """Step time per core, its counted/estimated shares, MFU and tokens per 30 minutes on one chip."""
    step_s = t.counted_s + t.tiling_s + t.traffic_s + t.optimizer_s
    counted = t.counted_s + (t.optimizer_s if t.optimizer_counted else 0.0)
    flops = model_flops_per_token(cfg) * cfg.train.tokens_per_step
    peak = 2 * cost.target(target).tensor_macs_per_s
    steps = BUDGET_S / step_s
    return {"kernel_s": t.counted_s, "projection_s": t.tiling_s, "glue_s": t.traffic_s,
            "optimizer_s": t.optimizer_s, "step_s": step_s,
            "share_counted": counted / step_s, "share_estimated": 1 - counted / step_s,
            "model_flops_per_step": flops, "peak_flops_per_core": peak, "mfu": flops / (CORES * step_s * peak),
            "steps_per_30min": steps, "tokens_per_30min": steps * cfg.train.tokens_per_step,
            "note": "kernels serial, engines overlapped within a kernel; projections costed from their "
                    "128-row tiling, glue from its HBM passes (estimates); 30 minutes on 2 NeuronCores "
                    "(one trn1 chip; a trn2 chip has 8)"}


def format_whole_step(w: dict, cores: int) -> list[str]:
    return [f"estimated step: {w['step_s'] * 1e3:.1f} ms per core = kernels {w['kernel_s'] * 1e3:.1f} + "
            f"q/k/v/o projections {w['projection_s'] * 1e3:.1f} (tiling) + glue {w['glue_s'] * 1e3:.1f} "
            f"(HBM passes) + optimizer {w['optimizer_s'] * 1e3:.1f} ms",
            f"counted from kernels: {w['share_counted']:.1%} of the step; estimated: {w['share_estimated']:.1%}",
            f"MFU {w['mfu']:.1%} of {w['peak_flops_per_core'] / 1e12:.0f} TFLOP/s x {cores} cores "
            f"({w['model_flops_per_step'] / 1e12:.1f} TFLOP per step); 30 minutes on {cores} cores: "
            f"{w['steps_per_30min']:,.0f} steps = {w['tokens_per_30min'] / 1e9:.2f} B tokens", w["note"]]
