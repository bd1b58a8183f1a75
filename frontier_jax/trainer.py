"""The JAX trainer: the trainer interface (frontier_jax.run.interface) for a Flax NNX model on a device mesh.

`frontier_jax.run.driver.run_budgeted` decides the order of events (untimed compile warm-up then reset, the timed
loop and its stop order, validation cadence, checkpoints, the final validation, the summary). This
module does what is JAX's: every input (config, data, the checkpoint a resume restores) is checked
before the run directory is created, locked (one process per directory, `rundir.claim_run_dir`) or
written; the state is created with its shardings; the jitted train and eval steps (dispatched one
step ahead: a step's host metrics are read at the next iteration); snapshot/restore for the warm-up
reset; orbax checkpoints and resume; the multi-process agreement (process 0's clock decides the
schedule and the stop, any process's signal stops all at the same step). The start-up lifecycle is
`frontier_jax.run.startup.start_run`: SIGINT/SIGTERM are handled from the start, and before the first step a
signal stops with nothing to save. The n-gram runtime is a
run hook (`ngram_runtime.for_config`: a null hook when it is off), as are the progress lines
(`frontier_jax.run.progress`) and `on_step`. After the final validation, the artifact's round trip
(`JaxTrainer.roundtrip`, `frontier_jax.interop.artifact`: eval.artifact) and the final pipeline's records
(`final_records`, `record_final`: a resume finishes a run's final steps, `frontier_jax.run.final`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from frontier_jax import checkpoint, ops, optim, parallel
from frontier_jax.interop import artifact, state_dict
from frontier_jax.policies import dtypes as dtype_policy
from frontier_jax.policies import sizing
from frontier_jax.policies.geometry import split_batch, step_batch
from frontier_jax.policies.scoring import val_window_tokens
from frontier_jax.run import driver, host, progress, rundir, startup
from frontier_jax.config import Config, ConfigError, config_hash, model_hash, to_dict
from frontier_jax.errors import BadInput
from frontier_jax.contest import codebytes
from frontier_jax.data.dataset import Dataset, load_for_config
from frontier_jax.data.stream import TrainLoader, val_batches
from frontier_jax.model import build, count_params
from frontier_jax.neuron import memory, program
from frontier_jax.ngram import runtime as ngram_runtime
from frontier_jax.parallel import DataParallel, make_data_parallel
from frontier_jax.run.rundir import RunError, RunLog, claim_run_dir, truncate_metrics
from frontier_jax.steps import evaluate_batches, make_eval_step, make_train_step, q_gains
from frontier_jax.run.interface import RunHook, RunState, Trainer

__all__ = ["run", "init_state", "RunError"]


def _initializer(cfg: Config, tx, compute_dtype, dp: DataParallel):
    """(graphdef, init() -> (params, opt_state), shardings of that pair)."""

    def make_model():
        return build(cfg, compute_dtype)

    graphdef, _ = nnx.split(nnx.eval_shape(make_model))

    def init():
        _, params = nnx.split(make_model())
        return params, tx.init(params)

    abstract = jax.eval_shape(init)
    shardings = (jax.tree_util.tree_map(lambda _: dp.replicated, abstract[0]), dp.state_shardings(abstract[1]))
    return graphdef, init, shardings


def init_state(cfg: Config, tx, compute_dtype, dp: DataParallel):
    """(graphdef, params, opt_state, shardings): initialised on the host CPU (the same values on every
    platform; AWS: run RNG initialisation on the CPU backend, Threefry "is not completely supported" on
    Neuron, aws-neuron-sdk frameworks/jax/setup/jax-neuronx-known-issues.rst), then placed with the run's
    shardings, each process filling its own devices' shards."""
    graphdef, init, shardings = _initializer(cfg, tx, compute_dtype, dp)
    with jax.default_device(_host_cpu()):
        host_state = jax.tree_util.tree_map(np.asarray, jax.jit(init)())
    params, opt_state = jax.tree_util.tree_map(
        lambda x, s: jax.make_array_from_callback(x.shape, s, lambda idx: x[idx]), host_state, shardings)
    return graphdef, params, opt_state, shardings


