"""What a run submits (frontier_jax.run.roundtrip): the round trip's summary entries, the UTF-8 bytes of the code
files the run recorded (frontier_jax.contest.codebytes, tests/test_contest_codebytes.py) added to the artifact's,
and the official lines, which end with the run's rules profile."""

from __future__ import annotations

from frontier_jax.run import roundtrip

ROUNDTRIP = {"loss": 0.7, "bpb": 1.25, "nll_sum_nats": 7.0, "tokens": 10, "bytes": 12, "eval_seconds": 0.5,
             "artifact": "run/final_model.int8.ptz", "artifact_bytes": 1000, "raw_bytes": 3000,
             "stats": {"int8_payload_bytes": 2000, "baseline_tensor_bytes": 8000}}


def test_the_submission_is_the_artifact_plus_the_utf8_bytes_of_the_code_files(tmp_path):
    cfg, mod = tmp_path / "config.json", tmp_path / "m.py"
    cfg.write_text('{"name": "é"}', encoding="utf-8")  # 14 bytes in UTF-8, 13 characters
    mod.write_text("X = 1\n", encoding="utf-8")
    f = roundtrip.summary_fields({**ROUNDTRIP, "code_files": [cfg, mod]})
    assert (f["code_bytes"], f["code_files"], f["submission_bytes"]) == (14 + 6, 2, 1000 + 20)
    assert f"Code size: {f['code_bytes']} bytes (2 source files" in roundtrip.export_lines(f)[1]


def test_the_official_lines_end_with_the_rules_profile_when_the_run_has_one():
    f = roundtrip.summary_fields({**ROUNDTRIP, "code_files": []})
    assert roundtrip.roundtrip_lines(f) == [
        "final_int8_zlib_roundtrip val_loss:0.7000 val_bpb:1.2500 eval_time:500ms",
        "final_int8_zlib_roundtrip_exact val_loss:0.70000000 val_bpb:1.25000000"]
    tagged = roundtrip.roundtrip_lines({**f, "rules_tag": " rules:parameter-golf(fails:size)"})
    assert tagged == [line + " rules:parameter-golf(fails:size)" for line in roundtrip.roundtrip_lines(f)]
