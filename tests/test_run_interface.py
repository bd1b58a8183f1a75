"""The trainer interface (frontier_jax.trainer): a trainer with only the required methods runs the driver
with the optional capabilities' defaults."""

from __future__ import annotations

import math

from frontier_jax import run_policy as rp
from frontier_jax.config import Config, OptimConfig, TrainConfig
from frontier_jax.trainer import Trainer


class Signals:
    received = None
    stopping = "stopping before training starts; nothing to save"


class Minimal(Trainer):
    """The required methods only; the step that makes handle `nan_at` gives a non-finite loss."""

    def __init__(self, nan_at=None):
        self.signals, self.rows, self.summaries, self.n, self.nan_at = Signals(), [], [], 0, nan_at

    def train_step(self, lr_scale, momentum):
        self.n += 1
        return self.n

    def read_metrics(self, handle):
        return (math.nan if handle == self.nan_at else 1.0 / handle), 1.0

    def eval_sums(self, max_tokens):
        return {"nll_sum_nats": 7.0, "tokens": 10, "bytes": 20}

    def snapshot(self):
        return self.n

    def restore(self, token):
        self.n = token

    def log(self, msg):
        pass

    def metrics(self, **row):
        self.rows.append(row)

    def write_summary(self, summary):
        self.summaries.append(summary)


def _policy(**train):
    cfg = Config(train=TrainConfig(seq_len=8, tokens_per_step=32, micro_batch_seqs=4, val_batch_seqs=4,
                                   budget_seconds=1e9, **train), optim=OptimConfig())
    return rp.Policy.from_config(cfg)


def test_the_defaults_no_checkpoints_no_resume_one_process_no_round_trip():
    t = Minimal()
    assert not t.checkpoints and t.resume() is None and t.agree(True, 2.5) == (True, 2.5)
    assert t.summary_fields() == {} and t.run_hooks() == [] and t.roundtrip(lambda: {}) is None
    s = rp.run_budgeted(_policy(max_steps=3, checkpoint_every_steps=1), t, {"config_name": "t"})
    assert s["stop_reason"] == rp.STOP_MAX_STEPS and s["steps"] == 3 and t.summaries == [s]
    assert t.signals.stopping == "stopping after this step"  # no "checkpoint follows": it has none
    assert "val_bpb" in s and not any(k.startswith("roundtrip") for k in s)
    assert [r["kind"] for r in t.rows] == ["train"] * 3 + ["val"]  # no round-trip validation row


def test_a_diverged_run_without_checkpoints_discards_nothing():
    t = Minimal(nan_at=5)  # the warm-up's steps are undone (restore), so timed step k returns handle k
    s = rp.run_budgeted(_policy(max_steps=10, checkpoint_every_steps=2), t, {"config_name": "t"})
    assert s["stop_reason"] == rp.STOP_NONFINITE and s["steps"] == 5 and rp.exit_code(s["stop_reason"]) == 3
    assert t.rows[-1]["step"] == 5 and math.isnan(t.rows[-1]["loss"]) and "val_bpb" not in s
