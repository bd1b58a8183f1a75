"""python -m frontier_jax.train: every bad input is one `error: <file/setting>: problem` line, exit 2, no
checkpoint and no run directory; one process per run directory (a lock); a failed or finished resume
leaves the run as it was; signals: during the warm-up exit 130 cleanly, mid-training a resumable
checkpoint (a second SIGINT does not abort it)."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import REPO, TINY_OVERRIDES
from frontier_jax import checkpoint
from frontier_jax.data.shards import write_shard
from frontier_jax.train import main

TINY = str(REPO / "configs" / "tiny.py")


def _sets(*extra):
    return [a for o in (*TINY_OVERRIDES, *extra) for a in ("--set", o)]


def _exit_code(argv) -> int:
    """main's return value, or the code of the SystemExit that `exit_on_error` raises."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _fail(argv, capsys, out_dir, *fragments):
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for f in fragments:
        assert str(f) in err, err
    assert checkpoint.latest_step(out_dir) is None
    assert not out_dir.exists() or (out_dir / "config.json").exists(), "a partial run directory was left"
    return err


def _copy_data(byte_data, dst):
    shutil.copytree(byte_data, dst)
    return dst


def test_missing_and_empty_data_dir(tmp_path, capsys):
    out = tmp_path / "run"
    _fail(["--config", TINY, "--data", str(tmp_path / "nope"), "--tokenizer", "bytes", "--out", str(out), *_sets()],
          capsys, out, tmp_path / "nope", "does not exist")
    (tmp_path / "empty").mkdir()
    _fail(["--config", TINY, "--data", str(tmp_path / "empty"), "--tokenizer", "bytes", "--out", str(out), *_sets()],
          capsys, out, tmp_path / "empty", "no files matching")


def test_shard_with_wrong_magic(byte_data, tmp_path, capsys):
    data = _copy_data(byte_data, tmp_path / "data")
    shard = data / "synth_train_000001.bin"
    raw = bytearray(shard.read_bytes())
    raw[:4] = np.int32(12345).tobytes()
    shard.write_bytes(bytes(raw))
    _fail(["--config", TINY, "--data", str(data), "--tokenizer", "bytes", "--out", str(tmp_path / "run"), *_sets()],
          capsys, tmp_path / "run", shard, "bad magic")


def test_tokenizer_vocab_differs_from_config(byte_data, tmp_path, capsys):
    _fail(["--config", TINY, "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(tmp_path / "run"),
           *_sets("model.vocab_size=1024")], capsys, tmp_path / "run", "bytes: vocabulary 260", "model.vocab_size 1024")


def test_val_split_shorter_than_one_window(byte_data, tmp_path, capsys):
    data = _copy_data(byte_data, tmp_path / "data")
    write_shard(data / "synth_val_000000.bin", np.arange(4, 40))
    _fail(["--config", TINY, "--data", str(data), "--tokenizer", "bytes", "--out", str(tmp_path / "run"), *_sets()],
          capsys, tmp_path / "run", data / "synth_val_000000.bin", "fewer than one window")


@pytest.mark.parametrize("extra, fragments", [
    (["--set", "model.depth=3"], ["model.depth", "unknown key"]),
    (["--set", "model.num_layers=two"], ["model.num_layers", "expected int"]),
    (["--budget", "0"], ["train.budget_seconds", "must be > 0"]),
])
def test_bad_settings(byte_data, tmp_path, capsys, extra, fragments):
    _fail(["--config", TINY, "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(tmp_path / "run"),
           *_sets(), *extra], capsys, tmp_path / "run", *fragments)


