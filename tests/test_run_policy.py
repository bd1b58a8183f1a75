"""The shared run policy: stop order, cadences, schedules (equal to the JAX optimizer's), the driver's
order of events on a fake trainer with a fake clock, the summary and exit codes; it loads no JAX."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from conftest import REPO
from frontier_jax import policies, quantize
from frontier_jax import run_policy as rp
from frontier_jax.trainer import RunHook, RunState, Trainer
from frontier_jax.config import Config, ConfigError, ModelConfig, OptimConfig, TrainConfig
from frontier_jax.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK, BadInput


def test_the_policy_modules_load_no_jax():
    code = ("import sys, frontier_jax.run_policy, frontier_jax.rundir, frontier_jax.startup, frontier_jax.resolve; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax', 'optax', 'orbax')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


# ----------------------------------------------------------------------------- pure rules


def test_stop_order_signal_then_max_steps_then_budget():
    assert rp.decide_stop("SIGTERM", 10, 10, 99.0, 5.0) == "signal SIGTERM"
    assert rp.decide_stop(rp.STOP_REQUESTED, 0, 10, 0.0, 5.0) == "signal stop requested"
    assert rp.decide_stop(None, 10, 10, 99.0, 5.0) == rp.STOP_MAX_STEPS
    assert rp.decide_stop(None, 9, 10, 5.0, 5.0) == rp.STOP_BUDGET
    assert rp.decide_stop(None, 9, 10, 4.99, 5.0) is None


def test_cadences():
    assert [s for s in range(13) if rp.val_due(s, 0, 4)] == [4, 8, 12]
    assert [s for s in range(13) if rp.val_due(s, 8, 4)] == [12]  # never at an invocation's first step
    assert not any(rp.val_due(s, 0, 0) for s in range(13))
    assert [s for s in range(1, 8) if rp.checkpoint_due(s, 3)] == [3, 6]
    assert not any(rp.checkpoint_due(s, 0) for s in range(8))


def test_exit_codes():
    assert rp.exit_code(rp.STOP_NONFINITE) == EXIT_DIVERGED == 3
    assert rp.exit_code("signal SIGINT") == EXIT_INTERRUPTED == 130
    assert rp.exit_code(rp.STOP_BUDGET) == rp.exit_code(rp.STOP_MAX_STEPS) == EXIT_OK == 0


def test_every_stop_reason_maps_to_its_ending_through_the_one_table():
    """Exit status and the entry points' last line (a trainer with checkpoints / one with weights only)."""
    cases = {  # stop reason, resumed -> (table row, exit code)
        (rp.STOP_BUDGET, False): ("done", 0), (rp.STOP_MAX_STEPS, True): ("done", 0),
        (rp.STOP_FINISHED, True): ("already finished", 0), (rp.STOP_NONFINITE, False): ("diverged", 3),
        ("signal SIGINT before training", False): ("interrupted before training", 130),
        ("signal SIGINT before training", True): ("interrupted before training a resume", 130),
        ("signal SIGTERM during the final validation", False): ("interrupted in the final validation", 130),
        (rp.signal_reason(None), False): ("interrupted", 130), ("signal SIGHUP", True): ("interrupted", 130)}
    for (reason, resumed), (row, code) in cases.items():
        end = rp.ending(reason, resumed)
        assert end is rp.ENDINGS[row] and end.exit_code == code == rp.exit_code(reason), reason
    assert set(rp.ENDINGS) == {row for row, _ in cases.values()}  # every row is reachable
    summary = {"steps": 7, "checkpoint_step": 6, "note": "runs/x: already finished at step 9"}
    line = lambda reason, resumed, ckpt: rp.ending(reason, resumed).line(summary, "runs/x", ckpt)
    assert line(rp.STOP_BUDGET, False, True) is None and line(rp.STOP_NONFINITE, False, False) is None
    assert line(rp.STOP_FINISHED, True, True) == summary["note"] and not rp.ENDINGS["already finished"].results
    assert line("signal SIGINT", False, True) == ("interrupted: checkpoint step 6 saved; continue with: "
                                                  "python -m frontier_jax.train --resume runs/x")
    assert line("signal SIGINT", False, False) == line("signal SIGINT during the final validation", False, False) == \
        "interrupted after 7 steps; weights in runs/x/weights.npz (the torch baseline has no resume)"
    assert line("signal SIGINT during the final validation", False, True).endswith(
        "checkpoint step 6 saved; score it with: python -m frontier_jax.evaluate --run runs/x")
    assert line("signal SIGINT before training", True, True).endswith("train --resume runs/x")
    assert line("signal SIGINT before training", False, True).endswith("nothing trained, no checkpoint written")
    assert line("signal SIGINT before training", True, False).endswith("nothing trained, nothing written")


