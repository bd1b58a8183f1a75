"""What one run of `python -m frontier_jax.compare` produced: status, scores, curve, throughput over time.

Scores (`stage_scores`). Every run has a plain score, the final `val_bpb` (summary.json's `val_bpb` for a
jax/torch arm; for a `cmd:` arm the last line of its output, other than the final score lines below, with a
`val_bpb:` value: the official script's last `step:N/M val_loss:... val_bpb:` line, the record's DIAGNOSTIC line),
and may have the final pipeline's scores, each from summary.json (`roundtrip_val_bpb`, `sliding_val_bpb`,
`ttt_val_bpb`) or from the last of its lines in the output, the `_exact` line when there is one:
  roundtrip  `final_int6_roundtrip(_exact)` (the record's), else `final_int8_zlib_roundtrip(_exact)` (the official
             script's and ours): the record prints its sliding-window score under the second name too (its
             train_gpt.py L1865), so in a log with the first, the second is not a round trip;
  sliding    `final_int6_sliding_window(_exact)` or `final_int8_zlib_sliding_window(_exact)` (the record's extra
             `final_int6_sliding_window_s64` lines are not read, nor taken for the plain score);
  ttt        `legal_ttt(_exact)` (the record's score-first TTT).
Which one is an arm's score is `compare --score` (frontier_jax.compare.stats.score_key). The final line decides:
`val_bpb: nan` (or a value that overflows to inf) after an earlier finite one is a failed run, never scored by
the earlier value; so is a score that is not a positive finite number (`score_problem`: `val_bpb: -5`, or
`1e-400`, which underflows to 0).

Throughput. Per run, the rate over time (tokens/s from metrics.jsonl's train rows; steps/s from the
official script's `step:N/M train_loss:... train_time:Xms` lines), over the first quarter of its
timed steps and the rest, and the machine's 1-minute load average (sampled by compare while the
run ran; metrics rows' `loadavg_1m` where the trainer records it).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

_NUM = (r"([-+]?(?:nan|inf(?:inity)?|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?))"
        r"(?![A-Za-z0-9_.])")
BPB_RE = re.compile(r"val_bpb:\s*" + _NUM, re.I)
# the final score lines, by stage: (line name, preference) pairs, the first name present in a log wins
STAGE_LINES = {"roundtrip": ("final_int6_roundtrip", "final_int8_zlib_roundtrip"),
               "sliding": ("final_int6_sliding_window", "final_int8_zlib_sliding_window"),
               "ttt": ("legal_ttt",)}
LINE_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(n for names in STAGE_LINES.values() for n in names)
                     + r")(_exact)?(?=\s)")
FINAL_RE = re.compile(r"(?<![A-Za-z0-9_])(?:final_int|legal_ttt)\w*(?=\s)")  # any final line: never the plain score
STAGES = ("val", *STAGE_LINES)  # a run's scores: the plain final val_bpb, then the final pipeline's
FIELDS = {stage: "val_bpb" if stage == "val" else f"{stage}_val_bpb" for stage in STAGES}  # a run's field of each
OFFICIAL_VAL_RE = re.compile(r"step:(\d+)/\d+\s+val_loss:\S+\s+val_bpb:(\S+)\s+train_time:(\d+)ms")
OFFICIAL_TRAIN_RE = re.compile(r"step:(\d+)/\d+\s+train_loss:\S+\s+train_time:(\d+)ms")
EARLY_FRACTION = 0.25  # "first steps": the first quarter of a run's timed steps


def _float(text: str) -> float:
    try:
        return float(text)
    except (OverflowError, ValueError):
        return math.nan


def stage_scores(text: str) -> dict[str, float | None]:
    """{stage: the final val_bpb of that stage} of a command's output (module docstring); None where absent."""
    plain, seen = None, {}  # seen[(name, exact)] = the last value of that line
    for line in text.splitlines():
        found = BPB_RE.findall(line)
        if not found:
            continue
        m = LINE_RE.search(line)
        if m:
            seen[(m.group(1), bool(m.group(2)))] = _float(found[-1])
        elif not FINAL_RE.search(line):
            plain = _float(found[-1])
    out = {"val": plain}
    for stage, names in STAGE_LINES.items():
        name = next((n for n in names if (n, True) in seen or (n, False) in seen), None)
        out[stage] = None if name is None else seen.get((name, True), seen.get((name, False)))
    return out


def final_scores(text: str) -> tuple[float | None, float | None]:
    """(plain, round-trip) final val_bpb of a command's output (`stage_scores`); None where absent."""
    s = stage_scores(text)
    return s["val"], s["roundtrip"]


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def score_problem(name: str, value) -> str | None:
    """Why `value` (a run's `name` score) cannot be scored, or None: a score is a positive finite number of bits
    per byte (`val_bpb: -5` would win by 6.6 bpb; `1e-400` underflows to 0; `nan` or `1e400` is no score)."""
    if value is None:
        return None
    if not finite(value):
        return f"non-finite final {name}"
    if value <= 0:
        return f"{name} {value:g} is not a positive score" + (" (it underflowed to 0)" if value == 0 else "")
    return None


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _read_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed run
        if isinstance(row, dict):
            rows.append(row)
    return rows


