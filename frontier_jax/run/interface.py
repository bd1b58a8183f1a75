"""The trainer interface: what a trainer supplies to the driver (`frontier_jax.run.driver.run_budgeted`).

`Trainer` is a `typing.Protocol` both trainers implement as a class (`frontier_jax.trainer.JaxTrainer`,
`baseline_torch.train.Trainer`). Its required methods are the step, the evaluation sums, the warm-up's
snapshot/restore, the log, the metrics sink and the summary writer. The optional capabilities have
defaults here, which a class that names `Trainer` as its base inherits:

- checkpoints: `checkpoints` False (the default) means the driver never calls `save` or `discard`;
- resume: `resume` returns None (a fresh run);
- several processes: `agree` returns this process's own stop decision and clock;
- more programs compiled in the warm-up: `warm_up_programs` runs none and returns None;
- more summary entries: `summary_fields` returns {};
- the artifact and its round trip: `roundtrip` returns None (none is run);
- averaged weights for the final evaluation: `final_weights` returns None (the trained weights are scored);
- score-first test-time training (ttt.enabled): `ttt_sums` raises (a trainer without it refuses such a config);
- finishing a run's final steps on a resume: `final_records` returns {} and `record_final` keeps nothing.

Plug-ins (the n-gram runtime, progress lines, a compile watch) are `RunHook`s the trainer lists in
`run_hooks`, as levanter's `add_hook`. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol


@dataclasses.dataclass
class RunState:
    """Where a run stands: what a checkpoint records and what the summary reports."""

    step: int = 0
    tokens: int = 0
    train_seconds: float = 0.0
    start_step: int = 0  # the step this invocation started at (resume)
    final_loss: float = math.nan
    stop_reason: str | None = None
    saved_step: int | None = None  # the newest step with a checkpoint (resumed from, or saved)
    late_qat_step: int | None = None  # the step late QAT switched on at (optim.late_qat_threshold), or None: off


class RunHook:
    """A plug-in of the run (no-op by default): the n-gram runtime, a progress bar, a per-step log."""

    def on_start(self, state: RunState) -> None:
        """The timed part begins (after warm-up and resume)."""

    def before_step(self, state: RunState) -> None:
        """Just before the train step that will make step `state.step + 1`."""

    def after_step(self, state: RunState, row: dict) -> None:
        """A finished step's metrics row (kind=train), in step order."""

    def on_end(self, state: RunState) -> None:
        """The timed loop ended (state.stop_reason set); before the final checkpoint and validation."""

    def close(self) -> None:
        """Always called at the end, also on an exception after `on_start`."""


