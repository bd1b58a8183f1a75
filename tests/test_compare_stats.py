"""frontier_jax.compare.stats: Welch intervals against scipy and a textbook case, the run count that settles a
comparison, verdicts in words."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from frontier_jax.compare.stats import MAX_RUNS, NOISE_BPB, describe, runs_to_settle, verdict, welch

# Welch's t-test, Wikipedia ("Welch's t-test", Examples, first example): t = -2.46, df = 25.0, p = 0.021,
# means 20.82 and 22.99, sample sds 2.804 and 1.953; 2.060 is the printed-table t quantile (0.975, 25 df).
TEXTBOOK_A = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
TEXTBOOK_B = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]


def test_welch_textbook_case():
    w = welch(TEXTBOOK_A, TEXTBOOK_B)
    assert w["n_a"] == w["n_b"] == 15
    assert w["diff"] == pytest.approx(22.99 - 20.82, abs=0.01)  # B - A
    assert w["df"] == pytest.approx(25.0, abs=0.05)
    assert w["se"] == pytest.approx(math.sqrt(2.804**2 / 15 + 1.953**2 / 15), rel=1e-3)
    assert w["diff"] / w["se"] == pytest.approx(2.46, abs=0.005)  # the example's |t|
    half = 2.060 * w["se"]
    assert w["ci"] == pytest.approx((w["diff"] - half, w["diff"] + half), abs=2e-3)
    assert w["ci"][0] > 0  # p = 0.021 < 0.05: the interval excludes 0


@pytest.mark.parametrize("a, b, level", [
    ([1.30, 1.31, 1.32], [1.25, 1.26], 0.95),
    ([1.2, 1.25], [1.21, 1.3, 1.28, 1.22], 0.9),
    ([3.0, 3.5, 2.5, 3.1], [3.0, 3.0001, 2.9999], 0.99),
])
def test_welch_matches_scipy_and_the_formula(a, b, level):
    w = welch(a, b, level)
    ref = stats.ttest_ind(b, a, equal_var=False)
    assert w["ci"] == pytest.approx(tuple(ref.confidence_interval(level)), rel=1e-12)
    da, db = describe(a), describe(b)
    qa, qb = da["sd"] ** 2 / da["n"], db["sd"] ** 2 / db["n"]
    df = (qa + qb) ** 2 / (qa**2 / (da["n"] - 1) + qb**2 / (db["n"] - 1))  # Welch-Satterthwaite by hand
    assert w["df"] == pytest.approx(df) and w["se"] == pytest.approx(math.sqrt(qa + qb))
    assert w["diff"] == pytest.approx(db["mean"] - da["mean"])
    half = stats.t.ppf(0.5 + level / 2, df) * w["se"]
    assert w["ci"] == pytest.approx((w["diff"] - half, w["diff"] + half))


def test_welch_degenerate_arms():
    assert welch([1.3, 1.3], [1.2, 1.2]) == {"n_a": 2, "n_b": 2, "diff": pytest.approx(-0.1), "se": 0.0,
                                             "ci": (pytest.approx(-0.1), pytest.approx(-0.1)), "df": math.inf,
                                             "level": 0.95}
    one = welch([1.3], [1.2, 1.25])
    assert one["diff"] == pytest.approx(-0.075) and one["ci"] is None and one["df"] is None
    assert welch([], [1.2])["diff"] is None
    assert describe([1.0, None, float("nan"), 3.0]) == {"n": 2, "mean": 2.0, "sd": math.sqrt(2), "min": 1.0, "max": 3.0}


@pytest.mark.parametrize("sd_a, sd_b, diff, n_now", [
    (1e-3, 1.5e-3, -2e-3, 2), (4e-4, 4e-4, 1e-4, 3), (2e-3, 1e-4, 8e-4, 5), (1e-3, 1e-3, 0.0, 2)])
def test_runs_to_settle_is_the_first_count_that_settles(sd_a, sd_b, diff, n_now):
    n = runs_to_settle(sd_a, sd_b, diff, n_now)
    target = abs(diff) if abs(diff) >= NOISE_BPB else NOISE_BPB - abs(diff)
    var = sd_a**2 + sd_b**2

    def half(k):
        df = (k - 1) * var**2 / (sd_a**4 + sd_b**4)
        return stats.t.ppf(0.975, df) * math.sqrt(var / k)

    assert n is not None and n_now < n <= MAX_RUNS
    assert half(n) < target
    assert n == max(n_now + 1, 2) or half(n - 1) >= target
    assert runs_to_settle(0.0, 0.0, 1e-3, 4) == 4  # no spread: settled now
    assert runs_to_settle(1e-3, 1e-3, NOISE_BPB, 2) is not None
    assert runs_to_settle(1.0, 1.0, 1e-6, 2) is None  # would need more than MAX_RUNS


def test_verdicts_in_words():
    better = verdict([1.300, 1.3002, 1.3001], [1.290, 1.2901, 1.2902], "A", "B")
    assert better["verdict"] == "better" and "B is better than A by 0.0100" in better["text"]
    worse = verdict([1.290, 1.2901, 1.2902], [1.300, 1.3002, 1.3001])
    assert worse["verdict"] == "worse" and worse["more_runs"] == 0
    # distinguishable but below the 0.0005 bpb rule: still "within noise"
    tiny = verdict([1.3000, 1.3000, 1.3000], [1.3002, 1.3002, 1.3002])
    assert tiny["verdict"] == "within noise" and "below the 0.0005" in tiny["text"]
    equal = verdict([1.3000, 1.3001, 1.3002], [1.3001, 1.3002, 1.3003])
    assert equal["verdict"] == "within noise" and "equal within noise" in equal["text"]
    # a real-looking gain with a wide interval: undecided, and a finite number of extra runs settles it
    open_ = verdict([1.300, 1.302], [1.297, 1.2985])
    assert open_["verdict"] == "undecided" and open_["ci"][0] < 0 < open_["ci"][1]
    assert 0 < open_["more_runs"] < 1000 and "more run(s) per arm" in open_["text"]
    need = open_["more_runs"] + 2
    assert need == runs_to_settle(describe([1.300, 1.302])["sd"], describe([1.297, 1.2985])["sd"], open_["diff"], 2)
    single = verdict([1.30], [1.29])
    assert single["verdict"] == "undecided" and single["ci"] is None and single["more_runs"] == 1
    assert verdict([], [1.2])["verdict"] == "no data"
