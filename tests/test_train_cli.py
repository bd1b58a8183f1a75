"""python -m frontier_jax.train: every bad input is one `error: <file/setting>: problem` line, exit 2, no
checkpoint; a real SIGINT mid-training exits 130 with a resumable checkpoint."""

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, TINY_OVERRIDES
from frontier_jax import checkpoint
from frontier_jax.data.shards import write_shard
from frontier_jax.train import main

TINY = str(REPO / "configs" / "tiny.py")


def _sets(*extra):
    return [a for o in (*TINY_OVERRIDES, *extra) for a in ("--set", o)]


def _fail(argv, capsys, out_dir, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for f in fragments:
        assert str(f) in err, err
    assert checkpoint.latest_step(out_dir) is None
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
    assert main(["--resume", str(run), "--set", "model.num_layers=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {run}/checkpoints/200: checkpoint is from another model") and "\n" not in err
    assert (run / "config.json").read_text() == before  # the run directory is left as it was
    assert checkpoint.latest_step(run) == 200


def test_resume_of_a_directory_without_a_run(tmp_path, capsys):
    assert main(["--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.slow
def test_sigint_mid_training_saves_a_resumable_checkpoint(byte_data, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "frontier_jax.train", "--config", TINY, "--data", str(byte_data), "--tokenizer",
           "bytes", "--out", str(out), *_sets("train.max_steps=100000")]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            metrics = out / "metrics.jsonl"
            if metrics.exists() and '"kind": "train"' in metrics.read_text():
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        else:
            pytest.fail("no training step within 240 s")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert "--resume" in output
    step, meta = checkpoint.read_meta(out)
    assert step >= 1 and meta["reason"] == "interrupted" and meta["data"]["position_tokens"] > 0
    from frontier_jax.interop import restore_params

    assert restore_params(out)[3] == step  # restorable with the run's own config
