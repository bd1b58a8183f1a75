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
