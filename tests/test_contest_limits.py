"""The rules with a number: size against the cap, times on the profile's hardware (measured there, or scaled
by the ratio of matmul peaks as an estimate), and what every run states about its profile at its end."""

import pytest

from frontier_jax.contest import limits, rules
from frontier_jax.contest.limits import RunHardware

PG, TF = rules.PARAMETER_GOLF, rules.TRAINIUM_FRONTIER


def test_size_against_the_decimal_cap():
    cap = PG.rule("size")
    assert limits.size_verdict(cap, 15_900_000, 100_000, "x").verdict == rules.PASS  # exactly 16,000,000
    v = limits.size_verdict(cap, 15_900_000, 100_001, "x")
    assert v.verdict == rules.FAIL and "16,000,001 bytes = 15,900,000 artifact + 100,001 code" in v.evidence
    v = limits.size_verdict(TF.rule("size"), 24_000_000, 400_000, "x")
    assert v.verdict == rules.NOT_CHECKABLE and "states no cap" in v.evidence


def test_times_on_the_profile_hardware():
    trn1 = RunHardware("NC_v2", 2, 190e12, "documented")
    v = limits.time_verdict(TF.rule("train_time"), 1799.0, "trained", trn1, TF.hardware)
    assert v.verdict == rules.PASS and "measured on one trn1 chip" in v.evidence
    assert limits.time_verdict(TF.rule("train_time"), 1801.0, "trained", trn1, TF.hardware).verdict == rules.FAIL
    # elsewhere: scaled by the peaks' ratio, an estimate (1800 s at 190 TFLOP/s on 8 x 989.5 TFLOP/s)
    est, how = limits.on_profile_hardware(1800.0, trn1, PG.hardware)
    assert est == pytest.approx(1800.0 * 190e12 / (8 * 989.5e12)) and how.startswith("estimate:")
    slow = RunHardware("cpu", 1, 1e11, "measured")
    v = limits.time_verdict(PG.rule("train_time"), 600.0 * 8 * 989.5e12 / 1e11 * 1.01, "trained", slow, PG.hardware)
    assert v.verdict == rules.FAIL and "estimate" in v.evidence
    nopeak = RunHardware("cpu", 1, None, None)
    assert limits.time_verdict(PG.rule("train_time"), 5.0, "trained", nopeak, PG.hardware).verdict == rules.NOT_CHECKABLE
    assert limits.time_verdict(TF.rule("eval_time"), 5.0, "x", trn1, TF.hardware).verdict == rules.NOT_CHECKABLE
    assert limits.time_verdict(PG.rule("eval_time"), None, "x", trn1, PG.hardware).verdict == rules.NOT_CHECKABLE


def test_end_of_run_names_the_profile_and_a_failing_size():
    over = limits.end_of_run({"rules_profile": "parameter-golf", "artifact_bytes": 24_000_000, "code_bytes": 400_000})
    assert over["rules_tag"] == " rules:parameter-golf(fails:size)" and over["rules_at_end"] == {"size": rules.FAIL}
    ok = limits.end_of_run({"rules_profile": "trainium-frontier", "artifact_bytes": 24_000_000, "code_bytes": 1})
    assert ok["rules_tag"] == " rules:trainium-frontier" and ok["rules_at_end"] == {"size": rules.NOT_CHECKABLE}
    assert limits.end_of_run({"rules_profile": "parameter-golf"}) == {"rules_profile": "parameter-golf",
                                                                      "rules_tag": " rules:parameter-golf"}
    assert limits.end_of_run({}) == {}
