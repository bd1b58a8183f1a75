"""The submission check end to end: a run of configs/frontier14.py's shape passes trainium-frontier and fails
parameter-golf on the size cap and the training-data n-gram tables; a config that reads the environment, a
TTT log that scores after training, changed code, and bad input; the CLI on a trained run in under 10 s."""

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import frontier_jax.trainer  # noqa: F401 - the modules a run imports, so the fake runs' code.json is a run's
from frontier_jax.config import CONFIG_MODULE_PREFIX, apply_overrides, load_config, to_dict
from frontier_jax.contest import codebytes, rules
from frontier_jax.contest.rules import FAIL, NOT_APPLICABLE, NOT_CHECKABLE, PASS
from frontier_jax.run import rundir
from frontier_jax.submission import check, evidence
from frontier_jax.submission.__main__ import main
from helpers import REPO, tiny_config

DATA = "/data/fineweb10B_sp1024"
# The account of the accepted 14-layer entry: about 24 MB after int8+zlib; its n-gram tables ~252 MB.
FRONTIER14_ARTIFACT_BYTES = 24_000_000


def fake_run(run: Path, cfg, summary: dict, env: dict, ngram: dict | None = None, ttt=None) -> Path:
    """A run directory as the trainer leaves it: config.json, env.json, summary.json, code.json (this process's
    project modules and the config, as `codebytes.record_run` writes at a run's end), the artifact (a file of
    the summary's size), the n-gram record and the TTT log when given."""
    run.mkdir(parents=True)
    rundir.write_json(run / rundir.CONFIG, to_dict(cfg))
    rundir.write_json(run / rundir.ENV, env)
    files = codebytes.record_run(run, run / rundir.CONFIG)
    art = run / "final_model.int8.ptz"
    with open(art, "wb") as f:
        f.truncate(summary["artifact_bytes"])
    summary = {"artifact": str(art), "code_bytes": codebytes.count_bytes(files), "code_files": len(files),
               "rules_profile": cfg.rules.profile, "run_dir": str(run), **summary}
    rundir.write_json(run / rundir.SUMMARY_JSON, summary)
    if ngram is not None:
        (run / evidence.NGRAM_RECORD).parent.mkdir()
        (run / evidence.NGRAM_RECORD).write_text(json.dumps(ngram))
    if ttt is not None:
        keys = ("chunk", "event", "first_target", "last_target")
        (run / evidence.TTT_LOG).write_text("".join(json.dumps(dict(zip(keys, e))) + "\n" for e in ttt))
    return run


def frontier14_run(tmp_path) -> Path:
    """A 30-minute trn1 run of configs/frontier14.py as its records would read (a fake run directory: the
    artifact is a placeholder file of the issue's ~24 MB, nothing was trained)."""
    cfg = apply_overrides(load_config(REPO / "configs" / "frontier14.py"),
                          [f"data.data_dir={DATA!r}", f"data.tokenizer={DATA + '/fineweb_1024_bpe.model'!r}"])
    steps = 5200
    ngram = {"built_from": "train shards", "table_bytes": cfg.ngram.table_bytes,
             "trainer_shards": [f"{DATA}/fineweb_train_{i:06d}.bin" for i in range(79)],
             "builder_shards": [f"{DATA}/fineweb_train_000079.bin"], "swaps": [],
             "final": {"step": steps, "version": 17, "snapshot": None}}
    summary = {"steps": steps, "train_seconds": 1795.2, "artifact_bytes": FRONTIER14_ARTIFACT_BYTES,
               "roundtrip_eval_seconds": 118.0, "roundtrip_val_tokens": 62_021_632, "matmul_peak_flops": 190e12,
               "peak_source": "documented: AWS Trainium (trn1) 190 BF16 TFLOPS per chip"}
    env = {"backend": "neuron", "device_kind": "NC_v2", "devices": ["NC_v2:0", "NC_v2:1"]}
    return fake_run(tmp_path / "frontier14", cfg, summary, env, ngram)


def _verdicts(run, profile=None) -> dict:
    prof, _, verdicts = check.check_run(run, profile)
    assert [v.rule for v in verdicts] == [r.id for r in prof.rules]  # one line per rule, the profile's order
    return {v.rule: v for v in verdicts}


def test_every_rule_has_a_check():
    assert {r.id for p in rules.PROFILES.values() for r in p.rules} == set(check.CHECKS)


