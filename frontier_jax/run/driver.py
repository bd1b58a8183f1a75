"""The budgeted-run driver both trainers call: warm-up, resume, the timed loop, the finish and the summary.

It imports no JAX, so the PyTorch baseline runs exactly the same semantics without loading JAX. A trainer
(`frontier_jax.trainer.JaxTrainer`, `baseline_torch.train.Trainer`) is a class implementing the
`frontier_jax.run.interface.Trainer` protocol (its step, evaluation sums, snapshot/restore and optional
capabilities) and calls `run_budgeted`; plug-ins (the n-gram runtime, progress lines) are the
`RunHook`s its `run_hooks` lists, as levanter's `add_hook`. The stop reasons and how a run ends are
`frontier_jax.run.endings`; the schedules, the step's geometry and the val score are `frontier_jax.policies`.

Order of events (docs/training.md); the caller has installed the signal handlers (the start-up
lifecycle, frontier_jax.run.startup) before its set-up, so a signal is never lost:
1. untimed compile warm-up: `warmup_steps` train steps (at least one, lr multiplier 1, Muon momentum
   of steps 0, 1, ...), each waited for, one evaluation of `warmup_val_tokens`, and the trainer's
   `warm_up_programs` for the eval windows of the validations and the final pipeline (the JAX trainer
   runs there every program a switch of the attention forward or the final pipeline would run); then `restore`
   puts back the state from before it (fresh or resumed parameters and optimizer state, the data
   position), as the baseline. A signal here (checked after each warm-up step, after the
   evaluation and after each of the other programs, agreed across processes) raises `InterruptedBeforeTraining`: nothing trained, nothing
   saved, exit 130;
2. an optional resume (`Trainer.resume`: step, tokens and trained seconds carry on);
3. the timed loop. Each iteration, in this order:
   a. the previous step's host metrics are read (the step was dispatched asynchronously) and logged;
      a non-finite loss or gradient norm stops the run ("non-finite loss"), and a checkpoint this
      invocation wrote of the parameters that produced it (the step before) is discarded;
   b. the stop is decided, checked in this order: a signal (or `stop_after_steps` steps of this
      invocation, as a signal), then `max_steps`, then the time budget (`decide_stop`); with several
      processes `Trainer.agree` makes every process take process 0's clock and any process's signal;
   c. a periodic validation when due (`val_due`: every `val_every_steps` steps, never at the first
      step of an invocation); its time is not counted;
   d. the schedules (`lr_scale`, `muon_momentum`) at the current step and elapsed time; late QAT switched on
      (for good: `RunState.late_qat_step`, checkpointed) when that lr scale is below
      optim.late_qat_threshold; the hooks' `before_step`, one train step;
   e. a periodic checkpoint when due (`checkpoint_due`): the step's metrics are read first, and a
      diverged step is never saved; the save's time is not counted; a save that fails (BadInput,
      e.g. a full disk) stops the run ("checkpoint not written");
4. the hooks' `on_end`; a final checkpoint ("final", or "interrupted" after a signal; none after a
   non-finite loss, so the last finite one stays; saving a step that is already saved is the
   trainer's no-op); unless interrupted, diverged or unsaved, the final evaluation pipeline
   (`frontier_jax.run.final`: the final validation over the whole val split, the artifact, its round trip
   and sliding windows, scored by the same `eval_sums`, and test-time training, `ttt_sums`; a signal stops it
   at once); the summary
   (`Trainer.write_summary`, logged as a table); a failed save is raised last (exit 2).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

from frontier_jax.config import Config, OptimConfig
from frontier_jax.contest import limits
from frontier_jax.errors import BadInput, describe_os_error
from frontier_jax.policies.schedules import late_qat_due, lr_scale, muon_momentum
from frontier_jax.policies.scoring import val_result
from frontier_jax.run import rundir
from frontier_jax.run.endings import (FINAL_VAL_INTERRUPTED, STOP_NONFINITE, STOP_REQUESTED, STOP_SAVE_FAILED,
                                      STOP_WRITE_FAILED, InterruptedBeforeTraining, decide_stop, is_interrupted,
                                      signal_reason)
from frontier_jax.run.final import FinalPlan, run_final
from frontier_jax.run.interface import RunHook, RunState, Trainer


def val_due(step: int, start_step: int, every: int) -> bool:
    """Periodic validation before step `step`+1: every `every` steps (0: never), not at an invocation's start."""
    return bool(every) and step > start_step and step % every == 0


