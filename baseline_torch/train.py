"""python -m baseline_torch.train: the PyTorch baseline in the project's harness.

Same configs (`configs/*.py` + `--set`), same numpy data pipeline (TrainLoader, val windows, byte
tables: identical tokens in identical order, identical byte counts), same budget semantics (untimed
compile warm-up, then weights, optimizer state and data position reset; validation pauses the clock;
stop decided after each step) and the same run-directory layout as `python -m frontier_jax.train`:
config.json, env.json, metrics.jsonl, summary.json (+ summary.txt), curves.png, train.log, plus
weights.npz (the interop format). Prints `val_bpb: X` at the end.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from baseline_torch.model import GPT, count_params, load_npz, save_npz
from baseline_torch.optim import Optimizers
from frontier_jax import optim as jax_optim
from frontier_jax import report
from frontier_jax.host import tune_allocator
from frontier_jax.config import Config, config_hash, model_hash, to_dict
from frontier_jax.data.stream import TrainLoader
from frontier_jax.errors import BadInput, exit_on_error
from frontier_jax.data.tokenizer import count_bytes
from frontier_jax.parallel import split_batch
from frontier_jax.run_support import (RunError, RunLog, Signals, load_run_data, padded_val_batches,
                                      prepare_run_dir, step_batch)
from frontier_jax.model import model_flops_per_token, resolve_compute_dtype

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RunError(f"--device {device}: CUDA is not available in this PyTorch build/machine")
    return torch.device(device)


def compute_dtype_for(cfg: Config, device: torch.device) -> torch.dtype:
    """The JAX dtype policy (frontier_jax.model.resolve_compute_dtype) applied to this device."""
    name = str(resolve_compute_dtype(cfg.model, "cpu" if device.type == "cpu" else "gpu"))
    return _TORCH_DTYPES[name]


def environment(device: torch.device) -> dict:
    versions = {}
    for name in ("torch", "numpy", "sentencepiece"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": sys.version.split()[0], "platform": platform.platform(), "versions": versions,
            "git": report.git_hash(), "backend": f"torch-{device.type}", "devices": [str(device)],
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
    """Model + optimizers + the two step functions (train with grad accumulation, eval sums)."""

    def __init__(self, cfg: Config, device: torch.device, compile_model: bool = False):
        self.cfg, self.device = cfg, device
        self.dtype = compute_dtype_for(cfg, device)
        torch.manual_seed(cfg.train.seed)
        self.model = GPT(cfg.model, self.dtype).to(device)
        self.forward = torch.compile(self.model, dynamic=False, fullgraph=True) if compile_model else self.model
        self.opt = Optimizers(self.model, cfg.optim, device.type)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16)

    def train_step(self, x_MBT: np.ndarray, y_MBT: np.ndarray, lr_scale: float, momentum: float) -> dict:
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
        return {"loss": float(total / M), "grad_norm": float(gnorm)}

    @torch.no_grad()
    def eval_sums(self, batches, tables) -> dict:
        nll, toks, nbytes = 0.0, 0, 0
        for x, y, mask in batches:
            xt = torch.from_numpy(x).to(self.device, torch.long)
            yt = torch.from_numpy(y).to(self.device, torch.long)
            with self._autocast():
                loss = self.forward(xt, yt).float()
            m = torch.from_numpy(mask).to(self.device).bool()
            nll += float(torch.where(m, loss, 0.0).double().sum())
            toks += int(mask.sum())
            nbytes += int((count_bytes(tables, x, y) * mask).sum())
        return {"nll_sum_nats": nll, "tokens": toks, "bytes": nbytes}

    def reset(self, model_state: dict) -> None:
        self.model.load_state_dict(model_state)
        self.opt = Optimizers(self.model, self.cfg.optim, self.device.type)


def run(cfg: Config, out_dir: Path, device: str | None = None, compile_model: bool = False,
        init_weights: str | None = None, echo: bool = True) -> dict:
    """Train `cfg` with PyTorch into `out_dir`; returns the summary dict (as frontier_jax.loop.run)."""
    out_dir = prepare_run_dir(out_dir, resume=False)
    log = RunLog(out_dir / "train.log", echo)
    try:
        return _run(cfg, out_dir, resolve_device(device), compile_model, init_weights, log)
    finally:
        log.close()


def _run(cfg: Config, out_dir: Path, device: torch.device, compile_model: bool, init_weights, log) -> dict:
    t = cfg.train
    micro_seqs, accum = split_batch(t.tokens_per_step // t.seq_len, t.micro_batch_seqs, 1, 1)
    env = environment(device)
    report.write_json(out_dir / "config.json", to_dict(cfg))
    data = load_run_data(cfg)
    tokenizer, tables, train_files, val_tokens = data.tokenizer, data.tables, data.train_files, data.val_tokens
    loader = TrainLoader(train_files, t.seq_len)

    trainer = Trainer(cfg, device, compile_model)
    if init_weights:
        load_npz(trainer.model, init_weights)
    report.write_json(out_dir / "env.json", {**env, "compute_dtype": str(trainer.dtype).removeprefix("torch."),
                                             "torch_compile": compile_model})
    log(f"baseline_torch run {out_dir} | config {cfg.name} ({config_hash(cfg)}) | git {env['git']}")
    log(f"device {device} | torch {torch.__version__} | compute dtype {trainer.dtype} "
        f"(model.compute_dtype={cfg.model.compute_dtype}) | torch.compile {compile_model}")
    log(f"data {cfg.data.data_dir}: {len(train_files)} train shards, {val_tokens.size - 1:,} val targets | "
        f"tokenizer {tokenizer.path}")
    log(f"step = {t.tokens_per_step:,} tokens = {accum} micro-batch(es) of {micro_seqs} x {t.seq_len}")
    log(f"model: {count_params(trainer.model):,} parameters, hash {model_hash(cfg.model)}")
    flops_per_token = model_flops_per_token(cfg.model, t.seq_len)
    peak = measure_matmul_peak(device, trainer.dtype)
    log(f"measured matmul peak: {peak / 1e9:.1f} GFLOP/s ({trainer.dtype})")

    def next_step_batch():
        return step_batch(loader, t.tokens_per_step // t.seq_len, accum, t.seq_len)

    def validate(max_tokens: int) -> dict:
        toks = val_tokens if not max_tokens else val_tokens[: min(val_tokens.size, max_tokens + 1)]
        toks = toks[: ((toks.size - 1) // t.seq_len) * t.seq_len + 1]
        s = trainer.eval_sums(padded_val_batches(toks, t.seq_len, t.val_batch_seqs), tables)
        return {**s, "loss": s["nll_sum_nats"] / max(s["tokens"], 1), "bpb": report.bpb(s["nll_sum_nats"], s["bytes"])}

    # ---- compile warm-up (untimed), then reset weights, optimizer state and data position
    t_compile = time.perf_counter()
    initial = copy.deepcopy(trainer.model.state_dict())
    data0 = loader.state()
    for i in range(max(t.compile_warmup_steps, 1)):
        trainer.train_step(*next_step_batch(), 1.0, jax_optim.muon_momentum(cfg.optim, i))
    validate(t.val_batch_seqs * t.seq_len)
    trainer.reset(initial)
    loader.restore(data0)
    _sync(device)
    log(f"compile warm-up: {time.perf_counter() - t_compile:.1f} s (untimed; state reset)")

    metrics_log = report.MetricsLog(out_dir / "metrics.jsonl")
    step, train_s, tokens, final_loss, stop_reason = 0, 0.0, 0, math.nan, None
    with Signals() as flag:
        t0 = time.perf_counter()
        while stop_reason is None:
            if flag.received:
                stop_reason = f"signal {flag.received}"
                break
            if step >= t.max_steps:
                stop_reason = "max_steps"
                break
            elapsed = train_s + time.perf_counter() - t0
            scale = jax_optim.lr_scale(cfg.optim, step, elapsed, t.budget_seconds, t.max_steps)
            mom = jax_optim.muon_momentum(cfg.optim, step)
            m = trainer.train_step(*next_step_batch(), scale, mom)
            _sync(device)
            step += 1
            tokens += t.tokens_per_step
            now = train_s + time.perf_counter() - t0
            metrics_log.log(kind="train", step=step, loss=m["loss"], grad_norm=m["grad_norm"], lr_scale=scale,
                            momentum=mom, tokens=tokens, train_seconds=now)
            final_loss = m["loss"]
            if not (math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])):
                log(f"non-finite values after step {step}: loss={m['loss']} grad_norm={m['grad_norm']}")
                stop_reason = "non-finite loss"
                break
            if now >= t.budget_seconds:
                stop_reason = "budget"
                break
            if step % max(t.log_every_steps, 1) == 0:
                log(f"step {step} loss {m['loss']:.4f} lr_scale {scale:.3f} {tokens / max(now, 1e-9):,.0f} tok/s")
            if t.val_every_steps and step % t.val_every_steps == 0 and step < t.max_steps:
                train_s += time.perf_counter() - t0
                v = validate(t.val_max_tokens)
                metrics_log.log(kind="val", step=step, tokens=tokens, train_seconds=train_s, loss=v["loss"],
                                bpb=v["bpb"], val_tokens=v["tokens"])
                log(f"step {step} val loss {v['loss']:.4f} bpb {v['bpb']:.4f} ({v['tokens']:,} tokens)")
                t0 = time.perf_counter()
        train_s += time.perf_counter() - t0

    save_npz(trainer.model, out_dir / "weights.npz", {"model": to_dict(cfg)["model"], "step": step,
                                                      "source": "baseline_torch"})
    summary = {
        "config_name": cfg.name, "config_hash": config_hash(cfg), "implementation": "torch", "steps": step,
        "tokens": tokens, "train_seconds": train_s, "tokens_per_second": tokens / train_s if train_s > 0 else None,
        "matmul_peak_flops": peak, "flops_per_token": flops_per_token, "final_train_loss": final_loss,
        "stop_reason": stop_reason, "run_dir": str(out_dir),
    }
    if summary["tokens_per_second"]:
        summary["mfu"] = summary["tokens_per_second"] * flops_per_token / peak
    if not stop_reason.startswith("signal") and stop_reason != "non-finite loss":
        v = validate(0)
        summary.update(val_loss=v["loss"], val_bpb=v["bpb"], val_nll_sum_nats=v["nll_sum_nats"],
                       val_tokens=v["tokens"], val_bytes=v["bytes"])
        metrics_log.log(kind="val", step=step, tokens=tokens, train_seconds=train_s, loss=v["loss"], bpb=v["bpb"],
                        val_tokens=v["tokens"], final=True)
    metrics_log.close()
    report.write_json(out_dir / "summary.json", summary)
    table = report.format_table(report.summary_rows(summary))
    report.atomic_write_text(out_dir / "summary.txt", table + "\n")
    report.plot_run(metrics_log.rows, out_dir / "curves.png")
    log("summary:\n" + table)
    return summary


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
    from frontier_jax.train import resolve

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with exit_on_error():
        try:
            ns = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "threads"}, resume=None, kernels=None)
            cfg, out, _, _ = resolve(ns)
            tune_allocator(cfg.train.allocator)  # the same process setting as the JAX trainer
            if not args.out:
                out = Path("runs") / f"{cfg.name}-torch-{time.strftime('%Y%m%d-%H%M%S')}"
            summary = run(cfg, out, args.device, args.compile, args.init_weights)
        except ValueError as e:  # the torch side's own checks (e.g. --init-weights) raise plain ValueError
            raise BadInput(str(e)) from None
    if summary.get("val_bpb") is not None:
        print(f"val_bpb: {summary['val_bpb']:.6f}")
    if summary["stop_reason"] == "non-finite loss":
        return 3
    if summary["stop_reason"].startswith("signal"):
        print(f"interrupted after {summary['steps']} steps; weights in {out}/weights.npz "
              "(the torch baseline has no resume)")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
