"""The time-budgeted training loop (README "Training").

Order of events, as the baseline: set up; untimed compile warm-up steps on real data, after which
parameters, optimizer state and data position are reset; then steps until the budget is spent (the
stop is decided after each step; validation and checkpointing pause the clock); final full-val bpb.
Before that, every input (config, data, the checkpoint a resume restores) is checked before the run
directory is created, locked (one process per directory) or written. SIGINT/SIGTERM, from the start,
finish the current step, save a resumable checkpoint and stop (before the first step: stop, nothing
to save). With several processes, process 0's clock decides the schedule and the stop, and every
process learns it each step."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from frontier_jax import checkpoint, host, ops, optim, report
from frontier_jax.config import Config, ConfigError, config_hash, model_hash, to_dict
from frontier_jax.data.stream import TrainLoader
from frontier_jax.ngram import runtime as ngram_runtime
from frontier_jax.model import GPT, count_params, model_flops_per_token, resolve_compute_dtype
from frontier_jax.parallel import DataParallel, make_data_parallel, split_batch
from frontier_jax.errors import BadInput, describe_os_error
from frontier_jax.run_support import (RunError, RunLog, Signals, claim_run_dir, finished_summary, load_run_data,
                                      padded_val_batches, step_batch, stopped_before_training, truncate_metrics)
from frontier_jax.steps import evaluate_batches, make_eval_step, make_train_step

__all__ = ["run", "init_state", "RunError"]


def _initializer(cfg: Config, tx, compute_dtype, dp: DataParallel):
    """(graphdef, init() -> (params, opt_state), shardings of that pair)."""
    orders = ngram_runtime.num_orders(cfg.ngram) if cfg.ngram.enabled else 0

    def make_model():
        return GPT(cfg.model, rngs=nnx.Rngs(cfg.train.seed), compute_dtype=compute_dtype,
                   num_bias_orders=orders, bias_buckets=cfg.ngram.confidence_buckets)

    graphdef, _ = nnx.split(nnx.eval_shape(make_model))

    def init():
        _, params = nnx.split(make_model())
        return params, tx.init(params)

    abstract = jax.eval_shape(init)
    shardings = (jax.tree_util.tree_map(lambda _: dp.replicated, abstract[0]), dp.state_shardings(abstract[1]))
    return graphdef, init, shardings


def init_state(cfg: Config, tx, compute_dtype, dp: DataParallel):
    """(graphdef, params, opt_state, shardings), created directly with their shardings (no host copy)."""
    graphdef, init, shardings = _initializer(cfg, tx, compute_dtype, dp)
    params, opt_state = jax.jit(init, out_shardings=shardings)()
    return graphdef, params, opt_state, shardings


def _restore(cfg: Config, tx, compute_dtype, dp: DataParallel, out_dir: Path, log):
    """(params, opt_state, meta) of the newest intact checkpoint, read straight into their shardings."""
    _, init, shardings = _initializer(cfg, tx, compute_dtype, dp)
    abstract = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                      jax.eval_shape(init), shardings)
    state, meta = checkpoint.restore(out_dir, {"params": abstract[0], "opt_state": abstract[1]},
                                     expect_model_hash=model_hash(cfg.model), log=log)
    return state["params"], state["opt_state"], meta


def run(cfg: Config, out_dir: Path, resume: bool = False, echo: bool = True, stop_after_steps: int | None = None,
        on_step=None) -> dict:
    """Train `cfg` into `out_dir` and return the summary dict.

    resume: continue from the newest intact checkpoint in `out_dir` (a finished run returns at once
    with stop_reason "already finished"). stop_after_steps (tests): behave as if a signal arrived
    after that many steps of this invocation. on_step(step, row) receives each finished step's host
    metrics. Every input is checked before the run directory is created, locked or written to.
    """
    log = RunLog(None, echo, enabled=jax.process_index() == 0)
    try:
        with Signals() as signals:  # from the start: a signal during start-up or warm-up stops cleanly
            return _run(cfg, Path(out_dir).absolute(), resume, log, signals, stop_after_steps, on_step)
    finally:
        log.close()


def _claim(out_dir: Path, resume: bool, dp: DataParallel):
    """Process 0 creates and locks the run directory; every process learns whether that worked."""
    lock, created, err = None, False, None
    if dp.is_main:
        try:
            lock, created = claim_run_dir(out_dir, resume)
        except RunError as e:
            err = e
    if dp.process_count > 1:
        ok = multihost_utils.process_allgather(np.array([err is None]))
        if not ok.all() and err is None:
            if lock:
                lock.release()
            raise RunError(f"{out_dir}: process 0 could not claim the run directory")
    if err is not None:
        raise err
    return lock, created


def _run(cfg: Config, out_dir: Path, resume: bool, log: RunLog, signals, stop_after_steps, on_step) -> dict:
    t = cfg.train
    dp = make_data_parallel(cfg.parallel.num_devices, cfg.parallel.zero1)
    seqs_per_step = t.tokens_per_step // t.seq_len
    global_micro, accum = split_batch(seqs_per_step, t.micro_batch_seqs, dp.num_devices, dp.process_count)
    if t.val_batch_seqs % dp.num_devices:
        raise ConfigError(f"train.val_batch_seqs={t.val_batch_seqs} is not a multiple of the {dp.num_devices} devices")
    kernel_rows = ops.configure(t.kernels, unused=() if cfg.optim.fused else ops.FUSED_OPTIMIZER_OPS)
    env = {**report.environment(), "host_allocator": host.tune_allocator(t.allocator)}
    compute_dtype = resolve_compute_dtype(cfg.model)
    ns_dtype = optim.resolve_ns_dtype(cfg.optim)
    tx = optim.build_optimizer(cfg.optim)
    # ---- data and tokenizer (all checks before the run directory is touched)
    data = load_run_data(cfg)
    if signals.received:
        return stopped_before_training(out_dir, resume, signals, None, False)
    lock, created = _claim(out_dir, resume, dp)
    try:
        restored = None
        if resume:  # the checkpoint is read (and another model's refused) before anything is written
            restored = _restore(cfg, tx, compute_dtype, dp, out_dir, log)
            meta = restored[2]
            if meta["step"] >= t.max_steps or meta["train_seconds"] >= t.budget_seconds:
                return finished_summary(out_dir, meta, t)
        try:
            return _train(cfg, out_dir, resume, log, signals, stop_after_steps, on_step, dp, data, restored,
                          kernel_rows, env, compute_dtype, ns_dtype, tx, global_micro, accum, created)
        except BadInput:
            if created and not (out_dir / "metrics.jsonl").exists():  # nothing trained: leave no partial run
                shutil.rmtree(out_dir, ignore_errors=True)
            raise
    finally:
        if lock:
            lock.release()


def _train(cfg, out_dir, resume, log, signals, stop_after_steps, on_step, dp, data, restored, kernel_rows, env,
           compute_dtype, ns_dtype, tx, global_micro, accum, created) -> dict:
    t = cfg.train
    main = dp.is_main
    seqs_per_step = t.tokens_per_step // t.seq_len
    tokenizer, tables, train_files, val_tokens = data.tokenizer, data.tables, data.train_files, data.val_tokens
    log.attach(out_dir / "train.log")
    if main:
        report.write_json(out_dir / "config.json", to_dict(cfg))
        report.write_json(out_dir / "env.json", {**env, "compute_dtype": str(compute_dtype),
                                                "muon_ns_dtype": ns_dtype})
        report.write_json(out_dir / "kernels.json", {"dispatch": f"per device, {dp.num_devices} device(s)",
                                                     "ops": [dataclasses.asdict(r) for r in kernel_rows]})
    log(f"frontier_jax run {out_dir} | config {cfg.name} ({config_hash(cfg)}) | git {env['git']}")
    log(f"backend {env['backend']} | {dp.describe()} | allocator {host.describe(env['host_allocator'])}")
    log(f"compute dtype {compute_dtype} (model.compute_dtype={cfg.model.compute_dtype}) | Muon NS dtype "
        f"{ns_dtype} (optim.muon_ns_dtype={cfg.optim.muon_ns_dtype})")
    log(ops.format_kernel_table(kernel_rows) + "\n(each op dispatched per device on its shard of the batch)")
    ngram = None
    if cfg.ngram.enabled:
        ngram = ngram_runtime.NgramRuntime(cfg.ngram, train_files, out_dir, log, dp.replicated)
        train_files = ngram.trainer_files
    loader = TrainLoader(train_files, t.seq_len, dp.process_index, dp.process_count)
    log(f"data {cfg.data.data_dir}: {len(train_files)} train shards, {val_tokens.size - 1:,} val targets | "
        f"tokenizer {tokenizer.path}")
    log(f"data provenance: {data.provenance}")
    log(f"step = {t.tokens_per_step:,} tokens = {accum} micro-batch(es) of {global_micro} x {t.seq_len}")

    # ---- model, optimizer, compiled steps
    graphdef, params, opt_state, shardings = init_state(cfg, tx, compute_dtype, dp)
    log(f"model: {count_params(nnx.merge(graphdef, params)):,} parameters, hash {model_hash(cfg.model)}")
    bias_fn = ngram_runtime.bias_fn if ngram else None
    aux = lambda: ngram.tables if ngram else None  # noqa: E731 - current n-gram tables (or nothing)
    train_step = make_train_step(graphdef, tx, bias_fn, shardings=shardings, replicated=dp.replicated)
    eval_step = make_eval_step(graphdef, tables, bias_fn)
    flops_per_token = model_flops_per_token(cfg.model, t.seq_len)
    peak = report.measure_matmul_peak(compute_dtype) * dp.num_devices
    log(f"measured matmul peak: {peak / 1e9:.1f} GFLOP/s ({compute_dtype}, all devices)")

    def next_batch():
        x, y = step_batch(loader, seqs_per_step, accum, t.seq_len)
        return dp.put_batch(x, 1), dp.put_batch(y, 1)

    def validate(params_, max_tokens: int) -> dict:
        toks = val_tokens if not max_tokens else val_tokens[: min(val_tokens.size, max_tokens + 1)]
        toks = toks[: ((toks.size - 1) // t.seq_len) * t.seq_len + 1]
        batches = ((dp.put_batch(x), dp.put_batch(y), dp.put_batch(m)) for x, y, m in
                   padded_val_batches(toks, t.seq_len, t.val_batch_seqs, dp.process_index, dp.process_count))
        sums = evaluate_batches(eval_step, params_, batches, aux())
        return {**sums, "loss": sums["nll_sum_nats"] / max(sums["tokens"], 1),
                "bpb": report.bpb(sums["nll_sum_nats"], sums["bytes"])}

    def scalars(*values):
        return tuple(jax.device_put(jnp.float32(v), dp.replicated) for v in values)

    def stop_requested() -> bool:
        return agree(signals.received is not None, 0.0)[0]

    def agree(local_stop: bool, elapsed: float) -> tuple[bool, float]:
        """Multi-process: any process's signal stops all; process 0's clock is everyone's clock."""
        if dp.process_count == 1:
            return local_stop, elapsed
        g = multihost_utils.process_allgather(np.array([float(local_stop), elapsed]))
        return bool(g[:, 0].max()), float(g[0, 1])

    # ---- compile warm-up (untimed), then reset everything it touched; a signal stops it between steps
    resumed_step = restored[2]["step"] if restored else None
    log(f"compile warm-up: {max(t.compile_warmup_steps, 1)} step(s) and the eval step (untimed)")
    t_compile = time.perf_counter()
    data0 = loader.state()
    for i in range(max(t.compile_warmup_steps, 1)):
        params, opt_state, m = train_step(params, opt_state, *next_batch(),
                                          *scalars(1.0, optim.muon_momentum(cfg.optim, i)), aux())
        jax.block_until_ready(m)
        if stop_requested():
            return stopped_before_training(out_dir, resume, signals, resumed_step, created)
    validate(params, t.val_batch_seqs * t.seq_len)  # compiles the eval step
    if stop_requested():
        return stopped_before_training(out_dir, resume, signals, resumed_step, created)
    if restored:
        params, opt_state, meta = restored
        restored = None
    else:
        _, params, opt_state, _ = init_state(cfg, tx, compute_dtype, dp)
    loader.restore(data0)
    log(f"compile warm-up: {time.perf_counter() - t_compile:.1f} s (untimed; state reset)")

    step, train_s, tokens = 0, 0.0, 0
    if resume:
        step, train_s, tokens = meta["step"], meta["train_seconds"], meta["tokens"]
        loader.restore(meta["data"])
        dropped = truncate_metrics(out_dir / "metrics.jsonl", step) if main else 0
        log(f"resumed from step {step} ({train_s:.1f} s trained, data position {meta['data']})"
            + (f"; dropped {dropped} metrics row(s) logged after that step" if dropped else ""))
    metrics_log = report.MetricsLog(out_dir / "metrics.jsonl", enabled=main)
    signals.stopping = "stopping after this step; checkpoint follows"

    def save(reason: str) -> None:
        meta = {"step": step, "train_seconds": train_s, "tokens": tokens, "data": loader.state(),
                "model_hash": model_hash(cfg.model), "model": to_dict(cfg)["model"], "reason": reason}
        path = checkpoint.save(out_dir, step, {"params": params, "opt_state": opt_state}, meta)
        log(f"checkpoint step {step} -> {path} ({reason})" if path else
            f"checkpoint step {step}: already saved ({reason} save not needed)")

    def diverged(at_step: int) -> str:
        """The checkpoint of the step before a non-finite loss holds the parameters that produced it:
        remove it (if this invocation wrote it), so the last checkpoint kept is the last finite one."""
        bad = at_step - 1
        if bad > start_step and bad in checkpoint.steps(out_dir):  # every process: orbax coordinates them
            checkpoint.discard(out_dir, bad)
            log(f"removed checkpoint step {bad}: its parameters gave the non-finite loss of step {at_step}")
        return "non-finite loss"

    stop_reason, final_loss, start_step, pending, save_error = None, math.nan, step, None, None
    if ngram:  # starts with the timed budget: the builder's time counts against it
        ngram.start()
    try:
        bar = _progress_bar(t.budget_seconds, train_s, main)
        t0 = time.perf_counter()
        while True:
            if pending is not None:  # host metrics of the previous step (dispatch stays one step ahead)
                final_loss = _finish_step(pending, metrics_log, log, on_step, bar)
                if not math.isfinite(final_loss):
                    stop_reason = diverged(pending["step"])
                    break
                pending = None
            local_stop = signals.received is not None or (
                stop_after_steps is not None and step - start_step >= stop_after_steps)
            stop_now, elapsed = agree(local_stop, train_s + time.perf_counter() - t0)
            if stop_now and stop_reason is None:
                stop_reason = f"signal {signals.received or 'stop requested'}"
            if step >= t.max_steps and stop_reason is None:
                stop_reason = "max_steps"
            if elapsed >= t.budget_seconds and stop_reason is None:
                stop_reason = "budget"
            if stop_reason is not None:
                break
            if t.val_every_steps and step > start_step and step % t.val_every_steps == 0:
                train_s, v = elapsed, validate(params, t.val_max_tokens)
                metrics_log.log(kind="val", step=step, tokens=tokens, train_seconds=train_s, loss=v["loss"],
                                bpb=v["bpb"], val_tokens=v["tokens"])
                log(f"step {step} val loss {v['loss']:.4f} bpb {v['bpb']:.4f} ({v['tokens']:,} tokens)")
                t0 = time.perf_counter()
                elapsed = train_s
            scale = optim.lr_scale(cfg.optim, step, elapsed, t.budget_seconds, t.max_steps)
            mom = optim.muon_momentum(cfg.optim, step)
            if ngram:
                ngram.poll(step)
            params, opt_state, m = train_step(params, opt_state, *next_batch(), *scalars(scale, mom), aux())
            step += 1
            tokens += t.tokens_per_step
            pending = dict(step=step, metrics=m, lr_scale=scale, momentum=mom, tokens=tokens,
                           train_seconds=train_s + time.perf_counter() - t0)
            if t.checkpoint_every_steps and step % t.checkpoint_every_steps == 0:
                jax.block_until_ready(m)
                train_s += time.perf_counter() - t0
                final_loss = _finish_step(pending, metrics_log, log, on_step, bar)
                t0 = time.perf_counter()
                if not math.isfinite(final_loss):  # never save a checkpoint of a diverged step
                    stop_reason = diverged(step)
                    break
                pending = None
                try:
                    save("periodic")
                except checkpoint.CheckpointError as e:
                    save_error, stop_reason = e, "checkpoint not written"
                    break
                t0 = time.perf_counter()
        train_s += time.perf_counter() - t0
        if bar is not None:
            bar.close()
        if ngram:  # the final evaluation uses the newest tables built within the budget
            ngram.finish(step)  # stops the builder; the newest snapshot it published is used
        return _finish_run(cfg, out_dir, log, metrics_log, stop_reason, step, tokens, train_s, final_loss,
                           peak, flops_per_token, save, lambda: validate(params, 0), main, save_error)
    finally:
        if ngram:
            ngram.stop()