def test_the_jax_modules_use_these_rules_written_once():
    """optim and model take the schedules, groups and dtype names from here (one
    implementation); the JAX dtype resolvers give the same names as the policy on every platform."""
    from frontier_jax import model, optim  # the JAX side (this module itself loads no JAX)
    assert optim.label_for is policies.param_label
    for setting in ("auto", "float32", "bfloat16"):
        for platform in ("cpu", "gpu", "neuron"):
            assert policies.compute_dtype_name(ModelConfig(compute_dtype=setting), platform) == \
                str(model.resolve_compute_dtype(ModelConfig(compute_dtype=setting), platform))
            oc = OptimConfig(muon_ns_dtype=setting)
            assert policies.ns_dtype_name(oc, platform) == optim.resolve_ns_dtype(oc, platform)


def test_schedule_values():
    cfg = OptimConfig(warmdown_mode="steps", warmdown_steps=40, muon_momentum_warmup_steps=500)
    assert [rp.lr_scale(cfg, s, 0.0, 1.0, 100) for s in (0, 59, 60, 80, 99, 100)] == [1.0, 1.0, 1.0, 0.5, 0.025, 1.0]
    cfg = OptimConfig(warmdown_steps=10)  # time mode, 1 s per step: the last 10 s of the budget warm down
    assert rp.lr_scale(cfg, 95, 95.0, 100.0, 10_000) == pytest.approx(0.5)
    assert rp.lr_scale(cfg, 80, 80.0, 100.0, 10_000) == 1.0
    assert rp.lr_scale(OptimConfig(warmdown_steps=0), 5, 99.0, 100.0, 10) == 1.0
    assert [rp.muon_momentum(OptimConfig(), s) for s in (0, 250, 500, 5000)] == \
        pytest.approx([0.85, 0.90, 0.95, 0.95])


def test_groups_geometry_and_flops():
    for names, ndim, label in ((["tok_emb"], 2, "embed"), (["ngram_bias"], 2, "ngram"),
                               (["blocks", "0", "attn", "c_q"], 2, "muon"), (["blocks", "0", "resid_mix"], 2, "scalar"),
                               (["blocks", "0", "attn", "q_gain"], 1, "scalar"), (["skip_weights"], 2, "scalar"),
                               (["blocks", "1", "mlp", "fc"], 1, "scalar")):
        assert policies.param_label(names, ndim) == label
    assert [rp.split_batch(*a) for a in ((64, 64, 1), (512, 64, 1), (512, 64, 2), (512, 64, 32), (8, 4, 4))] == \
        [(64, 1), (64, 8), (128, 4), (512, 1), (8, 1)]
    for args in ((8, 4, 3), (12, 8, 1)):
        with pytest.raises(ConfigError):
            rp.split_batch(*args)
    mc = ModelConfig(vocab_size=100, num_layers=1, model_dim=8, num_heads=2, num_kv_heads=1, mlp_mult=2)
    # head dim 4; per layer q, k+v, o, MLP: 2 * (8*2*4 + 2*8*1*4 + 2*4*8 + 2*8*16) = 896; attention
    # 2*2*2*4*(T/2) = 64 at T = 4; head 2*8*100 = 1600; forward + backward = 3x
    assert mc.flops_per_token(4) == 3.0 * (896 + 64 + 1600)


