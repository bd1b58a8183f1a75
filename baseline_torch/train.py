"""python -m baseline_torch.train: the PyTorch baseline in the project's harness.

Same configs (`configs/*.py` + `--set`), same numpy data pipeline (TrainLoader, val windows, byte
tables: identical tokens in identical order, identical byte counts), the same driver as
`python -m frontier_jax.train` by construction (`frontier_jax.run.driver.run_budgeted`: untimed
compile warm-up then reset, stop order, validation cadence, schedules, summary, exit codes) and the
same run directory (`frontier_jax.run.rundir`: config.json, env.json, metrics.jsonl, summary.json +
summary.txt, curves.png, train.log), plus weights.npz (the interop format). No checkpoints and no
resume. Prints `val_bpb: X` at the end. Imports no JAX. `--device xla` trains on PyTorch/XLA's device, a
NeuronCore under torch-neuronx (baseline_torch.xla; torch_xla is imported only then).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from baseline_torch import quantize, xla
from baseline_torch.model import GPT, count_params, load_npz, refuse_recipe, save_npz
from baseline_torch.optim import Optimizers
from frontier_jax.policies import dtypes as dtype_policy
from frontier_jax.policies import sizing
from frontier_jax.policies.geometry import micro_batch_candidates, split_batch, step_batch
from frontier_jax.policies.scoring import val_window_tokens
from frontier_jax.run import driver, progress, rundir, startup
from frontier_jax.run.endings import STOP_NONFINITE, ending
from frontier_jax.config import Config, ConfigError, config_hash, to_dict
from frontier_jax.data.dataset import Dataset, load_for_config
from frontier_jax.data.stream import TrainLoader, val_batches
from frontier_jax.data.tokenizer import count_bytes
from frontier_jax.errors import ArgumentParser, exit_on_error, int_in
from frontier_jax.run.host import describe as describe_allocator
from frontier_jax.run.host import tune_allocator
from frontier_jax.run.resolve import resolve_run
from frontier_jax.run.rundir import RunError, RunLog
from frontier_jax.run.interface import Trainer as TrainerInterface

PACKAGES = ("torch", "numpy", "sentencepiece", "torch-xla", "torch-neuronx", "neuronx-cc")
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(device: str | None) -> torch.device:
    """auto: the XLA device on a Neuron host (baseline_torch.xla.neuron_host), else CUDA when available,
    else the CPU. xla: PyTorch/XLA's default device (docs/comparison.md, "The PyTorch baseline on trn1")."""
    if device in (None, "auto"):
        device = "xla" if xla.neuron_host() else "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RunError(f"--device {device}: CUDA is not available in this PyTorch build/machine")
    if device.startswith("xla"):
        if device not in ("xla", "xla:0"):
            raise RunError(f"--device {device}: give 'xla' (the process's default XLA device, one NeuronCore)")
        if not xla.available():
            raise RunError("--device xla: torch_xla is not installed (torch-neuronx on trn1, or torch-xla from "
                           "the package index; docs/comparison.md)")
        return xla.device()
    return torch.device(device)


def device_platform(device: torch.device) -> str:
    """Where the arithmetic runs: "cpu", "cuda", or for the XLA device its PJRT type ("neuron", "cpu")."""
    return xla.platform() if device.type == "xla" else device.type


def environment(device: torch.device) -> dict:
    return {**rundir.environment(PACKAGES), "backend": f"torch-{device.type}", "devices": [str(device)],
            "device_platform": device_platform(device), "torch_threads": torch.get_num_threads(),
            **(xla.versions() if device.type == "xla" else {})}


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = math.inf
    for _ in range(reps + 1):
        _sync(device)
        t0 = time.perf_counter()
        c = a @ b  # kept: an unreferenced lazy (XLA) result is never computed
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    del c
    return 2.0 * n**3 / best


