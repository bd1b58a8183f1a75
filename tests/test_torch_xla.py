"""baseline_torch on the PyTorch/XLA device, run on the CPU through PJRT (PJRT_DEVICE=CPU): the lazy program
torch-neuronx compiles for a NeuronCore, short of the Neuron compiler.

The tests marked `torch_xla` need torch_xla, which the main environment does not have (they skip there
with the reason): CI's second environment (.ci/run builds .ci/xla-venv with torch 2.9 + torch-xla 2.9)
runs them alone, `-m torch_xla --noconftest`, since tests/conftest.py imports JAX and that environment
has none. Self-contained for that reason: its own tiny byte-level data and config overrides. The
unmarked tests (device detection and refusals without torch_xla) run in the main environment.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch baseline needs the optional extra: pip install -e .[torch]")
HAVE_XLA = importlib.util.find_spec("torch_xla") is not None
if HAVE_XLA:
    os.environ.setdefault("PJRT_DEVICE", "CPU")  # the test harness picks the PJRT device; the library reads none
    # Before any eager backward of this process: PyTorch's autograd engine sizes its per-device queues at its
    # first backward, and an XLA device that comes up after that fails its backward (INTERNAL ASSERT in
    # engine.cpp). A training process starts it when it resolves --device xla, before any backward.
    import torch_xla

    torch_xla.device()
XLA_REASON = ("needs PyTorch/XLA (torch 2.9 + torch-xla 2.9): CI's second environment, built by .ci/run as "
              ".ci/xla-venv, runs these with PJRT_DEVICE=CPU")


def on_xla(test):
    """Marked `torch_xla` (what the second environment selects) and skipped with the reason without torch_xla."""
    return pytest.mark.torch_xla(pytest.mark.skipif(not HAVE_XLA, reason=XLA_REASON)(test))

from baseline_torch import xla  # noqa: E402
from baseline_torch.train import Trainer, measure_matmul_peak, resolve_device, run  # noqa: E402
from frontier_jax.config import apply_overrides, load_config  # noqa: E402
from frontier_jax.data.dataset import load_for_config  # noqa: E402
from frontier_jax.data.shards import write_shard  # noqa: E402
from frontier_jax.data.stream import TrainLoader  # noqa: E402
from frontier_jax.run.rundir import RunError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# configs/tiny.py made small (two layers, GQA, a tied embedding, encoder/decoder skips) and fp32 throughout,
# so that PJRT-CPU and eager CPU compute the same thing; two micro-batches per step (gradient accumulation
# inside the one graph).
OVERRIDES = ["model.vocab_size=260", "model.num_layers=2", "model.model_dim=64", "model.num_heads=4",
             "model.num_kv_heads=2", "model.compute_dtype='float32'", "optim.muon_ns_dtype='float32'",
             "train.seq_len=32", "train.tokens_per_step=256", "train.micro_batch_seqs=4",
             "train.compile_warmup_steps=1", "train.val_batch_seqs=4", "train.val_every_steps=0",
             "train.val_max_tokens=0", "train.max_steps=6", "train.budget_seconds=1000.0",
             "optim.warmdown_mode='steps'", "optim.warmdown_steps=4", "optim.muon_momentum_warmup_steps=4",
             "parallel.num_devices=1", "train.measure_peak=False"]
# Eager CPU vs PJRT-CPU in fp32: the same ops, fused and ordered differently by XLA (and Adam's capturable
# form on XLA), so equal to float32 rounding: one forward 1e-5 relative; the losses and gradient norms of
# six training steps 1e-4 (parameters are not compared element-wise: Adam turns rounding-level differences
# of near-zero gradients, e.g. a rare token's embedding row, into visible ones).
FORWARD_RTOL = 1e-5
STEPS_RTOL = 1e-4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Byte-level shards (tokenizer "bytes", vocab 260: BOS=1, bytes 4..259) of repetitive text."""
    out = tmp_path_factory.mktemp("xla_data")
    rng = np.random.default_rng(0)
    words = [w.encode() for w in "the of and to in is was for on that with as by at from it an were".split()]

    def stream(n):
        ids = []
        while len(ids) < n:
            ids += [1] + [b + 4 for w in rng.choice(len(words), 12) for b in words[w] + b" "]
        return np.asarray(ids[:n], np.uint16)

    write_shard(out / "synth_train_000000.bin", stream(20_000))
    write_shard(out / "synth_val_000000.bin", stream(2_000))
    return out


