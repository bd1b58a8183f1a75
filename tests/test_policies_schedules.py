"""The schedules both trainers follow (frontier_jax.policies.schedules): the learning-rate multiplier's warmdown
by steps or by the time budget, and Muon's momentum warm-up."""

from __future__ import annotations

import pytest

from frontier_jax.config import OptimConfig, load_config
from frontier_jax.policies import schedules
from helpers import REPO


def test_schedule_values():
    cfg = OptimConfig(warmdown_mode="steps", warmdown_steps=40, muon_momentum_warmup_steps=500)
    assert [schedules.lr_scale(cfg, s, 0.0, 1.0, 100) for s in (0, 59, 60, 80, 99, 100)] == [1.0, 1.0, 1.0, 0.5, 0.025, 1.0]
    cfg = OptimConfig(warmdown_steps=10)  # time mode, 1 s per step: the last 10 s of the budget warm down
    assert schedules.lr_scale(cfg, 95, 95.0, 100.0, 10_000) == pytest.approx(0.5)
    assert schedules.lr_scale(cfg, 80, 80.0, 100.0, 10_000) == 1.0
    assert schedules.lr_scale(OptimConfig(warmdown_steps=0), 5, 99.0, 100.0, 10) == 1.0
    assert [schedules.muon_momentum(OptimConfig(), s) for s in (0, 250, 500, 5000)] == \
        pytest.approx([0.85, 0.90, 0.95, 0.95])


def test_schedule_steps_mode_at_hand_computed_points():
    cfg = OptimConfig(warmdown_steps=20, warmdown_mode="steps")
    f = lambda step: schedules.lr_scale(cfg, step, 0.0, 1.0, 100)
    assert [f(s) for s in (0, 50, 79, 80, 90, 99)] == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.5, 0.05])


def test_schedule_time_mode_at_hand_computed_points():
    cfg = OptimConfig(warmdown_steps=10, warmdown_mode="time")
    # 1 s/step measured, budget 100 s: warmdown spans the last 10 s.
    f = lambda step, elapsed: schedules.lr_scale(cfg, step, elapsed, 100.0, 10_000)
    assert f(50, 50.0) == 1.0 and f(89, 89.0) == 1.0
    assert f(90, 90.0) == pytest.approx(1.0) and f(95, 95.0) == pytest.approx(0.5) and f(100, 100.0) == 0.0
    # 2 s/step: 10 steps are 20 s, so at 85 s (15 s left) the scale is 0.75.
    assert f(40, 85.0) == pytest.approx(15 / (10 * 85 / 40))
    assert schedules.lr_scale(OptimConfig(warmdown_steps=0), 5, 99.0, 100.0, 10) == 1.0


def test_momentum_warmup_endpoints():
    cfg = OptimConfig()
    assert schedules.muon_momentum(cfg, 0) == pytest.approx(0.85)
    assert schedules.muon_momentum(cfg, 250) == pytest.approx(0.90)
    assert schedules.muon_momentum(cfg, 500) == pytest.approx(0.95)
    assert schedules.muon_momentum(cfg, 5000) == pytest.approx(0.95)
    assert schedules.muon_momentum(OptimConfig(muon_momentum_warmup_steps=0), 0) == 0.95


def test_the_records_schedule():
    """configs/record11.py follows the record's schedule (train_gpt.py:1596-1605, 1676-1691): Muon momentum
    (1 - f) 0.92 + f 0.99 with f = min(step / 1500, 1); the wall-clock warmdown of 3500 steps at the measured step
    time (its log: step 7000 at 584,853 ms of 600 s); late QAT once the scale is below 0.15 (its log: step 6662 at
    scale 0.1498); SWA only below 0.2."""
    cfg = load_config(REPO / "configs" / "record11.py").optim
    frac = lambda s: min(s / 1500, 1.0)
    for step in (0, 1, 750, 1499, 1500, 7000):
        assert schedules.muon_momentum(cfg, step) == pytest.approx((1 - frac(step)) * 0.92 + frac(step) * 0.99)
    assert schedules.muon_momentum(cfg, 1) == pytest.approx(0.920046667, abs=1e-9)
    step_ms = 584_853 / 7000
    assert schedules.lr_scale(cfg, 7000, 584.853, 600.0, 9000) == pytest.approx(
        (600_000 - 584_853) / (3500 * step_ms))
    assert schedules.late_qat_due(cfg, 0.1498) and not schedules.late_qat_due(cfg, 0.15)
    assert not schedules.late_qat_due(OptimConfig(), 0.0)  # off by default
    assert (cfg.swa_every, cfg.swa_threshold, cfg.late_qat_threshold) == (50, 0.2, 0.15)
