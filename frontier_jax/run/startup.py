"""A run's start-up, written once for both trainers: signals, claiming the run directory, the release,
and the lines every run log starts with.

`start_run` is the lifecycle (`frontier_jax.trainer.run` and `baseline_torch.train.run` call it): the
signal handlers first (a signal during set-up or warm-up stops cleanly), the trainer's set-up (every
input checked before anything is written), a signal by then stopping with nothing written, the run
directory created and locked (`rundir.claim_run_dir`: one process per directory), the trainer's body,
and on every way out the lock released and the log closed. `start_lines` are the start-up lines both
trainers log about the data, the step, the model and the MFU denominator. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from frontier_jax.run import rundir
from frontier_jax.config import Config, config_hash, model_hash
from frontier_jax.errors import BadInput
from frontier_jax.run.endings import BEFORE_TRAINING, STOP_FINISHED, InterruptedBeforeTraining, signal_reason
from frontier_jax.run.rundir import RunLog, Signals


@dataclasses.dataclass
class Start:
    """One invocation's start, as the body of `start_run` sees it."""

    out_dir: Path
    resume: bool
    signals: Signals
    created: bool = False  # the run directory did not exist before this start claimed it
    resumed_step: int | None = None  # the checkpoint's step, once the body has read it (a resume)

    def check(self) -> None:
        """Between two phases of the set-up (before the first step): a signal received by now stops the start
        (InterruptedBeforeTraining: nothing trained, exit 130) instead of the next phase running."""
        if self.signals.received:
            raise InterruptedBeforeTraining(self.signals.received)


def start_run(out_dir: Path, resume: bool, log: RunLog, setup: Callable[[Callable[[], None]], Any],
              body: Callable[[Any, Start], dict], claim: Callable[[Any], tuple] | None = None) -> dict:
    """The start-up lifecycle; returns the summary `body(setup(), start)` returns, or the "before training"
    summary of a signal before the first timed step.

    1. SIGINT/SIGTERM/SIGHUP are handled from here on (`rundir.Signals`);
    2. `setup(check)` checks every input and builds what it can before anything is written, calling `check`
       (`Start.check`) between its phases, so a signal stops it there;
    3. a signal by then: nothing written, no run directory;
    4. `claim(prepared)` -> (lock or None, created) takes the run directory (default
       `rundir.claim_run_dir(out_dir, resume)`; the JAX trainer's agrees across processes);
    5. `body(prepared, start)`: a signal in its warm-up (InterruptedBeforeTraining) gives the "before
       training" summary and removes a directory this start created (the body calls `start.check` between
       its own phases before the warm-up); a BadInput before the first
       metrics row removes such a directory too (a failed start leaves no partial run);
    6. the lock is released and `log` closed, however it ends."""
    out_dir = Path(out_dir)
    try:
        with Signals() as signals:
            start = Start(out_dir, resume, signals)
            try:
                prepared = setup(start.check)
            except InterruptedBeforeTraining:
                return stopped_before_training(start)
            if signals.received:
                return stopped_before_training(start)
            lock, start.created = claim(prepared) if claim else rundir.claim_run_dir(out_dir, resume)
            if start.created:
                signals.discard = lambda: shutil.rmtree(out_dir, ignore_errors=True)
            try:
                return body(prepared, start)
            except InterruptedBeforeTraining:
                return stopped_before_training(start)
            except BadInput:
                if start.created and not (out_dir / rundir.METRICS).exists():
                    shutil.rmtree(out_dir, ignore_errors=True)
                raise
            finally:
                if lock:
                    lock.release()
    finally:
        log.close()


def stopped_before_training(start: Start) -> dict:
    """A signal before the first step: nothing trained, nothing to save; a new run directory is removed."""
    if start.created:
        shutil.rmtree(start.out_dir, ignore_errors=True)
    step = start.resumed_step
    return {"stop_reason": f"{signal_reason(start.signals.received)} {BEFORE_TRAINING}", "steps": step or 0,
            "run_dir": str(start.out_dir), "checkpoint_step": step if start.resume else None}


def finished_summary(out_dir: Path, meta: dict, train_cfg) -> dict:
    """What `--resume` of a finished run returns (its summary, stop_reason "already finished", a note)."""
    path = out_dir / rundir.SUMMARY_JSON
    summary = rundir.read_json_object(path, "run summary") if path.is_file() else {}
    limit = "max_steps" if meta["step"] >= train_cfg.max_steps else "budget_seconds"
    return {**summary, "stop_reason": STOP_FINISHED, "steps": meta["step"], "run_dir": str(out_dir),
            "note": f"{out_dir}: already finished at step {meta['step']} (train.{limit} reached); nothing to do: "
                    "raise train.max_steps or --budget to continue"}


def run_line(program: str, out_dir: Path, cfg: Config, git: str) -> str:
    """The run log's first line: which trainer, where, which config, which code."""
    return f"{program} run {out_dir} | config {cfg.name} ({config_hash(cfg)}) | git {git}"


def start_lines(cfg: Config, data, train_shards: int, accum: int, micro_seqs: int, num_params: int,
                peak_info: dict, peak_scope: str = "") -> list[str]:
    """The start-up lines both trainers log: the data (`train_shards` of `data`'s train split, the val
    targets, the tokenizer), its provenance, the step's split into micro-batches, the model's size and
    hash, and the MFU denominator (`peak_info`, {} when not measured; `peak_scope`, e.g. "all devices")."""
    t = cfg.train
    peak = peak_info.get("matmul_peak_flops")
    scope = f", {peak_scope}" if peak_scope else ""
    return [
        f"data {cfg.data.data_dir}: {train_shards} train shards, {data.val_tokens.size - 1:,} val targets | "
        f"tokenizer {data.tokenizer.path}",
        f"data provenance: {data.provenance}",
        f"step = {t.tokens_per_step:,} tokens = {accum} micro-batch(es) of {micro_seqs} x {t.seq_len}",
        f"model: {num_params:,} parameters, hash {model_hash(cfg)}",
        f"matmul peak (MFU denominator{scope}): {peak / 1e9:,.1f} GFLOP/s, {peak_info['peak_source']}" if peak
        else "matmul peak not measured (train.measure_peak=False): no MFU",
    ]
