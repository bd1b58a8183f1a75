"""The run directory module: preparing it, the log, signals, metrics, the summary files, reading a run
back, and the weights .npz (bf16 kept)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from frontier_jax.interop import npz
from frontier_jax.run import rundir
from frontier_jax.config import Config, ModelConfig, to_dict
from frontier_jax.data.shards import DataError
from frontier_jax.errors import BadInput


def test_prepare_refuses_an_existing_run_unless_resuming(tmp_path):
    out = rundir.prepare_run_dir(tmp_path / "a" / "run", resume=False)
    assert out.is_dir() and not list(out.iterdir())  # the write probe is gone
    (out / rundir.METRICS).write_text("")
    with pytest.raises(rundir.RunError, match="already holds a run"):
        rundir.prepare_run_dir(out, resume=False)
    assert rundir.prepare_run_dir(out, resume=True) == out


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into a read-only directory")
def test_prepare_names_an_unwritable_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(rundir.RunError, match="not writable"):
            rundir.prepare_run_dir(ro / "run", resume=False)
    finally:
        ro.chmod(0o700)


def test_log_appends_and_a_disabled_log_writes_nothing(tmp_path, capsys):
    log = rundir.RunLog(tmp_path / rundir.LOG, echo=True)
    log("one")
    log.close()
    log = rundir.RunLog(tmp_path / rundir.LOG, echo=False)
    log("two")
    log.close()
    assert (tmp_path / rundir.LOG).read_text() == "one\ntwo\n" and capsys.readouterr().out == "one\n"
    rundir.RunLog(tmp_path / "other.log", enabled=False)("x")
    assert not (tmp_path / "other.log").exists()


def test_signals_set_a_flag_and_restore_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with rundir.Signals() as s:
        assert s.received is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert s.received == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_metrics_summary_and_plot(tmp_path):
    m = rundir.MetricsLog(tmp_path / rundir.METRICS)
    for step in (1, 2):
        m.log(kind="train", step=step, loss=3.0 - step, tokens=10 * step, train_seconds=float(step))
    m.log(kind="val", step=2, loss=1.5, bpb=2.0, tokens=20, train_seconds=2.0, final=True)
    m.close()
    rows = rundir.read_metrics(tmp_path)
    assert [r["kind"] for r in rows] == ["train", "train", "val"] and rows == m.rows
    summary = {"config_name": "t", "config_hash": "abc", "steps": 2, "tokens": 20, "val_bpb": 2.0,
               "stop_reason": "max_steps", "mfu": 0.25}
    table = rundir.write_summary(tmp_path, summary)
    assert json.loads((tmp_path / rundir.SUMMARY_JSON).read_text()) == summary
    assert (tmp_path / rundir.SUMMARY_TXT).read_text() == table + "\n"
    assert "25.0%" in table and "max_steps" in table and "val bpb" in table
    assert (tmp_path / rundir.CURVES).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if "tmp" in p.name]
    other = tmp_path / "other"
    other.mkdir()
    assert rundir.write_summary(other, summary, write=False) == table and not list(other.iterdir())


def test_summary_table_names_the_run_directory_both_scores_and_the_sizes():
    s = {"run_dir": "/runs/a", "val_bpb": 1.5, "roundtrip_val_bpb": 1.51, "submission_bytes": 1300,
         "artifact_bytes": 1000, "code_bytes": 300, "matmul_peak_flops": 1e11, "peak_source": "measured: x"}
    table = dict(rundir.summary_rows(s))
    assert table["run directory"] == "/runs/a" and table["round-trip val bpb"].startswith("1.5100")
    assert table["submission size"] == "1,300 bytes = 1,000 int8+zlib model + 300 code"
    assert table["matmul peak"] == "1e+11 FLOP/s (measured: x)"
    assert table["rules"] == "-"
    table = dict(rundir.summary_rows({**s, "rules_profile": "parameter-golf", "rules_line": "parameter-golf: size pass"}))
    assert table["rules"] == ("parameter-golf: size pass (every rule: python -m frontier_jax.submission check "
                              "/runs/a)")
    assert table["round-trip val bpb"].endswith("(int8+zlib artifact: the score under the rules profile parameter-golf)")


def test_read_config_and_env_round_trip_and_refuse_what_is_not_a_run(tmp_path):
    cfg = Config(name="x", model=ModelConfig(num_layers=3))
    rundir.write_json(tmp_path / rundir.CONFIG, to_dict(cfg))
    rundir.write_json(tmp_path / rundir.ENV, {"compute_dtype": "float32"})
    assert rundir.read_config(tmp_path) == cfg and rundir.read_env(tmp_path) == {"compute_dtype": "float32"}
    with pytest.raises(DataError, match="not a run directory"):
        rundir.read_config(tmp_path / "nothing")
    assert rundir.read_env(tmp_path / "nothing") == {}
    (tmp_path / rundir.CONFIG).write_text("{broken")
    with pytest.raises(BadInput, match="unreadable run config"):
        rundir.read_config(tmp_path)


def test_weights_npz_round_trip_keeps_dtypes_and_meta(tmp_path):
    import ml_dtypes

    sd = {"tok_emb.weight": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
          "skip_weights": np.ones((1, 3), np.float32)}
    npz.save_npz(tmp_path / rundir.WEIGHTS, sd, {"step": 3})
    back, meta = npz.load_npz(tmp_path / rundir.WEIGHTS)
    assert meta == {"step": 3} and set(back) == set(sd)
    for k in sd:
        assert back[k].dtype == sd[k].dtype and np.array_equal(back[k].astype(np.float32), sd[k].astype(np.float32))
    with pytest.raises(npz.WeightsError, match="no such npz"):
        npz.load_npz(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(npz.WeightsError, match="not a readable npz"):
        npz.load_npz(tmp_path / "bad.npz")


def test_environment_lists_versions_and_git():
    env = rundir.environment(("numpy", "no-such-package-xyz"))
    assert env["versions"]["numpy"] == np.__version__ and env["versions"]["no-such-package-xyz"] is None
    assert env["python"] and env["git"]


def _forged_npz(path, shape, payload: bytes):
    """An npz whose one member's .npy header declares `shape` (float32) over `payload` bytes of data."""
    import io
    import zipfile

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("w.npy", buf.getvalue() + payload)