def test_unwritable_output_directory(byte_data, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")  # tests run as root, so chmod would not stop the write: use a file
    _fail(["--config", TINY, "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(blocker / "run"), *_sets()],
          capsys, blocker / "run", blocker / "run", "not writable")


def test_resume_from_a_run_of_a_different_model(trained_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained_run[0], run)
    before = (run / "config.json").read_text()
    assert _exit_code(["--resume", str(run), "--set", "model.num_layers=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {run}/checkpoints/200: checkpoint is from another model") and "\n" not in err
    assert (run / "config.json").read_text() == before  # the run directory is left as it was
    assert checkpoint.latest_step(run) == 200


def test_resume_of_a_directory_without_a_run(tmp_path, capsys):
    assert _exit_code(["--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def _start(cmd_args):
    cmd = [sys.executable, "-m", "frontier_jax.train", *cmd_args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for(proc, predicate, what: str, timeout: float = 240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    pytest.fail(f"no {what} within {timeout} s")


@pytest.mark.slow
def test_sigint_twice_mid_training_still_saves_a_resumable_checkpoint(byte_data, tmp_path):
    out = tmp_path / "run"
    proc = _start(["--config", TINY, "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(out),
                   *_sets("train.max_steps=100000")])
    try:
        metrics = out / "metrics.jsonl"
        _wait_for(proc, lambda: metrics.exists() and '"kind": "train"' in metrics.read_text(), "training step")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # ignored with a line: the checkpoint is still written
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stdout + stderr
    assert "SIGINT: stopping after this step; checkpoint follows" in stderr
    assert "SIGINT again: still stopping" in stderr and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("interrupted: checkpoint step")
    assert f"--resume {out}" in stderr
    step, meta = checkpoint.read_meta(out)
    assert step >= 1 and meta["reason"] == "interrupted" and meta["data"]["position_tokens"] > 0
    from frontier_jax.interop.state_dict import restore_params

    assert restore_params(out)[3] == step  # restorable with the run's own config


@pytest.mark.slow
def test_sigterm_during_the_compile_warm_up_exits_130_cleanly(byte_data, tmp_path):
    out = tmp_path / "run"
    proc = _start(["--config", TINY, "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(out),
                   *_sets("train.compile_warmup_steps=400")])
    try:
        seen = []
        _wait_for(proc, lambda: seen.append(proc.stdout.readline()) or "compile warm-up:" in seen[-1], "warm-up")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stdout + stderr
    lines = stderr.strip().splitlines()
    assert lines == ["SIGTERM: stopping before training starts; nothing to save",
                     "interrupted before training started: nothing trained, no checkpoint written"], stderr
    assert not out.exists()  # a new run directory with nothing trained is removed


@pytest.mark.slow
def test_disk_full_at_a_checkpoint_is_one_line_with_a_summary(byte_data, tmp_path, capsys, monkeypatch):
    from orbax.checkpoint._src.handlers import json_checkpoint_handler

    original, calls = json_checkpoint_handler.JsonCheckpointHandler._save_fn, []

    async def full_on_second_save(self, x, directory):
        calls.append(directory)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
        return await original(self, x, directory)

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", full_on_second_save)
    out = tmp_path / "run"
    assert _exit_code(["--config", TINY, "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(out),
                       *_sets("train.max_steps=6", "train.checkpoint_every_steps=2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {out.absolute()}/checkpoints/4: checkpoint not written (disk full (ENOSPC))")
    assert "\n" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "checkpoint not written" and summary["steps"] == 4
    assert summary["checkpoint_step"] == 2 and "disk full" in summary["error"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2"]  # no temporary directory
    monkeypatch.undo()
    from frontier_jax.interop.state_dict import restore_params

    assert restore_params(out)[3] == 2  # the last checkpoint is intact


def _copy_run(trained_run, dst):
    shutil.copytree(trained_run[0], dst)
    return dst


def _corrupt_checkpoint(run, step):
    for f in (run / "checkpoints" / str(step) / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"garbage" * 8)


def test_bad_input_without_out_creates_no_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _exit_code(["--config", TINY, "--data", str(tmp_path / "nope"), "--tokenizer", "bytes", *_sets()]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_failed_resume_leaves_config_json_as_it_was(trained_run, tmp_path, capsys):
    run = _copy_run(trained_run, tmp_path / "run")
    before = (run / "config.json").read_text()
    _fail(["--resume", str(run), "--data", str(tmp_path / "mistyped")], capsys, tmp_path / "never", "mistyped")
    assert (run / "config.json").read_text() == before
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in trained_run[0].iterdir())


def test_resume_with_a_corrupt_config_json(trained_run, tmp_path, capsys):
    run = _copy_run(trained_run, tmp_path / "run")
    (run / "config.json").write_text('{"model": {"vocab_size": 2')
    _fail(["--resume", str(run)], capsys, tmp_path / "never", run / "config.json")


def test_out_beside_resume_is_refused_unless_it_is_the_same_directory(trained_run, tmp_path, capsys):
    _fail(["--resume", str(trained_run[0]), "--out", str(tmp_path / "other")], capsys, tmp_path / "other",
          "--out", "drop --out")


def test_resume_of_a_finished_run_says_so_and_exits_0(trained_run, tmp_path, capsys):
    run = _copy_run(trained_run, tmp_path / "run")
    assert _exit_code(["--resume", str(run), "--out", str(run)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"{run.absolute()}: already finished at step 200 (train.max_steps reached); nothing to do: raise " \
                  "train.max_steps or --budget to continue"
    assert checkpoint.steps(run) == [200]


def test_resume_with_every_checkpoint_corrupt_is_one_line(trained_run, tmp_path, capsys):
    run = _copy_run(trained_run, tmp_path / "run")
    _corrupt_checkpoint(run, 200)
    assert _exit_code(["--resume", str(run)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"error: {run}: no intact checkpoint (unreadable: steps 200; newest: ") and "\n" not in err
    assert "skipped" not in captured.out  # the error line says it all


def test_a_second_training_on_a_locked_directory_is_refused(trained_run, byte_data, tmp_path, capsys):
    from frontier_jax.run.rundir import RunDirLock

    run = _copy_run(trained_run, tmp_path / "run")
    holder = RunDirLock(run)  # another process's lock, as far as the trainer can tell (flock is per open file)
    try:
        before = {p.name: p.stat().st_mtime_ns for p in run.rglob("*")}
        _fail(["--resume", str(run), "--set", "train.max_steps=300"], capsys, tmp_path / "never",
              str(run), "another process", f"pid {os.getpid()}")
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        other = RunDirLock(fresh)
        _fail(["--config", TINY, "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(fresh), *_sets()],
              capsys, tmp_path / "never", "another process")
        other.release()
        assert {p.name: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written
        assert [p.name for p in fresh.iterdir()] == [".lock"]
    finally:
        holder.release()


def test_a_killed_owner_does_not_block_its_own_resume(tmp_path):
    from frontier_jax.run.rundir import RunDirLock

    code = "import sys, time; from frontier_jax.run.rundir import RunDirLock; l = RunDirLock(sys.argv[1]); " \
           "print('locked', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(Exception, match="another process"):
            RunDirLock(tmp_path)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    RunDirLock(tmp_path).release()  # the kernel released the dead process's lock


def test_every_option_has_help():
    from frontier_jax.train import build_parser

    missing = [a.dest for a in build_parser()._actions if not a.help]
    assert not missing, f"options without help: {missing}"


def test_help_text_reads_as_user_help(capsys):
    from frontier_jax.train import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    assert "trainer.run" not in text and "Nothing else" not in text
    assert "exit codes" in text and "--resume" in text


def test_the_run_records_absolute_data_paths(tmp_path, monkeypatch):
    """A run evaluated from another directory finds its data: --data/--tokenizer are stored absolute."""
    from frontier_jax.train import parse_args, resolve

    monkeypatch.chdir(tmp_path)
    cfg, out, resume, demo = resolve(parse_args(["--config", TINY, "--data", "shards", "--tokenizer", "sp.model"]))
    assert cfg.data.data_dir == str(tmp_path / "shards") and cfg.data.tokenizer == str(tmp_path / "sp.model")
    cfg, *_ = resolve(parse_args(["--config", TINY, "--data", "shards", "--tokenizer", "bytes"]))
    assert cfg.data.tokenizer == "bytes"


# ----------------------------------------------------------------------------- round 3


def test_a_corrupt_newer_checkpoint_is_set_aside_and_every_later_save_reaches_disk(trained_run, tmp_path, capsys):
    """Round 3, cause 1: with a corrupt newer checkpoint on disk (restore skipped it), every later save up
    to its step was skipped while the log said it was written, and summary.json named the corrupt step."""
    run = _copy_run(trained_run, tmp_path / "run")
    shutil.copytree(run / "checkpoints" / "200", run / "checkpoints" / "205")
    (run / "checkpoints" / "205" / "meta" / "metadata").unlink()  # the reproduction
    assert _exit_code(["--resume", str(run), "--set", "train.max_steps=202",
                       "--set", "train.checkpoint_every_steps=1"]) == 0
    out = capsys.readouterr().out
    assert f"moved the unreadable checkpoint 205 aside to {run.absolute()}/corrupt-checkpoints/205" in out
    assert checkpoint.steps(run) == [201, 202] and (run / "corrupt-checkpoints" / "205").is_dir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["checkpoint_step"] == 202 and summary["steps"] == 202
    assert checkpoint.read_meta(run)[1]["step"] == 202


def test_a_failed_resume_after_the_warm_up_leaves_config_json_as_it_was(trained_run, byte_data, tmp_path, capsys):
    """Round 3, cause 5: config.json was rewritten after the warm-up, before the stream position was
    restored: a --data whose shards do not fit the saved position failed (exit 2) and from then on every
    plain --resume used that --data."""
    run = _copy_run(trained_run, tmp_path / "run")
    before = (run / "config.json").read_text()
    small = tmp_path / "small"
    small.mkdir()
    write_shard(small / "synth_train_000000.bin", np.asarray(
        __import__("frontier_jax.data.shards", fromlist=["read_shard"]).read_shard(
            byte_data / "synth_train_000000.bin"))[:700])
    shutil.copy(byte_data / "synth_val_000000.bin", small)
    assert _exit_code(["--resume", str(run), "--data", str(small), "--set", "train.max_steps=205"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "saved stream" in err and "\n" not in err
    assert (run / "config.json").read_text() == before


def test_resume_of_a_finished_run_with_a_corrupt_summary_is_one_line(trained_run, tmp_path, capsys):
    """Round 3, cause 10: summary.json on --resume of a finished run was read with an unguarded json.loads."""
    run = _copy_run(trained_run, tmp_path / "run")
    (run / "summary.json").write_text('{"steps": ')
    assert _exit_code(["--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {run}/summary.json: unreadable run summary") and "\n" not in err


def test_a_signal_in_the_warm_up_of_a_resume_leaves_config_json_as_it_was(trained_run, tmp_path, monkeypatch):
    """Round 3, cause 5: Ctrl-C in a resume's warm-up said 'the run is as it was' while the --set
    overrides had already been written to config.json."""
    from frontier_jax import trainer
    from frontier_jax.run import rundir, startup
    from frontier_jax.config import apply_overrides, load_run_config

    run = _copy_run(trained_run, tmp_path / "run")
    before = (run / "config.json").read_text()

    class SignalInWarmUp(rundir.Signals):
        reads = 0

        @property
        def received(self):  # None for the start-up check, then a SIGINT seen by the warm-up's check
            SignalInWarmUp.reads += 1
            return None if SignalInWarmUp.reads == 1 else "SIGINT"

        @received.setter
        def received(self, value):
            pass

    monkeypatch.setattr(startup, "Signals", SignalInWarmUp)
    cfg = apply_overrides(load_run_config(run / "config.json"), ["train.max_steps=210", "train.val_every_steps=3"])
    summary = trainer.run(cfg, run, resume=True, echo=False)
    assert summary["stop_reason"] == "signal SIGINT before training" and SignalInWarmUp.reads >= 2
    assert (run / "config.json").read_text() == before
