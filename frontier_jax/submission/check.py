"""The submission check: a run directory against a rules profile, one verdict per rule with its evidence.

`check_run(run_dir, profile_name)` reads what the run recorded (config.json, summary.json, env.json,
code.json, ngram-p0/runtime.json, ttt.jsonl: frontier_jax.run.rundir, frontier_jax.contest.codebytes,
frontier_jax.submission.evidence) and runs the check of every rule of the profile (`CHECKS`, by rule id).
Verdicts: pass, fail, not checkable (the profile states no limit, or the run lacks the record, or the code
changed since the run), not applicable (e.g. TTT order for a run without TTT). The checks that run the
model (one forward, causal, normalized) need the run's recorded code to be the code here (code.json's
sha256 of every file): they trace and run this checkout's code at the run's config.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

from frontier_jax.config import Config, DataConfig
from frontier_jax.contest import codebytes, limits
from frontier_jax.contest.rules import (ARTIFACT, FAIL, NOT_APPLICABLE, NOT_CHECKABLE, PASS, SCORED_VAL, TRAIN_SHARDS,
                                        VAL_SPLIT, Profile, Rule, Verdict, profile)
from frontier_jax.data.shards import DataError
from frontier_jax.run import rundir
from frontier_jax.submission import envscan, evidence, forward
from frontier_jax.submission.forward import SHOW


@dataclasses.dataclass
class Run:
    """What a run directory recorded (absent records are None / {})."""

    dir: Path
    cfg: Config
    summary: dict
    env: dict
    code: list | None  # codebytes.CodeFile
    ngram: dict | None
    ttt: list | None  # evidence.TTTEvent

    @functools.cached_property
    def changed_code(self) -> list[str] | None:
        """The recorded files missing or changed here (None: no code.json)."""
        return None if self.code is None else codebytes.changed(self.code)

    @property
    def hardware(self) -> limits.RunHardware:
        hw = limits.RunHardware.of(self.summary, self.env)
        n = self.cfg.parallel.num_devices
        return dataclasses.replace(hw, devices=n) if n else hw

    @functools.cached_property
    def measured(self) -> tuple[Verdict, Verdict]:
        return forward.causal_and_normalized(self.cfg)


def load_run(run_dir) -> Run:
    """A run's records; DataError / ConfigError (one line naming the file) when it is not a run or a record
    is unreadable."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: run directory does not exist")
    cfg = rundir.read_config(run_dir)
    summary_path = run_dir / rundir.SUMMARY_JSON
    summary = rundir.read_json_object(summary_path, "run summary") if summary_path.is_file() else {}
    return Run(run_dir, cfg, summary, rundir.read_env(run_dir), codebytes.read_record(run_dir),
               evidence.read_ngram_record(run_dir), evidence.read_ttt_log(run_dir))


def _code_unchanged(run: Run, rule: Rule) -> Verdict | None:
    """A not-checkable verdict when the run's code is unrecorded or differs from this checkout's; else None."""
    if run.changed_code is None:
        return Verdict(rule.id, NOT_CHECKABLE, f"the run recorded no {codebytes.RECORD} (which code it ran is unknown)")
    if run.changed_code:
        return Verdict(rule.id, NOT_CHECKABLE, f"the code here is not the code the run imported "
                                               f"({len(run.changed_code)} file(s): {'; '.join(run.changed_code[:SHOW])})")
    return None


# ----------------------------------------------------------------------------- the checks, by rule id


def check_size(run: Run, rule: Rule, prof: Profile) -> Verdict:
    s = run.summary
    if s.get("artifact_bytes") is None:
        return Verdict(rule.id, NOT_CHECKABLE, "the run has no int8+zlib artifact (no round trip in summary.json)")
    art = Path(s.get("artifact") or "")
    if art.is_file():
        art_bytes, art_where = art.stat().st_size, art.name
    else:
        art_bytes, art_where = int(s["artifact_bytes"]), "summary.json (the artifact file is absent)"
    if run.code is None:
        return Verdict(rule.id, NOT_CHECKABLE, f"artifact {art_bytes:,} bytes; the run recorded no "
                                               f"{codebytes.RECORD}, so its code bytes are not known")
    code = sum(f.bytes for f in run.code)
    detail = f"artifact: {art_where}; code: {len(run.code)} files in {codebytes.RECORD}, their UTF-8 bytes"
    return limits.size_verdict(rule, art_bytes, code, detail)


