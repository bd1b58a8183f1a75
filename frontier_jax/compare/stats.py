"""Statistics of `python -m frontier_jax.compare`: per-arm summaries, Welch t intervals, verdicts in words.

Difference convention: diff = mean(B) - mean(A) of final val bpb; lower bpb is better, so a negative
diff means B is better. The 95% confidence interval is Welch's (`scipy.stats.ttest_ind` with
`equal_var=False`: se = sqrt(sA^2/nA + sB^2/nB) with the sample variances, Welch-Satterthwaite degrees
of freedom, the Student t quantile). With fewer than 2 successful runs in an arm there is no interval.
Project rule: a |diff| below NOISE_BPB (0.0005 bpb) is noise-level whatever the interval says (two runs
of the same file differ by about 0.0003).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from frontier_jax.compare.collect import FIELDS, STAGES

NOISE_BPB = 0.0005
MAX_RUNS = 1000


def _finite(values: list[float]) -> np.ndarray:
    return np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)


def describe(values: list[float]) -> dict:
    """n, mean, sample sd (None below 2 values), min, max; None and non-finite values are left out."""
    v = _finite(values)
    if v.size == 0:
        return {"n": 0, "mean": None, "sd": None, "min": None, "max": None}
    return {"n": int(v.size), "mean": float(v.mean()), "sd": float(v.std(ddof=1)) if v.size > 1 else None,
            "min": float(v.min()), "max": float(v.max())}


def welch(a: list[float], b: list[float], level: float = 0.95) -> dict:
    """diff = mean(b) - mean(a) with its Welch t interval (ci None when an arm has < 2 values)."""
    va, vb = _finite(a), _finite(b)
    out = {"n_a": int(va.size), "n_b": int(vb.size), "diff": None, "ci": None, "df": None, "se": None,
           "level": level}
    if not va.size or not vb.size:
        return out
    out["diff"] = float(vb.mean() - va.mean())
    if va.size < 2 or vb.size < 2:
        return out
    se = math.sqrt(vb.var(ddof=1) / vb.size + va.var(ddof=1) / va.size)
    if se == 0.0:  # both arms constant: scipy's t statistic is undefined, the interval is the point
        out.update(ci=(out["diff"], out["diff"]), df=math.inf, se=0.0)
        return out
    res = stats.ttest_ind(vb, va, equal_var=False)
    ci = res.confidence_interval(level)
    out.update(ci=(float(ci.low), float(ci.high)), df=float(res.df), se=se)
    return out


def runs_to_settle(sd_a: float, sd_b: float, diff: float, n_now: int, noise: float = NOISE_BPB,
                   level: float = 0.95) -> int | None:
    """Runs per arm (total, more than n_now) after which, at the observed spreads, the interval's half-width would be
    below |diff| (to show a real difference) or below noise - |diff| (to show it is within noise).
    None when even MAX_RUNS would not do."""
    var = sd_a**2 + sd_b**2
    target = abs(diff) if abs(diff) >= noise else noise - abs(diff)
    if var == 0.0:
        return max(n_now, 2)
    if target <= 0.0:
        return None
    n = np.arange(max(n_now + 1, 2), MAX_RUNS + 1)
    df = (n - 1) * var**2 / (sd_a**4 + sd_b**4)  # Welch-Satterthwaite with n runs in each arm
    settled = np.flatnonzero(stats.t.ppf(0.5 + level / 2, df) * np.sqrt(var / n) < target)
    return int(n[settled[0]]) if settled.size else None


def verdict(a: list[float], b: list[float], name_a: str = "A", name_b: str = "B", noise: float = NOISE_BPB) -> dict:
    """{"verdict": better|worse|within noise|undecided|no data, "text": one sentence, "more_runs": int|None,
    plus the welch() fields}. better/worse describe B relative to A (lower bpb is better)."""
    w = welch(a, b)
    res = {**w, "verdict": "no data", "more_runs": None}
    if w["diff"] is None:
        res["text"] = f"no successful runs of {name_a if not w['n_a'] else name_b}: nothing to compare"
        return res
    diff, n_now = w["diff"], max(w["n_a"], w["n_b"])
    size = f"{abs(diff):.4f} bpb"
    if w["ci"] is None:
        res.update(verdict="undecided", more_runs=2 - min(w["n_a"], w["n_b"]))
        small = f"; the observed difference is below the {noise} bpb noise level" if abs(diff) < noise else ""
        res["text"] = (f"{name_b} - {name_a} = {diff:+.4f} bpb, but an interval needs at least 2 successful runs "
                       f"per arm{small}")
        return res
    lo, hi = w["ci"]
    ci = f"95% CI {lo:+.4f} .. {hi:+.4f}"
    sd_a, sd_b = describe(a)["sd"], describe(b)["sd"]
    if lo > 0 or hi < 0:
        if abs(diff) < noise:
            res.update(verdict="within noise", more_runs=0)
            res["text"] = (f"{name_b} and {name_a} differ by {size} ({ci}): distinguishable, but below the "
                           f"{noise} bpb noise level, so treat them as equal")
        else:
            word = "better" if diff < 0 else "worse"
            res.update(verdict=word, more_runs=0)
            res["text"] = f"{name_b} is {word} than {name_a} by {size} ({ci})"
        return res
    if -noise < lo and hi < noise:
        res.update(verdict="within noise", more_runs=0)
        res["text"] = f"{name_b} and {name_a} are equal within noise ({ci} lies inside +-{noise})"
        return res
    need = runs_to_settle(sd_a, sd_b, diff, n_now, noise)
    res.update(verdict="undecided", more_runs=None if need is None else need - n_now)
    more = (f"more than {MAX_RUNS} runs per arm would be needed" if need is None
            else f"about {need - n_now} more run(s) per arm would settle it at the observed spread")
    if abs(diff) < noise:
        res["text"] = (f"{name_b} and {name_a} differ by only {size}, below the {noise} bpb noise level, but "
                       f"the interval ({ci}) is wider than +-{noise}; {more}")
    else:
        lean = "better" if diff < 0 else "worse"
        res["text"] = (f"{name_b} looks {size} {lean} than {name_a} but the difference is within noise so far "
                       f"({ci} includes 0); {more}")
    return res


# ----------------------------------------------------------------------------- the comparison's own conditions

# Project rule, like NOISE_BPB: throughputs of one arm (its runs, or a run's first quarter against the
# rest) within a factor 1.25 are the machine's noise (two cores shared with other jobs); beyond it the
# arms did not run under the same conditions, and a bpb difference may come from the steps a run lost.
THROUGHPUT_TOLERANCE = 0.25


def _spread(values: list[float]) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x) and x > 0]
    return max(v) / min(v) if len(v) >= 2 else None


def throughput_flags(labels: list[str], runs: list[dict], tol: float = THROUGHPUT_TOLERANCE) -> dict:
    """{"runs": {run index: reason}, "arms": {label: [reasons]}, "pairs": {"A|B": [reasons]}}: an ok run whose
    first-quarter throughput differs from its rest by more than `tol`, an arm whose runs differ by more,
    a pair whose per-round throughput ratio changed by more."""
    flags = {"runs": {}, "arms": {}, "pairs": {}}
    rate = {}
    for i, r in enumerate(runs):
        t = r.get("throughput") or {}
        if r.get("status") != "ok" or not t.get("rate"):
            continue
        rate[(r["arm"], r["seed"])] = t["rate"]
        s = _spread([t.get("early"), t.get("late")])
        if s is not None and s > 1 + tol:
            flags["runs"][i] = (f"{r['arm']} seed {r['seed']}: throughput {t['early']:,.3g} {t['unit']} in its first "
                                f"quarter, {t['late']:,.3g} after ({s:.2f}x)")
            flags["arms"].setdefault(r["arm"], []).append(flags["runs"][i])
    for label in labels:
        mine = {seed: v for (arm, seed), v in rate.items() if arm == label}
        s = _spread(list(mine.values()))
        if s is not None and s > 1 + tol:
            lo, hi = min(mine, key=mine.get), max(mine, key=mine.get)
            flags["arms"].setdefault(label, []).append(
                f"{label}: runs differ in throughput by {s:.2f}x (seed {lo}: {mine[lo]:,.3g}, seed {hi}: {mine[hi]:,.3g})")
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            ratios = [rate[(a, seed)] / rate[(b, seed)] for (arm, seed) in rate if arm == a and (b, seed) in rate]
            s = _spread(ratios)
            if s is not None and s > 1 + tol:
                flags["pairs"][f"{a}|{b}"] = [f"the throughput ratio {a}/{b} changed by {s:.2f}x between seeds"]
    return flags


def remedies(flags: dict, runs: list[dict], budget: float, threads: int | None, cpus: int | None,
             max_load: float | None) -> list[str]:
    """What would remove the confounders `flags` found, each with the compare option that applies it: a run
    whose first quarter ran at another rate than its rest (warm-up and compilation weigh on a short run): a
    longer --budget; runs or pairs whose rates moved between seeds (the machine's other load): --threads 1 (each
    run on one CPU: less exposed to other processes); a load average above the CPUs while the runs ran: a
    quieter machine, or --max-load (compare waits before each run until the load falls below it)."""
    between = any(x not in flags["runs"].values() for v in flags["arms"].values() for x in v) or bool(flags["pairs"])
    if not (flags["runs"] or between):
        return []
    out = []
    if flags["runs"]:
        out.append(f"a longer budget: --budget {2 * budget:g} (twice this one; warm-up and compilation weigh less "
                   "in a longer run's first quarter)")
    if between and threads != 1:
        out.append("--threads 1: every run pinned to one CPU (torch arms --threads 1), less exposed to the "
                   "machine's other load")
    loads = [r["load_1m"]["mean"] for r in runs if r.get("load_1m")]
    busy = cpus is not None and loads and max(loads) > cpus
    if busy or max_load is None:
        seen = f" (the 1-minute load averaged up to {max(loads):.1f} on {cpus} CPU(s) during the runs)" if busy else ""
        out.append(f"a quieter machine{seen}: stop other jobs, or --max-load {max(0.5, (cpus or 2) / 2):g} (compare "
                   "waits before each run until the 1-minute load average is below it)")
    return out


def confounders(flags: dict, a: str, b: str) -> list[str]:
    """The reasons a pair's comparison is confounded (its arms' flags and the pair's own)."""
    return flags["arms"].get(a, []) + flags["arms"].get(b, []) + flags["pairs"].get(f"{a}|{b}", [])


