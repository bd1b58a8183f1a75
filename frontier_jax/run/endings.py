"""How a run stops and how it ends: the stop reasons, the stop decided before each step (`decide_stop`:
a signal, then max_steps, then the budget), and one table (`ENDINGS`, `ending`) from a finished run's stop
reason to the entry points' exit status and last line. Both trainers' drivers and entry points read it;
nothing here imports JAX."""

from __future__ import annotations

import dataclasses

from frontier_jax.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK
from frontier_jax.run.rundir import WEIGHTS

STOP_BUDGET = "budget"
STOP_MAX_STEPS = "max_steps"
STOP_NONFINITE = "non-finite loss"
STOP_SAVE_FAILED = "checkpoint not written"
STOP_WRITE_FAILED = "run file not written"  # an OSError writing the run's files (a full disk) in the loop
STOP_FINISHED = "already finished"  # --resume of a run that reached its max_steps or budget (nothing trained)
FINAL_VAL_INTERRUPTED = "during the final validation"  # suffix of a signal's stop reason there
BEFORE_TRAINING = "before training"  # suffix of a signal's stop reason before the first timed step
SIGNAL_PREFIX = "signal"
STOP_REQUESTED = "stop requested"  # stop_after_steps (tests) behaves as a signal with this name


def signal_reason(name: str | None) -> str:
    return f"{SIGNAL_PREFIX} {name or STOP_REQUESTED}"


def is_interrupted(stop_reason: str) -> bool:
    return stop_reason.startswith(SIGNAL_PREFIX)


@dataclasses.dataclass(frozen=True)
class Ending:
    """What an entry point does for a run that ended one way: its exit status, whether it prints the
    run's result lines (progress.final_lines), and its last line for a trainer that resumes from
    checkpoints (`resumable`) and for one that does not (`weights_only`; None: no line). A line is a
    format string of the summary's fields and `out` (the run directory)."""

    exit_code: int
    results: bool = True
    resumable: str | None = None
    weights_only: str | None = None
    to_stderr: bool = True

    def line(self, summary: dict, out, checkpoints: bool) -> str | None:
        text = self.resumable if checkpoints else self.weights_only
        return None if text is None else text.format_map({**summary, "out": out})


_TORCH_INTERRUPTED = (f"interrupted after {{steps}} steps; weights in {{out}}/{WEIGHTS} "
                      "(the torch baseline has no resume)")
_BEFORE = "interrupted before training started: nothing trained, "

ENDINGS = {  # the kinds of `ending`, one row each
    "done": Ending(EXIT_OK),  # budget, max_steps
    "already finished": Ending(EXIT_OK, results=False, resumable="{note}", to_stderr=False),  # the note on stdout
    "diverged": Ending(EXIT_DIVERGED),
    "interrupted before training": Ending(
        EXIT_INTERRUPTED, resumable=_BEFORE + "no checkpoint written", weights_only=_BEFORE + "nothing written"),
    "interrupted before training a resume": Ending(
        EXIT_INTERRUPTED, resumable=_BEFORE + "the run is as it was; continue with: python -m frontier_jax.train "
                                              "--resume {out}", weights_only=_BEFORE + "nothing written"),
    "interrupted in the final validation": Ending(
        EXIT_INTERRUPTED, resumable="interrupted during the final validation: checkpoint step {checkpoint_step} saved; "
                                    "its final steps run with: python -m frontier_jax.train --resume {out}",
        weights_only=_TORCH_INTERRUPTED),
    "interrupted": Ending(EXIT_INTERRUPTED, resumable="interrupted: checkpoint step {checkpoint_step} saved; continue "
                                                      "with: python -m frontier_jax.train --resume {out}",
                          weights_only=_TORCH_INTERRUPTED),
}


def ending(stop_reason: str, resumed: bool = False) -> Ending:
    """The `ENDINGS` row of a finished run's stop reason (`resumed`: the invocation was a --resume)."""
    if stop_reason == STOP_FINISHED:
        return ENDINGS["already finished"]
    if stop_reason == STOP_NONFINITE:
        return ENDINGS["diverged"]
    if not is_interrupted(stop_reason):
        return ENDINGS["done"]
    if stop_reason.endswith(BEFORE_TRAINING):
        return ENDINGS["interrupted before training a resume" if resumed else "interrupted before training"]
    if stop_reason.endswith(FINAL_VAL_INTERRUPTED):
        return ENDINGS["interrupted in the final validation"]
    return ENDINGS["interrupted"]


def exit_code(stop_reason: str) -> int:
    """The entry points' exit status for a finished run: 3 diverged, 130 interrupted, else 0 (`ENDINGS`)."""
    return ending(stop_reason).exit_code


def decide_stop(signalled: str | None, step: int, max_steps: int, elapsed_s: float, budget_s: float) -> str | None:
    """The stop reason before the next step, or None: a signal first, then max_steps, then the budget.

    `signalled` is the signal's name ("" or None when none arrived; STOP_REQUESTED for stop_after_steps)."""
    if signalled:
        return signal_reason(signalled)
    if step >= max_steps:
        return STOP_MAX_STEPS
    if elapsed_s >= budget_s:
        return STOP_BUDGET
    return None


class InterruptedBeforeTraining(KeyboardInterrupt):
    """A signal arrived before the first timed step: nothing was trained, nothing is saved (exit 130).
    `reason` is the stop reason ("signal SIGINT before training")."""

    def __init__(self, signal_name: str | None):
        self.reason = f"{signal_reason(signal_name)} {BEFORE_TRAINING}"
        super().__init__(self.reason)
