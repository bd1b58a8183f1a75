"""The trainer interface (frontier_jax.run.interface): a trainer with only the required methods
(tests/helpers.FakeTrainer as it comes) runs the driver with the optional capabilities' defaults."""

from __future__ import annotations

import math

from frontier_jax.run import driver, endings
from frontier_jax.config import Config, OptimConfig, TrainConfig
from frontier_jax.run.interface import Trainer
from helpers import FakeTrainer


def _policy(**train):
    cfg = Config(train=TrainConfig(seq_len=8, tokens_per_step=32, micro_batch_seqs=4, val_batch_seqs=4,
                                   budget_seconds=1e9, **train), optim=OptimConfig())
    return driver.Policy.from_config(cfg)


def test_the_defaults_no_checkpoints_no_resume_one_process_no_round_trip():
    optional = ("checkpoints", "resume", "save", "discard", "agree", "summary_fields", "roundtrip", "run_hooks")
    assert all(getattr(FakeTrainer, m) is getattr(Trainer, m) for m in optional)  # the interface's, not its own
    t = FakeTrainer()
    assert not t.checkpoints and t.resume() is None and t.agree(True, 2.5) == (True, 2.5)
    assert t.summary_fields() == {} and t.run_hooks() == [] and t.roundtrip(lambda: {}) is None
    s = driver.run_budgeted(_policy(max_steps=3, checkpoint_every_steps=1), t, {"config_name": "t"})
    assert s["stop_reason"] == endings.STOP_MAX_STEPS and s["steps"] == 3 and t.summaries == [s]
    assert t.signals.stopping == "stopping after this step"  # no "checkpoint follows": it has none
    assert "val_bpb" in s and not any(k.startswith("roundtrip") for k in s)
    assert [r["kind"] for r in t.rows] == ["train"] * 3 + ["val"]  # no round-trip validation row


def test_a_diverged_run_without_checkpoints_discards_nothing():
    t = FakeTrainer(nan_at={5})  # the warm-up's steps are undone (restore), so timed step k returns handle k
    s = driver.run_budgeted(_policy(max_steps=10, checkpoint_every_steps=2), t, {"config_name": "t"})
    assert s["stop_reason"] == endings.STOP_NONFINITE and s["steps"] == 5 and endings.exit_code(s["stop_reason"]) == 3
    assert t.rows[-1]["step"] == 5 and math.isnan(t.rows[-1]["loss"]) and "val_bpb" not in s
