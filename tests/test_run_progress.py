"""frontier_jax.run.progress: progress lines off a terminal (every N steps or T seconds), the repetition estimate
and its warning, the MFU probe summary, the entry points' final lines."""

from __future__ import annotations

import dataclasses

from frontier_jax.run import progress
from frontier_jax.run.interface import RunState


@dataclasses.dataclass
class _Policy:
    budget_seconds: float = 100.0
    max_steps: int = 1000
    tokens_per_step: int = 1000


@dataclasses.dataclass
class _Train:
    log_every_steps: int = 5
    log_every_seconds: float = 30.0


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _row(step, secs, loss=2.0):
    return {"step": step, "tokens": step * 1000, "train_seconds": secs, "loss": loss, "grad_norm": 1.0}


def _run(train, split_tokens=50_000, policy=None, steps=20, sec_per_step=1.0, wall_per_step=1.0):
    lines, clock = [], _Clock()
    p = progress.Progress(lines.append, policy or _Policy(), split_tokens, train, tty=False, clock=clock)
    p.on_start(RunState())
    for s in range(1, steps + 1):
        clock.t += wall_per_step
        p.after_step(None, _row(s, s * sec_per_step))
    p.close()
    return lines


def test_off_a_terminal_a_line_every_n_steps_with_tokens_rate_loss_and_budget():
    lines = _run(_Train(log_every_steps=5, log_every_seconds=1e9))
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert steps[0] == "step 5/1000 | 5,000 tokens | 1,000 tok/s | loss 2.0000 | 5.0/100 s"
    assert [ln.split("/")[0] for ln in steps] == ["step 5", "step 10", "step 15", "step 20"]


def test_off_a_terminal_a_line_every_t_seconds_when_steps_are_slow():
    lines = _run(_Train(log_every_steps=0, log_every_seconds=30.0), steps=10, wall_per_step=12.0, sec_per_step=12.0)
    steps = [ln.split("/")[0] for ln in lines if ln.startswith("step ")]
    assert steps == ["step 3", "step 6", "step 9"]  # 36 s, 36 s, 36 s of wall clock apart


def test_split_size_and_repetition_warning_past_one_pass():
    lines = _run(_Train(log_every_steps=0, log_every_seconds=1e9), split_tokens=50_000)
    assert lines[0].startswith("train split: 50,000 tokens (one pass = 50.0 steps")
    (rep,) = [ln for ln in lines if ln.startswith("repetition:")]
    # 1,000 tok/s over steps 1-10, 100 s budget: about 100,000 tokens = 2 passes
    assert "1,000 tok/s (steps 1-10)" in rep and "100,000 tokens = 2.00 passes" in rep and "WARNING" in rep
    once = _run(_Train(log_every_steps=0, log_every_seconds=1e9), split_tokens=10_000_000)
    (rep,) = [ln for ln in once if ln.startswith("repetition:")]
    assert "0.01 passes" in rep and "WARNING" not in rep


def test_nothing_from_a_non_main_process_and_no_line_for_a_non_finite_step():
    lines = []
    p = progress.Progress(lines.append, _Policy(), 1000, _Train(log_every_steps=1), main=False, tty=False)
    p.on_start(RunState())
    p.after_step(None, _row(1, 1.0))
    assert lines == []
    p = progress.Progress(lines.append, _Policy(), 1000, _Train(log_every_steps=1), tty=False)
    p.on_start(RunState())
    p.after_step(None, _row(1, 1.0, loss=float("nan")))
    assert len(lines) == 1 and lines[0].startswith("train split")


def test_probe_summary_reports_the_median_and_spread():
    r = progress.probe_summary([72e9, 150e9, 168e9, 140e9, 145e9], "2048^3 float32 matmul")
    assert r["matmul_peak_flops"] == 145e9 and r["peak_spread"] == [72e9, 168e9]
    assert "median of 5 probes" in r["peak_source"] and "72.0-168.0 GFLOP/s (66% spread)" in r["peak_source"]


def test_final_lines_put_the_round_trip_after_the_plain_val_bpb():
    s = {"val_bpb": 1.5, "roundtrip_val_bpb": 1.51234567, "roundtrip_val_loss": 1.0, "roundtrip_eval_seconds": 0.5}
    assert progress.final_lines(s) == [
        "val_bpb: 1.500000", "final_int8_zlib_roundtrip val_loss:1.0000 val_bpb:1.5123 eval_time:500ms",
        "final_int8_zlib_roundtrip_exact val_loss:1.00000000 val_bpb:1.51234567"]
    assert progress.final_lines({"val_bpb": 1.5}) == ["val_bpb: 1.500000"]
    assert progress.final_lines({}) == []


def test_on_a_terminal_the_lines_go_to_the_file_only():
    class Log(list):
        def __call__(self, m):
            self.append(("echo", m))

        def file(self, m):
            self.append(("file", m))

    log = Log()
    p = progress.Progress(log, _Policy(), 1000, _Train(log_every_steps=2), tty=True)
    p.on_start(RunState())
    p.after_step(None, _row(1, 1.0))
    p.after_step(None, _row(2, 2.0))
    p.close()
    assert log[0][0] == "echo" and ("file", "step 2/1000 | 2,000 tokens | 1,000 tok/s | loss 2.0000 | 2.0/100 s") in log