def checkpoint_due(step: int, every: int) -> bool:
    """Periodic checkpoint after step `step` (0: never)."""
    return bool(every) and step % every == 0


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the driver needs from a config (train.* and the schedules' optim.*)."""

    budget_seconds: float
    max_steps: int
    tokens_per_step: int
    val_every_steps: int
    val_max_tokens: int
    warmup_steps: int
    warmup_val_tokens: int
    checkpoint_every_steps: int
    optim: OptimConfig
    stop_after_steps: int | None = None  # tests: behave as if a signal arrived after this many steps
    final: FinalPlan = FinalPlan()  # the final evaluation pipeline (eval.*)

    @classmethod
    def from_config(cls, cfg: Config, stop_after_steps: int | None = None) -> Policy:
        t = cfg.train
        return cls(budget_seconds=t.budget_seconds, max_steps=t.max_steps, tokens_per_step=t.tokens_per_step,
                   val_every_steps=t.val_every_steps, val_max_tokens=t.val_max_tokens,
                   warmup_steps=max(t.compile_warmup_steps, 1), warmup_val_tokens=t.val_batch_seqs * t.seq_len,
                   checkpoint_every_steps=t.checkpoint_every_steps, optim=cfg.optim,
                   stop_after_steps=stop_after_steps, final=FinalPlan.from_config(cfg))


def warm_up(policy: Policy, trainer: Trainer) -> float:
    """The untimed compile warm-up, then reset; returns its seconds. A signal stops it between steps."""
    trainer.log(f"compile warm-up: {policy.warmup_steps} step(s) and the eval step (untimed)")
    t0 = time.perf_counter()
    token = trainer.snapshot()

    def check_signal():
        if trainer.agree(trainer.signals.received is not None, 0.0)[0]:
            raise InterruptedBeforeTraining(trainer.signals.received)

    for i in range(policy.warmup_steps):
        trainer.read_metrics(trainer.train_step(1.0, muon_momentum(policy.optim, i)))
        check_signal()
    trainer.eval_sums(policy.warmup_val_tokens)  # compiles the eval step
    check_signal()
    final = policy.final  # the other programs: every eval geometry of the validations and the final pipeline
    programs = trainer.warm_up_programs([{}, final.geometry(), *([final.geometry(sliding=True)] if final.stride
                                                                   else [])], check_signal)
    check_signal()
    trainer.restore(token)
    seconds = time.perf_counter() - t0
    trainer.log(f"compile warm-up: {'' if programs is None else f'{programs} programs, '}{seconds:.1f} s "
                "(untimed; state reset)")
    return seconds


def run_budgeted(policy: Policy, trainer: Trainer, summary_base: dict, finish_only: bool = False) -> dict:
    """Warm-up, resume, the timed loop and the finish (module docstring); returns the summary dict:
    `summary_base` (config name/hash, run dir, matmul peak, FLOPs per token, ...) plus steps, tokens,
    train seconds, tokens/s, MFU, final train loss, stop reason, `summary_fields()` and the final pipeline's
    entries (`frontier_jax.run.final`). finish_only: the resumed checkpoint is at the run's end and its final
    steps did not complete: no warm-up (nothing is trained: the loop stops before its first step), the
    restored state put in place, then the finish runs the stages that are missing."""
    if finish_only:
        trainer.log("the run reached its end but its final steps did not complete: running them from the last "
                    "checkpoint (no training)")
        trainer.restore(trainer.snapshot())
    else:
        warm_up(policy, trainer)
    resumed = trainer.resume()
    state = resumed or RunState()
    state.start_step = state.step
    if resumed is not None:
        state.saved_step = state.step  # the checkpoint it came from
    if hasattr(trainer.signals, "stopping"):
        trainer.signals.stopping = "stopping after this step" + ("; checkpoint follows" if trainer.checkpoints else "")
    plugins = list(trainer.run_hooks())
    try:
        for h in plugins:
            h.on_start(state)
        try:
            save_error = _timed_loop(policy, trainer, plugins, state)
        except OSError as e:  # e.g. metrics.jsonl on a full disk: one line naming the file, and the summary
            state.stop_reason, save_error = STOP_WRITE_FAILED, BadInput(describe_os_error(e))
        for h in plugins:
            h.on_end(state)
        return _finish(trainer, policy, state, summary_base, save_error)
    finally:
        for h in plugins:
            h.close()


def _record(trainer: Trainer, plugins: list[RunHook], state: RunState, pending: dict,
            metrics: tuple[float, float] | None = None) -> float:
    """Log a dispatched step's metrics row (read now unless given) and run the hooks; the loss, or nan
    when the loss or the gradient norm is not finite."""
    loss, gnorm = metrics if metrics is not None else trainer.read_metrics(pending["handle"])
    last, pending["done"][0] = pending["done"][0], pending["clock"]()  # the step's own rate: arrival to arrival
    row = dict(kind="train", step=pending["step"], loss=loss, grad_norm=gnorm, lr_scale=pending["lr_scale"],
               momentum=pending["momentum"], tokens=pending["tokens"], train_seconds=pending["train_seconds"],
               tokens_per_second=pending["step_tokens"] / max(pending["done"][0] - last, 1e-9),
               loadavg_1m=os.getloadavg()[0])
    trainer.metrics(**row)
    for h in plugins:
        h.after_step(state, row)
    if not math.isfinite(loss) or not math.isfinite(gnorm):
        trainer.log(f"non-finite values after step {row['step']}: loss={loss} grad_norm={gnorm} "
                    f"lr_scale={row['lr_scale']:.4g}")
        return math.nan
    return loss


def _validate(trainer: Trainer, state: RunState, max_tokens: int, final: bool = False, kind: str = "val",
              **geometry) -> dict:
    """Evaluation sums (`geometry`: the eval windows' seq_len / stride where not the training validation's; kind
    "ttt": the test-time training pass, `Trainer.ttt_sums`) and their metrics row."""
    v = val_result(trainer.ttt_sums() if kind == "ttt" else trainer.eval_sums(max_tokens, **geometry))
    trainer.metrics(kind=kind, step=state.step, tokens=state.tokens, train_seconds=state.train_seconds,
                    loss=v["loss"], bpb=v["bpb"], val_tokens=v["tokens"], **({"final": True} if final else {}))
    return v


def _timed_loop(policy: Policy, trainer: Trainer, plugins: list[RunHook], s: RunState) -> BadInput | None:
    """Steps until a stop (s.stop_reason); returns the error of a periodic save that failed, if any."""
    pending, done, t0 = None, [s.train_seconds], time.perf_counter()  # done: when the last step's metrics came
    def clock() -> float:  # the timed clock: validations and checkpoints excluded
        return s.train_seconds + time.perf_counter() - t0
    while True:
        if pending is not None:  # host metrics of the previous step (dispatch stays one step ahead)
            s.final_loss = _record(trainer, plugins, s, pending)
            if not math.isfinite(s.final_loss):
                _diverged(trainer, s, pending["step"])
                break
            pending = None
        received = trainer.signals.received or (
            STOP_REQUESTED if policy.stop_after_steps is not None and s.step - s.start_step >= policy.stop_after_steps
            else None)
        stop_now, elapsed = trainer.agree(received is not None, s.train_seconds + time.perf_counter() - t0)
        s.stop_reason = decide_stop((received or STOP_REQUESTED) if stop_now else None, s.step, policy.max_steps,
                                    elapsed, policy.budget_seconds)
        if s.stop_reason is not None:
            break
        if val_due(s.step, s.start_step, policy.val_every_steps):
            s.train_seconds = elapsed
            v = _validate(trainer, s, policy.val_max_tokens)
            trainer.log(f"step {s.step} val loss {v['loss']:.4f} bpb {v['bpb']:.4f} ({v['tokens']:,} tokens)")
            t0 = time.perf_counter()
            elapsed = s.train_seconds
        scale = lr_scale(policy.optim, s.step, elapsed, policy.budget_seconds, policy.max_steps)
        mom = muon_momentum(policy.optim, s.step)
        if s.late_qat_step is None and late_qat_due(policy.optim, scale):
            s.late_qat_step = s.step
            trainer.log(f"late QAT on from step {s.step + 1} (lr scale {scale:.4f} < optim.late_qat_threshold="
                        f"{policy.optim.late_qat_threshold})")
        for h in plugins:
            h.before_step(s)
        handle = trainer.train_step(scale, mom, s.late_qat_step is not None)
        s.step += 1
        s.tokens += policy.tokens_per_step
        pending = dict(step=s.step, handle=handle, lr_scale=scale, momentum=mom, tokens=s.tokens, train_seconds=clock(),
                       step_tokens=policy.tokens_per_step, clock=clock, done=done)
        if trainer.checkpoints and checkpoint_due(s.step, policy.checkpoint_every_steps):
            metrics = trainer.read_metrics(handle)  # waits for the step: its time counts
            s.final_loss = _record(trainer, plugins, s, pending, metrics)
            s.train_seconds, t0 = clock(), time.perf_counter()
            if not math.isfinite(s.final_loss):  # never save a checkpoint of a diverged step
                _diverged(trainer, s, s.step)
                break
            pending = None
            try:
                _save(trainer, s, "periodic")
            except BadInput as e:
                s.stop_reason = STOP_SAVE_FAILED
                return e
            t0 = time.perf_counter()
    s.train_seconds += time.perf_counter() - t0
    return None


def _diverged(trainer: Trainer, s: RunState, at_step: int) -> None:
    """Stop for a non-finite loss at `at_step`. The checkpoint of the step before holds the parameters
    that produced it: discard it if this invocation wrote it, so the last one kept is the last finite one."""
    s.stop_reason = STOP_NONFINITE
    bad = at_step - 1
    if trainer.checkpoints and s.saved_step == bad and bad > s.start_step:
        trainer.discard(bad)
        s.saved_step = None
        trainer.log(f"removed checkpoint step {bad}: its parameters gave the non-finite loss of step {at_step}")


def _save(trainer: Trainer, s: RunState, reason: str) -> None:
    trainer.save(s, reason)
    s.saved_step = s.step


def _finish(trainer: Trainer, policy: Policy, s: RunState, summary_base: dict,
            save_error: BadInput | None) -> dict:
    interrupted = is_interrupted(s.stop_reason)
    if s.stop_reason == STOP_NONFINITE:
        trainer.log(f"STOP: non-finite training loss at step {s.step}; the last checkpoint kept is the last finite one")
    elif trainer.checkpoints and (save_error is None or s.stop_reason == STOP_WRITE_FAILED):
        try:
            _save(trainer, s, "interrupted" if interrupted else "final")
        except BadInput as e:
            save_error, s.stop_reason = save_error or e, s.stop_reason if save_error else STOP_SAVE_FAILED
    summary = {**summary_base, "steps": s.step, "tokens": s.tokens, "train_seconds": s.train_seconds,
               "tokens_per_second": s.tokens / s.train_seconds if s.train_seconds > 0 else None,
               "final_train_loss": s.final_loss, "stop_reason": s.stop_reason,
               **({"late_qat_step": s.late_qat_step} if s.late_qat_step is not None else {}),
               **trainer.summary_fields()}
    if save_error is not None:
        summary["error"] = str(save_error)
        trainer.log(f"STOP: {save_error}")
    peak, fpt = summary.get("matmul_peak_flops"), summary.get("flops_per_token")
    if summary["tokens_per_second"] and peak and fpt:
        summary["mfu"] = summary["tokens_per_second"] * fpt / peak
    if not interrupted and s.stop_reason not in (STOP_NONFINITE, STOP_SAVE_FAILED, STOP_WRITE_FAILED):
        sig = trainer.signals
        if hasattr(sig, "interrupt"):  # a signal now stops the evaluation at once (the checkpoint is saved)
            sig.stopping, sig.interrupt = "stopping the final validation (the checkpoint is saved)", True
        try:  # the final validation, the artifact, its round trip and sliding windows (frontier_jax.run.final)
            run_final(trainer, policy.final, lambda kind, final=False, **geometry: _validate(
                trainer, s, 0, final=final, kind=kind, **geometry), summary)
        except KeyboardInterrupt:
            s.stop_reason = summary["stop_reason"] = f"{signal_reason(sig.received)} {FINAL_VAL_INTERRUPTED}"
            trainer.log(f"final validation interrupted ({sig.received}); checkpoint step {s.saved_step} is saved")
        finally:
            if hasattr(sig, "interrupt"):
                sig.interrupt = False
    summary.update(limits.end_of_run(summary))  # the rules profile, the size rule (frontier_jax.contest)
    try:
        trainer.write_summary(summary)
    except OSError as e:
        if save_error is None:
            raise
        trainer.log(f"summary not written either: {describe_os_error(e)}")
    trainer.log("summary:\n" + rundir.format_table(rundir.summary_rows(summary)))
    if save_error is not None:
        raise save_error
    return summary