def test_npz_headers_are_checked_before_any_array_is_read(tmp_path, monkeypatch):
    """Round 3, cause 10: every npz member was loaded before keys and shapes were checked, so a 4 TiB header or
    a zip bomb ended in MemoryError. Now: header vs member size, the total against the host's memory, and
    (interop import) the expected keys and shapes, all from the headers; one line each."""
    forged = tmp_path / "forged.npz"
    _forged_npz(forged, (1 << 40,), b"\0" * 16)  # 4 TiB declared, 16 bytes held
    with pytest.raises(npz.WeightsError, match=r"member 'w' declares shape \[1099511627776\]"):
        npz.load_npz(forged)
    big = tmp_path / "big.npz"
    np.savez(big, w=np.zeros(1 << 18, np.float32))  # 1 MiB: "too big" for a host of 1 MiB
    monkeypatch.setattr(npz, "host_memory_bytes", lambda: 1 << 20)
    with pytest.raises(npz.WeightsError, match="over half of this host's 1048576 bytes"):
        npz.load_npz(big)
    monkeypatch.undo()
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("an array was read before the keys were checked"))
    with pytest.raises(npz.WeightsError, match=r"key 'w' has shape \[262144\], the model expects \[4\]"):
        npz.load_npz(big, expect={"w": (4,)})
    with pytest.raises(npz.WeightsError, match="missing key 'v'"):
        npz.load_npz(big, expect={"w": (1 << 18,), "v": (2,)})


def test_a_directory_made_by_interop_import_holds_a_run(tmp_path):
    """Round 3, cause 4: `train --out DIR` on a directory made by `interop import` (config.json, env.json,
    checkpoints/0, no metrics.jsonl) trained from scratch over it; retention deleted the imported weights."""
    run = tmp_path / "imported"
    (run / rundir.CHECKPOINTS / "0").mkdir(parents=True)
    (run / rundir.CONFIG).write_text("{}")
    (run / rundir.ENV).write_text("{}")
    with pytest.raises(rundir.RunError, match="already holds a run; use --resume"):
        rundir.claim_run_dir(run, resume=False)
    assert (run / rundir.CHECKPOINTS / "0").is_dir()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / rundir.CONFIG).write_text("{}")  # a start that stopped before training: not a run
    lock, created = rundir.claim_run_dir(fresh, resume=False)
    lock.release()
    assert not created


def test_a_full_disk_under_the_metrics_log_names_the_file(tmp_path):
    """Round 3: disk full outside a checkpoint named no file (a write reports none)."""
    import errno

    class Full:  # a file on a full disk: every write fails with ENOSPC (as /dev/full, a device the log refuses)
        def write(self, _):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            pass

    log = rundir.MetricsLog(tmp_path / rundir.METRICS)
    log._f.close()
    log._f = Full()
    with pytest.raises(OSError) as e:
        log.log(kind="train", step=1)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / rundir.METRICS)


def test_sighup_is_handled_like_sigterm():
    """Round 3: SIGHUP (a closed terminal) ended the process without a checkpoint."""
    with rundir.Signals() as sig:
        os.kill(os.getpid(), signal.SIGHUP)
        assert sig.received == "SIGHUP"
        sig.interrupt = True
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)