def _sync(device: torch.device) -> None:
    """Wait until the device has finished everything issued so far (XLA: after marking the step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xla":
        xla.sync(wait=True)


def _mark_step(device: torch.device) -> None:
    """The end of one graph on the XLA device (compiled once, then launched without waiting); eager
    devices have run everything already."""
    if device.type == "xla":
        xla.sync()


class Trainer(TrainerInterface):
    """Model + optimizers + data, and the trainer interface (frontier_jax.run.interface): train step (with grad
    accumulation), eval sums, snapshot/restore for the warm-up reset, the run's log, metrics and summary
    files (`start`), the int8 + zlib round trip. No checkpoints and no resume (the interface's defaults).

    On the XLA device a train step is one graph: the micro-batches' forward and backward, the gradient
    norm and the optimizer step are recorded lazily and the step is marked once at its end; its loss and
    gradient norm come back as one device tensor that the driver reads a step later (the read waits
    for that step, so the budget counts finished steps). Evaluation marks one graph per (fixed-shape)
    batch and reads the sums at the end."""

    def __init__(self, cfg: Config, device: torch.device, loader: TrainLoader, val_tokens: np.ndarray, tables,
                 compile_model: bool = False):
        self.cfg, self.device, self.loader, self.val_tokens, self.tables = cfg, device, loader, val_tokens, tables
        self.platform = device_platform(device)
        self.dtypes = dtype_policy.resolve(cfg, self.platform)  # resolved once: the model's and Newton-Schulz's
        self.dtype = _TORCH_DTYPES[self.dtypes.compute]
        # NeuronCore-v2 computes no float64 (its engines: cFP8, FP16, BF16, TF32, FP32, INT8-32; aws-neuron-sdk
        # about-neuron/arch/neuron-hardware/neuron-core-v2.rst): per-batch sums in fp32 on XLA, float64 on the host.
        self.sum_dtype = torch.float32 if device.type == "xla" else torch.float64
        t = cfg.train
        self.seqs_per_step = t.tokens_per_step // t.seq_len
        # train.micro_batch_seqs = 0 (auto): the PyTorch baseline estimates no memory (the JAX trainer does,
        # frontier_jax.neuron.memory); it takes the baseline's micro-batch, 64 sequences (a divisor of the step)
        micro = t.micro_batch_seqs or micro_batch_candidates(self.seqs_per_step)[0]
        self.micro_seqs, self.accum = split_batch(self.seqs_per_step, micro, 1, 1)
        torch.manual_seed(t.seed)
        self.model = GPT(cfg.model, self.dtype).to(device)
        self.forward = torch.compile(self.model, dynamic=False, fullgraph=True) if compile_model else self.model
        self.opt = Optimizers(self.model, cfg.optim, self.dtypes.muon_ns, xla=device.type == "xla")
        _mark_step(device)  # parameters and optimizer state become device data before the first step

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16)

    def train_step(self, lr_scale: float, momentum: float, qat: bool = False) -> tuple[float, float]:
        """One step on the loader's next batch; (loss, grad_norm) once it has finished (`qat` is always off: a
        config with late QAT is refused, `refuse_recipe`)."""
        t = self.cfg.train
        x_MBT, y_MBT = step_batch(self.loader, self.seqs_per_step, self.accum, t.seq_len)
        M = x_MBT.shape[0]
        total = torch.zeros((), device=self.device)
        for m in range(M):
            x = torch.from_numpy(x_MBT[m]).to(self.device, torch.long)
            y = torch.from_numpy(y_MBT[m]).to(self.device, torch.long)
            with self._autocast():
                loss = self.forward(x, y).mean()
            (loss / M).backward()
            total += loss.detach().float()
        grads = [p.grad.float() for p in self.model.parameters() if p.grad is not None]
        gnorm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        self.opt.step(lr_scale, momentum)
        self.opt.zero_grad()
        metrics = torch.stack([total / M, gnorm.float()])
        _mark_step(self.device)
        return metrics

    @staticmethod
    def read_metrics(metrics: torch.Tensor) -> tuple[float, float]:
        """(loss, grad_norm) of a step `train_step` returned; waits for that step to finish."""
        loss, gnorm = metrics.tolist()
        return loss, gnorm

    @torch.no_grad()
    def eval_sums(self, max_tokens: int, seq_len: int | None = None, stride: int | None = None) -> dict:
        """Evaluation sums over non-overlapping windows of `seq_len` (default train.seq_len), or sliding ones at
        `stride` (eval.batch_seqs windows per batch) that score every target once (the JAX trainer's windows)."""
        t = self.cfg.train
        T = seq_len or t.seq_len
        batch = (self.cfg.eval.batch_seqs or t.val_batch_seqs) if stride else t.val_batch_seqs
        toks = self.val_tokens if stride and not max_tokens else val_window_tokens(self.val_tokens, max_tokens, T)
        sums, ntoks, nbytes = [], 0, 0
        for x, y, mask in val_batches(toks, T, batch, stride=stride):
            xt = torch.from_numpy(x).to(self.device, torch.long)
            yt = torch.from_numpy(y).to(self.device, torch.long)
            with self._autocast():
                loss = self.forward(xt, yt).float()
            m = torch.from_numpy(mask).to(self.device).bool()
            sums.append(torch.where(m, loss, 0.0).to(self.sum_dtype).sum())
            _mark_step(self.device)
            ntoks += int(mask.sum())
            nbytes += int((count_bytes(self.tables, x, y) * mask).sum())
        nll = sum(float(s) for s in sums)  # float64 on the host, batch by batch
        return {"nll_sum_nats": nll, "tokens": ntoks, "bytes": nbytes}

    def snapshot(self):
        """The parameters (copied to host memory) and the data position, before the warm-up."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}, self.loader.state()

    def restore(self, snap) -> None:
        model_state, data_state = snap
        self.model.load_state_dict(model_state)
        self.opt = Optimizers(self.model, self.cfg.optim, self.dtypes.muon_ns, xla=self.device.type == "xla")
        self.loader.restore(data_state)
        _sync(self.device)

    def start(self, out_dir: Path, log: RunLog, signals, metrics_log: rundir.MetricsLog, hooks: list) -> None:
        """The run this trainer trains: its directory, log, signal handlers, metrics sink and plug-ins."""
        self.out_dir, self.log, self.signals, self.metrics_log, self._hooks = out_dir, log, signals, metrics_log, hooks

    def run_hooks(self) -> list:
        return self._hooks

    def metrics(self, **row) -> None:
        self.metrics_log.log(**row)

    def write_summary(self, summary: dict) -> None:
        """summary.json/txt, curves.png and weights.npz (the interop format; not of a diverged model)."""
        self.metrics_log.close()
        if summary["stop_reason"] != STOP_NONFINITE:
            save_npz(self.model, self.out_dir / rundir.WEIGHTS, {"model": to_dict(self.cfg)["model"],
                                                                 "step": summary["steps"], "source": "baseline_torch"})
        rundir.write_summary(self.out_dir, summary)

    def roundtrip(self, evaluate) -> dict:
        return quantize.roundtrip_scored(self.model, self.out_dir, evaluate)


def run(cfg: Config, out_dir: Path, device: str | None = None, compile_model: bool = False,
        init_weights: str | None = None, echo: bool = True, allocator: dict | None = None) -> dict:
    """Train `cfg` with PyTorch into `out_dir`; returns the summary dict (as frontier_jax.trainer.run).
    Every input (device, data, tokenizer, initial weights) is checked before anything is written; a
    signal before the first timed step leaves no run directory behind."""
    if cfg.ngram.enabled:  # never silently a different model than the config names
        raise ConfigError("ngram.enabled=True: the PyTorch baseline has no n-gram bias (use the JAX trainer, or "
                          "--set ngram.enabled=False)")
    refuse_recipe(cfg.model, cfg.optim)  # before anything is written
    if cfg.eval.artifact != "int8_zlib":  # nor another artifact than the one it writes
        raise ConfigError(f"eval.artifact={cfg.eval.artifact!r}: the PyTorch baseline writes the baseline's int8+zlib "
                          "artifact only (use the JAX trainer, or --set eval.artifact=int8_zlib)")
    if cfg.ttt.enabled:  # nor a final pipeline without the config's test-time training stage
        raise ConfigError("ttt.enabled=True: the PyTorch baseline has no test-time training (use the JAX trainer, or "
                          "--set ttt.enabled=False)")
    out_dir = Path(out_dir).absolute()
    log = RunLog(None, echo)

    def setup(check) -> tuple[Trainer, Dataset]:
        sizing.check_host_memory(cfg)  # before anything is allocated (as the JAX trainer)
        dev = resolve_device(device)
        if compile_model and dev.type == "xla":
            raise RunError("--compile with --device xla: torch.compile is not supported by torch-neuronx 2.9 "
                           "(aws-neuron-sdk archive/appnotes/torch-neuronx/introducing-pytorch-2-9.rst); the XLA "
                           "device compiles each marked step as one graph already")
        data = load_for_config(cfg)
        check()  # a signal by now stops the start (startup.Start.check), before the model is built
        trainer = Trainer(cfg, dev, TrainLoader(data.train_files, cfg.train.seq_len), data.val_tokens, data.tables,
                          compile_model)
        check()
        if init_weights:
            load_npz(trainer.model, init_weights)
        return trainer, data

    def body(prepared, start: startup.Start) -> dict:
        trainer, data = prepared
        log.attach(out_dir / rundir.LOG)
        return _run(cfg, out_dir, trainer, data, compile_model, log, allocator, start.signals)

    # signals from the start, as the JAX trainer; one process per run directory (rundir.claim_run_dir)
    return startup.start_run(out_dir, False, log, setup, body)


def _run(cfg: Config, out_dir: Path, trainer: Trainer, data, compile_model: bool, log, allocator, signals) -> dict:
    t, device = cfg.train, trainer.device
    env = environment(device)
    rundir.write_json(out_dir / rundir.CONFIG, to_dict(cfg))
    rundir.write_json(out_dir / rundir.ENV, {**env, "compute_dtype": str(trainer.dtype).removeprefix("torch."),
                                              "torch_compile": compile_model, "host_allocator": allocator})
    log(startup.run_line("baseline_torch", out_dir, cfg, env["git"]))
    log(f"device {device} ({trainer.platform}) | torch {torch.__version__}"
        + (f" | torch_xla {env['torch_xla']}" if device.type == "xla" else "") + f" | compute dtype {trainer.dtype} "
        f"(model.compute_dtype={cfg.model.compute_dtype}) | torch.compile {compile_model}"
        + (f" | allocator {describe_allocator(allocator)}" if allocator else ""))
    peak_info = progress.probe_summary([measure_matmul_peak(device, trainer.dtype) for _ in range(5)],
                                       f"2048^3 {trainer.dtype} matmul on {device}") if t.measure_peak else {}
    for line in startup.start_lines(cfg, data, len(data.train_files), trainer.accum, trainer.micro_seqs,
                                    count_params(trainer.model), peak_info):
        log(line)
    if not t.micro_batch_seqs:
        log(f"micro-batch {trainer.micro_seqs} sequences (train.micro_batch_seqs=0): the PyTorch baseline estimates "
            "no memory and takes the baseline's micro-batch; set train.micro_batch_seqs lower if the step does not fit")
    trainer.start(out_dir, log, signals, rundir.MetricsLog(out_dir / rundir.METRICS),
                  [*([xla.CompileWatch(log)] if device.type == "xla" else []),
                   progress.Progress(log, driver.Policy.from_config(cfg), progress.train_tokens(data.train_files), t)])
    base = {"config_name": cfg.name, "config_hash": config_hash(cfg), "implementation": "torch",
            "rules_profile": cfg.rules.profile,
            **peak_info, "matmul_peak_flops": peak_info.get("matmul_peak_flops"),
            "flops_per_token": cfg.model.flops_per_token(t.seq_len), "run_dir": str(out_dir)}
    try:
        return driver.run_budgeted(driver.Policy.from_config(cfg), trainer, base)
    finally:
        trainer.metrics_log.close()


def parse_args(argv):
    p = ArgumentParser(prog="python -m baseline_torch.train", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="a configs/*.py file (default configs/tiny.py with the demo corpus)")
    p.add_argument("--data", help="directory of *_train_*.bin / *_val_*.bin shards")
    p.add_argument("--tokenizer", help="SentencePiece .model matching the shards, or 'bytes'")
    p.add_argument("--budget", type=float, help="training budget in seconds (train.budget_seconds)")
    p.add_argument("--out", help="run directory (default runs/<config>-torch-<time>)")
    p.add_argument("--seed", type=int, help="initialisation seed (train.seed)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. model.num_layers=4")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | xla (PyTorch/XLA: a NeuronCore "
                                                     "under torch-neuronx; auto picks it on a Neuron host)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (as the baseline does on GPU)")
    p.add_argument("--init-weights", metavar="NPZ", help="start from these weights (interop .npz, state_dict names)")
    p.add_argument("--threads", type=int_in(1), help="torch intra-op threads (default: torch's choice; 1 is faster on "
                                                "a CPU shared with other busy processes)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        with exit_on_error():
            cfg, out, _, _ = resolve_run(config=args.config, data=args.data, tokenizer=args.tokenizer,
                                         budget=args.budget, seed=args.seed, sets=args.set, out=args.out,
                                         out_tag="-torch")
            device = resolve_device(args.device)
            allocator = tune_allocator(cfg.train.allocator, device_platform(device))  # the JAX trainer's setting
            summary = run(cfg, out, str(device), args.compile, args.init_weights, allocator=allocator)
    except SystemExit as e:  # one line on stderr already printed
        return int(e.code)
    end = ending(summary["stop_reason"])
    for line in progress.final_lines(summary) if end.results else ():
        print(line)
    line = end.line(summary, out, checkpoints=False)
    if line:
        print(line, file=sys.stderr if end.to_stderr else sys.stdout)
    return end.exit_code


if __name__ == "__main__":
    sys.exit(main())