def check_train_time(run: Run, rule: Rule, prof: Profile) -> Verdict:
    v = limits.time_verdict(rule, run.summary.get("train_seconds"), "trained", run.hardware, prof.hardware)
    extra = ""
    if run.cfg.ngram.enabled:
        extra = "; the n-gram builder ran inside it (it starts and stops with the timed budget)"
    return dataclasses.replace(v, evidence=v.evidence + extra)


EVAL_STAGES = ("roundtrip", "sliding", "ttt")  # the evaluations of the artifact a run times (frontier_jax.run.final)


def check_eval_time(run: Run, rule: Rule, prof: Profile) -> Verdict:
    stages = [s for s in EVAL_STAGES if run.summary.get(f"{s}_eval_seconds") is not None]
    seconds = sum(run.summary[f"{s}_eval_seconds"] for s in stages) if stages else None
    return limits.time_verdict(rule, seconds, f"the artifact's evaluation (full val split: {' + '.join(stages)})",
                               run.hardware, prof.hardware)


def check_no_env(run: Run, rule: Rule, prof: Profile) -> Verdict:
    if run.code is None:
        return Verdict(rule.id, NOT_CHECKABLE, f"the run recorded no {codebytes.RECORD} (which files it imported is "
                                               "unknown)")
    paths, missing = [], []  # the files as the run had them (by sha256), and the ones that are not
    for f in run.code:
        p = codebytes.current_path(f) if f.path.endswith(".py") else None
        if p is not None and codebytes.sha256(p) == f.sha256:
            paths.append(p)
        elif f.path.endswith(".py"):
            missing.append(f"{f.path} ({'changed' if p else 'missing'})")
    findings, unreadable = envscan.scan_files(paths)
    if findings:
        return Verdict(rule.id, FAIL, f"{len(findings)} environment access(es) in the code the run imported: "
                                      + "; ".join(str(f) for f in findings[:SHOW]))
    missing += unreadable
    if missing:
        return Verdict(rule.id, NOT_CHECKABLE, f"no environment access in {len(paths)} files, but "
                                               f"{len(missing)} cannot be scanned as the run had them: "
                                               + "; ".join(missing[:SHOW]))
    return Verdict(rule.id, PASS, f"no environment access (os.environ, getenv, ... in any spelling; AST scan) in "
                                  f"the {len(paths)} Python files the run imported ({codebytes.RECORD}), its "
                                  "config file included")


def check_one_forward(run: Run, rule: Rule, prof: Profile) -> Verdict:
    return _code_unchanged(run, rule) or forward.one_forward(run.cfg, platform=run.env.get("backend") or "cpu")


def check_causal(run: Run, rule: Rule, prof: Profile) -> Verdict:
    return _code_unchanged(run, rule) or run.measured[0]


def check_normalized(run: Run, rule: Rule, prof: Profile) -> Verdict:
    return _code_unchanged(run, rule) or run.measured[1]


def _eval_sources(run: Run) -> tuple[list[tuple[str, str]], str | None]:
    """([(source kind, evidence)], a reason the sources are unknown or None)."""
    s = run.summary
    art = f"{int(s['artifact_bytes']):,} bytes, counted in the size" if s.get("artifact_bytes") is not None else \
        "no artifact recorded"
    sources = [(ARTIFACT, f"the artifact ({art})")]
    if run.cfg.ngram.enabled:
        rec = run.ngram
        if rec is None:
            return sources, f"n-gram tables are on, but the run has no {evidence.NGRAM_RECORD}"
        d = run.cfg.data
        splits = {evidence.shard_split(p, d.train_pattern, d.val_pattern) for p in rec.get("builder_shards", [])}
        kind = TRAIN_SHARDS if splits == {"train"} else VAL_SPLIT if "val" in splits else None
        if kind is None:
            return sources, f"the n-gram builder's shards are of no known split: {rec.get('builder_shards')}"
        table = int(rec.get("table_bytes") or run.cfg.ngram.table_bytes)
        final = (rec.get("final") or {}).get("snapshot")
        disk = f", snapshot {evidence.dir_bytes(final):,} bytes on disk" if final and Path(final).exists() else ""
        names = [Path(p).name for p in rec.get("builder_shards", [])]
        sources.append((kind, f"n-gram tables built from {len(names)} {kind} ({', '.join(names[:SHOW])}): "
                              f"{table:,} bytes in memory{disk}, not in the artifact"))
    if run.ttt is not None:
        sources.append((SCORED_VAL, f"test-time training on scored val tokens ({evidence.TTT_LOG}: "
                                    f"{len(run.ttt)} events)"))
    return sources, None


