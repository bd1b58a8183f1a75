"""The final evaluation pipeline (frontier_jax.run.final) on a fake trainer: the record's order and lines (the
final validation, the artifact's size lines, the round trip at eval.seq_len, the sliding windows at eval.stride,
then score-first test-time training from the artifact's weights), the score the config names, each stage recorded
as it is done, and a resume that runs only the missing stages."""

from __future__ import annotations

import math

import pytest

from frontier_jax.config import (Config, ConfigError, EvalConfig, OptimConfig, TrainConfig, TTTConfig,
                                 apply_overrides)
from frontier_jax.run import driver, roundtrip
from frontier_jax.run.final import FinalPlan
from frontier_jax.run.interface import RunState
from helpers import FakeClock, FakeTrainer


@pytest.fixture
def fake_time(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(driver, "time", clock)
    monkeypatch.setattr(roundtrip, "time", clock)
    return clock


def _policy(ttt=False, **eval_kw):
    cfg = Config(train=TrainConfig(seq_len=8, tokens_per_step=32, micro_batch_seqs=4, compile_warmup_steps=1,
                                   val_batch_seqs=4, max_steps=2, budget_seconds=1000.0),
                 optim=OptimConfig(warmdown_mode="steps"), eval=EvalConfig(**eval_kw),
                 ttt=TTTConfig(enabled=ttt, chunk_tokens=16))
    return driver.Policy.from_config(cfg)


BPB = 7 / math.log(2) / 20  # the fake trainer's sums: 7 nats over 20 bytes
INFO = {"format": "int6_lzma", "artifact": "run/final_model.int6.ptz", "artifact_bytes": 900, "raw_bytes": 3000,
        "code_files": [], "stats": {"int6": 2, "int8": 1, "passthrough": 5, "passthrough_ctrl": 0, "payload_bytes": 2500}}


class Recording(FakeTrainer):
    """A fake trainer with the artifact round trip and the final records (kept in memory, as final_steps.json)."""

    def __init__(self, clock, records=None, interrupt_on=None, info=INFO):
        super().__init__(clock, checkpoints=True, resume=RunState(step=2, tokens=64, train_seconds=2.0) if records
                         else None)
        self.kept, self.log_lines, self.roundtrips, self.interrupt_on = dict(records or {}), [], 0, interrupt_on
        self.info = info
        self.log = self.log_lines.append

    def roundtrip(self, evaluate):
        self.roundtrips += 1
        return {**self.info, **evaluate(dict(self.info))}

    def final_records(self):
        return dict(self.kept)

    def record_final(self, records):
        self.kept = records

    def eval_sums(self, max_tokens, **geometry):
        if geometry.get("stride") and self.interrupt_on == "sliding":
            raise KeyboardInterrupt
        return super().eval_sums(max_tokens, **geometry)

    def ttt_sums(self):
        """A TTT pass: 12 fake seconds, a better score than the other stages (6 nats over 20 bytes)."""
        if self.interrupt_on == "ttt":
            raise KeyboardInterrupt
        self.clock.now += 12.0
        self.evals.append("ttt")
        return {"nll_sum_nats": 6.0, "tokens": 10, "bytes": 20, "estimate_full_val_seconds": 4321.0,
                "hardware": "1 x cpu (cpu)"}


def test_the_record_pipeline_in_order_with_its_lines_and_the_score_it_names(fake_time):
    fake = Recording(fake_time)
    s = driver.run_budgeted(_policy(seq_len=16, stride=4, artifact="int6_lzma", score="sliding"), fake, {})
    # the final validation at train.seq_len, then the round trip at eval.seq_len, then sliding windows at the stride
    assert fake.evals[-3:] == [0, (0, {"seq_len": 16}), (0, {"seq_len": 16, "stride": 4})]
    assert [r["kind"] for r in fake.rows[-3:]] == ["val", "roundtrip", "sliding"] and fake.rows[-3]["final"]
    lines = fake.log_lines
    first = next(i for i, m in enumerate(lines) if m.startswith("DIAGNOSTIC"))
    assert lines[first] == f"DIAGNOSTIC trained val_loss:0.7000 val_bpb:{BPB:.4f} eval_time:10000ms"
    assert lines[first + 1:first + 8] == [
        "Code size: 0 bytes (0 source files this run imported, and its config.json)",
        "Serialized model int6+lzma: 900 bytes", "Total submission size int6+lzma: 900 bytes",
        f"final_int6_roundtrip val_loss:0.7000 val_bpb:{BPB:.4f} eval_time:10000ms",
        f"final_int6_roundtrip_exact val_loss:0.70000000 val_bpb:{BPB:.8f}",
        f"final_int6_sliding_window val_loss:0.7000 val_bpb:{BPB:.4f} stride:4 eval_time:10000ms",
        f"final_int6_sliding_window_exact val_loss:0.70000000 val_bpb:{BPB:.8f}"]
    assert s["score"] == {"line": "final_int6_sliding_window", "val_loss": 0.7, "val_bpb": s["sliding_val_bpb"]}
    assert s["final_complete"] and s["sliding_stride"] == 4 and s["eval_seq_len"] == 16
    assert s["artifact_format"] == "int6_lzma" and s["artifact_tensors"]["int6"] == 2 and s["payload_bytes"] == 2500
    assert set(fake.kept) == {"val", "artifact", "roundtrip", "sliding"}
    assert roundtrip.roundtrip_lines(s) == lines[first + 4:first + 8]  # the entry points' last lines


def test_the_baseline_pipeline_is_unchanged_by_default(fake_time):
    fake = Recording(fake_time, info={**INFO, "format": "int8_zlib", "stats": {"int8_payload_bytes": 2000,
                                                                              "baseline_tensor_bytes": 8000}})
    s = driver.run_budgeted(_policy(), fake, {})
    assert fake.evals[-2:] == [0, 0] and not any(m.startswith(("DIAGNOSTIC", "final_int6")) for m in fake.log_lines)
    assert f"final_int8_zlib_roundtrip_exact val_loss:0.70000000 val_bpb:{BPB:.8f}" in fake.log_lines
    assert s["score"]["line"] == "final_int8_zlib_roundtrip" and "sliding_val_bpb" not in s and s["final_complete"]


def test_a_resume_runs_only_the_missing_stages(fake_time):
    """Stopped during the sliding windows: the final validation, the artifact and the round trip are kept (in the
    summary and the records); the resume runs the sliding windows alone (the artifact is written again)."""
    fake = Recording(fake_time, interrupt_on="sliding")
    fake.signals.interrupt = False
    s = driver.run_budgeted(_policy(stride=4, artifact="int6_lzma"), fake, {})
    assert s["stop_reason"].endswith("during the final validation") and not s["final_complete"]
    assert set(fake.kept) == {"val", "artifact", "roundtrip"} and s["roundtrip_val_bpb"] == s["val_bpb"]
    again = Recording(fake_time, records=fake.kept)
    s2 = driver.run_budgeted(_policy(stride=4, artifact="int6_lzma"), again, {}, finish_only=True)
    assert again.schedule == [] and again.events == ["snapshot", "restore after 0 warm-up steps"]  # no step
    assert again.evals == [(0, {"stride": 4})] and again.roundtrips == 1  # only the sliding windows are scored
    assert s2["final_complete"] and s2["sliding_val_bpb"] == s2["val_bpb"] and s2["stop_reason"] == "max_steps"
    assert any(m.startswith("final steps recorded by an earlier invocation: val, artifact, roundtrip") for m in
               again.log_lines)
    done = Recording(fake_time, records=again.kept)
    s3 = driver.run_budgeted(_policy(stride=4, artifact="int6_lzma"), done, {}, finish_only=True)
    assert done.evals == [] and done.roundtrips == 0 and s3["final_complete"]  # every stage recorded: nothing runs
    assert {k: s3[k] for k in s2 if k.startswith(("val", "roundtrip_val", "sliding_val"))} == \
        {k: s2[k] for k in s2 if k.startswith(("val", "roundtrip_val", "sliding_val"))}


@pytest.mark.parametrize("sets, fragment", [
    (["eval.artifact=int4"], "eval.artifact must be int8_zlib|int6_lzma"),
    (["eval.score=best"], "eval.score must be roundtrip|sliding|ttt"),
    (["eval.score=ttt"], "eval.score='ttt' needs ttt.enabled=True"),
    (["eval.score=sliding"], "needs eval.stride > 0"),
    (["eval.stride=-1"], "eval.stride must be in [0, inf), got -1"),
    (["eval.stride=512"], "eval.stride=512 is longer than the eval window of 256"),
    (["eval.seq_len=128", "eval.stride=200"], "eval.stride=200 is longer than the eval window of 128"),
])
def test_eval_settings_are_checked_in_one_line(sets, fragment):
    from helpers import REPO

    from frontier_jax.config import load_config

    with pytest.raises(ConfigError) as e:
        apply_overrides(load_config(REPO / "configs" / "tiny.py"), sets)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_the_plan_and_the_val_cut_follow_the_eval_section():
    cfg = Config(train=TrainConfig(seq_len=8, tokens_per_step=32), eval=EvalConfig(seq_len=24, stride=4))
    assert (cfg.eval_seq_len, cfg.val_seq_len) == (24, 24) and Config().val_seq_len == Config().train.seq_len
    plan = FinalPlan.from_config(cfg)
    assert plan.geometry() == {"seq_len": 24} and plan.geometry(sliding=True) == {"seq_len": 24, "stride": 4}
    assert FinalPlan.from_config(Config()).geometry() == {} and plan.line("sliding") == "final_int8_zlib_sliding_window"


TTT_BPB = 6 / math.log(2) / 20  # the fake trainer's TTT sums


def test_the_ttt_stage_follows_the_sliding_windows_and_its_legal_ttt_line_is_the_score(fake_time):
    """ttt.enabled: after the sliding windows, `Trainer.ttt_sums` (inside the artifact's round trip: from its
    weights) gives the record's `legal_ttt` lines, its time and full-val estimate in the summary, and the score."""
    fake = Recording(fake_time)
    s = driver.run_budgeted(_policy(ttt=True, stride=4, artifact="int6_lzma", score="ttt"), fake, {})
    assert fake.evals[-3:] == [0, (0, {"stride": 4}), "ttt"] and fake.roundtrips == 1
    assert [r["kind"] for r in fake.rows[-4:]] == ["val", "roundtrip", "sliding", "ttt"]
    ttt_lines = [f"legal_ttt val_loss:0.6000 val_bpb:{TTT_BPB:.4f} eval_time:12000ms",
                 f"legal_ttt_exact val_loss:0.60000000 val_bpb:{TTT_BPB:.8f}"]
    at = fake.log_lines.index(ttt_lines[0])
    assert fake.log_lines[at - 2].startswith("final_int6_sliding_window ") and fake.log_lines[at:at + 2] == ttt_lines
    assert s["score"] == {"line": "legal_ttt", "val_loss": 0.6, "val_bpb": s["ttt_val_bpb"]}
    assert s["ttt_eval_seconds"] == 12.0 and s["ttt_estimate_full_val_seconds"] == 4321.0
    assert s["ttt_hardware"] == "1 x cpu (cpu)" and s["final_complete"]
    assert set(fake.kept) == {"val", "artifact", "roundtrip", "sliding", "ttt"}
    assert roundtrip.roundtrip_lines(s)[-2:] == ttt_lines
    from frontier_jax.run.rundir import summary_rows

    rows = dict(summary_rows({**s, "submission_bytes": 900, "code_bytes": 0}))
    assert rows["TTT val bpb"].startswith(f"{TTT_BPB:.4f} (score-first test-time training from the int6+lzma "
                                          "artifact: the score under the rules profile")
    assert rows["TTT val bpb"].endswith("a full val split pass: about 4321 s on 1 x cpu (cpu))")
    assert "the score" not in rows["sliding val bpb"]


def test_a_run_stopped_during_ttt_resumes_with_the_ttt_stage_alone(fake_time):
    fake = Recording(fake_time, interrupt_on="ttt")
    fake.signals.interrupt = False
    policy = _policy(ttt=True, stride=4, artifact="int6_lzma", score="ttt")
    s = driver.run_budgeted(policy, fake, {})
    assert not s["final_complete"] and "score" not in s
    assert set(fake.kept) == {"val", "artifact", "roundtrip", "sliding"}
    again = Recording(fake_time, records=fake.kept)
    s2 = driver.run_budgeted(policy, again, {}, finish_only=True)
    assert again.evals == ["ttt"] and s2["final_complete"] and s2["score"]["line"] == "legal_ttt"
    assert s2["sliding_val_bpb"] == s["sliding_val_bpb"] and s2["ttt_estimate_full_val_seconds"] == 4321.0