def _finish_run(cfg, out_dir, log, metrics_log, stop_reason, step, tokens, train_s, final_loss, peak,
                flops_per_token, save, full_validation, main, save_error=None) -> dict:
    """Final (or interrupted) checkpoint, final validation, summary. A checkpoint that cannot be written
    (disk full) still gets a summary, if that can be written, and is then raised (one line, exit 2)."""
    interrupted = stop_reason.startswith("signal")
    if stop_reason == "non-finite loss":
        log(f"STOP: non-finite training loss at step {step}; the last checkpoint kept is the last finite one")
    elif save_error is None:
        try:
            save("interrupted" if interrupted else "final")
        except checkpoint.CheckpointError as e:
            save_error, stop_reason = e, "checkpoint not written"
    summary = {
        "config_name": cfg.name, "config_hash": config_hash(cfg), "steps": step, "tokens": tokens,
        "train_seconds": train_s, "tokens_per_second": tokens / train_s if train_s > 0 else None,
        "matmul_peak_flops": peak, "flops_per_token": flops_per_token,
        "final_train_loss": final_loss, "stop_reason": stop_reason, "run_dir": str(out_dir),
        "checkpoint_step": checkpoint.latest_step(out_dir),
    }
    if save_error is not None:
        summary["error"] = str(save_error)
        log(f"STOP: {save_error}")
    if summary["tokens_per_second"]:
        summary["mfu"] = summary["tokens_per_second"] * flops_per_token / peak
    if not interrupted and stop_reason not in ("non-finite loss", "checkpoint not written"):
        v = full_validation()
        summary.update(val_loss=v["loss"], val_bpb=v["bpb"], val_nll_sum_nats=v["nll_sum_nats"],
                       val_tokens=v["tokens"], val_bytes=v["bytes"])
        metrics_log.log(kind="val", step=step, tokens=tokens, train_seconds=train_s, loss=v["loss"], bpb=v["bpb"],
                        val_tokens=v["tokens"], final=True)
    metrics_log.close()
    table = report.format_table(report.summary_rows(summary))
    if main:
        try:
            report.write_json(out_dir / "summary.json", summary)
            report.atomic_write_text(out_dir / "summary.txt", table + "\n")
            with open(out_dir / "metrics.jsonl") as f:
                report.plot_run([json.loads(line) for line in f if line.strip()], out_dir / "curves.png")
        except OSError as e:
            if save_error is None:
                raise
            log(f"summary not written either: {describe_os_error(e)}")
    log("summary:\n" + table)
    if save_error is not None:
        raise save_error
    return summary


def _progress_bar(budget_s: float, train_s: float, main: bool):
    if not main:
        return None
    from tqdm.auto import tqdm

    total = round(budget_s)
    return tqdm(total=total, initial=min(round(train_s), total), unit="s", desc="train", disable=None, leave=False)


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
        bar.set_postfix(step=p["step"], loss=f"{loss:.3f}",
                        tok_s=f"{p['tokens'] / max(p['train_seconds'], 1e-9):,.0f}", refresh=False)
        bar.refresh()
    return loss
