"""The schedules both trainers follow, as plain functions of the optimizer config and the run's clock:
the learning-rate multiplier (constant, then a linear warmdown by steps or by the remaining time budget),
Muon's momentum warm-up and late QAT's switch. The driver (`frontier_jax.run.driver`) computes them before every
step and hands them to the trainer's step as runtime scalars (`frontier_jax.optim`: optax's extra args, or the fused
kernels' operands), so a schedule never recompiles. No JAX."""

from __future__ import annotations

from frontier_jax.config import OptimConfig

def muon_momentum(cfg: OptimConfig, step: int) -> float:
    """Linear warm-up of Muon's momentum from warmup_start to momentum over warmup_steps."""
    if cfg.muon_momentum_warmup_steps <= 0:
        return cfg.muon_momentum
    frac = min(step / cfg.muon_momentum_warmup_steps, 1.0)
    return (1 - frac) * cfg.muon_momentum_warmup_start + frac * cfg.muon_momentum


def lr_scale(cfg: OptimConfig, step: int, elapsed_s: float, budget_s: float, max_steps: int) -> float:
    """Constant, then linear warmdown to 0 over the last `warmdown_steps` steps (baseline lr_mul).

    time mode: the warmdown length in seconds is warmdown_steps times the measured mean step time,
    and it starts when the remaining budget drops below that. steps mode: by step count.
    """
    w = cfg.warmdown_steps
    if w <= 0:
        return 1.0
    if cfg.warmdown_mode == "steps":
        start = max(max_steps - w, 0)
        return max((max_steps - step) / max(w, 1), 0.0) if start <= step < max_steps else 1.0
    step_s = elapsed_s / max(step, 1)
    warmdown_s = w * step_s
    remaining_s = max(budget_s - elapsed_s, 0.0)
    return remaining_s / max(warmdown_s, 1e-9) if remaining_s <= warmdown_s else 1.0


def late_qat_due(cfg: OptimConfig, lr_scale: float) -> bool:
    """Whether late QAT switches on before a step of this lr scale (the record's train_gpt.py:1676-1678: when the
    scale is below optim.late_qat_threshold > 0; the driver keeps it on from then on)."""
    return cfg.late_qat_threshold > 0 and lr_scale < cfg.late_qat_threshold