@pytest.mark.slow
def test_a_frontier14_run_passes_trainium_frontier_and_fails_parameter_golf(tmp_path, capsys):
    run = frontier14_run(tmp_path)
    tf = _verdicts(run)  # the run's own profile: trainium-frontier (the default)
    assert {k: v.verdict for k, v in tf.items()} == {
        "size": NOT_CHECKABLE, "train_time": PASS, "eval_time": NOT_CHECKABLE, "no_env": PASS, "one_forward": PASS,
        "eval_data": PASS, "ttt_order": NOT_APPLICABLE}, tf
    assert "measured on one trn1 chip" in tf["train_time"].evidence
    assert "251,658,240 bytes in memory" in tf["eval_data"].evidence  # 15 orders x 2**20 rows x 16 bytes
    assert main(["check", str(run)]) == 0

    pg = _verdicts(run, "parameter-golf")
    assert sorted(k for k, v in pg.items() if v.verdict == FAIL) == ["eval_data", "size"], pg
    assert "> 16,000,000 cap" in pg["size"].evidence and "24,000,000 artifact" in pg["size"].evidence
    assert "train shards" in pg["eval_data"].evidence and "fineweb_train_000079.bin" in pg["eval_data"].evidence
    assert pg["train_time"].verdict == PASS and "estimate" in pg["train_time"].evidence
    assert all(pg[k].verdict == PASS for k in ("causal", "normalized", "single_pass", "train_data_in_time"))
    capsys.readouterr()
    assert main(["check", str(run), "--rules", "parameter-golf"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: " in out and "(size, eval_data)" in out and len(out.splitlines()) == 3 + len(pg)


def _env_config(tmp_path) -> Path:
    path = tmp_path / "env_layers.py"
    path.write_text("import dataclasses\nimport os\n\nfrom configs.tiny import get_config as tiny\n\n\n"
                    "def get_config():\n    cfg = tiny()\n"
                    "    layers = int(os.environ.get('NUM_LAYERS', '4'))  # the architecture from the environment\n"
                    "    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_layers=layers))\n")
    return path


def test_a_config_that_reads_the_environment_fails_the_env_rule(tmp_path):
    path = _env_config(tmp_path)
    try:
        cfg = load_config(path)
        run = fake_run(tmp_path / "run", cfg, {"artifact_bytes": 1000}, {})
    finally:
        sys.modules.pop(f"{CONFIG_MODULE_PREFIX}{path.stem}", None)  # later runs in this process do not import it
    v = _verdicts(run)["no_env"]
    assert v.verdict == FAIL and f"{path}:9: layers = int(os.environ.get('NUM_LAYERS', '4'))" in v.evidence
    assert str(path) in {f.path for f in codebytes.read_record(run)}


def _tiny_run(tmp_path, name="run", **kw) -> Path:
    cfg = tiny_config("/data/synth", "model.vocab_size=64")
    summary = {"steps": 6, "train_seconds": 3.0, "artifact_bytes": 5000, "roundtrip_eval_seconds": 0.5,
               "matmul_peak_flops": 1e11, "peak_source": "measured"}
    return fake_run(tmp_path / name, cfg, summary, {"backend": "cpu", "device_kind": "cpu", "devices": ["cpu:0"]},
                    **kw)


def test_a_ttt_log_that_scores_after_training_fails(tmp_path):
    good = _tiny_run(tmp_path, "good", ttt=[(0, "score", 0, 63), (0, "train", 0, 63), (1, "score", 64, 127)])
    bad = _tiny_run(tmp_path, "bad", ttt=[(0, "score", 0, 63), (0, "train", 0, 127), (1, "score", 64, 127)])
    g, b = _verdicts(good, "parameter-golf"), _verdicts(bad, "parameter-golf")
    assert g["ttt_order"].verdict == PASS and g["single_pass"].verdict == PASS and g["eval_data"].verdict == PASS
    assert b["ttt_order"].verdict == FAIL and "scores targets 64..127 after training on 64..127" in b["ttt_order"].evidence
    tf = _verdicts(bad)  # trainium-frontier states no TTT rule: reported, not judged
    assert tf["ttt_order"].verdict == NOT_CHECKABLE and "would break score-before-update" in tf["ttt_order"].evidence
    assert tf["eval_data"].verdict == NOT_CHECKABLE and "scored val prefix" in tf["eval_data"].evidence
    assert main(["check", str(bad), "--rules", "parameter-golf"]) == 1


def test_changed_code_makes_the_model_checks_not_checkable(tmp_path):
    run = _tiny_run(tmp_path)
    rec = json.loads((run / codebytes.RECORD).read_text())
    model = next(f for f in rec["files"] if f["module"] == "frontier_jax.model")
    model["sha256"] = "0" * 64  # the run imported another model.py than this checkout's
    (run / codebytes.RECORD).write_text(json.dumps(rec))
    v = _verdicts(run)
    assert v["one_forward"].verdict == NOT_CHECKABLE and "model.py (changed)" in v["one_forward"].evidence
    assert v["no_env"].verdict == NOT_CHECKABLE and v["size"].verdict == NOT_CHECKABLE


@pytest.mark.parametrize("case", ["missing", "not a run", "profile", "ttt", "code"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    run = tmp_path / "missing"
    args = []
    if case == "not a run":
        run.mkdir()
    elif case != "missing":
        run = _tiny_run(tmp_path)
        if case == "profile":
            args = ["--rules", "golf"]
        elif case == "ttt":
            (run / evidence.TTT_LOG).write_text('{"chunk": 0}\n')
        else:
            (run / codebytes.RECORD).write_text("[]")
    with pytest.raises(SystemExit) as e:
        main(["check", str(run), *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ")


@pytest.mark.slow
def test_the_cli_on_a_trained_run_prints_every_rule_in_under_10_s(trained_run):
    """A tiny run trained by the trainer (as the README's demo, on the synthetic byte data), checked by the CLI in
    a fresh process against its own profile: every rule printed with its verdict, within 10 s."""
    run_dir, summary = trained_run
    assert summary["rules_profile"] == "trainium-frontier" and summary["rules_tag"] == " rules:trainium-frontier"
    assert (run_dir / codebytes.RECORD).is_file()
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "frontier_jax.submission", "check", str(run_dir)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    seconds = time.perf_counter() - t0
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for r in rules.TRAINIUM_FRONTIER.rules:
        assert any(line.startswith(f"{r.id} ") and any(f" {v} " in line for v in rules.VERDICTS) for line in lines), r.id
    assert lines[-1].startswith("PASS: ") and seconds < 10, (seconds, out.stdout)
