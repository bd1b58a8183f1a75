"""python -m baseline_torch.train: the PyTorch baseline in the project's harness.

Same configs (`configs/*.py` + `--set`), same numpy data pipeline (TrainLoader, val windows, byte
tables: identical tokens in identical order, identical byte counts), the same run policy as
`python -m frontier_jax.train` by construction (`frontier_jax.run_policy.run_budgeted`: untimed
compile warm-up then reset, stop order, validation cadence, schedules, summary, exit codes) and the
same run directory (`frontier_jax.rundir`: config.json, env.json, metrics.jsonl, summary.json +
summary.txt, curves.png, train.log), plus weights.npz (the interop format). No checkpoints and no
resume. Prints `val_bpb: X` at the end. Imports no JAX.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from baseline_torch.model import GPT, count_params, load_npz, save_npz
from baseline_torch.optim import Optimizers
from frontier_jax import rundir
from frontier_jax import run_policy as policy
from frontier_jax.config import Config, config_hash, model_hash, to_dict
from frontier_jax.data.stream import TrainLoader
from frontier_jax.data.tokenizer import count_bytes
from frontier_jax.config import ConfigError
from frontier_jax.errors import exit_on_error
from frontier_jax.host import describe as describe_allocator
from frontier_jax.host import tune_allocator
from frontier_jax.data.dataset import load_for_config
from frontier_jax.data.stream import val_batches
from frontier_jax.rundir import RunError, RunLog

PACKAGES = ("torch", "numpy", "sentencepiece")
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RunError(f"--device {device}: CUDA is not available in this PyTorch build/machine")
    return torch.device(device)


def compute_dtype_for(cfg: Config, device: torch.device) -> torch.dtype:
    """The dtype policy (frontier_jax.run_policy.compute_dtype_name) applied to this device."""
    return _TORCH_DTYPES[policy.compute_dtype_name(cfg.model, "cpu" if device.type == "cpu" else "gpu")]


def environment(device: torch.device) -> dict:
    return {**rundir.environment(PACKAGES), "backend": f"torch-{device.type}", "devices": [str(device)],
            "torch_threads": torch.get_num_threads()}


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = math.inf
    for _ in range(reps + 1):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    """Model + optimizers + data, and the run policy's hooks: train step (with grad accumulation), eval
    sums, snapshot/restore for the warm-up reset."""

    def __init__(self, cfg: Config, device: torch.device, loader: TrainLoader, val_tokens: np.ndarray, tables,
                 compile_model: bool = False):
        self.cfg, self.device, self.loader, self.val_tokens, self.tables = cfg, device, loader, val_tokens, tables
        self.dtype = compute_dtype_for(cfg, device)
        t = cfg.train
        self.seqs_per_step = t.tokens_per_step // t.seq_len
        self.micro_seqs, self.accum = policy.split_batch(self.seqs_per_step, t.micro_batch_seqs, 1, 1)
        torch.manual_seed(t.seed)
        self.model = GPT(cfg.model, self.dtype).to(device)
        self.forward = torch.compile(self.model, dynamic=False, fullgraph=True) if compile_model else self.model
        self.opt = Optimizers(self.model, cfg.optim, device.type)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16)

    def train_step(self, lr_scale: float, momentum: float) -> tuple[float, float]:
        """One step on the loader's next batch; (loss, grad_norm) once it has finished."""
        t = self.cfg.train
        x_MBT, y_MBT = policy.step_batch(self.loader, self.seqs_per_step, self.accum, t.seq_len)
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
        return float(total / M), float(gnorm)  # float() waits for the device

    @torch.no_grad()
    def eval_sums(self, max_tokens: int) -> dict:
        t = self.cfg.train
        toks = policy.val_window_tokens(self.val_tokens, max_tokens, t.seq_len)
        nll, ntoks, nbytes = 0.0, 0, 0
        for x, y, mask in val_batches(toks, t.seq_len, t.val_batch_seqs):
            xt = torch.from_numpy(x).to(self.device, torch.long)
            yt = torch.from_numpy(y).to(self.device, torch.long)
            with self._autocast():
                loss = self.forward(xt, yt).float()
            m = torch.from_numpy(mask).to(self.device).bool()
            nll += float(torch.where(m, loss, 0.0).double().sum())
            ntoks += int(mask.sum())
            nbytes += int((count_bytes(self.tables, x, y) * mask).sum())
        return {"nll_sum_nats": nll, "tokens": ntoks, "bytes": nbytes}

    def snapshot(self):
        return copy.deepcopy(self.model.state_dict()), self.loader.state()

    def restore(self, snap) -> None:
        model_state, data_state = snap
        self.model.load_state_dict(model_state)
        self.opt = Optimizers(self.model, self.cfg.optim, self.device.type)
        self.loader.restore(data_state)
        _sync(self.device)