def _host_cpu():
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError as e:  # JAX_PLATFORMS without cpu
        raise ConfigError(f"the host CPU backend is not available to JAX ({e}); it initialises the model: "
                          "allow it, e.g. JAX_PLATFORMS=neuron,cpu") from e


def _restore(cfg: Config, tx, compute_dtype, dp: DataParallel, out_dir: Path, log, skipped: list):
    """(params, opt_state, meta) of the newest intact checkpoint, read straight into their shardings; the
    unreadable newer steps it skipped are appended to `skipped`."""
    _, init, shardings = _initializer(cfg, tx, compute_dtype, dp)
    abstract = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                      jax.eval_shape(init), shardings)
    state, meta = checkpoint.restore(out_dir, {"params": abstract[0], "opt_state": abstract[1]},
                                     expect_model_hash=model_hash(cfg), log=log, skipped_steps=skipped)
    return state["params"], state["opt_state"], meta


def run(cfg: Config, out_dir: Path, resume: bool = False, echo: bool = True, stop_after_steps: int | None = None,
        on_step=None) -> dict:
    """Train `cfg` into `out_dir` and return the summary dict.

    resume: continue from the newest intact checkpoint in `out_dir` (a finished run, one whose summary says
    its final steps completed, returns at once with stop_reason "already finished"; one at its last step whose
    final steps did not complete runs only those, `frontier_jax.run.final`). stop_after_steps (tests): behave as if a signal arrived
    after that many steps of this invocation. on_step(step, row) receives each finished step's host
    metrics. Every input is checked before the run directory is created, locked or written to.
    """
    out_dir = Path(out_dir).absolute()
    log = RunLog(None, echo, enabled=jax.process_index() == 0)

    def body(s: Setup, start: startup.Start) -> dict:
        restored, skipped, t, at_end = None, [], cfg.train, False
        if resume:  # the checkpoint is read (and another model's refused) before anything is written
            restored = _restore(cfg, s.tx, s.dtypes.compute, s.dp, out_dir, log, skipped)
            meta = restored[2]
            start.resumed_step = meta["step"]
            at_end = meta["step"] >= t.max_steps or meta["train_seconds"] >= t.budget_seconds
            if at_end and rundir.finished(out_dir):
                return startup.finished_summary(out_dir, meta, t)
            start.check()
        trainer = JaxTrainer(cfg, out_dir, log, s, restored, skipped, check=start.check)
        # a run at its end whose final steps did not complete (a signal, a full disk, a kill): only those run
        return trainer.run(start.signals, stop_after_steps, on_step, finish_only=resume and at_end)

    # signals from the start (a signal during start-up or warm-up stops cleanly), then the checks, the claim
    return startup.start_run(out_dir, resume, log, lambda check: _setup(cfg, check), body,
                             claim=lambda s: _claim(out_dir, resume, s.dp))


def _claim(out_dir: Path, resume: bool, dp: DataParallel):
    """Process 0 creates and locks the run directory; every process learns whether that worked."""
    lock, created, err = None, False, None
    if dp.is_main:
        try:
            lock, created = claim_run_dir(out_dir, resume)
        except BadInput as e:  # RunError, or a lock file that is a symlink (data.files.UnsafeFile)
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


@dataclasses.dataclass
class Setup:
    """What the set-up checked and built before the run directory is claimed."""

    dp: DataParallel
    global_micro: int
    accum: int
    fit: memory.Fit  # the micro-batch per device and the step's estimated peak against a device's memory
    kernel_rows: list
    program_report: str | None  # the Neuron program check's report for the log (None: not on Neuron)
    env: dict
    dtypes: dtype_policy.Dtypes  # resolved once, for every use below
    tx: object  # the optimizer, built once (the Neuron program check traces this one)
    data: Dataset