def check_eval_data(run: Run, rule: Rule, prof: Profile) -> Verdict:
    sources, unknown = _eval_sources(run)
    if unknown:
        return Verdict(rule.id, NOT_CHECKABLE, unknown)
    bad = [ev for kind, ev in sources if kind not in rule.allows and kind not in rule.unstated]
    unstated = [ev for kind, ev in sources if kind in rule.unstated]
    if bad:
        return Verdict(rule.id, FAIL, f"{prof.name} allows eval-time state from {' and '.join(rule.allows)} only: "
                                      + "; ".join(bad))
    listing = "; ".join(ev for _, ev in sources)
    if unstated:
        return Verdict(rule.id, NOT_CHECKABLE, f"{listing} ({prof.name} states no rule on {' or '.join(rule.unstated)})")
    return Verdict(rule.id, PASS, listing)


def check_train_data_in_time(run: Run, rule: Rule, prof: Profile) -> Verdict:
    uses = ["the trainer's steps (timed)", "the int8 quantization reads no data (per-row percentile clip, "
                                           "no calibration)"]
    if run.cfg.ngram.enabled:
        final = (run.ngram or {}).get("final")
        steps = run.summary.get("steps")
        if not final or steps is None:
            return Verdict(rule.id, NOT_CHECKABLE, "n-gram tables are on, but the run recorded no final snapshot "
                                                   f"step ({evidence.NGRAM_RECORD}) or no step count")
        if final.get("step") != steps:
            return Verdict(rule.id, FAIL, f"the n-gram builder's final snapshot was taken at step {final.get('step')}, "
                                          f"not at the end of the timed budget (step {steps})")
        uses.append(f"the n-gram builder (started with the timed budget, stopped at its end: step {steps}; the "
                    "compile warm-up's steps are discarded)")
    return Verdict(rule.id, PASS, "training data is read by " + "; ".join(uses))


def check_val_not_in_training(run: Run, rule: Rule, prof: Profile) -> Verdict:
    d = run.cfg.data
    parts = [f"the trainer reads data.train_pattern {d.train_pattern!r} shards, the evaluation "
             f"{d.val_pattern!r}; the start-up refuses a file in both and a val split whose documents occur in "
             f"train over data.max_val_duplicate_share={d.max_val_duplicate_share}"]
    if run.cfg.ngram.enabled and run.ngram is not None:
        splits = {evidence.shard_split(p, d.train_pattern, d.val_pattern) for p in run.ngram.get("builder_shards", [])}
        if splits != {"train"}:
            return Verdict(rule.id, FAIL, f"the n-gram builder read shards of {sorted(splits)}: "
                                          f"{run.ngram.get('builder_shards')}")
        parts.append("the n-gram builder read train shards only")
    if d.max_val_duplicate_share > DataConfig().max_val_duplicate_share:
        return Verdict(rule.id, NOT_CHECKABLE, parts[0] + " (a share that lets val documents into training)")
    return Verdict(rule.id, PASS, "; ".join(parts))