class StepLog(policy.RunHook):
    """A train.log line every train.log_every_steps steps."""

    def __init__(self, log, every: int):
        self.log, self.every = log, max(every, 1)

    def after_step(self, state: policy.RunState, row: dict) -> None:
        if row["step"] % self.every == 0:
            self.log(f"step {row['step']} loss {row['loss']:.4f} lr_scale {row['lr_scale']:.3f} "
                     f"{row['tokens'] / max(row['train_seconds'], 1e-9):,.0f} tok/s")


def run(cfg: Config, out_dir: Path, device: str | None = None, compile_model: bool = False,
        init_weights: str | None = None, echo: bool = True, allocator: dict | None = None) -> dict:
    """Train `cfg` with PyTorch into `out_dir`; returns the summary dict (as frontier_jax.loop.run).
    Every input (device, data, tokenizer, initial weights) is checked before anything is written; a
    signal before the first timed step leaves no run directory behind."""
    if cfg.ngram.enabled:  # never silently a different model than the config names
        raise ConfigError("ngram.enabled=True: the PyTorch baseline has no n-gram bias (use the JAX trainer, or "
                          "--set ngram.enabled=False)")
    with rundir.Signals() as signals:  # from the start, as the JAX trainer
        dev = resolve_device(device)
        data = load_for_config(cfg)
        trainer = Trainer(cfg, dev, TrainLoader(data.train_files, cfg.train.seq_len), data.val_tokens, data.tables,
                          compile_model)
        if init_weights:
            load_npz(trainer.model, init_weights)
        out_dir = Path(out_dir).absolute()
        if signals.received:
            return rundir.stopped_before_training(out_dir, False, signals, None, False)
        lock, created = rundir.claim_run_dir(out_dir, resume=False)  # one process per run directory
        log = RunLog(out_dir / rundir.LOG, echo)
        try:
            return _run(cfg, out_dir, trainer, data, compile_model, log, allocator, signals)
        except policy.InterruptedBeforeTraining:
            return rundir.stopped_before_training(out_dir, False, signals, None, created)
        finally:
            log.close()
            lock.release()