def config(data_dir, *extra):
    sets = [*OVERRIDES, f"data.data_dir={str(data_dir)!r}", "data.tokenizer='bytes'", *extra]
    return apply_overrides(load_config(os.path.join(REPO, "configs", "tiny.py")), sets)


def trainer(cfg, device):
    data = load_for_config(cfg)
    return Trainer(cfg, device, TrainLoader(data.train_files, cfg.train.seq_len), data.val_tokens, data.tables)


def counts() -> tuple[int, int]:
    """(graphs compiled, graphs executed) so far, once the device has finished what was launched."""
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    xm.wait_device_ops()
    execs = met.metric_data("ExecuteTime")
    return xla.compile_count(), int(execs[0]) if execs else 0


# ----------------------------------------------------------------------------- without torch_xla too


def test_a_neuron_host_is_torch_neuronx_installed_and_dev_neuron_devices(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    installed = {"torch_xla", "torch_neuronx"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n in installed else real(n, *a))
    (tmp_path / "neuron_stats").touch()  # not a device
    assert not xla.neuron_host(tmp_path)
    (tmp_path / "neuron0").touch()
    assert xla.neuron_host(tmp_path)
    installed.discard("torch_neuronx")  # torch_xla alone (e.g. this CI's PJRT-CPU environment) is no Neuron host
    assert not xla.neuron_host(tmp_path)


def test_auto_takes_the_xla_device_on_a_neuron_host(monkeypatch):
    monkeypatch.setattr(xla, "neuron_host", lambda: True)
    monkeypatch.setattr(xla, "available", lambda: True)
    monkeypatch.setattr(xla, "device", lambda: torch.device("xla", 0))
    assert resolve_device("auto") == torch.device("xla", 0)
    with pytest.raises(RunError, match="give 'xla'"):
        resolve_device("xla:1")


@pytest.mark.skipif(HAVE_XLA, reason="checks the refusal where torch_xla is absent")
def test_device_xla_without_torch_xla_is_one_clear_error():
    with pytest.raises(RunError, match="torch_xla is not installed"):
        resolve_device("xla")
    assert resolve_device("auto").type in ("cpu", "cuda")


# ----------------------------------------------------------------------------- on xla:0 (PJRT CPU)


@on_xla
def test_the_xla_device_and_its_platform_are_pjrt_cpu_here():
    dev = resolve_device("xla")
    assert dev.type == "xla" and xla.platform() == "cpu"
    assert not xla.neuron_host()  # no torch-neuronx, no /dev/neuron*: auto does not pick xla
    assert resolve_device("auto").type in ("cpu", "cuda")


@on_xla
def test_same_weights_give_the_same_loss_on_xla_as_on_the_eager_cpu(data_dir):
    cfg = config(data_dir)
    cpu, lazy = trainer(cfg, torch.device("cpu")), trainer(cfg, resolve_device("xla"))
    for k, v in cpu.model.state_dict().items():  # same seed, same initialisation on both
        assert torch.equal(v, lazy.model.state_dict()[k].cpu()), k
    x = torch.randint(0, 260, (4, 32))
    y = torch.randint(0, 260, (4, 32))
    with torch.no_grad():
        want = cpu.model(x, y)
        got = lazy.model(x.to(lazy.device), y.to(lazy.device)).cpu()
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=FORWARD_RTOL, atol=0)
    a, b = cpu.eval_sums(0), lazy.eval_sums(0)  # the whole val split: per-token losses, masks, byte counts
    assert (a["tokens"], a["bytes"]) == (b["tokens"], b["bytes"]) and a["tokens"] > 1000
    assert b["nll_sum_nats"] == pytest.approx(a["nll_sum_nats"], rel=FORWARD_RTOL)


@on_xla
def test_a_few_steps_give_the_same_losses_on_xla_as_on_the_eager_cpu(data_dir):
    cfg = config(data_dir)
    cpu, lazy = trainer(cfg, torch.device("cpu")), trainer(cfg, resolve_device("xla"))
    schedule = [(1.0, 0.85), (1.0, 0.875), (0.75, 0.9), (0.5, 0.925), (0.25, 0.95), (0.125, 0.95)]
    for scale, mom in schedule:
        want = cpu.read_metrics(cpu.train_step(scale, mom))
        got = lazy.read_metrics(lazy.train_step(scale, mom))
        np.testing.assert_allclose(got, want, rtol=STEPS_RTOL, atol=0)  # (loss, grad norm) of each step


