"""How a run stops and ends (frontier_jax.run.endings): the stop order, the exit codes and the one table from a
stop reason to an entry point's exit status and last line."""

from __future__ import annotations

from frontier_jax.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK
from frontier_jax.run import endings


def test_stop_order_signal_then_max_steps_then_budget():
    assert endings.decide_stop("SIGTERM", 10, 10, 99.0, 5.0) == "signal SIGTERM"
    assert endings.decide_stop(endings.STOP_REQUESTED, 0, 10, 0.0, 5.0) == "signal stop requested"
    assert endings.decide_stop(None, 10, 10, 99.0, 5.0) == endings.STOP_MAX_STEPS
    assert endings.decide_stop(None, 9, 10, 5.0, 5.0) == endings.STOP_BUDGET
    assert endings.decide_stop(None, 9, 10, 4.99, 5.0) is None


def test_exit_codes():
    assert endings.exit_code(endings.STOP_NONFINITE) == EXIT_DIVERGED == 3
    assert endings.exit_code("signal SIGINT") == EXIT_INTERRUPTED == 130
    assert endings.exit_code(endings.STOP_BUDGET) == endings.exit_code(endings.STOP_MAX_STEPS) == EXIT_OK == 0


def test_every_stop_reason_maps_to_its_ending_through_the_one_table():
    """Exit status and the entry points' last line (a trainer with checkpoints / one with weights only)."""
    cases = {  # stop reason, resumed -> (table row, exit code)
        (endings.STOP_BUDGET, False): ("done", 0), (endings.STOP_MAX_STEPS, True): ("done", 0),
        (endings.STOP_FINISHED, True): ("already finished", 0), (endings.STOP_NONFINITE, False): ("diverged", 3),
        ("signal SIGINT before training", False): ("interrupted before training", 130),
        ("signal SIGINT before training", True): ("interrupted before training a resume", 130),
        ("signal SIGTERM during the final validation", False): ("interrupted in the final validation", 130),
        (endings.signal_reason(None), False): ("interrupted", 130), ("signal SIGHUP", True): ("interrupted", 130)}
    for (reason, resumed), (row, code) in cases.items():
        end = endings.ending(reason, resumed)
        assert end is endings.ENDINGS[row] and end.exit_code == code == endings.exit_code(reason), reason
    assert set(endings.ENDINGS) == {row for row, _ in cases.values()}  # every row is reachable
    summary = {"steps": 7, "checkpoint_step": 6, "note": "runs/x: already finished at step 9"}
    line = lambda reason, resumed, ckpt: endings.ending(reason, resumed).line(summary, "runs/x", ckpt)
    assert line(endings.STOP_BUDGET, False, True) is None and line(endings.STOP_NONFINITE, False, False) is None
    assert line(endings.STOP_FINISHED, True, True) == summary["note"] and not endings.ENDINGS["already finished"].results
    assert line("signal SIGINT", False, True) == ("interrupted: checkpoint step 6 saved; continue with: "
                                                  "python -m frontier_jax.train --resume runs/x")
    assert line("signal SIGINT", False, False) == line("signal SIGINT during the final validation", False, False) == \
        "interrupted after 7 steps; weights in runs/x/weights.npz (the torch baseline has no resume)"
    assert line("signal SIGINT during the final validation", False, True).endswith(
        "checkpoint step 6 saved; its final steps run with: python -m frontier_jax.train --resume runs/x")
    assert line("signal SIGINT before training", True, True).endswith("train --resume runs/x")
    assert line("signal SIGINT before training", False, True).endswith("nothing trained, no checkpoint written")
    assert line("signal SIGINT before training", True, False).endswith("nothing trained, nothing written")