def throughput(points: list[tuple[float, float]], unit: str) -> dict:
    """Rates from cumulative (seconds, count) points: overall, over the first quarter of the points and the
    rest, and a series of per-interval rates (at most 50) for the report."""
    pts = sorted((t, n) for t, n in points if finite(t) and finite(n))
    out = {"unit": unit, "rate": None, "early": None, "late": None, "series": []}
    if len(pts) < 2:
        return out

    def rate(a, b):
        dt = b[0] - a[0]
        return (b[1] - a[1]) / dt if dt > 0 else None

    out["rate"] = rate(pts[0], pts[-1])
    if len(pts) >= 4:
        k = max(1, int(len(pts) * EARLY_FRACTION))
        out["early"], out["late"] = rate(pts[0], pts[k]), rate(pts[k], pts[-1])
    step = max(1, len(pts) // 50)
    out["series"] = [[pts[i + step][0], rate(pts[i], pts[i + step])] for i in range(0, len(pts) - step, step)]
    return out


def collect(run_dir: Path, console: Path, rc: int | None, load_samples: list[float] | None = None) -> dict:
    """What one finished run produced: status, steps, tokens, tokens/s, plain and round-trip val bpb, the
    val curve (step, tokens, seconds, bpb), throughput over time and the machine's load."""
    text = console.read_text(errors="replace") if console.exists() else ""
    scores = stage_scores(text)
    res = {"status": "ok", "rc": rc, "steps": None, "tokens": None, "train_seconds": None,
           "tokens_per_second": None, "curve": [], **{FIELDS[stage]: scores[stage] for stage in STAGES},
           "artifact_format": "int6_lzma" if "final_int6_roundtrip" in text else None}
    summary_path, note = run_dir / "summary.json", None
    if summary_path.is_file():
        try:
            s = json.loads(summary_path.read_text(encoding="utf-8"))
            s = s if isinstance(s, dict) else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            s, note = {}, f"unreadable {summary_path} ({str(e).splitlines()[0]})"
        for k in ("steps", "tokens", "train_seconds", "tokens_per_second"):
            res[k] = s.get(k)
        if "val_bpb" in s:  # the trainer's own final value (None: no final validation)
            res["val_bpb"] = s["val_bpb"]
        if isinstance(s.get("artifact_format"), str):
            res["artifact_format"] = s["artifact_format"]
        for key in (FIELDS[stage] for stage in STAGES[1:]):
            if s.get(key) is not None:
                res[key] = s[key]
    metrics, loads = run_dir / "metrics.jsonl", []
    if metrics.is_file():
        rows = _read_rows(metrics)
        res["curve"] = [{"step": r.get("step"), "train_seconds": r.get("train_seconds"), "tokens": r.get("tokens"),
                         "bpb": r["bpb"]} for r in rows if r.get("kind") == "val" and finite(r.get("bpb"))]
        train = [r for r in rows if r.get("kind") == "train"]
        res["throughput"] = throughput([(r.get("train_seconds"), r.get("tokens")) for r in train], "tokens/s")
        loads = [r["loadavg_1m"] for r in train if finite(r.get("loadavg_1m"))]
    else:  # the official script's log lines
        res["curve"] = [{"step": int(st), "train_seconds": int(ms) / 1000, "tokens": None, "bpb": _float(b)}
                        for st, b, ms in OFFICIAL_VAL_RE.findall(text) if finite(_float(b))]
        steps = [(int(ms) / 1000, int(st)) for st, ms in OFFICIAL_TRAIN_RE.findall(text)]
        res["throughput"] = throughput(steps, "steps/s")
        if steps:
            res["steps"] = steps[-1][1]
    samples = [x for x in (load_samples or []) if finite(x)] + loads
    res["load_1m"] = ({"mean": sum(samples) / len(samples), "max": max(samples), "n": len(samples)}
                      if samples else None)
    if rc is None:
        res["status"] = "interrupted"
    elif rc != 0:
        res["status"] = "failed"
    elif note is not None:
        res["status"] = note
    elif all(res[key] is None for key in FIELDS.values()):
        res["status"] = "no val_bpb line"
    elif any(score_problem(key, res[key]) for key in FIELDS.values()):
        res["status"] = "failed: " + next(score_problem(key, res[key]) for key in FIELDS.values()
                                          if score_problem(key, res[key]))
    if res["status"] != "ok":
        res["log_tail"] = log_tail(console)
    return res


def strict_json(obj):
    """`obj` with every non-finite float replaced by None (results.json is strict JSON: no NaN/Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj
