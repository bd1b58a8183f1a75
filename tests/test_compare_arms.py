"""python -m frontier_jax.compare: crafted arms (fake external commands,
a crashing arm, an arm without a val_bpb line), refusal of mismatched input, interruption, and (slow) a
real JAX vs PyTorch comparison on the synthetic byte data."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, TINY_OVERRIDES
from frontier_jax.compare.arms import main
from frontier_jax.errors import EXIT_BAD_INPUT


# compare sets the budget for every arm, so an arm may not carry train.budget_seconds
ARM_SETS = " ".join(f"--set {o}" for o in TINY_OVERRIDES
                    if not o.startswith(("train.budget_seconds", "train.max_steps")))


def _py(code: str) -> str:
    """A cmd arm running `python -c code` ({seed} etc. are substituted by compare)."""
    return f"cmd:{sys.executable} -c '{code}'"


# ----------------------------------------------------------------------------- crafted arms


def test_compare_cmd_arms_failures_reported_others_finish(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main([
        "--arm", "good=" + _py('print("val_bpb: %.4f" % (1.30 + 0.0002 * ({seed} - 1337)))'),
        "--arm", "crash=" + _py('import sys; print("starting"); sys.exit("boom: simulated crash")'),
        "--arm", "quiet=" + _py('print("trained, but no score line")'),
        "--arm", "better=" + _py('print("step:1/9 val_loss:2.0 val_bpb:1.5 train_time:1000ms"); '
                                 'print("val_bpb:%.4f" % (1.20 + 0.0003 * ({seed} - 1337)))'),
        "--budget", "3", "--seeds", "2", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert [r["arm"] for r in res["runs"]] == ["good", "crash", "quiet", "better"] * 2  # interleaved
    status = {(r["arm"], r["seed"]): r["status"] for r in res["runs"]}
    assert status[("crash", 1338)] == "failed" and status[("quiet", 1337)] == "no val_bpb line"
    crash = next(r for r in res["runs"] if r["arm"] == "crash")
    assert crash["rc"] == 1 and "boom: simulated crash" in crash["log_tail"]
    arms = {a["arm"]: a for a in res["arms"]}
    assert arms["good"]["val_bpb"]["mean"] == pytest.approx(1.3001) and arms["good"]["ok"] == 2
    assert arms["crash"]["ok"] == 0 and arms["crash"]["failed"] == 2
    pair = next(p for p in res["pairs"] if (p["a"], p["b"]) == ("good", "better"))
    assert pair["verdict"] == "better" and pair["diff"] == pytest.approx(-0.09995)
    assert next(r for r in res["runs"] if r["arm"] == "better")["curve"][0]["bpb"] == 1.5  # official log lines
    md = (out / "results.md").read_text()
    assert "| good | cmd | 2 / 2 |" in md and "crash seed 1337: failed" in md and "no val_bpb line" in md
    assert (out / "val_bpb.png").stat().st_size > 1000


@pytest.mark.parametrize("arm_extra, message", [
    ("jax:configs/tiny.py --data /elsewhere", "--data is set by compare"),
    ("torch:configs/tiny.py --set data.tokenizer=bytes", "own data"),
    ("jax:configs/tiny.py --set model.vocab_size=512", "vocabulary 260 does not match arm"),
    ("jax:configs/no_such.py", "not found"),
    ("cmd:no-such-program-xyz --flag", "not found"),
])
def test_mismatched_input_refused_before_running(byte_data, tmp_path, capsys, arm_extra, message):
    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as exit_:
        main(["--arm", f"jax:{REPO}/configs/tiny.py {ARM_SETS}", "--arm", arm_extra, "--data", str(byte_data),
              "--tokenizer", "bytes", "--budget", "3", "--out", str(out)])
    assert exit_.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and err.count("\n") == 1  # one line
    assert not out.exists()


def test_shards_from_another_tokenizer_refused(byte_data, tmp_path, capsys):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(byte_data, data)
    (data / "manifest.json").write_text(json.dumps({"tokenizer": {"path": "other.model", "sha256": "0" * 64}}))
    with pytest.raises(SystemExit) as exit_:
        main(["--arm", _py("print(1)"), "--arm", _py("print(2)"), "--data", str(data), "--tokenizer", "bytes",
              "--budget", "3", "--out", str(tmp_path / "cmp")])
    assert exit_.value.code == EXIT_BAD_INPUT
    assert "shards were made with tokenizer other.model" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["out is a file", "missing shards", "bad --seeds"])
def test_other_bad_input_is_one_line_exit_2(byte_data, tmp_path, capsys, case):
    """OSError (an unusable --out), DataError (no shards) and CompareError all leave through errors.exit_on_error."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    args = {"out is a file": ["--data", str(byte_data), "--out", str(blocker / "cmp")],
            "missing shards": ["--data", str(tmp_path), "--out", str(tmp_path / "cmp")],
            "bad --seeds": ["--data", str(byte_data), "--seeds", "0", "--out", str(tmp_path / "cmp")]}[case]
    with pytest.raises(SystemExit) as exit_:
        main(["--arm", f"jax:{REPO}/configs/tiny.py {ARM_SETS}", "--arm", f"torch:{REPO}/configs/tiny.py {ARM_SETS}",
              "--tokenizer", "bytes", "--budget", "3", *args])
    assert exit_.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert {"out is a file": str(blocker), "missing shards": str(tmp_path), "bad --seeds": "--seeds"}[case] in err
    assert not (tmp_path / "cmp").exists()


def test_interrupt_keeps_finished_runs(tmp_path):
    out = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "frontier_jax.compare", "--arm", "fast=" + _py('print("val_bpb: 1.25")'),
           "--arm", "slow=" + _py("import time; time.sleep(60)"), "--budget", "3", "--seeds", "2", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "runs" / "slow-s1337").exists():
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    res = json.loads((out / "results.json").read_text())
    assert res["runs"][0]["arm"] == "fast" and res["runs"][0]["status"] == "ok"
    assert res["runs"][-1]["status"] == "interrupted" and len(res["runs"]) == 2
    assert "kept in" in err


# ----------------------------------------------------------------------------- real arms (slow)


@pytest.mark.slow
def test_jax_vs_torch_on_byte_data(byte_data, tmp_path):
    pytest.importorskip("torch", reason="the torch arm needs the optional extra: pip install -e .[torch]")
    out = tmp_path / "cmp"
    rc = main(["--arm", f"jax:{REPO}/configs/tiny.py {ARM_SETS}",
               "--arm", f"torch:{REPO}/configs/tiny.py {ARM_SETS} --threads 1",
               "--data", str(byte_data), "--tokenizer", "bytes", "--budget", "3", "--seeds", "1", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert [r["status"] for r in res["runs"]] == ["ok", "ok"], [r.get("log_tail") for r in res["runs"]]
    for run in res["runs"]:
        assert run["steps"] >= 1 and run["tokens"] == run["steps"] * 512 and 0 < run["val_bpb"] < 10
        assert run["curve"] and run["curve"][-1]["bpb"] == pytest.approx(run["val_bpb"])
    assert res["pairs"][0]["verdict"] == "undecided"  # one seed each: no interval
    assert "A-torch-tiny" not in (out / "results.md").read_text() and "B-torch-tiny" in (out / "results.md").read_text()


def test_jax_arms_get_the_torch_arms_core_count():
    from frontier_jax.compare.arms import match_core_count, parse_arm

    arms = [parse_arm(s, i) for i, s in enumerate(["jax:configs/tiny.py", "two=jax:configs/tiny.py --set "
                                                   "parallel.num_devices=2", "torch:configs/tiny.py"])]
    notes = match_core_count(arms)
    assert arms[0].args == ["--set", "parallel.num_devices=1"] and len(notes) == 1 and arms[0].label in notes[0]
    assert arms[1].args == ["--set", "parallel.num_devices=2"] and arms[2].args == []  # its own choice is kept
    alone = [parse_arm("jax:configs/tiny.py", 0), parse_arm("jax:configs/tiny.py --set model.num_layers=3", 1)]
    assert match_core_count(alone) == [] and alone[0].args == []  # no torch arm: untouched


# ----------------------------------------------------------------------------- round 3: scores, conditions, timeout


def _strict(path):
    """results.json parsed as strict JSON (NaN / Infinity are not JSON)."""
    def bad(const):
        raise AssertionError(f"{path}: non-JSON constant {const}")
    return json.loads(path.read_text(), parse_constant=bad)


def test_the_final_val_bpb_decides_and_a_non_finite_one_is_a_failed_run(tmp_path):
    """Round 3, cause 3: `val_bpb: nan` after a periodic value was scored by the earlier value and called
    better; `1e400` became inf and results.json held Infinity; a zero-spread pair wrote "df": Infinity."""
    out = tmp_path / "cmp"
    rc = main(["--arm", "base=" + _py('print("val_bpb: 1.3000")'),
               "--arm", "nan=" + _py('print("val_bpb: 1.1000"); print("val_bpb: nan")'),
               "--arm", "huge=" + _py('print("val_bpb: 1e400")'),
               "--arm", "same=" + _py('print("val_bpb: 1.2000")'),
               "--budget", "3", "--seeds", "2", "--out", str(out)])
    assert rc == 0
    res = _strict(out / "results.json")
    status = {r["arm"]: r["status"] for r in res["runs"]}
    assert status["nan"] == status["huge"] == "failed: non-finite final val_bpb" and status["base"] == "ok"
    pairs = {(p["a"], p["b"]): p for p in res["pairs"]}
    assert pairs[("base", "nan")]["verdict"] == "no data"  # never "better"
    assert pairs[("base", "same")]["verdict"] == "better" and pairs[("base", "same")]["df"] is None


def test_compare_flags_an_arm_whose_runs_differ_in_throughput_by_2x(tmp_path):
    """Issue 26 (a): per run, throughput over time and the load; an arm whose runs differ by 2x confounds
    every verdict it is part of, and results.md says so."""
    steady = ('[print("step:%d/20 train_loss:2.0 train_time:%dms step_avg:1ms" % (s, 100 * s)) for s in range(1, 21)]; '
              'print("val_bpb: 1.30")')
    jumpy = ('[print("step:%d/20 train_loss:2.0 train_time:%dms step_avg:1ms" % (s, 100 * ({seed} - 1336) * s)) '
             'for s in range(1, 21)]; print("val_bpb: 1.20")')
    out = tmp_path / "cmp"
    assert main(["--arm", "steady=" + _py(steady), "--arm", "jumpy=" + _py(jumpy), "--budget", "3", "--seeds", "2",
                 "--out", str(out)]) == 0
    res = _strict(out / "results.json")
    run = res["runs"][0]
    assert run["throughput"]["unit"] == "steps/s" and run["throughput"]["rate"] == pytest.approx(10.0)
    arms = {a["arm"]: a for a in res["arms"]}
    assert not arms["steady"]["confounded"] and "runs differ in throughput by 2.00x" in arms["jumpy"]["confounded"][0]
    assert res["pairs"][0]["confounded"] and res["pairs"][0]["text"].startswith("CONFOUNDED")
    md = (out / "results.md").read_text()
    assert "**CONFOUNDED:**" in md and "jumpy: runs differ in throughput by 2.00x" in md


def test_every_arm_is_scored_by_the_round_trip_score_when_every_arm_has_one(tmp_path):
    """Issue 26 (b): the official script's final_int8_zlib_roundtrip(_exact) lines (a cmd: arm) and
    summary.json's roundtrip_val_bpb (a jax/torch arm) give the round-trip score, used only when every
    arm has one; results.md says which score."""
    from frontier_jax.compare.collect import collect, final_scores

    official = ("step:9/9 val_loss:2.1 val_bpb:1.2500 train_time:900ms step_avg:100.00ms\n"
                "final_int8_zlib_roundtrip val_loss:2.1100 val_bpb:1.2600 eval_time:10ms\n"
                "final_int8_zlib_roundtrip_exact val_loss:2.11000000 val_bpb:1.26012345\n")
    assert final_scores(official) == (1.25, 1.26012345)
    assert final_scores("val_bpb:enabled tokenizer_kind=sentencepiece\nval_bpb: 1.5\n") == (1.5, None)
    run = tmp_path / "jaxrun"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"val_bpb": 1.3, "roundtrip_val_bpb": 1.31, "steps": 4}))
    (run / "console.log").write_text("val_bpb: 1.300000\n")
    got = collect(run, run / "console.log", 0)
    assert got["status"] == "ok" and (got["val_bpb"], got["roundtrip_val_bpb"]) == (1.3, 1.31)

    def arm(plain, rt):
        code = f'print("val_bpb: {plain}")' + (f'; print("final_int8_zlib_roundtrip_exact val_loss:2 val_bpb:{rt}")'
                                              if rt else "")
        return _py(code)

    out = tmp_path / "cmp"
    assert main(["--arm", "a=" + arm(1.30, 1.40), "--arm", "b=" + arm(1.35, 1.36), "--budget", "3", "--seeds", "1",
                 "--out", str(out)]) == 0
    res = _strict(out / "results.json")
    assert res["conditions"]["score"] == "roundtrip_val_bpb" and res["pairs"][0]["diff"] == pytest.approx(-0.04)
    assert "int8+zlib round-trip" in (out / "results.md").read_text()
    out2 = tmp_path / "cmp2"
    assert main(["--arm", "a=" + arm(1.30, 1.40), "--arm", "b=" + arm(1.35, None), "--budget", "3", "--seeds", "1",
                 "--out", str(out2)]) == 0
    res = _strict(out2 / "results.json")
    assert res["conditions"]["score"] == "val_bpb" and res["pairs"][0]["diff"] == pytest.approx(0.05)
    assert "plain final val_bpb (b reported no round-trip score)" in (out2 / "results.md").read_text()