def check_ttt_order(run: Run, rule: Rule, prof: Profile) -> Verdict:
    if run.ttt is None:
        return Verdict(rule.id, NOT_APPLICABLE, f"no {evidence.TTT_LOG}: the run has no test-time training")
    order = evidence.ttt_order(run.ttt, str(run.dir / evidence.TTT_LOG))
    what = f"{evidence.TTT_LOG}: {order.events} events over {order.chunks} chunks"
    if not rule.known:
        found = f"; {len(order.order_violations)} would break score-before-update" if order.order_violations else ""
        return Verdict(rule.id, NOT_CHECKABLE, f"{what}{found} ({prof.name} states no rule on test-time training)")
    if order.order_violations:
        return Verdict(rule.id, FAIL, f"{what}: " + "; ".join(order.order_violations[:SHOW]))
    return Verdict(rule.id, PASS, f"{what}: every chunk scored before it is trained on, no trained target scored "
                                  "later, every trained target scored before")


def check_single_pass(run: Run, rule: Rule, prof: Profile) -> Verdict:
    if run.ttt is not None:
        order = evidence.ttt_order(run.ttt, str(run.dir / evidence.TTT_LOG))
        if order.pass_violations:
            return Verdict(rule.id, FAIL, "; ".join(order.pass_violations[:SHOW]))
        return Verdict(rule.id, PASS, f"{evidence.TTT_LOG}: {order.events} events, the scored ranges disjoint and "
                                      "in increasing order")
    from frontier_jax.data.stream import val_batches
    from frontier_jax.policies.scoring import val_window_tokens

    T, B = run.cfg.train.seq_len, run.cfg.train.val_batch_seqs
    ids = np.arange(7 * T + T // 2, dtype=np.int64)  # target i is token id i: a probe split of 7.5 windows
    toks = val_window_tokens(ids, 0, T)
    scored = np.concatenate([y[m.astype(bool)] for _, y, m in val_batches(toks, T, B)])
    once = np.array_equal(scored, np.arange(1, toks.size))
    n = run.summary.get("roundtrip_val_tokens")
    ev = (f"the run's evaluation (whole seq_len={T} windows, {B} per batch; weights fixed: no {evidence.TTT_LOG}) "
          f"scores the {toks.size - 1} targets of a probe split {'each once, in order' if once else 'NOT once each'}"
          + (f"; the round trip scored {n:,} targets" if n else ""))
    return Verdict(rule.id, PASS if once else FAIL, ev)


CHECKS = {
    "size": check_size, "train_time": check_train_time, "eval_time": check_eval_time, "no_env": check_no_env,
    "one_forward": check_one_forward, "eval_data": check_eval_data, "train_data_in_time": check_train_data_in_time,
    "val_not_in_training": check_val_not_in_training, "ttt_order": check_ttt_order, "causal": check_causal,
    "normalized": check_normalized, "single_pass": check_single_pass,
}


def check_run(run_dir, profile_name: str | None = None) -> tuple[Profile, Run, list[Verdict]]:
    """(the profile, the run's records, one verdict per rule of the profile, in the profile's order)."""
    run = load_run(run_dir)
    prof = profile(profile_name or run.cfg.rules.profile)
    return prof, run, [CHECKS[r.id](run, r, prof) for r in prof.rules]


def exit_code(verdicts: list[Verdict]) -> int:
    """0 when no rule fails (every checkable rule passes), 1 when one does."""
    return 1 if any(v.verdict == FAIL for v in verdicts) else 0


def report(prof: Profile, run: Run, verdicts: list[Verdict]) -> str:
    rules = {r.id: r for r in prof.rules}
    width = max(len(v.rule) for v in verdicts)
    claimed = run.cfg.rules.profile
    head = [f"submission check {run.dir}: rules {prof.name}"
            + ("" if claimed == prof.name else f" (the run's own profile: {claimed})"),
            f"  {prof.summary}"]
    lines = [f"{v.rule:<{width}}  {v.verdict:<14}  {rules[v.rule].title}: {v.evidence}" for v in verdicts]
    counts = {k: sum(v.verdict == k for v in verdicts) for k in (PASS, FAIL, NOT_CHECKABLE, NOT_APPLICABLE)}
    failed = [v.rule for v in verdicts if v.verdict == FAIL]
    tail = (f"{'FAIL' if failed else 'PASS'}: {counts[PASS]} pass, {counts[FAIL]} fail"
            + (f" ({', '.join(failed)})" if failed else "")
            + f", {counts[NOT_CHECKABLE]} not checkable, {counts[NOT_APPLICABLE]} not applicable")
    return "\n".join(head + lines + [tail])