@on_xla
def test_a_step_is_one_graph_compiled_once_whatever_the_schedule(data_dir):
    """With the Neuron dtype policy (bf16 autocast matmuls, bf16 embedding and Newton-Schulz); the fp32
    step is checked by the run below (its log counts the timed loop's compilations)."""
    cfg = config(data_dir, "model.compute_dtype='bfloat16'", "optim.muon_ns_dtype='bfloat16'")
    lazy = trainer(cfg, resolve_device("xla"))
    assert lazy.dtype == torch.bfloat16 and lazy.accum == 2
    lazy.read_metrics(lazy.train_step(1.0, 0.85))  # the warm-up step: the one compile
    compiled, executed = counts()
    # lr and momentum values a Python scalar would make graph constants (0, 1) and back: graph inputs here
    for i, (scale, mom) in enumerate([(1.0, 0.0), (0.5, 1.0), (0.0, 0.9), (0.3, 0.95), (1.0, 0.95)], 1):
        m = lazy.train_step(scale, mom)
        assert counts() == (compiled, executed + i)  # marked once: one graph launched, nothing compiled
        loss, gnorm = lazy.read_metrics(m)  # a transfer of what the step computed, no graph
        assert counts() == (compiled, executed + i) and np.isfinite([loss, gnorm]).all()
    lazy.restore(lazy.snapshot())  # the warm-up reset: fresh optimizer state, same step graph
    compiled, executed = counts()
    lazy.read_metrics(lazy.train_step(1.0, 0.85))
    assert counts()[0] == compiled
    lazy.eval_sums(0)
    compiled = counts()[0]
    lazy.eval_sums(0)  # one fixed-shape graph per batch, compiled at the first evaluation only
    assert counts()[0] == compiled


@on_xla
def test_the_cpu_path_never_imports_torch_xla_and_compile_is_refused_on_xla(data_dir, tmp_path):
    code = ("import sys, torch; from baseline_torch.train import resolve_device; resolve_device('cpu'); "
            "assert 'torch_xla' not in sys.modules, 'torch_xla imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
    with pytest.raises(RunError, match="--compile with --device xla"):
        run(config(data_dir), tmp_path / "run", device="xla", compile_model=True, echo=False)
    assert not (tmp_path / "run").exists()


@on_xla
def test_the_matmul_peak_probe_computes_on_the_xla_device():
    dev = resolve_device("xla")
    _, executed = counts()
    flops = measure_matmul_peak(dev, torch.float32, n=64, reps=2)
    assert flops > 0 and np.isfinite(flops) and counts()[1] >= executed + 3


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """The same tiny run on the eager CPU and on xla:0 (warmdown and momentum warm-up, a periodic validation)."""
    out = tmp_path_factory.mktemp("xla_runs")
    cfg = config(data_dir, "train.val_every_steps=3")
    return {d: (out / d, run(cfg, out / d, device=d, echo=False)) for d in ("cpu", "xla")}


@on_xla
def test_the_run_directory_is_the_same_as_on_the_cpu(runs):
    (cpu_dir, cpu), (xla_dir, lazy) = runs["cpu"], runs["xla"]
    assert sorted(p.name for p in xla_dir.iterdir()) == sorted(p.name for p in cpu_dir.iterdir())
    assert set(lazy) == set(cpu) and lazy["steps"] == cpu["steps"] == 6 and lazy["stop_reason"] == "max_steps"
    rows = {d: [json.loads(r) for r in (p / "metrics.jsonl").read_text().splitlines()] for d, (p, _) in runs.items()}
    assert [(r["kind"], r["step"], sorted(r)) for r in rows["xla"]] == [(r["kind"], r["step"], sorted(r))
                                                                       for r in rows["cpu"]]
    np.testing.assert_allclose([r["loss"] for r in rows["xla"]], [r["loss"] for r in rows["cpu"]], rtol=STEPS_RTOL)
    assert lazy["val_bpb"] == pytest.approx(cpu["val_bpb"], rel=STEPS_RTOL)
    env = {d: json.loads((p / "env.json").read_text()) for d, (p, _) in runs.items()}
    assert set(env["xla"]) == set(env["cpu"]) | {"torch_xla", "pjrt_device"}
    assert env["xla"]["backend"] == "torch-xla" and env["xla"]["pjrt_device"] == "CPU"
    assert env["xla"]["compute_dtype"] == env["cpu"]["compute_dtype"] == "float32"


@on_xla
def test_nothing_recompiles_in_the_timed_loop_after_a_one_step_warm_up(runs):
    log = (runs["xla"][0] / "train.log").read_text()
    assert "xla: 0 graph compilation(s) in 6 timed step(s)" in log
    assert "device xla:0 (cpu)" in log and "torch_xla 2." in log
