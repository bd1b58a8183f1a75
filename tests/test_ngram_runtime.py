"""The n-gram bias inside the trainer: shard disjointness, snapshot swaps without recompiling, builder
crash (logged / strict), shutdown leaving nothing behind. Runs are tiny (CPU, seconds each).

Determinism: the builder process takes seconds to spawn, so the tests never rely on timing. A
`HookedRuntime` (patched into the loop) waits for the builder to finish when the loop polls at a chosen
step and polls without the 2 s rate limit, so the swap happens exactly at that step."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
from pathlib import Path

import pytest

from helpers import tiny_config
from frontier_jax import trainer
from frontier_jax.ngram import runtime as ngram_runtime
from frontier_jax.ngram import snapshot as S

NGRAM_SETS = ["ngram.enabled=True", "ngram.table_log2_size=12", "ngram.min_order=2", "ngram.max_order=6",
              "ngram.snapshot_every_tokens=8000", "ngram.builder_niceness=0"]


class HookedRuntime(ngram_runtime.NgramRuntime):
    wait_at_step = 0
    instances: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.poll_seconds = 0.0
        self.background = False  # swap at the very poll that finds the snapshot
        HookedRuntime.instances.append(self)

    def poll(self, step, force=False):
        if step == self.wait_at_step and self.builder.alive():
            assert self.builder.wait(120), "builder did not finish within 120 s"
        return super().poll(step, force)


@pytest.fixture
def hooked(monkeypatch):
    HookedRuntime.instances = []
    HookedRuntime.wait_at_step = 0
    monkeypatch.setattr(ngram_runtime, "NgramRuntime", HookedRuntime)
    return HookedRuntime


def _no_leftovers(rt) -> None:
    assert not rt.builder.alive()
    assert not [p for p in mp.active_children() if p.name == "ngram-builder"]
    with pytest.raises(ProcessLookupError):
        os.kill(rt._builder_pid, 0)
    assert not [p.name for p in rt.out_dir.iterdir() if p.name.startswith(S.TMP_PREFIX)]


def test_run_with_bias_disjoint_shards_and_swap_without_recompiling(byte_data, tmp_path, hooked, monkeypatch):
    traces = []

    def counting_bias_fn(model, x_BT, tables):  # called once per trace of the train / eval step
        if HookedRuntime.instances:  # not the set-up's memory estimate (a jaxpr traced before the runtime starts)
            traces.append(len(HookedRuntime.instances[0].swaps))
        return ngram_runtime.__dict__["_orig_bias_fn"](model, x_BT, tables)

    monkeypatch.setitem(ngram_runtime.__dict__, "_orig_bias_fn", ngram_runtime.bias_fn)
    monkeypatch.setattr(ngram_runtime, "bias_fn", counting_bias_fn)
    hooked.wait_at_step = 3
    out = tmp_path / "run"
    summary = trainer.run(tiny_config(byte_data, *NGRAM_SETS), out, echo=False)
    rt = HookedRuntime.instances[0]
    # (a) which shards each side used, and disjointness (runtime object, run log, runtime.json, snapshot sources)
    assert [f.name for f in rt.trainer_files] == ["synth_train_000000.bin"]
    assert [f.name for f in rt.builder_files] == ["synth_train_000001.bin"]
    log_text = (out / "train.log").read_text()
    assert "trainer reads 1 shards (synth_train_000000.bin" in log_text
    assert "builder reads 1 shards from the far end (synth_train_000001.bin); disjoint: yes" in log_text
    record = json.loads((out / "ngram-p0" / "runtime.json").read_text())
    assert not set(record["trainer_shards"]) & set(record["builder_shards"])
    final = S.load_snapshot(out / "ngram-p0" / record["final"]["snapshot"])  # relative to runtime.json
    assert {Path(s["file"]).name for s in final.header["sources"]} == {"synth_train_000001.bin"}
    assert final.header["complete"] and final.header["tokens_consumed"] == 30_000
    # (b) the swap happened between steps 2 and 3, and nothing was traced again after it
    assert rt.swaps[0]["step"] == 3 and rt.swaps[0]["complete"]
    assert "in use from step 3" in log_text
    assert traces == [0, 0], f"train/eval step traced {len(traces)} times (swaps seen at trace: {traces})"
    assert summary["steps"] == 6 and summary["val_bpb"] > 0
    _no_leftovers(rt)


def _corrupt_builder_data(byte_data, tmp_path, monkeypatch) -> Path:
    """A data copy whose builder shard is overwritten with garbage after the loop checked every header
    (as if the disk failed under the builder): the builder crashes on its first read."""
    d = tmp_path / "data"
    d.mkdir()
    for name in ("synth_train_000000.bin", "synth_train_000001.bin", "synth_val_000000.bin"):
        shutil.copy(byte_data / name, d)

    class CorruptingRuntime(HookedRuntime):
        def start(self):
            self.builder_files[-1].write_bytes(b"not a shard" * 100)
            return super().start()

    monkeypatch.setattr(ngram_runtime, "NgramRuntime", CorruptingRuntime)
    return d


def test_builder_crash_is_logged_and_training_continues(byte_data, tmp_path, hooked, monkeypatch):
    hooked.wait_at_step = 1
    out = tmp_path / "run"
    summary = trainer.run(tiny_config(_corrupt_builder_data(byte_data, tmp_path, monkeypatch), *NGRAM_SETS), out, echo=False)
    assert summary["steps"] == 6 and summary["val_bpb"] > 0
    log_text = (out / "train.log").read_text()
    assert "NGRAM BUILDER FAILED; training continues on snapshot v-1" in log_text
    assert "bad magic" in log_text
    assert "no snapshot was published within the budget" in log_text
    record = json.loads((out / "ngram-p0" / "runtime.json").read_text())
    assert "bad magic" in record["builder_error"]
    _no_leftovers(HookedRuntime.instances[0])
    # Round 3, cause 6: a run whose builder died before its first snapshot is evaluable (empty tables, said so)
    from frontier_jax.evaluate import evaluate_run

    shutil.copy(byte_data / "synth_train_000001.bin", tmp_path / "data")  # the disk "recovered"
    lines = []
    r = evaluate_run(out, log=lines.append)
    assert r["bpb"] == pytest.approx(summary["val_bpb"], rel=1e-6)
    assert any("no n-gram snapshot was published; scoring with empty tables" in line for line in lines)


def test_builder_crash_stops_the_run_in_strict_mode(byte_data, tmp_path, hooked, monkeypatch):
    hooked.wait_at_step = 1
    cfg = tiny_config(_corrupt_builder_data(byte_data, tmp_path, monkeypatch), *NGRAM_SETS, "ngram.strict=True")
    with pytest.raises(ngram_runtime.NgramBuilderFailed, match="ngram builder failed .*bad magic"):
        trainer.run(cfg, tmp_path / "run", echo=False)
    assert "NGRAM BUILDER FAILED; stopping (ngram.strict)" in (tmp_path / "run" / "train.log").read_text()
    _no_leftovers(HookedRuntime.instances[0])


@pytest.mark.parametrize("how", ["sigint", "exception"])
def test_interrupt_or_crash_leaves_no_builder_and_no_temp_dirs(byte_data, tmp_path, hooked, how):
    hooked.wait_at_step = -1  # never wait: the builder is usually still starting or building when we stop

    def on_step(step, row):
        if step == 2:
            if how == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
            else:
                raise RuntimeError("simulated trainer crash")

    cfg = tiny_config(byte_data, *NGRAM_SETS, "train.max_steps=50")
    if how == "sigint":
        summary = trainer.run(cfg, tmp_path / "run", echo=False, on_step=on_step)
        assert summary["stop_reason"].startswith("signal")
    else:
        with pytest.raises(RuntimeError, match="simulated trainer crash"):
            trainer.run(cfg, tmp_path / "run", echo=False, on_step=on_step)
    _no_leftovers(HookedRuntime.instances[0])


def test_background_preparation_swaps_at_a_later_poll(byte_data, tmp_path):
    """Outside the loop: the first poll after a snapshot appears only submits it; a later poll swaps it."""
    import time

    import jax
    import numpy as np

    from frontier_jax.config import NgramConfig
    from frontier_jax.data.shards import list_shards
    from frontier_jax.ngram.bias import host_arrays

    cfg = NgramConfig(enabled=True, table_log2_size=12, max_order=6, snapshot_every_tokens=10**9, builder_niceness=0)
    lines = []
    rt = ngram_runtime.NgramRuntime(cfg, list_shards(byte_data, "*_train_*.bin"), tmp_path, lines.append,
                                    jax.devices()[0], poll_seconds=0.0)
    assert rt.background
    try:
        rt.start()
        assert rt.builder.wait(120)
        assert rt.poll(0) is False and rt._pending is not None
        deadline = time.monotonic() + 60
        step = 1
        while not rt.poll(step):
            assert time.monotonic() < deadline, "background preparation did not finish"
            time.sleep(0.05)
            step += 1
        snap = S.load_snapshot(S.list_snapshots(rt.out_dir)[-1][1])
        for got, want in zip((rt.tables.fp_OK, rt.tables.top_OK, rt.tables.conf_OK),
                             host_arrays(snap.rows_OK4, cfg.confidence_buckets)):
            np.testing.assert_array_equal(np.asarray(got), want)
        assert rt.swaps[-1]["background"] and rt.swaps[-1]["step"] == step
        assert any("prepared background" in line for line in lines)
    finally:
        rt.stop()
    _no_leftovers(rt)


@pytest.mark.parametrize("strict", [False, True])
def test_a_snapshot_that_fails_to_load_is_logged_and_skipped(byte_data, tmp_path, strict):
    """Round 3, cause 6: a published snapshot that failed to load (truncated) raised in the background
    thread and ended the trainer with exit 1, no checkpoint, no summary. Now: one WARNING line, the
    snapshot is skipped (not retried) and training continues on the last good tables; strict stops."""
    import jax

    from frontier_jax.config import NgramConfig
    from frontier_jax.data.shards import list_shards
    from frontier_jax.ngram.tables import NgramTables

    cfg = NgramConfig(enabled=True, table_log2_size=12, max_order=6, builder_niceness=0, strict=strict)
    lines = []
    rt = ngram_runtime.NgramRuntime(cfg, list_shards(byte_data, "*_train_*.bin"), tmp_path, lines.append,
                                    jax.devices()[0], poll_seconds=0.0)
    snap = S.write_snapshot(NgramTables(2, 6, 12), rt.out_dir, 0, complete=True)
    rows = snap / "rows_OK4.npy"
    rows.write_bytes(rows.read_bytes()[:200])  # truncated
    before = rt.tables
    if strict:
        with pytest.raises(ngram_runtime.NgramBuilderFailed, match="snap_000000: snapshot could not be loaded"):
            rt.poll(1, force=True)
        return
    assert rt.poll(1, force=True) is False and rt.tables is before and rt.version == -1
    assert len(lines) == 2 and "WARNING snapshot v0 could not be loaded" in lines[1] and "\n" not in lines[1]
    assert rt.poll(2, force=True) is False and len(lines) == 2  # not retried


def test_runtime_json_is_checked_and_its_snapshot_kept_inside_the_run(tmp_path):
    """runtime.json's absolute snapshot path was followed out of the run (a copied n-gram run was scored with
    the original's tables); a truncated runtime.json was a traceback. The snapshot is named relative to its
    directory and must lie inside the run; a bad record is one line naming the file."""
    from frontier_jax.errors import BadInput
    from frontier_jax.ngram.network_eval import run_snapshot

    original, copy = tmp_path / "original", tmp_path / "copy"
    for run in (original, copy):
        (run / "ngram-p0" / S.snapshot_name(1)).mkdir(parents=True)
        (run / "ngram-p0" / S.snapshot_name(2)).mkdir()
    rec = copy / "ngram-p0" / ngram_runtime.RECORD_FILE
    rec.write_text(json.dumps({"final": {"snapshot": str(original / "ngram-p0" / S.snapshot_name(1))}}))
    with pytest.raises(BadInput, match=f"outside {copy}; a run's n-gram snapshot must lie inside the run"):
        run_snapshot(copy)
    rec.write_text(json.dumps({"final": {"snapshot": S.snapshot_name(1)}}))
    assert run_snapshot(copy) == copy / "ngram-p0" / S.snapshot_name(1)
    rec.write_text(json.dumps({"final": {"snapshot": "../../original/ngram-p0/snap_000001"}}))
    with pytest.raises(BadInput, match="outside"):
        run_snapshot(copy)
    for text, message in (('{"final": {"snap', "unreadable n-gram runtime record"),
                          ('{"final": [1]}', r"final is \[1\], expected dict or null"),
                          ('{"final": {"snapshot": 7}}', "final: snapshot is 7, expected str or null")):
        rec.write_text(text)
        with pytest.raises(BadInput, match=message) as e:
            run_snapshot(copy)
        assert str(e.value).startswith(str(rec)) and "\n" not in str(e.value)
    rec.write_text(json.dumps({"final": None}))
    assert run_snapshot(copy) is None  # none recorded, none published (these directories hold no tables)
