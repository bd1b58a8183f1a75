"""The final evaluation both trainers run after training, in record 2026-03-23's order (docs/evaluation.md):

1. the averaged weights (`Trainer.final_weights`: the hook where averaged weights replace the trained ones;
   by default none, the trained weights are scored);
2. the final validation, the record's DIAGNOSTIC line: non-overlapping windows of train.seq_len over the whole
   val split on those weights (summary `val_bpb`);
3. the artifact (`Trainer.roundtrip`: eval.artifact, int8+zlib or int6+lzma, written and read back) and its size
   lines;
4. the round trip: non-overlapping windows of eval.seq_len on the artifact's dequantized weights
   (`final_int8_zlib_roundtrip` / `final_int6_roundtrip` and their `_exact` lines);
5. with eval.stride > 0, sliding windows at that stride on the same weights, every target scored exactly once
   (`final_int8_zlib_sliding_window` / `final_int6_sliding_window`, `stride:N`, and `_exact`);
6. with ttt.enabled, score-first test-time training from the same dequantized weights (`Trainer.ttt_sums`,
   frontier_jax.ttt: the record's progress lines, then `legal_ttt` and `legal_ttt_exact`).

Which of those lines is the run's score is eval.score (summary.json `score`: the line's name, loss and bpb).
Every evaluation returns sums (the trainer's `eval_sums`, the training forward). Each stage's sums are recorded
as soon as it is done (`Trainer.record_final`), so that a run stopped in its final steps (a signal, a full disk,
a kill) is finished by `--resume` from its last checkpoint running only the stages that are missing
(`Trainer.final_records`); summary.json's `final_complete` says that every stage is done. The score lines end
with the run's rules tag (`frontier_jax.contest.limits.end_of_run`, known once the artifact's size is). No JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from frontier_jax.config import Config, line_name
from frontier_jax.errors import BadInput, describe_os_error
from frontier_jax.policies.scoring import val_result
from frontier_jax.contest import limits
from frontier_jax.run import roundtrip, rundir

STAGES = rundir.FINAL_STAGES  # the records of `Trainer.record_final`, in pipeline order
TTT_FIELDS = tuple(rundir.TTT_RECORD)  # what the TTT stage records beside its sums (summary.json: ttt_<field>)


@dataclasses.dataclass(frozen=True)
class FinalPlan:
    """What the final pipeline does (a config's eval section, resolved against train)."""

    artifact: str = "int8_zlib"  # eval.artifact
    seq_len: int = 0  # T of the round trip and the sliding windows when it is not train.seq_len (0: the same)
    stride: int = 0  # eval.stride (0: no sliding-window line)
    score: str = "roundtrip"  # eval.score
    ttt: bool = False  # ttt.enabled: the TTT stage after the sliding windows

    @classmethod
    def from_config(cls, cfg: Config) -> FinalPlan:
        T = cfg.eval_seq_len
        return cls(artifact=cfg.eval.artifact, seq_len=0 if T == cfg.train.seq_len else T, stride=cfg.eval.stride,
                   score=cfg.eval.score, ttt=cfg.ttt.enabled)

    def line(self, stage: str) -> str:
        """The name of a stage's score line (`roundtrip`, `sliding`, `ttt`), e.g. final_int6_sliding_window."""
        return line_name(self.artifact, stage)

    def geometry(self, sliding: bool = False) -> dict:
        """The keyword arguments of `Trainer.eval_sums` for the round trip (or the sliding windows): none where
        they are the training validation's, so a trainer that knows only that one runs the baseline's pipeline."""
        kw = {"seq_len": self.seq_len} if self.seq_len else {}
        return {**kw, "stride": self.stride} if sliding else kw

    def stages(self) -> tuple[str, ...]:
        """The stages this plan needs before the run counts as finished."""
        return STAGES[:2] + self.evaluations()

    def evaluations(self) -> tuple[str, ...]:
        """The evaluations of the artifact's weights, in order: the round trip, the sliding windows, TTT."""
        return ("roundtrip",) + (("sliding",) if self.stride else ()) + (("ttt",) if self.ttt else ())


def run_final(trainer, plan: FinalPlan, validate: Callable[..., dict], summary: dict) -> None:
    """The pipeline of the module docstring, its entries added to `summary` as each stage is done (also when a
    signal stops it: KeyboardInterrupt goes to the caller). `validate(kind, final=False, **geometry)` evaluates the
    whole val split (trainer.eval_sums) and logs its metrics row. An artifact that cannot be written or read is
    logged and reported as `roundtrip_error`, the stages before it kept."""
    records = dict(trainer.final_records())
    if plan.seq_len:
        summary["eval_seq_len"] = plan.seq_len
    if records:
        trainer.log(f"final steps recorded by an earlier invocation: {', '.join(s for s in STAGES if s in records)}; "
                    "running the rest")
        for stage, fields in records.items():
            _enter(summary, plan, stage, fields)

    def record(stage: str, fields: dict) -> None:
        records[stage] = fields
        trainer.record_final(dict(records))
        _enter(summary, plan, stage, fields)

    def timed(kind: str, **kw) -> dict:
        v = roundtrip.timed(lambda: validate(kind, **kw))
        return {k: v[k] for k in ("nll_sum_nats", "tokens", "bytes", "eval_seconds", *TTT_FIELDS) if k in v}

    label = trainer.final_weights()  # averaged weights (the EMA) in place of the trained ones, if any
    if label is not None:
        trainer.log(f"final evaluation on the {label} weights")
    label = label or "trained"
    try:
        if "val" not in records:
            record("val", timed("val", final=True))
        if plan.artifact == "int6_lzma":
            trainer.log(f"DIAGNOSTIC {label} val_loss:{summary['val_loss']:.4f} val_bpb:{summary['val_bpb']:.4f} "
                        f"eval_time:{1000.0 * records['val']['eval_seconds']:.0f}ms")
        try:
            if any(s not in records for s in plan.stages()):
                _artifact_stages(trainer, plan, timed, record, records, summary)
        except (OSError, BadInput) as e:
            msg = describe_os_error(e) if isinstance(e, OSError) else str(e)
            trainer.log(f"{roundtrip.FORMAT_LABELS[plan.artifact]} round trip failed: {msg}")
            summary["roundtrip_error"] = msg
    finally:
        if plan.score in records:
            v = val_result(records[plan.score])
            summary["score"] = {"line": plan.line(plan.score), "val_loss": v["loss"], "val_bpb": v["bpb"]}
        summary["final_complete"] = all(s in records for s in plan.stages()) and "roundtrip_error" not in summary


def _artifact_stages(trainer, plan: FinalPlan, timed, record, records: dict, summary: dict) -> None:
    """The artifact and the evaluations of its weights that are missing (`Trainer.roundtrip`); each logged with
    the lines of the script that defines it and recorded as it is done."""
    stages = plan.evaluations()

    def evaluate(info: dict | None = None) -> dict:
        summary.setdefault("artifact_format", plan.artifact)  # (the score lines' names)
        if info is not None:  # the artifact is written: its size lines before the scores, as the scripts print them
            _artifact_done(trainer, record, summary, info)
        for stage in stages:
            if stage not in records:
                record(stage, timed(stage, **plan.geometry(sliding=stage == "sliding")))
            if info is not None:  # (else once the artifact is known: the lines end with its size verdict)
                for line in roundtrip.stage_lines(summary, stage):
                    trainer.log(line)
        return dict(records["roundtrip"])

    result = trainer.roundtrip(evaluate)
    if result is not None and "artifact" not in records:  # a trainer that does not hand its info to `evaluate`
        _artifact_done(trainer, record, summary, result)
        for line in (line for stage in stages for line in roundtrip.stage_lines(summary, stage)):
            trainer.log(line)


def _artifact_done(trainer, record, summary: dict, info: dict) -> None:
    record("artifact", roundtrip.artifact_fields(info))
    for line in roundtrip.export_lines(summary):
        trainer.log(line)


def _enter(summary: dict, plan: FinalPlan, stage: str, fields: dict) -> None:
    """summary.json's entries of one stage's record (`val_*`, `roundtrip_val_*`, `sliding_val_*`, the artifact's
    and, with the artifact's size, the rules tag)."""
    if stage == "artifact":
        summary.update(fields)
        summary.update(limits.end_of_run(summary))
        return
    v = val_result(fields)
    prefix = "" if stage == "val" else f"{stage}_"
    summary.update({f"{prefix}val_loss": v["loss"], f"{prefix}val_bpb": v["bpb"],
                    f"{prefix}val_nll_sum_nats": v["nll_sum_nats"], f"{prefix}val_tokens": v["tokens"],
                    f"{prefix}val_bytes": v["bytes"]})
    if stage != "val":
        summary[f"{stage}_eval_seconds"] = fields["eval_seconds"]
    if stage == "sliding":
        summary["sliding_stride"] = plan.stride
    summary.update({f"ttt_{k}": fields[k] for k in TTT_FIELDS if k in fields})
