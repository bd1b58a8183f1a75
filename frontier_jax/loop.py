"""The time-budgeted training loop (spec baseline.md 1.3).

Order of events, as the baseline: set up; untimed compile warm-up steps on real data, after which
parameters, optimizer state and data position are reset; then steps until the budget is spent (the
stop is decided after each step; validation and checkpointing pause the clock); final full-val bpb.
SIGINT/SIGTERM finish the current step, save a resumable checkpoint and stop.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from frontier_jax import checkpoint, ops, optim, report
from frontier_jax.config import Config, ConfigError, config_hash, model_hash, to_dict
from frontier_jax.data.shards import DataError, list_shards
from frontier_jax.data.stream import TrainLoader, load_val_tokens, val_batches
from frontier_jax.data.tokenizer import check_vocab, load_tokenizer
from frontier_jax.model import GPT, count_params, model_flops_per_token, resolve_compute_dtype
from frontier_jax.steps import evaluate_batches, make_eval_step, make_train_step


class RunError(RuntimeError):
    """A run that cannot start or continue (message names the file/setting and the problem)."""


@dataclasses.dataclass
class Geometry:
    seqs_per_step: int
    micro_seqs: int
    accum: int


def geometry(cfg: Config) -> Geometry:
    t = cfg.train
    seqs = t.tokens_per_step // t.seq_len
    micro = min(t.micro_batch_seqs, seqs)
    if seqs % micro:
        raise ConfigError(f"train.tokens_per_step/seq_len = {seqs} sequences is not a multiple of "
                          f"train.micro_batch_seqs = {micro}")
    return Geometry(seqs, micro, seqs // micro)


class RunLog:
    """Prints and appends to <run>/train.log."""

    def __init__(self, path: Path | None, echo: bool = True):
        self._f = open(path, "a") if path else None
        self.echo = echo

    def __call__(self, msg: str = "") -> None:
        if self.echo:
            print(msg, flush=True)
        if self._f:
            self._f.write(msg + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f:
            self._f.close()


def prepare_run_dir(out_dir: Path, resume: bool) -> Path:
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write_probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunError(f"{out_dir}: output directory is not writable ({e.strerror or e})") from None
    if not resume and (out_dir / "metrics.jsonl").exists():
        raise RunError(f"{out_dir}: already holds a run; use --resume {out_dir} or another --out")
    return out_dir


class _Signals:
    """SIGINT/SIGTERM set a flag checked between steps; a second SIGINT aborts immediately."""

    def __init__(self):
        self.received: str | None = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread: no handlers
                pass
        return self

    def _handle(self, signum, frame):
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def init_state(cfg: Config, tx, compute_dtype):
    model = GPT(cfg.model, rngs=nnx.Rngs(cfg.train.seed), compute_dtype=compute_dtype)
    graphdef, params = nnx.split(model)
    return graphdef, params, tx.init(params)


def _stack_micro(loader: TrainLoader, geo: Geometry):
    xs, ys = zip(*(loader.next_batch(geo.micro_seqs) for _ in range(geo.accum)))
    return np.stack(xs), np.stack(ys)


def padded_val_batches(tokens, seq_len: int, batch_seqs: int, process_index=0, process_count=1):
    """(x, y, mask) with the last batch padded to full size (mask 0), so eval compiles once."""
    for x, y in val_batches(tokens, seq_len, batch_seqs, process_index, process_count):
        mask = np.ones_like(x, dtype=np.int32)
        if x.shape[0] < batch_seqs:
            pad = ((0, batch_seqs - x.shape[0]), (0, 0))
            x, y, mask = np.pad(x, pad), np.pad(y, pad), np.pad(mask, pad)
        yield x, y, mask


def run(cfg: Config, out_dir: Path, resume: bool = False, echo: bool = True, stop_after_steps: int | None = None,
        on_step=None) -> dict:
    """Train `cfg` into `out_dir` and return the summary dict.

    resume: continue from the latest checkpoint in `out_dir`. stop_after_steps (tests): behave as if a
    signal arrived after that many steps of this invocation. on_step(step, metrics) is called with the
    host metrics of each finished step.
    """
    out_dir = prepare_run_dir(out_dir, resume)
    log = RunLog(out_dir / "train.log", echo)
    try:
        return _run(cfg, out_dir, resume, log, stop_after_steps, on_step)
    finally:
        log.close()


def _run(cfg: Config, out_dir: Path, resume: bool, log: RunLog, stop_after_steps, on_step) -> dict:
    t = cfg.train
    geo = geometry(cfg)
    kernel_rows = ops.configure(t.kernels)
    env = report.environment()
    compute_dtype = resolve_compute_dtype(cfg.model)
    report.write_json(out_dir / "config.json", to_dict(cfg))
    report.write_json(out_dir / "env.json", {**env, "compute_dtype": str(compute_dtype)})
    report.write_json(out_dir / "kernels.json", [dataclasses.asdict(r) for r in kernel_rows])
    log(f"frontier_jax run {out_dir} | config {cfg.name} ({config_hash(cfg)}) | git {env['git']}")
    log(f"backend {env['backend']} devices {env['devices']} | compute dtype {compute_dtype} "
        f"(model.compute_dtype={cfg.model.compute_dtype})")
    log(ops.format_kernel_table(kernel_rows))

    # ---- data and tokenizer (all checks before any compute)
    if not cfg.data.data_dir:
        raise DataError("<data>: no data directory given (--data DIR or data.data_dir)")
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    check_vocab(tokenizer, cfg.model.vocab_size, "model.vocab_size")
    tables = tokenizer.byte_tables(cfg.model.vocab_size)
    train_files = list_shards(cfg.data.data_dir, cfg.data.train_pattern)
    val_tokens = load_val_tokens(list_shards(cfg.data.data_dir, cfg.data.val_pattern), t.seq_len)
    loader = TrainLoader(train_files, t.seq_len)
    log(f"data {cfg.data.data_dir}: {len(train_files)} train shards, {val_tokens.size - 1:,} val targets | "
        f"tokenizer {tokenizer.path}")
    log(f"step = {geo.seqs_per_step} x {t.seq_len} tokens = {geo.accum} micro-batches of {geo.micro_seqs}")

    # ---- model, optimizer, compiled steps
    tx = optim.build_optimizer(cfg.optim)
    graphdef, params, opt_state = init_state(cfg, tx, compute_dtype)
    log(f"model: {count_params(nnx.merge(graphdef, params)):,} parameters, hash {model_hash(cfg.model)}")
    train_step = make_train_step(graphdef, tx)
    eval_step = make_eval_step(graphdef, tables)
    flops_per_token = model_flops_per_token(cfg.model, t.seq_len)
    peak = report.measure_matmul_peak(compute_dtype)
    log(f"measured matmul peak: {peak / 1e9:.1f} GFLOP/s ({compute_dtype})")

    def validate(params_, max_tokens: int) -> dict:
        toks = val_tokens if not max_tokens else val_tokens[: min(val_tokens.size, max_tokens + 1)]
        toks = toks[: ((toks.size - 1) // t.seq_len) * t.seq_len + 1]
        sums = evaluate_batches(eval_step, params_, padded_val_batches(toks, t.seq_len, t.val_batch_seqs))
        return {**sums, "loss": sums["nll_sum_nats"] / max(sums["tokens"], 1),
                "bpb": report.bpb(sums["nll_sum_nats"], sums["bytes"])}

    # ---- compile warm-up (untimed), then reset everything it touched
    t_compile = time.perf_counter()
    data0 = loader.state()
    for i in range(max(t.compile_warmup_steps, 1)):
        x, y = _stack_micro(loader, geo)
        params, opt_state, m = train_step(params, opt_state, x, y, jnp.float32(1.0),
                                          jnp.float32(optim.muon_momentum(cfg.optim, i)), None)
    jax.block_until_ready(m)
    validate(params, t.val_batch_seqs * t.seq_len)  # compiles the eval step
    _, params, opt_state = init_state(cfg, tx, compute_dtype)
    loader.restore(data0)
    log(f"compile warm-up: {time.perf_counter() - t_compile:.1f} s (untimed; state reset)")

    metrics_log = report.MetricsLog(out_dir / "metrics.jsonl")
    step, train_s, tokens = 0, 0.0, 0
    if resume:
        state, meta = checkpoint.restore(out_dir, {"params": params, "opt_state": opt_state},
                                         expect_model_hash=model_hash(cfg.model))
        params, opt_state = state["params"], state["opt_state"]
        step, train_s, tokens = meta["step"], meta["train_seconds"], meta["tokens"]
        loader.restore(meta["data"])
        log(f"resumed from step {step} ({train_s:.1f} s trained, data position {meta['data']})")

    def save(reason: str) -> None:
        meta = {"step": step, "train_seconds": train_s, "tokens": tokens, "data": loader.state(),
                "model_hash": model_hash(cfg.model), "model": to_dict(cfg)["model"], "reason": reason}
        path = checkpoint.save(out_dir, step, {"params": params, "opt_state": opt_state}, meta)
        log(f"checkpoint step {step} -> {path} ({reason})")

    stop_reason = None
    final_loss = math.nan
    start_step = step
    try:
        from tqdm.auto import tqdm
        bar = tqdm(total=round(t.budget_seconds), initial=min(round(train_s), round(t.budget_seconds)),
                   unit="s", desc="train", disable=None, leave=False)
    except ImportError:  # pragma: no cover
        bar = None
    with _Signals() as signals:
        t0 = time.perf_counter()
        pending = None
        while True:
            if signals.received or (stop_after_steps is not None and step - start_step >= stop_after_steps):
                stop_reason = stop_reason or f"signal {signals.received or 'test stop'}"
            last = stop_reason is not None or step >= t.max_steps
            if pending is not None:  # host metrics of the previous step (dispatch stays one step ahead)
                final_loss = _finish_step(pending, metrics_log, log, on_step, bar)
                pending = None
                if not math.isfinite(final_loss):
                    stop_reason = "non-finite loss"
                    break
            if step >= t.max_steps and stop_reason is None:
                stop_reason = "max_steps"
            if t.val_every_steps and step > start_step and step % t.val_every_steps == 0 and not last:
                train_s += time.perf_counter() - t0
                v = validate(params, t.val_max_tokens)
                metrics_log.log(kind="val", step=step, tokens=tokens, train_seconds=train_s, loss=v["loss"],
                                bpb=v["bpb"], val_tokens=v["tokens"])
                log(f"step {step} val loss {v['loss']:.4f} bpb {v['bpb']:.4f} ({v['tokens']:,} tokens)")
                t0 = time.perf_counter()
            if last:
                break
            elapsed = train_s + time.perf_counter() - t0
            scale = optim.lr_scale(cfg.optim, step, elapsed, t.budget_seconds, t.max_steps)
            mom = optim.muon_momentum(cfg.optim, step)
            x, y = _stack_micro(loader, geo)
            params, opt_state, m = train_step(params, opt_state, x, y, jnp.float32(scale), jnp.float32(mom), None)
            step += 1
            tokens += geo.seqs_per_step * t.seq_len
            now = train_s + time.perf_counter() - t0
            pending = dict(step=step, metrics=m, lr_scale=scale, momentum=mom, tokens=tokens, train_seconds=now)
            if now >= t.budget_seconds and stop_reason is None:
                stop_reason = "budget"
            if t.checkpoint_every_steps and step % t.checkpoint_every_steps == 0 and stop_reason is None:
                jax.block_until_ready(m)
                train_s = train_s + time.perf_counter() - t0
                save("periodic")
                t0 = time.perf_counter()
        train_s += time.perf_counter() - t0
    if bar is not None:
        bar.close()

    interrupted = stop_reason.startswith("signal")
    if stop_reason == "non-finite loss":
        log(f"STOP: non-finite training loss at step {step}; no checkpoint written over the last good one")
    else:
        save("interrupted" if interrupted else "final")
    summary = {
        "config_name": cfg.name, "config_hash": config_hash(cfg), "steps": step, "tokens": tokens,
        "train_seconds": train_s, "tokens_per_second": tokens / train_s if train_s > 0 else None,
        "matmul_peak_flops": peak, "flops_per_token": flops_per_token,
        "final_train_loss": final_loss, "stop_reason": stop_reason, "run_dir": str(out_dir),
    }
    if summary["tokens_per_second"]:
        summary["mfu"] = summary["tokens_per_second"] * flops_per_token / peak
    if not interrupted and stop_reason != "non-finite loss":
        v = validate(params, 0)
        summary.update(val_loss=v["loss"], val_bpb=v["bpb"], val_nll_sum_nats=v["nll_sum_nats"],
                       val_tokens=v["tokens"], val_bytes=v["bytes"])
        metrics_log.log(kind="val", step=step, tokens=tokens, train_seconds=train_s, loss=v["loss"], bpb=v["bpb"],
                        val_tokens=v["tokens"], final=True)
    metrics_log.close()
    report.write_json(out_dir / "summary.json", summary)
    table = report.format_table(report.summary_rows(summary))
    report.atomic_write_text(out_dir / "summary.txt", table + "\n")
    report.plot_run(report_rows(out_dir), out_dir / "curves.png")
    log("summary:\n" + table)
    return summary


def report_rows(out_dir: Path) -> list[dict]:
    import json

    with open(out_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def _finish_step(p: dict, metrics_log, log, on_step, bar) -> float:
    loss = float(p["metrics"]["loss"])
    gnorm = float(p["metrics"]["grad_norm"])
    row = dict(kind="train", step=p["step"], loss=loss, grad_norm=gnorm, lr_scale=p["lr_scale"],
               momentum=p["momentum"], tokens=p["tokens"], train_seconds=p["train_seconds"])
    metrics_log.log(**row)
    if on_step is not None:
        on_step(p["step"], row)
    if not math.isfinite(loss) or not math.isfinite(gnorm):
        log(f"non-finite values after step {p['step']}: loss={loss} grad_norm={gnorm} lr_scale={p['lr_scale']:.4g}")
        return math.nan
    if bar is not None:
        bar.n = min(round(p["train_seconds"]), bar.total)
        bar.set_postfix(step=p["step"], loss=f"{loss:.3f}", tok_s=f"{p['tokens'] / max(p['train_seconds'], 1e-9):,.0f}",
                        refresh=False)
        bar.refresh()
    return loss