def test_a_second_signal_before_training_ends_the_process_at_once(tmp_path):
    """A warm-up step of configs/baseline.py on a CPU takes many minutes and a signal waits for it: before
    training starts there is nothing to save, so the second signal discards (the start-up's new run
    directory) and exits at once (128 + its number)."""
    (tmp_path / "run").mkdir()
    code = ("import os, shutil, signal, time\n"
            "from frontier_jax.run import rundir\n"
            "with rundir.Signals() as s:\n"
            f"    s.discard = lambda: shutil.rmtree({str(tmp_path / 'run')!r})\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    assert s.received == 'SIGTERM'\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    assert proc.stderr.splitlines() == ["SIGTERM: stopping before training starts; nothing to save",
                                        "SIGINT again: exiting before training starts (nothing to save)"]
    assert not (tmp_path / "run").exists()


def test_no_run_file_is_written_through_a_symlink(tmp_path):
    """`cp -a RUN lk; ln -s victim lk/.lock; train --resume lk` wrote a pid into the victim; train.log and
    metrics.jsonl were appended to through symlinks. Every such file is refused in one line and the victim is
    untouched; the files written by rename (summary, plot) replace a symlink, never write through it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "lk"
    run.mkdir()
    (run / rundir.METRICS).write_text('{"kind": "train", "step": 1}\n')
    (run / rundir.RunDirLock.NAME).symlink_to(victim)
    with pytest.raises(BadInput, match=r"\.lock: the run directory's lock file is a symlink"):
        rundir.claim_run_dir(run, resume=True)
    (run / rundir.RunDirLock.NAME).unlink()
    for name, open_it in ((rundir.LOG, lambda p: rundir.RunLog(p)), (rundir.METRICS, rundir.MetricsLog),
                          (rundir.METRICS, lambda p: rundir.truncate_metrics(p, 0))):
        (run / name).unlink(missing_ok=True)
        (run / name).symlink_to(victim)
        with pytest.raises(BadInput, match="is a symlink"):
            open_it(run / name)
    (run / rundir.METRICS).unlink()
    (run / rundir.SUMMARY_JSON).symlink_to(victim)
    (run / rundir.CURVES).symlink_to(victim)
    rundir.write_summary(run, {"config_name": "t", "steps": 1})
    assert victim.read_text() == "precious\n" and not (run / rundir.SUMMARY_JSON).is_symlink()
    assert not (run / rundir.CURVES).is_symlink()
    fifo = run / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="is a FIFO, not a regular file"):
        rundir.RunLog(fifo)


def test_reading_metrics_names_a_bad_line_and_skips_a_torn_last_one(tmp_path):
    """A row that is not a metrics row (a string step, not an object) is one line naming the file and line; the
    torn last line a killed run leaves is skipped; `truncate_metrics` drops both kinds on resume."""
    path = tmp_path / rundir.METRICS
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "train", "step": 2}\n{"kind": "tr')
    assert [r["step"] for r in rundir.read_metrics(tmp_path)] == [1, 2]
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "train", "step": "7"}\n[1]\n')
    with pytest.raises(DataError, match=rf"{path}:2: not a metrics row"):
        rundir.read_metrics(tmp_path)
    assert rundir.truncate_metrics(path, 5) == 2 and [r["step"] for r in rundir.read_metrics(tmp_path)] == [1]


def test_summary_json_is_strict_json_without_a_bare_nan(tmp_path):
    """A diverged run's summary held a bare NaN (not JSON for strict readers); non-finite numbers are null."""
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))

    rundir.write_summary(tmp_path, {"config_name": "t", "steps": 3, "final_train_loss": float("nan"),
                                    "mfu": float("inf"), "nested": {"x": [1.0, float("-inf")]}})
    s = strict((tmp_path / rundir.SUMMARY_JSON).read_text())
    assert s["final_train_loss"] is None and s["mfu"] is None and s["nested"] == {"x": [1.0, None]}


def test_the_final_steps_record_is_read_back_only_for_its_step_and_only_when_well_formed(tmp_path):
    from frontier_jax.errors import BadInput

    sums = {"nll_sum_nats": 7.0, "tokens": 10, "bytes": 20, "eval_seconds": 0.5}
    rundir.write_final_steps(tmp_path, 6, {"val": sums, "roundtrip": sums})
    assert rundir.read_final_steps(tmp_path, 6) == {"val": sums, "roundtrip": sums}
    assert rundir.read_final_steps(tmp_path, 7) == {} and rundir.read_final_steps(tmp_path / "none", 6) == {}
    for bad in ({"val": {**sums, "tokens": "10"}}, {"val": {**sums, "bytes": 0}}, {"artifact": {"artifact": 1}}):
        rundir.write_final_steps(tmp_path, 6, bad)
        with pytest.raises(BadInput, match="final_steps.json"):
            rundir.read_final_steps(tmp_path, 6)
