"""The driver both trainers call (frontier_jax.run.driver): the cadences, the order of events on a fake trainer
(tests/helpers.FakeTrainer) with a fake clock, the summary and exit codes; the run room loads no JAX."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from frontier_jax.config import Config, OptimConfig, TrainConfig
from frontier_jax.errors import EXIT_INTERRUPTED, BadInput
from frontier_jax.policies import scoring
from frontier_jax.run import driver, endings, roundtrip
from frontier_jax.run.final import FinalPlan
from frontier_jax.run.interface import RunHook, RunState
from helpers import REPO, FakeClock, FakeTrainer


def test_the_run_room_and_the_policies_load_no_jax():
    mods = [p.stem for p in (REPO / "frontier_jax" / "run").glob("*.py") if p.stem != "__init__"]
    policies = ("dtypes", "geometry", "groups", "schedules", "scoring")
    names = [f"frontier_jax.policies.{m}" for m in policies] + [f"frontier_jax.run.{m}" for m in mods]
    code = (f"import sys, {', '.join(names)}; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax', 'optax', 'orbax')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


# ----------------------------------------------------------------------------- pure rules


def test_cadences():
    assert [s for s in range(13) if driver.val_due(s, 0, 4)] == [4, 8, 12]
    assert [s for s in range(13) if driver.val_due(s, 8, 4)] == [12]  # never at an invocation's first step
    assert not any(driver.val_due(s, 0, 0) for s in range(13))
    assert [s for s in range(1, 8) if driver.checkpoint_due(s, 3)] == [3, 6]
    assert not any(driver.checkpoint_due(s, 0) for s in range(8))


# ----------------------------------------------------------------------------- the driver, on a fake trainer


@pytest.fixture(autouse=True)
def fake_time(monkeypatch):
    """The driver's clock (driver.time) replaced by one the fake trainer advances."""
    clock = FakeClock()
    monkeypatch.setattr(driver, "time", clock)
    return clock


class Recorder(RunHook):
    def __init__(self, events):
        self.events = events

    def on_start(self, state):
        self.events.append(f"start at {state.step}")

    def before_step(self, state):
        self.events.append(f"before {state.step + 1}")

    def after_step(self, state, row):
        self.events.append(f"after {row['step']}")

    def on_end(self, state):
        self.events.append(f"end {state.stop_reason}")

    def close(self):
        self.events.append("close")


def policy(**kw):
    t = dict(seq_len=8, tokens_per_step=32, micro_batch_seqs=4, compile_warmup_steps=2, val_batch_seqs=4,
             max_steps=6, budget_seconds=1000.0)
    t.update({k: v for k, v in kw.items() if k in TrainConfig.__dataclass_fields__})
    cfg = Config(train=TrainConfig(**t), optim=OptimConfig(warmdown_steps=2, warmdown_mode="steps",
                                                                    muon_momentum_warmup_steps=4))
    return driver.Policy.from_config(cfg, stop_after_steps=kw.get("stop_after_steps"))


BASE = {"config_name": "t", "matmul_peak_flops": 1000.0, "flops_per_token": 10.0}