class Trainer(Protocol):
    """What a trainer supplies to `driver.run_budgeted` (the order of the calls: the driver's docstring)."""

    signals: Any
    """The installed signal handlers' state (`rundir.Signals`): `.received` names a signal that arrived (or
    is None); `.stopping`, when present, is what the first signal prints (set by the driver for the timed
    loop); `.interrupt`, when present, makes a signal raise KeyboardInterrupt (the final validation)."""

    checkpoints: bool = False
    """Whether the trainer saves checkpoints: only then does the driver call `save` and `discard`."""

    def train_step(self, lr_scale: float, momentum: float, qat: bool = False) -> Any:
        """One step on the next batch; returns a handle of its metrics (the step may still be running). `qat`: the
        late-QAT flag of the step's forward (a trainer without late QAT refuses a config that sets it)."""
        ...

    def read_metrics(self, handle: Any) -> tuple[float, float]:
        """(loss, grad_norm) of a step `train_step` returned, as floats (waits for that step)."""
        ...

    def eval_sums(self, max_tokens: int, seq_len: int | None = None, stride: int | None = None) -> dict:
        """{"nll_sum_nats", "tokens", "bytes"} over at most `max_tokens` val targets (0: all), in non-overlapping
        windows of train.seq_len; `seq_len` (the round trip's eval.seq_len) and `stride` (sliding windows that
        score every target once) are passed only where the final pipeline asks for other windows."""
        ...

    def snapshot(self) -> Any:
        """A token of the state before the warm-up (parameters, optimizer state, data position)."""
        ...

    def restore(self, token: Any) -> None:
        """Undo the warm-up: put back the state `snapshot` returned `token` for."""
        ...

    def log(self, msg: str) -> None:
        """One message of the run log."""
        ...

    def metrics(self, **row) -> None:
        """The metrics sink: one row per train step, validation or round-trip validation."""
        ...

    def write_summary(self, summary: dict) -> None:
        """Write the summary files (summary.json/txt, curves.png) and whatever ends the run's files."""
        ...

    def run_hooks(self) -> list[RunHook]:
        """The plug-ins of this run, called in this order (default: none)."""
        return []

    def resume(self) -> RunState | None:
        """After the warm-up: the resumed checkpoint's step, tokens and trained seconds (restored into the
        trainer), or None for a fresh run (the default)."""
        return None

    def save(self, state: RunState, reason: str) -> None:
        """A checkpoint of `state` ("periodic", "final", "interrupted"); called only when `checkpoints`.
        Saving a step that is already saved is a no-op; a save that fails raises BadInput."""
        raise NotImplementedError(f"{type(self).__name__} has no checkpoints")

    def discard(self, step: int) -> None:
        """Remove checkpoint `step` (its parameters gave a non-finite loss); called only when `checkpoints`."""
        raise NotImplementedError(f"{type(self).__name__} has no checkpoints")

    def agree(self, local_stop: bool, elapsed: float) -> tuple[bool, float]:
        """Several processes agree on (stop, elapsed seconds); the default: this one process decides."""
        return local_stop, elapsed

    def warm_up_programs(self, evals: list[dict], check: Callable[[], None]) -> int | None:
        """At the end of the compile warm-up (after its steps and evaluation, before `restore`): run once, so
        compile, every other program the run may call, the steps of another forward and the eval steps of each
        of `evals` (`eval_sums`' keyword arguments: {} for the validation's windows, the final pipeline's
        others), calling `check` (it raises on a signal) after each, so that nothing compiles in the timed loop
        or the final evaluation; returns how many programs the warm-up compiled, or None (the default: none is
        added, the warm-up's steps and evaluation are all)."""
        return None

    def summary_fields(self) -> dict:
        """More summary entries, computed at the end (e.g. the newest checkpoint); default none."""
        return {}

    def roundtrip(self, evaluate: Callable[[dict], dict]) -> dict | None:
        """The artifact (eval.artifact) of the final weights: written, read back, its dequantized weights put in
        place while `evaluate(info)` scores them (info: the artifact's format, path, bytes, torch.save bytes,
        quantizer stats and the run's code files), then the final weights put back; returns info plus the sums
        `evaluate` returned (frontier_jax.run.final logs and records them), or None: this trainer has no round
        trip (the default)."""
        return None

    def final_weights(self) -> str | None:
        """Put in place the weights the final evaluation scores when they are not the trained ones (averaged
        weights) and return their label for the DIAGNOSTIC line; None (the default): the trained weights."""
        return None

    def ttt_sums(self) -> dict:
        """Score-first test-time training (frontier_jax.ttt) from the weights in place (the final pipeline: the
        artifact's, inside `roundtrip`): the sums of every target it scored, plus the TTT record
        (`rundir.TTT_RECORD`), its log written to <run>/ttt.jsonl. Called only with ttt.enabled."""
        raise NotImplementedError(f"{type(self).__name__} has no test-time training")

    def final_records(self) -> dict:
        """The final stages an earlier invocation recorded for the resumed checkpoint ({stage: sums or artifact
        entries}, frontier_jax.run.final.STAGES); {} (the default): none, every stage runs."""
        return {}

    def record_final(self, records: dict) -> None:
        """Keep the final stages done so far, so that a resume runs only what is missing (default: kept nowhere)."""
