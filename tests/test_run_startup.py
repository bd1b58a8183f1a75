"""The start-up lifecycle both trainers run (frontier_jax.run.startup): signals first, the set-up, a signal by
then writing nothing, the claim, the body, the release; and the start-up lines."""

from __future__ import annotations

import os
import signal
import types

import numpy as np
import pytest

from frontier_jax.run import rundir, startup
from frontier_jax.config import Config, model_hash
from frontier_jax.errors import BadInput
from frontier_jax.run.driver import InterruptedBeforeTraining


def _start(out, body, setup=lambda check: "prepared", resume=False, claim=None):
    log = rundir.RunLog(None, echo=False)
    return startup.start_run(out, resume, log, setup, body, claim=claim), log


def test_a_signal_during_the_set_up_writes_nothing_and_claims_nothing(tmp_path):
    out, claims = tmp_path / "run", []

    def setup(check):
        os.kill(os.getpid(), signal.SIGTERM)  # the handlers are installed before the set-up
        return "prepared"

    s, _ = _start(out, lambda p, start: pytest.fail("no body after a signal"), setup,
                  claim=lambda p: claims.append(p))
    assert s == {"stop_reason": "signal SIGTERM before training", "steps": 0, "run_dir": str(out),
                 "checkpoint_step": None}
    assert not out.exists() and claims == []


def test_a_signal_between_set_up_phases_stops_before_the_next_phase(tmp_path):
    """A signal during a long set-up phase (a model being built) was only seen after the whole set-up: the set-up
    checks the flag between its phases (`check`), and the body between its own (`start.check`), exit 130."""
    out, phases = tmp_path / "run", []

    def setup(check):
        phases.append("data")
        os.kill(os.getpid(), signal.SIGTERM)
        check()
        phases.append("model")  # never reached
        return "prepared"

    s, _ = _start(out, lambda p, start: pytest.fail("no body after a signal"), setup)
    assert phases == ["data"] and s["stop_reason"] == "signal SIGTERM before training" and not out.exists()

    def body(prepared, start):
        phases.append("claimed")
        os.kill(os.getpid(), signal.SIGINT)
        start.check()
        phases.append("built")  # never reached
        return {}

    s, _ = _start(out, body)
    assert phases[-1] == "claimed" and s["stop_reason"] == "signal SIGINT before training" and not out.exists()


def test_the_body_runs_on_a_claimed_directory_and_the_lock_is_released(tmp_path):
    out = tmp_path / "run"

    def body(prepared, start):
        assert prepared == "prepared" and start.created and (out / rundir.RunDirLock.NAME).exists()
        with pytest.raises(BadInput, match="another process"):
            rundir.RunDirLock(out)  # held while the body runs
        return {"stop_reason": "max_steps"}

    s, log = _start(out, body)
    assert s == {"stop_reason": "max_steps"} and log._f is None  # the log is closed
    rundir.RunDirLock(out).release()  # released


def test_a_signal_in_the_warm_up_removes_a_new_directory_and_reports_a_resumes_step(tmp_path):
    def body(prepared, start):
        start.signals.received = "SIGINT"
        start.resumed_step = 40 if start.resume else None
        raise InterruptedBeforeTraining("SIGINT")

    s, _ = _start(tmp_path / "new", body)
    assert s["stop_reason"] == "signal SIGINT before training" and not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    s, _ = _start(tmp_path / "old", body, resume=True)
    assert s["steps"] == 40 and s["checkpoint_step"] == 40 and (tmp_path / "old").is_dir()


def test_bad_input_before_the_first_metrics_row_leaves_no_partial_run(tmp_path):
    def failing(metrics_written):
        def body(prepared, start):
            (start.out_dir / rundir.CONFIG).write_text("{}")
            if metrics_written:
                (start.out_dir / rundir.METRICS).write_text("{}\n")
            raise BadInput("disk full")
        return body

    with pytest.raises(BadInput, match="disk full"):
        _start(tmp_path / "a", failing(False))
    assert not (tmp_path / "a").exists()
    with pytest.raises(BadInput, match="disk full"):
        _start(tmp_path / "b", failing(True))
    assert (tmp_path / "b" / rundir.METRICS).is_file()  # a run that trained keeps its files


def test_the_start_up_lines_name_the_data_the_step_the_model_and_the_peak():
    cfg = Config()
    data = types.SimpleNamespace(val_tokens=np.zeros(1001), tokenizer=types.SimpleNamespace(path="tok.model"),
                                 provenance="manifest ok")
    lines = startup.start_lines(cfg, data, 3, 2, 8, 12345, {"matmul_peak_flops": 2e12, "peak_source": "probe"},
                                "all devices")
    t = cfg.train
    assert lines == [
        f"data {cfg.data.data_dir}: 3 train shards, 1,000 val targets | tokenizer tok.model",
        "data provenance: manifest ok",
        f"step = {t.tokens_per_step:,} tokens = 2 micro-batch(es) of 8 x {t.seq_len}",
        f"model: 12,345 parameters, hash {model_hash(cfg)}",
        "matmul peak (MFU denominator, all devices): 2,000.0 GFLOP/s, probe"]
    assert startup.start_lines(cfg, data, 3, 2, 8, 1, {})[-1] == \
        "matmul peak not measured (train.measure_peak=False): no MFU"