SCORE_CHOICES = ("auto", *STAGES)  # compare --score
_SCORE_WORDS = {"val": "the plain final val_bpb (the trained weights)",
                "roundtrip": "the round-trip val_bpb (the artifact's weights: summary.json roundtrip_val_bpb, or the "
                             "final_int8_zlib_roundtrip / final_int6_roundtrip(_exact) line)",
                "sliding": "the sliding-window val_bpb of the artifact's weights (summary.json sliding_val_bpb, or the "
                           "final_int8_zlib_sliding_window / final_int6_sliding_window(_exact) line)",
                "ttt": "the score-first TTT val_bpb (summary.json ttt_val_bpb, or the legal_ttt(_exact) line)"}


def score_key(runs: list[dict], choice: str = "auto") -> tuple[str, str]:
    """(run field, sentence) of the score every arm is compared by. `choice` names a stage of the final pipeline
    (`collect.STAGES`: val, roundtrip, sliding, ttt); "auto" is the project's rule: the round-trip score when
    every successful run has one (no arm scored before quantization against another scored after it), else
    the plain val_bpb."""
    if choice != "auto":
        return FIELDS[choice], f"every arm scored by {_SCORE_WORDS[choice]} (--score {choice})"
    ok = [r for r in runs if r.get("status") == "ok"]
    missing = sorted({r["arm"] for r in ok if r.get("roundtrip_val_bpb") is None})
    if ok and not missing:
        return "roundtrip_val_bpb", ("every arm scored by the int8+zlib round-trip val_bpb (the contest's score: "
                                     "summary.json roundtrip_val_bpb, or the final_int8_zlib_roundtrip(_exact) line)"
                                     if all(r.get("artifact_format") in (None, "int8_zlib") for r in ok) else
                                     f"every arm scored by {_SCORE_WORDS['roundtrip']}")
    why = f"{', '.join(missing)} reported no round-trip score" if missing else "no successful run"
    return "val_bpb", f"every arm scored by the plain final val_bpb ({why})"