def test_val_result_and_windows():
    import numpy as np

    v = rp.val_result({"nll_sum_nats": 2 * math.log(2.0) * 10, "tokens": 4, "bytes": 10})
    assert v["bpb"] == pytest.approx(2.0) and v["loss"] == pytest.approx(5 * math.log(2.0))
    toks = np.arange(1000)
    assert rp.val_window_tokens(toks, 0, 64).size == (999 // 64) * 64 + 1
    assert rp.val_window_tokens(toks, 200, 64).size == 3 * 64 + 1  # at most 200 targets, whole windows


# ----------------------------------------------------------------------------- the driver, on a fake trainer


class Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


@pytest.fixture(autouse=True)
def fake_time(monkeypatch):
    """The driver's clock (run_policy.time) replaced by one the fake trainer advances."""
    clock = Clock()
    monkeypatch.setattr(rp, "time", clock)
    return clock


class FakeSignals:
    def __init__(self):
        self.received = None
        self.stopping = "stopping before training starts; nothing to save"


class Fake(Trainer):
    """A trainer (with checkpoints and resume): each step costs `step_s` fake seconds, each evaluation `eval_s`, each save `save_s`;
    loss = 1 / (1 + step) unless the step is in `nan_at`; a signal arrives after `signal_at` train step
    calls (warm-up included)."""

    def __init__(self, clock, step_s=1.0, eval_s=10.0, save_s=5.0, nan_at=(), signal_at=None, resume=None):
        self.clock, self.step_s, self.eval_s, self.save_s = clock, step_s, eval_s, save_s
        self.nan_at, self.signal_at, self.resume_state = set(nan_at), signal_at, resume
        self.trained, self.calls, self.events, self.rows, self.saves, self.evals, self.schedule = 0, 0, [], [], [], [], []
        self.signals, self.summaries, self.discarded, self.plugins = FakeSignals(), [], [], []
        self.checkpoints, self.discard = True, self.discarded.append

    def train_step(self, lr, mom):
        self.clock.now += self.step_s
        self.trained += 1
        self.calls += 1
        self.schedule.append((lr, mom))
        if self.signal_at is not None and self.calls == self.signal_at:
            self.signals.received = "SIGTERM"
        return self.trained

    def read_metrics(self, handle):
        loss = math.nan if handle in self.nan_at else 1.0 / (1 + handle)
        return loss, 1.0

    def eval_sums(self, max_tokens):
        self.clock.now += self.eval_s
        self.evals.append(max_tokens)
        return {"nll_sum_nats": 7.0, "tokens": 10, "bytes": 20}

    def snapshot(self):
        self.events.append("snapshot")
        return self.trained

    def restore(self, token):
        self.events.append(f"restore after {self.trained - token} warm-up steps")
        self.trained = token

    def resume(self):
        if self.resume_state is None:
            return None
        self.trained = self.resume_state.step
        return RunState(step=self.resume_state.step, tokens=self.resume_state.tokens,
                           train_seconds=self.resume_state.train_seconds)

    def save(self, state, reason):
        self.clock.now += self.save_s
        self.saves.append((state.step, reason))

    def log(self, msg):
        pass

    def metrics(self, **row):
        self.rows.append(row)

    def write_summary(self, summary):
        self.summaries.append(summary)

    def run_hooks(self):
        return self.plugins

    def add_hook(self, hook):
        self.plugins.append(hook)

    def hooks(self, **kw):
        """This trainer with some of its methods replaced (log, agree, roundtrip, ...)."""
        for name, fn in kw.items():
            setattr(self, name, fn)
        return self


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
    return rp.Policy.from_config(cfg, stop_after_steps=kw.get("stop_after_steps"))


BASE = {"config_name": "t", "matmul_peak_flops": 1000.0, "flops_per_token": 10.0}


def test_driver_order_of_events_to_max_steps(fake_time):
    fake = Fake(fake_time)
    hooks = fake.hooks()
    hooks.add_hook(Recorder(fake.events))
    s = rp.run_budgeted(policy(), hooks, BASE)
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
    fake = Fake(fake_time, step_s=2.0)
    rp.run_budgeted(policy(max_steps=3), fake.hooks(), BASE)
    train = [r for r in fake.rows if r["kind"] == "train"]
    assert [r["tokens_per_second"] for r in train] == [pytest.approx(16.0)] * 3  # 32 tokens per 2 s step
    assert all(isinstance(r["loadavg_1m"], float) and r["loadavg_1m"] >= 0 for r in train)


def test_the_round_trip_runs_after_the_final_validation_and_fills_the_summary(fake_time, monkeypatch):
    """Trainer.roundtrip gets an `evaluate` that scores with the trainer's own eval_sums (the full split); its
    artifact fields and the official lines follow; a failure is reported and the run still ends with a summary."""
    fake, log, order = Fake(fake_time), [], []
    monkeypatch.setattr(quantize, "time", fake_time)  # the round trip's eval timer too

    def roundtrip(evaluate):
        order.append(("roundtrip", list(fake.evals)))
        v = evaluate()
        return {**v, "artifact": "run/final_model.int8.ptz", "artifact_bytes": 1000, "raw_bytes": 3000,
                "stats": {"int8_payload_bytes": 2000, "baseline_tensor_bytes": 8000}, "code_files": []}

    s = rp.run_budgeted(policy(max_steps=2), fake.hooks(roundtrip=roundtrip, log=log.append), BASE)
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
        fake, log = Fake(fake_time), []
        big = lambda evaluate: {**roundtrip(evaluate), "artifact_bytes": 16_000_001 if cap_fails else 1000}
        s = rp.run_budgeted(policy(max_steps=2), fake.hooks(roundtrip=big, log=log.append),
                            {**BASE, "rules_profile": profile})
        tag = f" rules:{profile}" + ("(fails:size)" if cap_fails else "")
        assert s["rules_profile"] == profile and s["rules_tag"] == tag
        assert [m for m in log if m.startswith("final_int8_zlib_roundtrip")] and all(
            m.endswith(tag) for m in log if m.startswith("final_int8_zlib_roundtrip"))
        assert s["rules_at_end"] == {"size": "fail" if cap_fails else "not checkable"}

    def broken(evaluate):
        raise OSError(28, "No space left on device", "run/.final_model.int8.ptz.tmp")

    fake, log = Fake(fake_time), []
    s = rp.run_budgeted(policy(max_steps=2), fake.hooks(roundtrip=broken, log=log.append), BASE)
    assert "disk full" in s["roundtrip_error"] and "roundtrip_val_bpb" not in s and fake.summaries == [s]
    assert any(m.startswith("int8+zlib round trip failed: run/.final_model.int8.ptz.tmp: disk full") for m in log)


def test_budget_stop_pauses_the_clock_for_validation_and_checkpoints(fake_time):
    fake = Fake(fake_time)
    s = rp.run_budgeted(policy(budget_seconds=4.5, max_steps=100, val_every_steps=2, val_max_tokens=64,
                               checkpoint_every_steps=3), fake.hooks(), BASE)
    assert s["stop_reason"] == "budget" and s["steps"] == 5  # 5 steps of 1 s: elapsed 5 >= 4.5
    assert s["train_seconds"] == pytest.approx(5.0)
    vals = [r for r in fake.rows if r["kind"] == "val"]
    assert [(r["step"], r.get("final", False)) for r in vals] == [(2, False), (4, False), (5, True)]
    assert fake.evals[1:] == [64, 64, 0]  # periodic on val_max_tokens, the final on everything
    assert fake.saves == [(3, "periodic"), (5, "final")]


def test_a_failed_save_stops_the_run_writes_the_summary_and_is_raised(fake_time):
    fake = Fake(fake_time)

    def save(state, reason):
        if state.step == 4:
            raise BadInput("run/checkpoints/4: disk full")
        fake.saves.append((state.step, reason))

    hooks = fake.hooks()
    hooks.save = save
    with pytest.raises(BadInput, match="disk full"):
        rp.run_budgeted(policy(max_steps=10, checkpoint_every_steps=2), hooks, BASE)
    [s] = fake.summaries
    assert s["stop_reason"] == rp.STOP_SAVE_FAILED and s["steps"] == 4 and "disk full" in s["error"]
    assert fake.saves == [(2, "periodic")] and "val_bpb" not in s  # no final save, no final validation
    fake = Fake(fake_time)
    hooks = fake.hooks()
    hooks.save = lambda state, reason: (_ for _ in ()).throw(BadInput("disk full"))
    with pytest.raises(BadInput):
        rp.run_budgeted(policy(max_steps=3), hooks, BASE)  # the final save
    assert fake.summaries[0]["stop_reason"] == rp.STOP_SAVE_FAILED


def test_non_finite_loss_stops_without_saving_the_diverged_step(fake_time):
    fake = Fake(fake_time, nan_at={3})
    s = rp.run_budgeted(policy(checkpoint_every_steps=3, max_steps=10), fake.hooks(), BASE)
    assert s["stop_reason"] == rp.STOP_NONFINITE and s["steps"] == 3 and math.isnan(s["final_train_loss"])
    assert fake.saves == [] and "val_bpb" not in s
    assert not [r for r in fake.rows if r["kind"] == "val"]
    fake = Fake(fake_time, nan_at={4})  # dispatched ahead: noticed at the next iteration's start
    s = rp.run_budgeted(policy(max_steps=10), fake.hooks(), BASE)
    assert s["stop_reason"] == rp.STOP_NONFINITE and s["steps"] == 4 and fake.trained == 4 and fake.saves == []
    assert rp.exit_code(s["stop_reason"]) == 3
    # a periodic checkpoint of the step before holds the parameters that gave the non-finite loss
    fake = Fake(fake_time, nan_at={5})
    s = rp.run_budgeted(policy(max_steps=10, checkpoint_every_steps=2), fake.hooks(), BASE)
    assert fake.saves == [(2, "periodic"), (4, "periodic")] and fake.discarded == [4]
    fake = Fake(fake_time, nan_at={5}, resume=RunState(step=4, tokens=128, train_seconds=4.0))
    rp.run_budgeted(policy(max_steps=10, checkpoint_every_steps=2), fake.hooks(), BASE)
    assert fake.discarded == []  # the checkpoint it resumed from was not written by this invocation


def test_signal_stops_with_an_interrupted_checkpoint_and_no_final_validation(fake_time):
    fake = Fake(fake_time, signal_at=2 + 3)  # 2 warm-up steps, then 3 real ones
    s = rp.run_budgeted(policy(max_steps=10), fake.hooks(), BASE)
    assert s["stop_reason"] == "signal SIGTERM" and s["steps"] == 3 and fake.saves == [(3, "interrupted")]
    assert "val_bpb" not in s and rp.exit_code(s["stop_reason"]) == 130
    fake = Fake(fake_time)
    s = rp.run_budgeted(policy(max_steps=10, stop_after_steps=2), fake.hooks(), BASE)
    assert s["stop_reason"] == "signal stop requested" and s["steps"] == 2 and fake.saves == [(2, "interrupted")]


def test_signal_during_warm_up_stops_before_anything_is_trained(fake_time):
    fake = Fake(fake_time, signal_at=1)
    hooks = fake.hooks()
    hooks.add_hook(Recorder(fake.events))
    with pytest.raises(rp.InterruptedBeforeTraining) as e:
        rp.run_budgeted(policy(), hooks, BASE)
    assert e.value.reason == "signal SIGTERM before training" and isinstance(e.value, KeyboardInterrupt)
    assert fake.trained == 1 and fake.saves == [] and fake.rows == [] and fake.summaries == []
    assert fake.events == ["snapshot"]  # no hook started, none closed
    assert fake.signals.stopping.startswith("stopping before training")


def test_resume_continues_counts_and_schedule_and_does_not_resave_its_step(fake_time):
    fake = Fake(fake_time, resume=RunState(step=4, tokens=128, train_seconds=40.0))
    s = rp.run_budgeted(policy(max_steps=6, val_every_steps=2), fake.hooks(), BASE)
    assert s["steps"] == 6 and s["tokens"] == 192 and s["train_seconds"] == pytest.approx(42.0)
    assert fake.schedule[2:] == [(1.0, 0.95), (0.5, 0.95)]  # momentum warm-up done, last warmdown step
    assert [r["step"] for r in fake.rows if r["kind"] == "val"] == [6]  # not at the resumed step 4
    fake = Fake(fake_time, resume=RunState(step=6, tokens=192, train_seconds=6.0))
    s = rp.run_budgeted(policy(max_steps=6), fake.hooks(), BASE)  # a finished run resumed: nothing to train
    assert s["steps"] == 6 and s["stop_reason"] == "max_steps" and fake.trained == 6
    fake = Fake(fake_time)
    s = rp.run_budgeted(policy(max_steps=6, checkpoint_every_steps=3), fake.hooks(), BASE)
    # the final save of a step already saved is asked for too: it is the trainer's no-op
    assert fake.saves == [(3, "periodic"), (6, "periodic"), (6, "final")]


def test_agree_takes_the_clock_and_stop_of_process_zero(fake_time):
    fake = Fake(fake_time)
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
    s = rp.run_budgeted(policy(max_steps=10, budget_seconds=1e9), hooks, BASE)
    assert warm == [(False, 0.0)] * 3  # after each of the 2 warm-up steps and after the eval compile
    assert s["stop_reason"] == "signal stop requested" and s["steps"] == 2
    assert [r["lr_scale"] for r in fake.rows if r["kind"] == "train"] == [1.0, 1.0]
    assert all(not local for local, _ in timed)


def test_hooks_are_closed_on_an_exception(fake_time):
    fake = Fake(fake_time)
    hooks = fake.hooks()
    hooks.add_hook(Recorder(fake.events))

    def broken(max_tokens):
        if fake.trained > 3:
            raise RuntimeError("eval failed")
        return {"nll_sum_nats": 1.0, "tokens": 1, "bytes": 1}

    hooks.eval_sums = broken
    with pytest.raises(RuntimeError):
        rp.run_budgeted(policy(max_steps=6), hooks, BASE)
    assert fake.events[-1] == "close"


def test_policy_from_config_keeps_one_warm_up_step_at_least():
    p = rp.Policy.from_config(Config(train=TrainConfig(compile_warmup_steps=0, val_batch_seqs=2, seq_len=16,
                                                       tokens_per_step=64)))
    assert p.warmup_steps == 1 and p.warmup_val_tokens == 32 and p.stop_after_steps is None


def test_bpb_from_sums():
    assert rp.bpb(8 * math.log(2.0), 4) == 2.0  # 8 bits over 4 bytes
    assert rp.bpb(0.0, 0) == 0.0  # no bytes: no division by zero


def test_a_signal_in_the_final_validation_stops_it_with_the_checkpoint_saved(fake_time):
    """Round 3: Ctrl-C during the final validation promised a checkpoint and did not stop. With the
    final checkpoint saved, a signal there ends the evaluation at once: no val_bpb, an interrupted stop."""
    fake = Fake(fake_time)
    fake.signals.interrupt = False

    def eval_sums(max_tokens):
        if max_tokens == 0:  # the final validation: a signal arrives (the handler raises, see rundir.Signals)
            assert fake.signals.interrupt and "final validation" in fake.signals.stopping
            fake.signals.received = "SIGINT"
            raise KeyboardInterrupt
        return Fake.eval_sums(fake, max_tokens)

    fake.eval_sums = eval_sums
    s = rp.run_budgeted(policy(), fake.hooks(), BASE)
    assert s["stop_reason"] == "signal SIGINT during the final validation" and "val_bpb" not in s
    assert fake.saves == [(6, "final")] and fake.summaries == [s] and not fake.signals.interrupt
    assert rp.exit_code(s["stop_reason"]) == EXIT_INTERRUPTED


def test_a_full_disk_outside_a_checkpoint_names_the_file_and_writes_the_summary(fake_time):
    """Round 3: a write in the loop (metrics.jsonl) on a full disk named no file and wrote no summary."""
    import errno

    fake = Fake(fake_time)
    hooks = fake.hooks()

    def metrics(**row):
        if row.get("step") == 3:
            raise OSError(errno.ENOSPC, "No space left on device", "/run/metrics.jsonl")
        fake.rows.append(row)

    hooks.metrics = metrics
    with pytest.raises(BadInput, match=r"^/run/metrics.jsonl: disk full \(ENOSPC\)$"):
        rp.run_budgeted(policy(), hooks, BASE)
    assert len(fake.summaries) == 1 and fake.summaries[0]["stop_reason"] == rp.STOP_WRITE_FAILED
    assert "disk full" in fake.summaries[0]["error"] and fake.saves == [(3, "final")]

