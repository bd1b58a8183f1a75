"""frontier_jax.neuron.memory: the live-buffer walk on programs counted by hand, its estimate against XLA's own
memory analysis of the compiled train step, the device's memory, the micro-batch auto chooses, the one-line
refusal of a set one that cannot fit (before the run directory exists), and the same trajectory at two
micro-batch sizes."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import TINY_OVERRIDES, tiny_config
from frontier_jax import optim, trainer
from frontier_jax.neuron import memory, program
from frontier_jax.policies import dtypes as dtype_policy

KB4 = 4096  # bytes of a float32[1024]


def _peak(fn, *args) -> int:
    return memory.peak_bytes(jax.make_jaxpr(fn)(*args))


def test_the_walk_counts_live_buffers_and_frees_them_after_their_last_use():
    x = jnp.ones(1024)
    # x live throughout; sin(x) and cos(sin(x)) live together at the second equation, then sin(x) is freed
    assert _peak(lambda x: jnp.cos(jnp.sin(x)), x) == 3 * KB4
    # a chain of 5: never more than the input and two links
    assert _peak(lambda x: jnp.exp(jnp.cos(jnp.sin(jnp.tanh(jnp.abs(x))))), x) == 3 * KB4
    # five values all used at the end: all live at once (x + a..e + the sums made from them)
    def fan(x):
        a, b, c, d, e = (jnp.sin(x), jnp.cos(x), jnp.tanh(x), jnp.exp(x), jnp.abs(x))
        return a + b + c + d + e
    assert _peak(fan, x) == 7 * KB4
    # an output nothing reads is freed at once: two dead 1 MiB products one after the other never meet (each
    # product lives only beside its own 1 MiB of ones)
    def dead(x):
        jnp.ones((256, 1024)) * x[0]
        jnp.ones((256, 1024)) * x[1]
        return jnp.sin(x)
    assert 2 * 256 * KB4 < _peak(dead, x) < 2.5 * 256 * KB4


def test_a_scan_body_counts_once_and_a_sub_program_adds_its_own_peak():
    xs = jnp.ones((8, 1024))
    body = lambda c, x: (c + jnp.sin(jnp.cos(x)).sum(), None)
    # the stacked input (8 rows), then the body's per-iteration values (x, cos x, sin cos x), not 8 times over
    walked = _peak(lambda xs: jax.lax.scan(body, 0.0, xs)[0], xs)
    assert 8 * KB4 < walked < 12 * KB4
    inner = jax.jit(lambda x: jnp.exp(jnp.exp(x)))
    assert _peak(lambda x: inner(x) + 1, jnp.ones(1024)) >= 3 * KB4


def _steps(cfg) -> program.StepPrograms:
    dtypes = dtype_policy.resolve(cfg, jax.default_backend())
    return program.StepPrograms(cfg, 1, dtypes, optim.build_optimizer(cfg.optim, dtypes.muon_ns))


@pytest.mark.slow
def test_the_estimate_bounds_what_xla_allocates_for_the_compiled_train_step(byte_data):
    """The trainer's train step compiled by XLA for this CPU (8 sequences of 64 as 4 accumulated micro-batches of
    2): XLA's arguments + outputs - aliased + temporaries <= the estimate <= 2x that (bench.memory_estimate has
    the configs', the baseline's where XLA / walk is largest)."""
    from bench.memory_estimate import xla_bytes

    cfg = tiny_config(byte_data)
    walk = memory.peak_bytes(_steps(cfg).train(2))
    xla = xla_bytes(cfg, 2)
    assert xla <= memory.MARGIN * walk <= 2 * xla, (walk, xla)


def _fake(sizes: dict):
    calls = []

    def estimate(m):
        calls.append(m)
        return sizes[m]

    return estimate, calls


def test_auto_takes_the_largest_micro_batch_that_fits_and_traces_few():
    limit = memory.DeviceMemory(100, "test")
    estimate, calls = _fake({m: 10 + 6 * m for m in range(1, 65)})  # fits up to 15; 16 divides 512, 15 does not
    got = memory.fit("baseline", 0, 512, estimate, limit)
    assert (got.micro_seqs, got.auto, got.estimate) == (8, True, 58) and got.fits
    # 64 needs 394: 32 is ruled out without a trace (it needs >= 394 x 32 / 64 = 197 > 100), 16 is not (98.5)
    assert calls == [64, 16, 8]
    assert memory.candidates(512) == [64, 32, 16, 8, 4, 2, 1] and memory.candidates(12) == [12, 6, 4, 3, 2, 1]


def test_a_set_micro_batch_that_cannot_fit_is_one_line_naming_the_estimate_limit_and_setting():
    limit = memory.DeviceMemory(100 * memory.GiB, "available RAM")
    estimate, _ = _fake({m: (2 + 3 * m) * memory.GiB for m in range(1, 65)})
    with pytest.raises(memory.DoesNotFit) as e:
        memory.fit("baseline", 64, 512, estimate, limit)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config baseline: ")
    assert "194.0 GiB" in msg and "100.0 GiB" in msg and "available RAM" in msg
    assert "train.micro_batch_seqs=64" in msg and "set train.micro_batch_seqs=32 (estimated 98.0 GiB)" in msg
    assert memory.fit("baseline", 32, 512, estimate, limit).micro_seqs == 32  # fits: kept
    assert not memory.fit("baseline", 64, 512, estimate, limit, strict=False).fits  # the Neuron check's report
    with pytest.raises(memory.DoesNotFit, match="even at 1 sequence per micro-batch"):
        memory.fit("big", 0, 512, estimate, memory.DeviceMemory(1, "tiny"))
    with pytest.raises(memory.DoesNotFit, match="eval step .* lower train.val_batch_seqs"):
        memory.fit("big", 0, 512, estimate, limit, fixed=lambda: 101 * memory.GiB)
    unknown = memory.fit("x", 0, 512, estimate, memory.DeviceMemory(None, "no limit"))
    assert unknown.micro_seqs == 64 and unknown.fits and "not checked" in unknown.line()


def test_device_memory_neuron_is_the_documented_hbm_cpu_is_available_ram_shared(tmp_path):
    """A NeuronCore: AWS's 16 GiB. The CPU: the host's available RAM within its memory cgroup's room (the reader
    the set-up's floor uses, policies.sizing), shared by the local CPU devices."""
    from frontier_jax.policies import sizing

    assert memory.device_memory("neuron").bytes == 16 * memory.GiB
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683792 kB\nMemFree:        1 kB\nMemAvailable:   2048 kB\n")
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    assert sizing.available_memory_bytes(meminfo, cgroup) == 2048 * 1024
    (cgroup / "memory.max").write_text("1000000\n")
    (cgroup / "memory.current").write_text("400000\n")
    assert sizing.available_memory_bytes(meminfo, cgroup) == 600000  # the container's room, under MemAvailable
    (cgroup / "memory.max").write_text("max\n")
    assert sizing.available_memory_bytes(meminfo, cgroup) == 2048 * 1024
    one, four = memory.device_memory("cpu", 1), memory.device_memory("cpu", 4)
    assert one.bytes > 0 and abs(four.bytes - one.bytes // 4) < one.bytes // 8  # (read twice: RAM moves)
    assert "over 4 CPU devices" in four.source


class _Limit:
    """trainer's device memory replaced by `bytes` (the tiny step fits any real machine)."""

    def __init__(self, monkeypatch, nbytes):
        monkeypatch.setattr(trainer.memory, "device_memory", lambda *a, **k: memory.DeviceMemory(nbytes, "test limit"))


def test_a_run_whose_step_cannot_fit_refuses_before_its_directory_exists(byte_data, tmp_path, monkeypatch, capsys):
    from frontier_jax import train

    steps = _steps(tiny_config(byte_data))
    four, eight = (memory.estimate_bytes([steps.train(m)]) for m in (4, 8))
    _Limit(monkeypatch, (four + eight) // 2)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(["--config", "configs/tiny.py", "--data", str(byte_data), "--tokenizer", "bytes", "--out", str(out),
                    *(f"--set={s}" for s in TINY_OVERRIDES), "--set", "train.micro_batch_seqs=8"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: config tiny: the train step needs an estimated "
                                                         f"{memory.gb(eight)} per device at train.micro_batch_seqs=8")
    assert f"over the {memory.gb((four + eight) // 2)} a device has (test limit)" in err
    assert f"set train.micro_batch_seqs=4 (estimated {memory.gb(four)}) or 0 (auto" in err
    assert not out.exists()


@pytest.mark.slow
def test_auto_runs_the_micro_batch_that_fits_with_the_same_trajectory(byte_data, tmp_path, monkeypatch):
    """8 sequences a step: one micro-batch of 8 (set) against auto under a limit between the estimates of 2 and 4
    sequences (2: 4 micro-batches accumulated): the same losses up to float32 summation order."""
    sets = ("train.micro_batch_seqs=8", "train.max_steps=4")
    full = trainer.run(tiny_config(byte_data, *sets), tmp_path / "one", echo=False)
    cfg = tiny_config(byte_data, "train.micro_batch_seqs=0", "train.max_steps=4")
    steps = _steps(cfg)
    two, four = (memory.estimate_bytes([steps.train(m)]) for m in (2, 4))
    _Limit(monkeypatch, (two + four) // 2)
    auto = trainer.run(cfg, tmp_path / "auto", echo=False)
    log = (tmp_path / "auto" / "train.log").read_text()
    assert "at 2 sequences per micro-batch (auto: the largest that fits)" in log
    assert "step = 512 tokens = 4 micro-batch(es) of 2 x 64" in log
    rows = lambda d: [json.loads(r) for r in (d / "metrics.jsonl").read_text().splitlines()]
    a = [r["loss"] for r in rows(tmp_path / "one") if r["kind"] == "train"]
    b = [r["loss"] for r in rows(tmp_path / "auto") if r["kind"] == "train"]
    assert len(a) == len(b) == 4
    np.testing.assert_allclose(a, b, rtol=2e-5)
    assert auto["val_bpb"] == pytest.approx(full["val_bpb"], rel=1e-4)
