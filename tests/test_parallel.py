"""Data parallelism: simulated CPU devices (conftest sets 4) and real multi-process runs on localhost; the matmul peak
(MFU denominator): documented for trn1, elsewhere a FLOP rate measured once per process and setting."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import REPO, TINY_OVERRIDES, tiny_config
from frontier_jax import checkpoint, parallel, trainer
from frontier_jax.config import ConfigError
from frontier_jax.parallel import make_data_parallel
from frontier_jax.policies.dtypes import resolve as resolve_dtypes



def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def test_mesh_over_simulated_devices():
    assert jax.device_count() == 4
    dp = make_data_parallel(2)
    assert dp.num_devices == 2 and dp.mesh.axis_names == ("data",)
    x = dp.put_batch(np.arange(16, dtype=np.int32).reshape(4, 4))
    assert x.sharding.spec == jax.sharding.PartitionSpec("data", None) and len(x.addressable_shards) == 2
    with pytest.raises(ConfigError, match="only 4 devices"):
        make_data_parallel(8)


# One trajectory, trained once per device count and shared by the tests below: constant LR (no warmdown), so that
# the two-process run stopped at step 3 and resumed to 6 follows the same schedule; the 4-device run is the
# replicated baseline of the ZeRO-1 test and the single-process reference of the two-process test.
MESH_SETS = ("train.max_steps=6", "optim.warmdown_steps=0")


@pytest.fixture(scope="module")
def mesh_run(byte_data, tmp_path_factory):
    """mesh_run(n): (run dir, summary) of the MESH_SETS run on n simulated devices, trained once per module."""
    runs = {}

    def get(n: int):
        if n not in runs:
            out = tmp_path_factory.mktemp(f"mesh{n}") / "run"
            runs[n] = out, trainer.run(tiny_config(byte_data, *MESH_SETS, f"parallel.num_devices={n}"), out, echo=False)
        return runs[n]

    return get


@pytest.mark.slow
def test_one_two_four_devices_same_trajectory_and_eval_sums(mesh_run):
    results = {n: (_losses(mesh_run(n)[0]), mesh_run(n)[1]) for n in (1, 2, 4)}
    ref_losses, ref = results[1]
    assert len(ref_losses) == 6
    for n in (2, 4):
        losses, s = results[n]
        assert _rel(losses, ref_losses) < 1e-5, (n, losses, ref_losses)
        assert abs(s["val_nll_sum_nats"] - ref["val_nll_sum_nats"]) / ref["val_nll_sum_nats"] < 1e-5
        assert s["val_tokens"] == ref["val_tokens"] and s["val_bytes"] == ref["val_bytes"]
        # the int8+zlib round trip on a mesh: the artifact's weights replicated over the devices again
        rt, ref_rt = s["roundtrip_val_nll_sum_nats"], ref["roundtrip_val_nll_sum_nats"]
        assert abs(rt - ref_rt) / ref_rt < 1e-5 and s["roundtrip_val_bytes"] == ref["roundtrip_val_bytes"]


@pytest.mark.slow
def test_zero1_shards_optimizer_state_and_matches_replicated(byte_data, mesh_run, tmp_path):
    base = [*MESH_SETS, "parallel.num_devices=4"]
    trainer.run(tiny_config(byte_data, *base, "parallel.zero1=True"), tmp_path / "z1", echo=False)
    assert _rel(_losses(tmp_path / "z1"), _losses(mesh_run(4)[0])) < 1e-5
    # the state layout really is sharded: a momentum buffer lives in quarters on the 4 devices
    from frontier_jax import optim

    cfg = tiny_config(byte_data, *base, "parallel.zero1=True")
    dp = make_data_parallel(4, zero1=True)
    dtypes = resolve_dtypes(cfg, jax.default_backend())
    _, _, opt_state, _ = trainer.init_state(cfg, optim.build_optimizer(cfg.optim, dtypes.muon_ns), dtypes.compute, dp)
    specs = {str(x.sharding.spec) for x in jax.tree_util.tree_leaves(opt_state) if x.ndim >= 1 and x.shape[0] % 4 == 0}
    assert any("data" in s for s in specs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(data_dir, out, port, extra, resume=False):
    """Two `python -m frontier_jax.train` processes with 2 CPU devices each, on a local coordinator."""
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "2", "PYTHONUNBUFFERED": "1"}
    procs = []
    for pid in range(2):
        sets = [a for s in [*[o for o in TINY_OVERRIDES if not o.startswith("parallel.")], "parallel.num_devices=0", *extra] for a in ("--set", s)]
        args = [sys.executable, "-m", "frontier_jax.train", "--config", str(REPO / "configs" / "tiny.py"),
                "--data", str(data_dir), "--tokenizer", "bytes", *sets,
                "--coordinator", f"localhost:{port}", "--num-processes", "2", "--process-id", str(pid)]
        args += ["--resume", str(out)] if resume else ["--out", str(out)]
        log = open(out.parent / f"{out.name}-p{pid}{'-resume' if resume else ''}.log", "w")
        procs.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def _wait(procs, timeout):
    return [p.wait(timeout=timeout) for p in procs]


@pytest.mark.slow
def test_two_processes_train_checkpoint_resume_and_match_single_process(byte_data, mesh_run, tmp_path):
    # MESH_SETS at 3 steps, resumed to 6 (constant LR: the same schedule), against the same run on one process
    common = [*MESH_SETS[1:], "train.budget_seconds=1000.0"]
    out = tmp_path / "mp"
    codes = _wait(_launch(byte_data, out, _free_port(), [*common, "train.max_steps=3"]), 300)
    assert codes == [0, 0], (out.parent / "mp-p0.log").read_text()[-3000:]
    assert checkpoint.latest_step(out) == 3
    codes = _wait(_launch(byte_data, out, _free_port(), [*common, "train.max_steps=6"], resume=True), 300)
    assert codes == [0, 0], (out.parent / "mp-p0-resume.log").read_text()[-3000:]
    multi = _losses(out)
    single = _losses(mesh_run(4)[0])  # 4 devices in one process: the same mesh
    assert len(multi) == len(single) == 6
    # same 4-device mesh; the cross-process (gloo) all-reduce sums in another order than the in-process
    # one, and the difference grows a little with each step: 1e-4 relative over 6 steps
    assert _rel(multi, single) < 1e-4, (multi, single)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["val_bpb"] > 0
    # process 0 wrote the artifact; every process scored the same dequantized weights
    assert summary["artifact_bytes"] == (out / "final_model.int8.ptz").stat().st_size
    assert abs(summary["roundtrip_val_bpb"] - summary["val_bpb"]) < 0.05


@pytest.mark.slow
def test_a_dead_process_fails_the_other_within_bounded_time(byte_data, tmp_path):
    out = tmp_path / "dead"
    extra = ["train.max_steps=100000", "train.budget_seconds=600.0", "train.checkpoint_every_steps=2",
             "parallel.heartbeat_timeout_seconds=5"]
    p0, p1 = _launch(byte_data, out, _free_port(), extra)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and checkpoint_steps(out) < 2:
            assert p0.poll() is None and p1.poll() is None, (out.parent / "dead-p0.log").read_text()[-3000:]
            time.sleep(0.5)
        assert checkpoint_steps(out) >= 2, "no periodic checkpoint appeared"
        p1.send_signal(signal.SIGKILL)
        t_kill = time.time()
        code = p0.wait(timeout=120)  # hanging forever would fail here
        assert code != 0
        assert time.time() - t_kill < 120
    finally:
        for p in (p0, p1):
            if p.poll() is None:
                p.kill()
    step, meta = checkpoint.read_meta(out)
    assert step == meta["step"] and step >= 2  # the last complete checkpoint is intact and readable


def checkpoint_steps(out: Path) -> int:
    d = out / "checkpoints"
    return len([p for p in d.iterdir() if p.name.isdigit()]) if d.is_dir() else 0


def test_matmul_peak_is_the_best_timing_measured_once_per_setting(monkeypatch):
    """The probe's rate is 2 n^3 FLOPs over the fastest of its `reps` timed runs (a scripted clock: runs of 5, 2
    and 3 s give 2 n^3 / 2 s), measured once per setting: the same dtype spelled otherwise reuses the
    measurement without timing again, another size is measured anew."""
    class Clock:
        def __init__(self, *stamps):
            self.stamps = list(stamps)

        def perf_counter(self):
            return self.stamps.pop(0)

    parallel._matmul_peak.cache_clear()
    try:
        clock = Clock(0.0, 5.0, 10.0, 12.0, 20.0, 23.0)  # (start, end) of each timed run
        monkeypatch.setattr(parallel, "time", clock)
        first = parallel.measure_matmul_peak(jnp.float32, n=128, reps=3)
        assert first == 2.0 * 128**3 / 2.0 and clock.stamps == []
        assert parallel.measure_matmul_peak(np.float32, n=128, reps=3) == first  # reused: the clock is not read
        info = parallel._matmul_peak.cache_info()
        assert (info.hits, info.misses) == (1, 1)
        clock.stamps = [0.0, 4.0]
        assert parallel.measure_matmul_peak(jnp.float32, n=64, reps=1) == 2.0 * 64**3 / 4.0  # another size: anew
        assert parallel._matmul_peak.cache_info().misses == 2 and clock.stamps == []
    finally:
        parallel._matmul_peak.cache_clear()  # no scripted rate is left for a later run's MFU


def test_mfu_peak_is_documented_for_trn1_and_a_repeated_probe_elsewhere(monkeypatch):
    """AWS documents the XLA device kind NC_v2 for Trainium1 and 92 BF16 TFLOPS per NeuronCore-v2's TensorE: the
    peak the trn1 step estimate uses too (one number for trn1 everywhere)."""
    from kernels_nki.emulator import cost

    class Dev:
        device_kind = "NC_v2"

    monkeypatch.setattr(parallel.jax, "devices", lambda: [Dev()])
    doc = parallel.matmul_peak(jnp.bfloat16, num_devices=2)
    assert doc["matmul_peak_flops"] == 2 * 92e12 and doc["peak_spread"] is None
    assert doc["matmul_peak_flops"] == pytest.approx(2 * 2 * cost.TARGETS["trn1"].tensor_macs_per_s, rel=0.01)
    assert doc["peak_source"].startswith("documented: AWS NeuronCore-v2") and "inferentia2_arch.rst" in doc["peak_source"]
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(parallel, "measure_matmul_peak", lambda dtype, round_=0: calls.append(round_) or 100.0 + round_)
    probe = parallel.matmul_peak(jnp.float32)
    assert calls == list(range(parallel.PROBE_ROUNDS)) and probe["matmul_peak_flops"] == 102.0
    assert probe["peak_spread"] == [100.0, 104.0] and probe["peak_source"].startswith("measured: median of 5 probes")