def _setup(cfg: Config, check=lambda: None) -> Setup:
    """Every check before the run directory is claimed; `check` (startup.Start.check) between the phases, so a
    signal stops the set-up there. The model's size against the host's memory comes first, before anything
    is allocated (policies.sizing.check_host_memory)."""
    t = cfg.train
    sizing.check_host_memory(cfg)
    dp = make_data_parallel(cfg.parallel.num_devices, cfg.parallel.zero1)
    if t.micro_batch_seqs:  # a set micro-batch the devices cannot split fails before anything is traced
        split_batch(t.tokens_per_step // t.seq_len, t.micro_batch_seqs, dp.num_devices, dp.process_count)
    if t.val_batch_seqs % dp.num_devices:
        raise ConfigError(f"train.val_batch_seqs={t.val_batch_seqs} is not a multiple of the {dp.num_devices} devices")
    if cfg.eval.batch_seqs % dp.num_devices:
        raise ConfigError(f"eval.batch_seqs={cfg.eval.batch_seqs} is not a multiple of the {dp.num_devices} devices")
    dtypes = dtype_policy.resolve(cfg, jax.default_backend())
    tx = optim.build_optimizer(cfg.optim, dtypes.muon_ns)
    kernel_rows = ops.configure(t.kernels, unused=ops.unused_ops(cfg.optim.fused), model=cfg.model)
    check()
    fit = _fit_memory(cfg, dp, dtypes, tx)  # the step's peak memory against the devices', before any allocation
    global_micro, accum = split_batch(t.tokens_per_step // t.seq_len, fit.micro_seqs, dp.num_devices,
                                      dp.process_count)
    check()
    program_report = _neuron_program_check(cfg, dp, dtypes, tx, fit.micro_seqs)
    check()
    env = {**parallel.environment(), "host_allocator": host.tune_allocator(t.allocator)}
    return Setup(dp, global_micro, accum, fit, kernel_rows, program_report, env, dtypes, tx,
                 load_for_config(cfg))  # the data: all checks before the run directory is touched


def _fit_memory(cfg: Config, dp: DataParallel, dtypes: dtype_policy.Dtypes, tx) -> memory.Fit:
    """The train and eval steps' estimated peak per device (frontier_jax.neuron.memory, a walk of the traced
    steps) against what a device has: the CPU devices of this process share its available RAM. A set
    train.micro_batch_seqs that cannot fit is refused in one line (exit 2); 0 (auto) takes the largest that fits."""
    backend = jax.default_backend()
    limit = memory.device_memory(backend, dp.num_devices // dp.process_count, jax.local_devices()[0])
    return program.fit_memory(cfg, dp.num_devices, dtypes, tx, limit)


def _neuron_program_check(cfg: Config, dp: DataParallel, dtypes: dtype_policy.Dtypes, tx,
                          micro_seqs: int) -> str | None:
    """On Neuron, the trainer's programs (in its dtypes, with its optimizer, at its micro-batch) against AWS's
    documented JAX limits (frontier_jax.neuron.check): the report for the run log; strict mode refuses a failing
    program in one line naming the rule and the op."""
    if jax.default_backend() != "neuron":
        return None
    from frontier_jax.neuron import check as neuron_check

    at_fit = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch_seqs=micro_seqs))
    findings = neuron_check.check_config(at_fit, dp.num_devices, dtypes, tx)
    if findings and cfg.train.kernels == "strict":
        raise ops.KernelUnavailableError(neuron_check.strict_error(findings))
    return neuron_check.format_report(cfg.name, dp.num_devices, findings, ops.switch_fallbacks(cfg.model))


class JaxTrainer(Trainer):
    """The run directory's files and the trainer interface (frontier_jax.run.interface) for one invocation of `run`."""

    checkpoints = True

    def __init__(self, cfg: Config, out_dir: Path, log: RunLog, s: Setup, restored, skipped=(), check=lambda: None):
        t, dp = cfg.train, s.dp
        self.cfg, self.out_dir, self.log, self.dp, self.tx = cfg, out_dir, log, dp, s.tx
        self.compute_dtype = s.dtypes.compute
        self.restored, self.meta = restored, restored[2] if restored else None
        self.saved_step: int | None = None
        self.setup, self.skipped = s, list(skipped)
        self.seqs_per_step, self.accum, self.metrics_log = t.tokens_per_step // t.seq_len, s.accum, None
        log.attach(out_dir / rundir.LOG)
        env = s.env
        self.env_backend = env["backend"]
        log(startup.run_line("frontier_jax", out_dir, cfg, env["git"]))
        log(f"backend {env['backend']} | {dp.describe()} | allocator {host.describe(env['host_allocator'])}")
        log(f"compute dtype {s.dtypes.compute} (model.compute_dtype={cfg.model.compute_dtype}) | Muon NS dtype "
            f"{s.dtypes.muon_ns} (optim.muon_ns_dtype={cfg.optim.muon_ns_dtype})")
        table = ops.run_log_table(s.kernel_rows, env["backend"])
        log(table if table.count("\n") == 0 else table + "\n(every kernel-backed op runs per device on its shard of "
            "the batch, inside jax.shard_map)")
        log(s.fit.line())
        if s.program_report is not None:
            log(s.program_report)
        data = s.data
        self.val_tokens = data.val_tokens
        self.ngram = ngram_runtime.for_config(cfg.ngram, data.train_files, out_dir, log, dp.replicated)
        self.loader = TrainLoader(self.ngram.trainer_files, t.seq_len, dp.process_index, dp.process_count)
        check()  # a signal by now: stop before the model is built (startup.Start.check)

        # ---- model, optimizer, compiled steps
        graphdef, self.params, self.opt_state, _ = init_state(cfg, s.tx, s.dtypes.compute, dp)
        self.graphdef, self._ttt_steps = graphdef, None
        check()
        specs = dp.state_specs(self.opt_state)
        self.late_qat = cfg.optim.late_qat_threshold > 0  # the step takes the late-QAT flag (a traced bool)
        make_train = lambda exact: make_train_step(graphdef, s.tx, self.ngram.bias_fn, mesh=dp.mesh, state_specs=specs,
                                                   head_dim=cfg.model.head_dim, attention_exact=exact,
                                                   late_qat=self.late_qat)
        make_eval = lambda exact: make_eval_step(graphdef, data.tables, self.ngram.bias_fn, mesh=dp.mesh,
                                                 attention_exact=exact)
        self._steps = _AttentionVariants(make_train, make_eval, ops.attention_variants_differ(), t.seq_len, log)
        self._steps.observe(_score_bound(self.params, cfg.model.head_dim))
        self.flops_per_token = cfg.model.flops_per_token(t.seq_len)
        self.peak_info = parallel.matmul_peak(s.dtypes.compute, dp.num_devices) if t.measure_peak else {}
        self.peak = self.peak_info.get("matmul_peak_flops")
        check()
        for line in startup.start_lines(cfg, data, len(self.ngram.trainer_files), s.accum, s.global_micro,
                                        count_params(nnx.merge(graphdef, self.params)), self.peak_info, "all devices"):
            log(line)

    def run(self, signals, stop_after_steps: int | None, on_step, finish_only: bool = False) -> dict:
        cfg, dp = self.cfg, self.dp
        self.signals = signals
        self._hooks = [progress.Progress(self.log, driver.Policy.from_config(cfg),
                                         progress.train_tokens(self.ngram.trainer_files), cfg.train, dp.is_main),
                       self.ngram]  # the n-gram runtime starts with the timed budget: its builder's time counts
        if on_step is not None:
            self._hooks.append(OnStep(on_step))
        base = {"config_name": cfg.name, "config_hash": config_hash(cfg), "rules_profile": cfg.rules.profile,
                **self.peak_info,
                "matmul_peak_flops": self.peak, "flops_per_token": self.flops_per_token, "run_dir": str(self.out_dir)}
        try:
            return driver.run_budgeted(driver.Policy.from_config(cfg, stop_after_steps), self, base, finish_only)
        finally:
            if self.metrics_log is not None:
                self.metrics_log.close()

    # ---- the trainer interface (frontier_jax.run.interface.Trainer)

    def run_hooks(self) -> list[RunHook]:
        return self._hooks

    def snapshot(self) -> dict:
        """The data position before the warm-up (`restore` re-creates or restores the parameters)."""
        return self.loader.state()

    def train_step(self, lr_scale: float, momentum: float, qat: bool = False):
        x, y = step_batch(self.loader, self.seqs_per_step, self.accum, self.cfg.train.seq_len)
        lr, mom = (jax.device_put(jnp.float32(v), self.dp.replicated) for v in (lr_scale, momentum))
        flag = (jax.device_put(jnp.bool_(qat), self.dp.replicated),) if self.late_qat else ()
        self.params, self.opt_state, m = self._steps.train()(self.params, self.opt_state, self.dp.put_batch(x, 1),
                                                             self.dp.put_batch(y, 1), lr, mom, self.ngram.tables,
                                                             *flag)
        return m

    def read_metrics(self, m) -> tuple[float, float]:
        """(loss, grad_norm); the step's score bound (its updated gains) picks the next step's attention forward."""
        self._steps.observe(float(m["score_bound"]))
        return float(m["loss"]), float(m["grad_norm"])

    def eval_sums(self, max_tokens: int, seq_len: int | None = None, stride: int | None = None) -> dict:
        """Evaluation sums over non-overlapping windows of `seq_len` (default train.seq_len), or sliding ones at
        `stride` (eval.batch_seqs windows per batch) that score every target once."""
        t, dp = self.cfg.train, self.dp
        T, batch = seq_len or t.seq_len, self._eval_rows(stride)
        # sliding windows cover the whole split (cut to whole windows of the longer length, Config.val_seq_len)
        toks = self.val_tokens if stride and not max_tokens else val_window_tokens(self.val_tokens, max_tokens, T)
        batches = ((dp.put_batch(x), dp.put_batch(y), dp.put_batch(m)) for x, y, m in
                   val_batches(toks, T, batch, dp.process_index, dp.process_count, stride=stride))
        return evaluate_batches(self._steps.eval(T), self.params, batches, self.ngram.tables)

    def _eval_rows(self, stride: int | None) -> int:
        """Windows per eval batch: eval.batch_seqs for sliding windows (0: train.val_batch_seqs), else the latter."""
        t = self.cfg.train
        return (self.cfg.eval.batch_seqs or t.val_batch_seqs) if stride else t.val_batch_seqs

    def warm_up_programs(self, evals: list[dict], check) -> int:
        """The warm-up's other programs (`_AttentionVariants.warm_up`): a train step with every qk_attention forward
        the run can switch to, and one batch of every eval shape of `evals` (eval_sums' geometries) with every
        forward possible at its length, so that neither a switch nor the final pipeline's windows compile later
        (the warm-up resets the state afterwards), and with ttt.enabled the test-time training's scoring and SGD
        steps (`ttt.warm_up`); `check` after each. Logs the programs; returns how many."""
        t, windows = self.cfg.train, {}
        for g in evals:
            T = g.get("seq_len") or t.seq_len
            windows.setdefault(f"{self._eval_rows(g.get('stride'))}x{T}", (T, g))
        names = self._steps.warm_up(lambda: jax.block_until_ready(self.train_step(1.0, 0.0)),
                                    lambda window: self.eval_sums(windows[window][0], **windows[window][1]),
                                    [(T, window) for window, (T, _) in windows.items()], check)
        if self.cfg.ttt.enabled:  # the final pipeline's test-time training (frontier_jax.ttt)
            from frontier_jax import ttt

            steps, kw = self._ttt()
            names += ttt.warm_up(self.params, self.val_tokens.shape[0], self.cfg, *steps, check=check, **kw)
        self.log(f"compile warm-up: {len(names)} programs: {', '.join(names)}")
        return len(names)

    def restore(self, data_state: dict) -> None:
        """Undo the warm-up: the restored (resume) or fresh parameters and optimizer state, the data position."""
        if self.restored:
            self.params, self.opt_state, _ = self.restored
            self.restored = None
        else:
            _, self.params, self.opt_state, _ = init_state(self.cfg, self.tx, self.compute_dtype, self.dp)
        self._steps.observe(_score_bound(self.params, self.cfg.model.head_dim))
        self.loader.restore(data_state)

    def _write_run_files(self) -> None:
        """config.json, env.json, kernels.json: written once the run is certain to start (after the warm-up
        and the resume position), so a failed or interrupted start leaves a run's files as they were."""
        s = self.setup
        if self.dp.is_main:
            rundir.write_json(self.out_dir / rundir.CONFIG, to_dict(self.cfg))
            rundir.write_json(self.out_dir / rundir.ENV, {**s.env, "compute_dtype": s.dtypes.compute,
                                                          "muon_ns_dtype": s.dtypes.muon_ns})
            rundir.write_json(self.out_dir / rundir.KERNELS, {"dispatch": f"per device, {self.dp.num_devices} device(s)",
                                                              "ops": [dataclasses.asdict(r) for r in s.kernel_rows]})

    def resume(self) -> RunState | None:
        """After the warm-up: the resumed checkpoint's counters (metrics.jsonl cut back to its step), or
        None; then the run's files are written (config.json etc.), the unreadable checkpoints restore
        skipped are moved aside, and metrics.jsonl is opened, as the run's first timed file."""
        meta, state = self.meta, None
        if meta is not None:
            step = meta["step"]
            self.loader.restore(meta["data"])  # a --data that does not fit the position fails here, unwritten
            if self.skipped and self.dp.is_main:
                for moved in checkpoint.set_aside(self.out_dir, self.skipped):
                    self.log(f"moved the unreadable checkpoint {moved.name} aside to {moved} (later saves of "
                             "its step are written)")
            dropped = truncate_metrics(self.out_dir / rundir.METRICS, step) if self.dp.is_main else 0
            self.log(f"resumed from step {step} ({meta['train_seconds']:.1f} s trained, data position {meta['data']})"
                     + (f"; dropped {dropped} metrics row(s) logged after that step" if dropped else ""))
            state = RunState(step=step, tokens=meta["tokens"], train_seconds=meta["train_seconds"],
                             late_qat_step=meta.get("late_qat_step"))
        self._write_run_files()
        self.metrics_log = rundir.MetricsLog(self.out_dir / rundir.METRICS, enabled=self.dp.is_main)
        return state

    def metrics(self, **row) -> None:
        self.metrics_log.log(**row)

    def save(self, s: RunState, reason: str) -> None:
        meta = {"step": s.step, "train_seconds": s.train_seconds, "tokens": s.tokens, "data": self.loader.state(),
                "model_hash": model_hash(self.cfg), "model": to_dict(self.cfg)["model"], "reason": reason,
                "late_qat_step": s.late_qat_step}
        path = checkpoint.save(self.out_dir, s.step, {"params": self.params, "opt_state": self.opt_state}, meta)
        self.saved_step = s.step  # the step a final pipeline after this save scores (final_steps.json)
        self.log(f"checkpoint step {s.step} -> {path} ({reason})" if path else
                 f"checkpoint step {s.step}: already saved ({reason} save not needed)")

    def discard(self, step: int) -> None:
        checkpoint.discard(self.out_dir, step)  # every process: orbax coordinates them

    def agree(self, local_stop: bool, elapsed: float) -> tuple[bool, float]:
        """Multi-process: any process's signal stops all; process 0's clock is everyone's clock."""
        if self.dp.process_count == 1:
            return local_stop, elapsed
        g = multihost_utils.process_allgather(np.array([float(local_stop), elapsed]))
        return bool(g[:, 0].max()), float(g[0, 1])

    def summary_fields(self) -> dict:
        kind = ops.attention_forward_kind(self._steps.bound, self.cfg.train.seq_len)
        if self.env_backend == "neuron":  # summary.json keeps it everywhere
            self.log(f"qk_attention forward for the final gains: {kind}")
        swa = {"swa_count": int(self.opt_state.swa.count)} if self.cfg.optim.swa_every else {}  # collected, unused
        return {"checkpoint_step": checkpoint.latest_step(self.out_dir),  # every process (orbax collectives)
                "attention_forward": kind, "attention_forward_switches": self._steps.switches, **swa}

    def final_weights(self) -> str | None:
        """With optim.ema_decay > 0, the EMA (cast to each parameter's dtype, `optim.final_params`) replaces the
        trained parameters for the final evaluation and the artifact, as the record loads its EMA before them
        (train_gpt.py:1761-1765); the checkpoint keeps both (training resumes from the trained ones)."""
        if not self.cfg.optim.ema_decay:
            return None
        shardings = jax.tree_util.tree_map(lambda a: a.sharding, self.params)
        self.params = jax.jit(optim.final_params, out_shardings=shardings)(self.params, self.opt_state)
        self._steps.observe(_score_bound(self.params, self.cfg.model.head_dim))
        return "post_ema"

    def roundtrip(self, evaluate) -> dict:
        """The artifact of the scored parameters (the trained ones, or the EMA `final_weights` put in their place;
        eval.artifact: int8+zlib or int6+lzma, frontier_jax.interop.artifact, from the state dict in the baseline's
        names and layout): written by process 0, read back, its dequantized parameters scored by `evaluate` (the
        run's own eval step), then the scored parameters put back."""
        host_params = jax.tree_util.tree_map(lambda a: np.asarray(a.addressable_shards[0].data), self.params)
        # (the record's names of the recipe's parameters: state_dict.params_to_state_dict's mapping)
        back, info = artifact.roundtrip(state_dict.params_to_state_dict(host_params), self.out_dir,
                                        self.cfg.eval.artifact, write=self.dp.is_main)
        info["code_files"] = codebytes.record_run(self.out_dir, self.out_dir / rundir.CONFIG, write=self.dp.is_main)
        deq = state_dict.state_dict_to_params(back, host_params, source=info["artifact"])
        trained = self.params
        self.params = jax.tree_util.tree_map(  # replicated as the trained ones, on every process's devices
            lambda a, like: jax.make_array_from_callback(a.shape, like.sharding, lambda idx, h=np.asarray(a): h[idx]),
            deq, trained)
        bound = self._steps.bound
        self._steps.observe(_score_bound(self.params, self.cfg.model.head_dim))  # the dequantized gains' forward
        try:
            sums = evaluate(info)
        finally:
            self.params = trained
            self._steps.observe(bound)
        return {**info, **sums}

    def _ttt(self):
        """(score step, SGD step) of test-time training: the eval step of the exact-max qk_attention forward
        (frontier_jax.ops.softmax_shift, valid whatever the gains become while TTT trains; the same program as the
        validations' where the two forwards are one) and `steps.make_ttt_step`; the keyword arguments of
        `ttt.run` / `ttt.warm_up` beside them."""
        from frontier_jax import ttt
        from frontier_jax.steps import make_ttt_step

        dp = self.dp
        if self._ttt_steps is None:
            self._ttt_steps = (self._steps.eval_exact(),
                               make_ttt_step(self.graphdef, ttt.sgd(self.cfg.ttt), self.ngram.bias_fn, mesh=dp.mesh,
                                             attention_exact=True))
        kw = {"aux": self.ngram.tables, "put": dp.put_batch, "process_count": dp.process_count,
              "num_devices": dp.num_devices}
        return self._ttt_steps, kw

    def ttt_sums(self) -> dict:
        """Score-first test-time training (frontier_jax.ttt) from the parameters in place (in the final pipeline the
        artifact's dequantized ones: `roundtrip` calls it through `evaluate`), on the run's val split, over the
        data axis (each process its windows and rows); ttt.jsonl written by process 0. Its programs were compiled
        in the warm-up (`warm_up_programs`)."""
        from frontier_jax import ttt
        from frontier_jax.submission.evidence import write_ttt_log

        steps, kw = self._ttt()
        r = ttt.run(self.params, self.val_tokens, self.cfg, *steps, log=self.log,
                    process_index=self.dp.process_index, **kw)
        if self.dp.is_main:
            write_ttt_log(self.out_dir, r["events"])
        return {"nll_sum_nats": r["nll_sum_nats"], "tokens": r["tokens"], "bytes": r["bytes"],
                "estimate_full_val_seconds": r["estimate"]["seconds"], "hardware": r["hardware"]}

    def final_records(self) -> dict:
        """The final stages an earlier invocation recorded for the checkpoint being finished (<run>/final_steps.json,
        kept for one step); an artifact record whose file is gone or changed is dropped (written again)."""
        if self.saved_step is None:
            return {}
        records = rundir.read_final_steps(self.out_dir, self.saved_step)
        a = records.get("artifact")
        if a is not None:
            path = artifact.artifact_path(self.out_dir, self.cfg.eval.artifact)
            if a["artifact_format"] != self.cfg.eval.artifact or not path.is_file() or \
                    path.stat().st_size != a["artifact_bytes"]:
                records.pop("artifact")
        return records

    def record_final(self, records: dict) -> None:
        if self.dp.is_main:
            rundir.write_final_steps(self.out_dir, self.saved_step, records)

    def write_summary(self, summary: dict) -> None:
        if self.metrics_log is not None:
            self.metrics_log.close()
        rundir.write_summary(self.out_dir, summary, write=self.dp.is_main)


