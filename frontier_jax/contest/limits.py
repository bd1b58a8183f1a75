"""The rules with a number: artifact + code bytes against the cap, training and evaluation time against the
limits, on the profile's hardware. Numbers only (the run's summary.json and env.json), no JAX.

A run on other hardware than the profile's has its times scaled by the ratio of the matmul peaks: the run's
(summary.json `matmul_peak_flops`, all its devices: AWS's documented peak on trn1, a measured probe
elsewhere) over the profile hardware's published dense BF16 peak (`rules.Hardware`). That assumes the same
MFU on both and is reported as an estimate; without a recorded peak the time is not checkable.
`end_of_run` is what every run states at its end (`frontier_jax.run.driver` calls it): the profile and the size
rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier_jax.contest.rules import FAIL, NOT_CHECKABLE, PASS, Hardware, Rule, Verdict, profile

@dataclass(frozen=True)
class RunHardware:
    device_kind: str | None
    devices: int | None
    peak_flops: float | None  # all devices
    peak_source: str | None

    @classmethod
    def of(cls, summary: dict, env: dict) -> "RunHardware":
        devices = env.get("devices")
        return cls(env.get("device_kind"), len(devices) if isinstance(devices, list) else None,
                   summary.get("matmul_peak_flops"), summary.get("peak_source"))

    def describe(self) -> str:
        kind = self.device_kind or "unrecorded devices"
        return f"{self.devices} x {kind}" if self.devices else kind

    def same_as(self, hw: Hardware) -> bool:
        return self.device_kind == hw.device_kind and self.devices == hw.devices


def on_profile_hardware(seconds: float, run: RunHardware, hw: Hardware) -> tuple[float | None, str]:
    """(seconds on the profile's hardware, how they were obtained); None when they cannot be estimated."""
    if run.same_as(hw):
        return seconds, f"measured on {hw.name}"
    if not run.peak_flops:
        return None, (f"{_secs(seconds)} measured on {run.describe()}; not scalable to {hw.name}: the run recorded "
                      "no matmul peak (train.measure_peak was off)")
    est = seconds * run.peak_flops / hw.peak_flops
    return est, (f"estimate: {_secs(seconds)} measured on {run.describe()} x its matmul peak "
                 f"{run.peak_flops:.3g} FLOP/s ({run.peak_source or 'source unrecorded'}) / {hw.name}'s "
                 f"{hw.peak_flops:.3g} FLOP/s ({hw.source.where}), assuming the same MFU")


def _secs(x: float) -> str:
    return f"{x:,.1f} s" if x >= 1 else f"{x:.2g} s"


def time_verdict(rule: Rule, seconds: float | None, what: str, run: RunHardware, hw: Hardware) -> Verdict:
    """`seconds` (the run's `what`, measured) on the profile's hardware against the rule's limit."""
    if seconds is None:
        return Verdict(rule.id, NOT_CHECKABLE, f"the run recorded no {what}")
    est, how = on_profile_hardware(float(seconds), run, hw)
    if est is None:
        return Verdict(rule.id, NOT_CHECKABLE, how)
    if not rule.known or rule.limit is None:
        return Verdict(rule.id, NOT_CHECKABLE, f"{what}: {_secs(est)} on {hw.name} ({how}); the profile states "
                                               "no limit")
    ok = est <= rule.limit
    return Verdict(rule.id, PASS if ok else FAIL,
                   f"{what}: {_secs(est)} on {hw.name} {'<=' if ok else '>'} {rule.limit:,.0f} s ({how})")


def size_verdict(rule: Rule, artifact_bytes: int, code_bytes: int, detail: str) -> Verdict:
    total = int(artifact_bytes) + int(code_bytes)
    what = f"{total:,} bytes = {int(artifact_bytes):,} artifact + {int(code_bytes):,} code ({detail})"
    if not rule.known or rule.limit is None:
        return Verdict(rule.id, NOT_CHECKABLE, f"{what}; the profile states no cap")
    ok = total <= rule.limit
    return Verdict(rule.id, PASS if ok else FAIL, f"{what} {'<=' if ok else '>'} {rule.limit:,.0f} cap")


def end_of_run(summary: dict) -> dict:
    """What a finished run states about its rules profile (summary.json's `rules_*` fields): the size rule
    when the run has an artifact, and `rules_tag`, the suffix of its score lines: ` rules:<profile>`, with
    `(fails:size)` when the size rule fails. Every other rule: `submission check`."""
    name = summary.get("rules_profile")
    if not name:
        return {}
    prof = profile(name)
    out = {"rules_profile": name, "rules_tag": f" rules:{name}"}
    rule = prof.rule("size")
    if rule is not None and summary.get("artifact_bytes") is not None and summary.get("code_bytes") is not None:
        v = size_verdict(rule, summary["artifact_bytes"], summary["code_bytes"], "code as counted in code.json")
        out["rules_at_end"] = {"size": v.verdict}
        out["rules_line"] = f"{name}: size {v.verdict}: {v.evidence}"
        if v.verdict == FAIL:
            out["rules_tag"] += "(fails:size)"
    return out