def test_timeout_ends_the_arms_whole_process_group_and_cd_arms_run(tmp_path):
    """Round 3, cause 8: --timeout killed only the arm's shell, its command ran on. Issue 26 (c): a
    `cmd:cd DIR && ...` arm is accepted (cd is a shell builtin, not a program on PATH)."""
    pid_file = tmp_path / "child.pid"
    out = tmp_path / "cmp"
    rc = main(["--arm", f"cmd:cd {tmp_path} && " + _py('print("val_bpb: 1.3")')[4:],
               "--arm", f"hang=cmd:sleep 300 & echo $! > {pid_file}; wait",
               "--budget", "3", "--seeds", "1", "--timeout", "2", "--out", str(out)])
    assert rc == 0
    res = _strict(out / "results.json")
    assert [r["status"] for r in res["runs"]] == ["ok", "failed"]
    pid = int(pid_file.read_text())
    time.sleep(0.2)
    try:
        state = open(f"/proc/{pid}/stat").read().split(") ")[1][0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), f"the arm's child {pid} is still running (state {state})"  # Z: killed, unreaped


def test_a_corrupt_manifest_is_one_line(byte_data, tmp_path, capsys):
    """Round 3, cause 10: compare read manifest.json with an unguarded json.loads (a traceback)."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(byte_data, data)
    (data / "manifest.json").write_text('{"tokenizer": ')
    with pytest.raises(SystemExit) as exit_:
        main(["--arm", _py("print(1)"), "--arm", _py("print(2)"), "--data", str(data), "--tokenizer", "bytes",
              "--budget", "3", "--out", str(tmp_path / "cmp")])
    err = capsys.readouterr().err
    assert exit_.value.code == EXIT_BAD_INPUT and err.count("\n") == 1 and "manifest.json: unreadable manifest" in err


def test_only_positive_finite_scores_are_scored_one_line_naming_the_arm(tmp_path, capsys):
    """`val_bpb: -5` won "better by 6.6471 bpb"; `1e-400` underflowed to 0 and won too: each run is not scored,
    one line names the arm, and the pair has no verdict."""
    out = tmp_path / "cmp"
    assert main(["--arm", "a=" + _py('print("val_bpb: 1.5{seed}")'), "--arm", "b=" + _py('print("val_bpb: -5.{seed}")'),
                 "--arm", "tiny=" + _py('print("val_bpb: 1e-400")'), "--budget", "3", "--seeds", "2",
                 "--out", str(out)]) == 0
    res = _strict(out / "results.json")
    status = {(r["arm"], r["seed"]): r["status"] for r in res["runs"]}
    assert status[("b", 1337)] == "failed: val_bpb -5.1337 is not a positive score"
    assert status[("tiny", 1338)] == "failed: val_bpb 0 is not a positive score (it underflowed to 0)"
    pairs = {(p["a"], p["b"]): p["verdict"] for p in res["pairs"]}
    assert pairs[("a", "b")] == pairs[("a", "tiny")] == "no data"
    shown = capsys.readouterr().out.splitlines()
    assert any(x.startswith("    b seed 1338: not scored: val_bpb -5.1338 is not a positive score (") for x in shown)
    from frontier_jax.compare.collect import score_problem

    assert [score_problem("val_bpb", v) for v in (1.2, None, 1e-300)] == [None, None, None]


def test_a_confounded_comparison_says_the_remedy_titles_and_marks_its_plot(tmp_path, capsys, monkeypatch):
    """An arm whose runs differ 2x in throughput: the remedies (with the options that apply them) in results.md,
    results.json and last on the screen; the plot titled and marked CONFOUNDED."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    steps = lambda scale: (f'[print("step:%d/20 train_loss:2.0 train_time:%dms step_avg:1ms" % (s, {scale} * s)) '
                           f'for s in range(1, 21)]; print("val_bpb: 1.30")')
    out = tmp_path / "cmp"
    assert main(["--arm", "steady=" + _py(steps(100)), "--arm", "jumpy=" + _py(steps("100 * ({seed} - 1336)")),
                 "--budget", "3", "--seeds", "2", "--out", str(out)]) == 0
    res = _strict(out / "results.json")
    fixes = res["conditions"]["remedies"]
    assert any(f.startswith("--threads 1: every run pinned to one CPU") for f in fixes)
    assert any("--max-load" in f for f in fixes)
    md = (out / "results.md").read_text()
    assert "**Remedy** (what compare would change, and the option that does it):" in md and "- --threads 1" in md
    screen = capsys.readouterr().out
    assert "CONFOUNDED: remedy: --threads 1" in screen.splitlines()[-3] + screen.splitlines()[-2]
    fig = figures[-1]
    assert fig._suptitle.get_text().startswith("val bits/byte (lower is better): steady vs jumpy; 2 seed(s) x 3 s")
    assert any(t.get_text().startswith("CONFOUNDED: the arms did not run under the same conditions") for t in fig.texts)
    from matplotlib.ticker import EngFormatter

    assert isinstance(fig.axes[1].xaxis.get_major_formatter(), EngFormatter)  # tokens as 200k, not 200000


def test_threads_pins_every_run_and_progress_lines_come_while_a_run_is_silent(tmp_path, capsys, monkeypatch):
    """--threads 1: the arm's process may run on one CPU only (torch arms get --threads 1); a line every
    PROGRESS_EVERY_S while a run runs, with its console's last line."""
    import argparse
    import os

    from frontier_jax.compare import arms

    monkeypatch.setattr(arms, "PROGRESS_EVERY_S", 0.5)
    code = 'import os, time; print("cpus", len(os.sched_getaffinity(0)), flush=True); time.sleep(2.5); print("val_bpb: 1.2")'
    out = tmp_path / "cmp"
    before = os.sched_getaffinity(0)
    assert main(["--arm", "a=" + _py(code), "--arm", "b=" + _py(code), "--budget", "3", "--seeds", "1",
                 "--threads", "1", "--out", str(out)]) == 0
    assert "cpus 1" in (out / "runs" / "a-s1337" / "console.log").read_text()
    assert os.sched_getaffinity(0) == before  # compare's own CPUs are put back
    screen = capsys.readouterr().out
    assert any(x.startswith("    a seed 1337: ") and x.endswith(" s | cpus 1") for x in screen.splitlines())
    torch_arm = arms.parse_arm("torch:configs/tiny.py", 0)
    ns = argparse.Namespace(data="d", tokenizer="t", budget=3.0, threads=1)
    cmd = arms.build_command(torch_arm, 1337, tmp_path, ns)
    assert cmd[cmd.index("--threads") + 1] == "1"


RECORD_LOG = """step:7179/9000 val_loss:1.9214 val_bpb:1.1379 train_time:600128ms step_avg:83.59ms
DIAGNOSTIC post_ema val_loss:1.9196 val_bpb:1.1369 eval_time:1971ms
Serialized model int6+lzma: 15887928 bytes
final_int6_roundtrip val_loss:1.9336 val_bpb:1.1452 eval_time:6562ms
final_int6_roundtrip_exact val_loss:1.93358885 val_bpb:1.14518023
final_int6_sliding_window val_loss:1.8939 val_bpb:1.1217 stride:64 eval_time:74066ms
final_int6_sliding_window_exact val_loss:1.89385556 val_bpb:1.12165091
final_int8_zlib_roundtrip_exact val_loss:1.89385556 val_bpb:1.12165091
final_int6_sliding_window_s64_exact val_loss:1.80000000 val_bpb:1.10000000
ttt_sliding:done val_loss=1.889768 val_bpb=1.119230 elapsed=409.8s
legal_ttt val_loss:1.8898 val_bpb:1.1192 eval_time:410268ms
legal_ttt_exact val_loss:1.88976776 val_bpb:1.11922988
"""


def test_the_records_final_lines_give_each_stage_its_score():
    """Record 2026-03-23's log (seed 1337's final lines, plus an `_s64` line): the plain score is its DIAGNOSTIC
    line, the round trip its final_int6_roundtrip_exact line (not the final_int8_zlib_roundtrip_exact line, which
    repeats its sliding score), the sliding and TTT scores their _exact lines; ours are read by the same rule."""
    from frontier_jax.compare.collect import stage_scores

    assert stage_scores(RECORD_LOG) == {"val": 1.1369, "roundtrip": 1.14518023, "sliding": 1.12165091,
                                        "ttt": 1.11922988}
    ours = ("val_bpb: 1.300000\nfinal_int8_zlib_roundtrip val_loss:2.0 val_bpb:1.3100 eval_time:5ms\n"
            "final_int8_zlib_roundtrip_exact val_loss:2.0 val_bpb:1.31000001\n"
            "final_int8_zlib_sliding_window val_loss:2.0 val_bpb:1.2900 stride:64 eval_time:5ms rules:trainium\n")
    assert stage_scores(ours) == {"val": 1.3, "roundtrip": 1.31000001, "sliding": 1.29, "ttt": None}