def _run(cfg: Config, out_dir: Path, trainer: Trainer, data, compile_model: bool, log, allocator, signals) -> dict:
    t, device = cfg.train, trainer.device
    env = environment(device)
    rundir.write_json(out_dir / rundir.CONFIG, to_dict(cfg))
    rundir.write_json(out_dir / rundir.ENV, {**env, "compute_dtype": str(trainer.dtype).removeprefix("torch."),
                                              "torch_compile": compile_model, "host_allocator": allocator})
    log(f"baseline_torch run {out_dir} | config {cfg.name} ({config_hash(cfg)}) | git {env['git']}")
    log(f"device {device} | torch {torch.__version__} | compute dtype {trainer.dtype} "
        f"(model.compute_dtype={cfg.model.compute_dtype}) | torch.compile {compile_model}"
        + (f" | allocator {describe_allocator(allocator)}" if allocator else ""))
    log(f"data {cfg.data.data_dir}: {len(data.train_files)} train shards, {data.val_tokens.size - 1:,} val targets | "
        f"tokenizer {data.tokenizer.path}")
    log(f"data provenance: {data.provenance}")
    log(f"step = {t.tokens_per_step:,} tokens = {trainer.accum} micro-batch(es) of {trainer.micro_seqs} x {t.seq_len}")
    log(f"model: {count_params(trainer.model):,} parameters, hash {model_hash(cfg.model)}")
    flops_per_token = cfg.model.flops_per_token(t.seq_len)
    peak = measure_matmul_peak(device, trainer.dtype) if t.measure_peak else None
    log(f"measured matmul peak: {peak / 1e9:.1f} GFLOP/s ({trainer.dtype})" if peak
        else "matmul peak not measured (train.measure_peak=False): no MFU")

    metrics_log = rundir.MetricsLog(out_dir / rundir.METRICS)

    def write_summary(summary: dict) -> None:
        metrics_log.close()
        if summary["stop_reason"] != policy.STOP_NONFINITE:  # a diverged model's weights are not written
            save_npz(trainer.model, out_dir / rundir.WEIGHTS, {"model": to_dict(cfg)["model"],
                                                                "step": summary["steps"], "source": "baseline_torch"})
        rundir.write_summary(out_dir, summary)

    hooks = policy.Hooks(train_step=trainer.train_step, read_metrics=lambda m: m, eval_sums=trainer.eval_sums,
                         snapshot=trainer.snapshot, restore=trainer.restore, log=log, metrics=metrics_log.log,
                         signals=signals, write_summary=write_summary, plugins=[StepLog(log, t.log_every_steps)])
    base = {"config_name": cfg.name, "config_hash": config_hash(cfg), "implementation": "torch",
            "matmul_peak_flops": peak, "flops_per_token": flops_per_token, "run_dir": str(out_dir)}
    try:
        return policy.run_budgeted(policy.Policy.from_config(cfg), hooks, base)
    finally:
        metrics_log.close()


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m baseline_torch.train", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="a configs/*.py file (default configs/tiny.py with the demo corpus)")
    p.add_argument("--data", help="directory of *_train_*.bin / *_val_*.bin shards")
    p.add_argument("--tokenizer", help="SentencePiece .model matching the shards, or 'bytes'")
    p.add_argument("--budget", type=float, help="training budget in seconds (train.budget_seconds)")
    p.add_argument("--out", help="run directory (default runs/<config>-torch-<time>)")
    p.add_argument("--seed", type=int)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. model.num_layers=4")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (as the baseline does on GPU)")
    p.add_argument("--init-weights", metavar="NPZ", help="start from these weights (interop .npz, state_dict names)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice; 1 is faster on "
                                                "a CPU shared with other busy processes)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        with exit_on_error():
            ns = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "threads"}, resume=None,
                                    kernels=None)
            cfg, out, _, _ = rundir.resolve_run(ns)
            device = resolve_device(args.device)
            allocator = tune_allocator(cfg.train.allocator, device.type)  # the JAX trainer's process setting
            if not args.out:
                out = Path("runs") / f"{cfg.name}-torch-{time.strftime('%Y%m%d-%H%M%S')}"
            summary = run(cfg, out, str(device), args.compile, args.init_weights, allocator=allocator)
    except SystemExit as e:  # one line on stderr already printed
        return int(e.code)
    if summary.get("val_bpb") is not None:
        print(f"val_bpb: {summary['val_bpb']:.6f}")
    code = policy.exit_code(summary["stop_reason"])
    if summary["stop_reason"].endswith("before training"):
        print("interrupted before training started: nothing trained, nothing written", file=sys.stderr)
    elif policy.is_interrupted(summary["stop_reason"]):
        print(f"interrupted after {summary['steps']} steps; weights in {out}/{rundir.WEIGHTS} "
              "(the torch baseline has no resume)", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