def test_driver_order_of_events_to_max_steps(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True)
    hooks = fake.hooks()
    hooks.add_hook(Recorder(fake.events))
    s = driver.run_budgeted(policy(), hooks, BASE)
    # warm-up: 2 steps at lr 1 and the momentum of steps 0 and 1, one eval of a val batch, then reset
    assert fake.schedule[:2] == [(1.0, 0.85), (1.0, pytest.approx(0.85 + 0.1 / 4))] and fake.evals[0] == 4 * 8
    assert fake.events[:2] == ["snapshot", "restore after 2 warm-up steps"]
    # step 1's metrics are read at the next iteration's start, before its stop check and step 2
    assert fake.events[2:6] == ["start at 0", "before 1", "after 1", "before 2"]
    assert fake.events[-3:] == ["after 6", "end max_steps", "close"]
    assert fake.summaries == [s] and fake.signals.stopping == "stopping after this step; checkpoint follows"
    assert s["stop_reason"] == "max_steps" and s["steps"] == 6 and s["tokens"] == 6 * 32
    assert s["train_seconds"] == pytest.approx(6.0)  # warm-up and final evaluation not counted
    assert s["tokens_per_second"] == pytest.approx(32.0) and s["mfu"] == pytest.approx(32.0 * 10 / 1000)
    assert s["final_train_loss"] == pytest.approx(1 / 7) and s["val_bpb"] == pytest.approx(7 / math.log(2) / 20)
    assert fake.saves == [(6, "final")]
    train = [r for r in fake.rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert [r["lr_scale"] for r in train] == [1.0, 1.0, 1.0, 1.0, 1.0, 0.5]  # steps warmdown over the last 2
    assert fake.rows[-1] == dict(kind="val", step=6, tokens=192, train_seconds=6.0, loss=0.7,
                                 bpb=pytest.approx(7 / math.log(2) / 20), val_tokens=10, final=True)


def test_train_rows_carry_the_steps_own_rate_and_the_load_average(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True, step_s=2.0)
    driver.run_budgeted(policy(max_steps=3), fake.hooks(), BASE)
    train = [r for r in fake.rows if r["kind"] == "train"]
    assert [r["tokens_per_second"] for r in train] == [pytest.approx(16.0)] * 3  # 32 tokens per 2 s step
    assert all(isinstance(r["loadavg_1m"], float) and r["loadavg_1m"] >= 0 for r in train)


def test_the_round_trip_runs_after_the_final_validation_and_fills_the_summary(fake_time, monkeypatch):
    """Trainer.roundtrip gets an `evaluate` that scores with the trainer's own eval_sums (the full split); its
    artifact fields and the official lines follow; a failure is reported and the run still ends with a summary."""
    fake, log, order = FakeTrainer(fake_time, checkpoints=True), [], []
    monkeypatch.setattr(roundtrip, "time", fake_time)  # the round trip's eval timer too

    def fake_roundtrip(evaluate):
        order.append(("roundtrip", list(fake.evals)))
        v = evaluate()
        return {**v, "artifact": "run/final_model.int8.ptz", "artifact_bytes": 1000, "raw_bytes": 3000,
                "stats": {"int8_payload_bytes": 2000, "baseline_tensor_bytes": 8000}, "code_files": []}

    s = driver.run_budgeted(policy(max_steps=2), fake.hooks(roundtrip=fake_roundtrip, log=log.append), BASE)
    assert order == [("roundtrip", [4 * 8, 0])]  # after the warm-up's and the final validation
    assert fake.evals[-1] == 0 and fake.rows[-1]["kind"] == "roundtrip" and fake.rows[-2].get("final")
    assert s["roundtrip_val_bpb"] == s["val_bpb"] and s["artifact_bytes"] == 1000
    assert s["submission_bytes"] == 1000 + s["code_bytes"] and s["roundtrip_eval_seconds"] == pytest.approx(10.0)
    assert "Serialized model int8+zlib: 1000 bytes (payload:2000 raw_torch:3000 payload_ratio:4.00x)" in log
    assert log[log.index(next(m for m in log if m.startswith("final_int8_zlib_roundtrip "))) + 1] == \
        f"final_int8_zlib_roundtrip_exact val_loss:0.70000000 val_bpb:{s['roundtrip_val_bpb']:.8f}"
    assert fake.summaries == [s]

    # the run's rules profile: every score line ends with it, a failing size rule named (frontier_jax.contest)
    for profile, cap_fails in (("trainium-frontier", False), ("parameter-golf", True)):
        fake, log = FakeTrainer(fake_time, checkpoints=True), []
        big = lambda evaluate: {**fake_roundtrip(evaluate), "artifact_bytes": 16_000_001 if cap_fails else 1000}
        s = driver.run_budgeted(policy(max_steps=2), fake.hooks(roundtrip=big, log=log.append),
                                {**BASE, "rules_profile": profile})
        tag = f" rules:{profile}" + ("(fails:size)" if cap_fails else "")
        assert s["rules_profile"] == profile and s["rules_tag"] == tag
        assert [m for m in log if m.startswith("final_int8_zlib_roundtrip")] and all(
            m.endswith(tag) for m in log if m.startswith("final_int8_zlib_roundtrip"))
        assert s["rules_at_end"] == {"size": "fail" if cap_fails else "not checkable"}

    def broken(evaluate):
        raise OSError(28, "No space left on device", "run/.final_model.int8.ptz.tmp")

    fake, log = FakeTrainer(fake_time, checkpoints=True), []
    s = driver.run_budgeted(policy(max_steps=2), fake.hooks(roundtrip=broken, log=log.append), BASE)
    assert "disk full" in s["roundtrip_error"] and "roundtrip_val_bpb" not in s and fake.summaries == [s]
    assert any(m.startswith("int8+zlib round trip failed: run/.final_model.int8.ptz.tmp: disk full") for m in log)


def test_budget_stop_pauses_the_clock_for_validation_and_checkpoints(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True)
    s = driver.run_budgeted(policy(budget_seconds=4.5, max_steps=100, val_every_steps=2, val_max_tokens=64,
                               checkpoint_every_steps=3), fake.hooks(), BASE)
    assert s["stop_reason"] == "budget" and s["steps"] == 5  # 5 steps of 1 s: elapsed 5 >= 4.5
    assert s["train_seconds"] == pytest.approx(5.0)
    vals = [r for r in fake.rows if r["kind"] == "val"]
    assert [(r["step"], r.get("final", False)) for r in vals] == [(2, False), (4, False), (5, True)]
    assert fake.evals[1:] == [64, 64, 0]  # periodic on val_max_tokens, the final on everything
    assert fake.saves == [(3, "periodic"), (5, "final")]


def test_a_failed_save_stops_the_run_writes_the_summary_and_is_raised(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True)

    def save(state, reason):
        if state.step == 4:
            raise BadInput("run/checkpoints/4: disk full")
        fake.saves.append((state.step, reason))

    hooks = fake.hooks()
    hooks.save = save
    with pytest.raises(BadInput, match="disk full"):
        driver.run_budgeted(policy(max_steps=10, checkpoint_every_steps=2), hooks, BASE)
    [s] = fake.summaries
    assert s["stop_reason"] == endings.STOP_SAVE_FAILED and s["steps"] == 4 and "disk full" in s["error"]
    assert fake.saves == [(2, "periodic")] and "val_bpb" not in s  # no final save, no final validation
    fake = FakeTrainer(fake_time, checkpoints=True)
    hooks = fake.hooks()
    hooks.save = lambda state, reason: (_ for _ in ()).throw(BadInput("disk full"))
    with pytest.raises(BadInput):
        driver.run_budgeted(policy(max_steps=3), hooks, BASE)  # the final save
    assert fake.summaries[0]["stop_reason"] == endings.STOP_SAVE_FAILED


def test_non_finite_loss_stops_without_saving_the_diverged_step(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True, nan_at={3})
    s = driver.run_budgeted(policy(checkpoint_every_steps=3, max_steps=10), fake.hooks(), BASE)
    assert s["stop_reason"] == endings.STOP_NONFINITE and s["steps"] == 3 and math.isnan(s["final_train_loss"])
    assert fake.saves == [] and "val_bpb" not in s
    assert not [r for r in fake.rows if r["kind"] == "val"]
    fake = FakeTrainer(fake_time, checkpoints=True, nan_at={4})  # dispatched ahead: noticed at the next iteration's start
    s = driver.run_budgeted(policy(max_steps=10), fake.hooks(), BASE)
    assert s["stop_reason"] == endings.STOP_NONFINITE and s["steps"] == 4 and fake.trained == 4 and fake.saves == []
    assert endings.exit_code(s["stop_reason"]) == 3
    # a periodic checkpoint of the step before holds the parameters that gave the non-finite loss
    fake = FakeTrainer(fake_time, checkpoints=True, nan_at={5})
    s = driver.run_budgeted(policy(max_steps=10, checkpoint_every_steps=2), fake.hooks(), BASE)
    assert fake.saves == [(2, "periodic"), (4, "periodic")] and fake.discarded == [4]
    fake = FakeTrainer(fake_time, checkpoints=True, nan_at={5}, resume=RunState(step=4, tokens=128, train_seconds=4.0))
    driver.run_budgeted(policy(max_steps=10, checkpoint_every_steps=2), fake.hooks(), BASE)
    assert fake.discarded == []  # the checkpoint it resumed from was not written by this invocation


def test_signal_stops_with_an_interrupted_checkpoint_and_no_final_validation(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True, signal_at=2 + 3)  # 2 warm-up steps, then 3 real ones
    s = driver.run_budgeted(policy(max_steps=10), fake.hooks(), BASE)
    assert s["stop_reason"] == "signal SIGTERM" and s["steps"] == 3 and fake.saves == [(3, "interrupted")]
    assert "val_bpb" not in s and endings.exit_code(s["stop_reason"]) == 130
    fake = FakeTrainer(fake_time, checkpoints=True)
    s = driver.run_budgeted(policy(max_steps=10, stop_after_steps=2), fake.hooks(), BASE)
    assert s["stop_reason"] == "signal stop requested" and s["steps"] == 2 and fake.saves == [(2, "interrupted")]


def test_signal_during_warm_up_stops_before_anything_is_trained(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True, signal_at=1)
    hooks = fake.hooks()
    hooks.add_hook(Recorder(fake.events))
    with pytest.raises(endings.InterruptedBeforeTraining) as e:
        driver.run_budgeted(policy(), hooks, BASE)
    assert e.value.reason == "signal SIGTERM before training" and isinstance(e.value, KeyboardInterrupt)
    assert fake.trained == 1 and fake.saves == [] and fake.rows == [] and fake.summaries == []
    assert fake.events == ["snapshot"]  # no hook started, none closed
    assert fake.signals.stopping.startswith("stopping before training")


def test_the_warm_up_compiles_the_programs_of_every_eval_window_the_run_uses(fake_time):
    """After the warm-up's steps and evaluation, before the reset: the trainer's `warm_up_programs` with the
    eval geometries of the validations and the final pipeline (the round trip at eval.seq_len, the sliding
    windows), the count it returns in the warm-up's last line (none where it counts none); a signal there
    stops before anything is trained."""
    asked, logged = [], []
    fake = FakeTrainer(fake_time, checkpoints=True)

    def programs(evals, check):
        asked.append(evals)
        fake.events.append("programs")
        return 7

    plan = dataclasses.replace(policy(), final=FinalPlan(seq_len=16, stride=4))
    driver.run_budgeted(plan, fake.hooks(warm_up_programs=programs, log=logged.append), BASE)
    assert asked == [[{}, {"seq_len": 16}, {"seq_len": 16, "stride": 4}]]
    assert fake.events[:3] == ["snapshot", "programs", "restore after 2 warm-up steps"]
    assert [line for line in logged if line.startswith("compile warm-up: 7 programs, ")]
    plain, logged = FakeTrainer(fake_time), []
    driver.run_budgeted(policy(), plain.hooks(log=logged.append), BASE)
    last = [line for line in logged if line.startswith("compile warm-up: ") and line.endswith("(untimed; state reset)")]
    assert last and "programs" not in last[0]

    fake = FakeTrainer(fake_time, checkpoints=True)

    def signalled(evals, check):
        fake.signals.received = "SIGTERM"
        check()  # the trainer checks after each program: a signal stops the warm-up there
        raise AssertionError("check() returned after a signal")

    with pytest.raises(endings.InterruptedBeforeTraining):
        driver.run_budgeted(policy(), fake.hooks(warm_up_programs=signalled), BASE)
    assert fake.trained == 2 and fake.saves == [] and fake.rows == [] and fake.events == ["snapshot"]


def test_resume_continues_counts_and_schedule_and_does_not_resave_its_step(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True, resume=RunState(step=4, tokens=128, train_seconds=40.0))
    s = driver.run_budgeted(policy(max_steps=6, val_every_steps=2), fake.hooks(), BASE)
    assert s["steps"] == 6 and s["tokens"] == 192 and s["train_seconds"] == pytest.approx(42.0)
    assert fake.schedule[2:] == [(1.0, 0.95), (0.5, 0.95)]  # momentum warm-up done, last warmdown step
    assert [r["step"] for r in fake.rows if r["kind"] == "val"] == [6]  # not at the resumed step 4
    fake = FakeTrainer(fake_time, checkpoints=True, resume=RunState(step=6, tokens=192, train_seconds=6.0))
    s = driver.run_budgeted(policy(max_steps=6), fake.hooks(), BASE)  # a finished run resumed: nothing to train
    assert s["steps"] == 6 and s["stop_reason"] == "max_steps" and fake.trained == 6
    fake = FakeTrainer(fake_time, checkpoints=True)
    s = driver.run_budgeted(policy(max_steps=6, checkpoint_every_steps=3), fake.hooks(), BASE)
    # the final save of a step already saved is asked for too: it is the trainer's no-op
    assert fake.saves == [(3, "periodic"), (6, "periodic"), (6, "final")]


def test_agree_takes_the_clock_and_stop_of_process_zero(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True)
    warm, timed = [], []

    class Started(RunHook):
        def on_start(self, state):
            warm.extend(timed)
            timed.clear()

    def agree(local_stop, elapsed):
        timed.append((local_stop, elapsed))
        return len(timed) == 3 and warm != [], 100.0 * len(timed)  # "process 0": stop at the third check

    hooks = fake.hooks(agree=agree)
    hooks.add_hook(Started())
    s = driver.run_budgeted(policy(max_steps=10, budget_seconds=1e9), hooks, BASE)
    assert warm == [(False, 0.0)] * 4  # after each of the 2 warm-up steps, the eval compile and the other programs
    assert s["stop_reason"] == "signal stop requested" and s["steps"] == 2
    assert [r["lr_scale"] for r in fake.rows if r["kind"] == "train"] == [1.0, 1.0]
    assert all(not local for local, _ in timed)


def test_hooks_are_closed_on_an_exception(fake_time):
    fake = FakeTrainer(fake_time, checkpoints=True)
    hooks = fake.hooks()
    hooks.add_hook(Recorder(fake.events))

    def broken(max_tokens):
        if fake.trained > 3:
            raise RuntimeError("eval failed")
        return {"nll_sum_nats": 1.0, "tokens": 1, "bytes": 1}

    hooks.eval_sums = broken
    with pytest.raises(RuntimeError):
        driver.run_budgeted(policy(max_steps=6), hooks, BASE)
    assert fake.events[-1] == "close"


def test_policy_from_config_keeps_one_warm_up_step_at_least():
    p = driver.Policy.from_config(Config(train=TrainConfig(compile_warmup_steps=0, val_batch_seqs=2, seq_len=16,
                                                       tokens_per_step=64)))
    assert p.warmup_steps == 1 and p.warmup_val_tokens == 32 and p.stop_after_steps is None


def test_bpb_from_sums():
    assert scoring.bpb(8 * math.log(2.0), 4) == 2.0  # 8 bits over 4 bytes
    with pytest.raises(BadInput, match="0 scored bytes"):  # no bytes: no score (never a division by max(0, 1))
        scoring.bpb(0.0, 0)


def test_a_signal_in_the_final_validation_stops_it_with_the_checkpoint_saved(fake_time):
    """Round 3: Ctrl-C during the final validation promised a checkpoint and did not stop. With the
    final checkpoint saved, a signal there ends the evaluation at once: no val_bpb, an interrupted stop."""
    fake = FakeTrainer(fake_time, checkpoints=True)
    fake.signals.interrupt = False

    def eval_sums(max_tokens):
        if max_tokens == 0:  # the final validation: a signal arrives (the handler raises, see rundir.Signals)
            assert fake.signals.interrupt and "final validation" in fake.signals.stopping
            fake.signals.received = "SIGINT"
            raise KeyboardInterrupt
        return FakeTrainer.eval_sums(fake, max_tokens)

    fake.eval_sums = eval_sums
    s = driver.run_budgeted(policy(), fake.hooks(), BASE)
    assert s["stop_reason"] == "signal SIGINT during the final validation" and "val_bpb" not in s
    assert fake.saves == [(6, "final")] and fake.summaries == [s] and not fake.signals.interrupt
    assert endings.exit_code(s["stop_reason"]) == EXIT_INTERRUPTED


def test_a_full_disk_outside_a_checkpoint_names_the_file_and_writes_the_summary(fake_time):
    """Round 3: a write in the loop (metrics.jsonl) on a full disk named no file and wrote no summary."""
    import errno

    fake = FakeTrainer(fake_time, checkpoints=True)
    hooks = fake.hooks()

    def metrics(**row):
        if row.get("step") == 3:
            raise OSError(errno.ENOSPC, "No space left on device", "/run/metrics.jsonl")
        fake.rows.append(row)

    hooks.metrics = metrics
    with pytest.raises(BadInput, match=r"^/run/metrics.jsonl: disk full \(ENOSPC\)$"):
        driver.run_budgeted(policy(), hooks, BASE)
    assert len(fake.summaries) == 1 and fake.summaries[0]["stop_reason"] == endings.STOP_WRITE_FAILED
    assert "disk full" in fake.summaries[0]["error"] and fake.saves == [(3, "final")]