def test_a_record_style_command_is_compared_by_the_line_score_names(tmp_path):
    """`--score` picks the line every arm is scored by (a cmd: arm printing the record's lines); an arm without
    that line is a failed run; auto keeps the project's rule (the round trip when every arm has one)."""
    def arm(rt, sliding, ttt=None):
        lines = [f"final_int6_roundtrip_exact val_loss:2 val_bpb:{rt}",
                 f"final_int6_sliding_window_exact val_loss:2 val_bpb:{sliding}",
                 f"final_int8_zlib_roundtrip_exact val_loss:2 val_bpb:{sliding}"]
        lines += [f"legal_ttt_exact val_loss:2 val_bpb:{ttt}"] if ttt else []
        return _py("; ".join(f'print("{line}")' for line in ["DIAGNOSTIC post_ema val_loss:2 val_bpb:1.5", *lines]))

    for score, diff in (("auto", 1.20 - 1.25), ("sliding", 1.10 - 1.12), ("ttt", 1.05 - 1.11)):
        out = tmp_path / score
        assert main(["--arm", "a=" + arm(1.25, 1.12, 1.11), "--arm", "b=" + arm(1.20, 1.10, 1.05), "--budget", "3",
                     "--seeds", "1", "--out", str(out), "--score", score]) == 0
        res = _strict(out / "results.json")
        assert res["pairs"][0]["diff"] == pytest.approx(diff), score
        assert res["conditions"]["score"] == {"auto": "roundtrip", "sliding": "sliding", "ttt": "ttt"}[score] + "_val_bpb"
    assert "final_int6_roundtrip" in res["conditions"]["scored_by"] or "legal_ttt" in res["conditions"]["scored_by"]
    out = tmp_path / "missing"
    assert main(["--arm", "a=" + arm(1.25, 1.12, 1.11), "--arm", "b=" + arm(1.20, 1.10), "--budget", "3", "--seeds", "1",
                 "--out", str(out), "--score", "ttt"]) == 0
    res = _strict(out / "results.json")
    assert [r["status"] for r in res["runs"]] == ["ok", "no ttt score (--score ttt)"]