def _score_bound(params, head_dim: int) -> float:
    """ops.score_bound of the parameters' query gains, on the host (replicated: any shard is the value)."""
    gains = [np.asarray(leaf.addressable_shards[0].data) for leaf in q_gains(params)]
    return float(ops.score_bound(gains, head_dim))


class _AttentionVariants:
    """The train and eval steps for the two qk_attention forward kernels, the one to run chosen on the host
    from the score bound of the gains the next step uses (the previous step's metric, read before the next
    is dispatched; or the parameters after a reset): no `lax.cond` in the program. `warm_up` runs (so
    compiles) every forward's steps in the untimed warm-up, so that a switch mid-run compiles nothing; a
    switch is logged. Where both forwards are the same program (the reference path), one pair of steps
    serves both."""

    def __init__(self, make_train, make_eval, differ: bool, seq_len: int, log):
        self._make = {"train": make_train, "eval": make_eval}
        self._built: dict = {}
        self.differ, self.seq_len, self.log = differ, seq_len, log
        self.bound, self.exact, self.switches = 0.0, None, 0
        self._forced: bool | None = None  # the forward `warm_up` runs, whatever the bound

    def observe(self, bound: float) -> None:
        self.bound = bound
        exact = not ops.bounded_shift_valid(bound, self.seq_len)
        if self.exact is not None and exact != self.exact and self.differ:
            self.switches += 1
            self.log(f"qk_attention forward: {ops.attention_forward_kind(bound, self.seq_len)} "
                     "(its steps were compiled in the warm-up)")
        self.exact = exact

    def forwards(self, seq_len: int) -> tuple[bool, ...]:
        """The forwards (exact max or not) a step over windows of `seq_len` can run: both where they differ and
        the bounded shift is exact for some gains at that length, else the one."""
        if not self.differ:
            return (False,)
        return (False, True) if ops.bounded_shift_valid(0.0, seq_len) else (True,)

    def warm_up(self, run_train, run_eval, eval_windows, check) -> list[str]:
        """Runs (so compiles) `run_train()` with the train step of every forward the training length can run,
        and `run_eval(window)` with the eval step of every forward each of the (seq_len, window) `eval_windows`
        (one a distinct eval shape) can run, each forward put in place whatever the bound, `check()` after
        each; returns the names of the programs."""
        names = []
        runs = [(exact, run_train, f"train step T={self.seq_len}") for exact in self.forwards(self.seq_len)]
        runs += [(exact, lambda w=window: run_eval(w), f"eval step {window}") for seq_len, window in eval_windows
                 for exact in self.forwards(seq_len)]
        try:
            for exact, run, name in runs:
                self._forced = exact
                run()
                names.append(name + (f" ({'exact max' if exact else 'bounded shift'})" if self.differ else ""))
                check()
        finally:
            self._forced = None
        return names

    def _get(self, kind: str, exact: bool):
        exact = exact and self.differ
        if (kind, exact) not in self._built:
            self._built[(kind, exact)] = self._make[kind](exact)
        return self._built[(kind, exact)]

    def train(self):
        return self._get("train", self.exact if self._forced is None else self._forced)

    def eval_exact(self):
        """The eval step of the exact-max forward, whatever the bound (test-time training's scoring step)."""
        return self._get("eval", True)

    def eval(self, seq_len: int | None = None):
        """The eval step for windows of `seq_len` (default the training length: the forward chosen by `observe`)."""
        if self._forced is not None:
            return self._get("eval", self._forced)
        if seq_len is None or seq_len == self.seq_len:
            return self._get("eval", self.exact)
        return self._get("eval", not ops.bounded_shift_valid(self.bound, seq_len))


class OnStep(RunHook):
    """Calls fn(step, row) with each finished step's host metrics (tests, tools)."""

    def __init__(self, fn):
        self.fn = fn

    def after_step(self, state: RunState, row: dict) -> None:
        self.fn(row["step"], row)
