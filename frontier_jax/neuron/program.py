"""The trainer's jitted programs as they run on Neuron, as jaxprs, and a walk over every equation in them.

`trace_steps(cfg, num_devices, dtypes, tx)` traces the train step (both qk_attention forwards), the eval step,
the optimizer update and, with ttt.enabled, test-time training's SGD step exactly as the trainer builds them
(`frontier_jax.steps`, `frontier_jax.ttt`, the config's model,
optimizer, n-gram bias and batch split), for a mesh of `num_devices` NeuronCores (an abstract mesh:
no device is needed), with Neuron's dtype policy (or the run's) and every kernel call standing where it is
on Neuron (`dispatch.kernel_primitives`: a `frontier_<op>_fwd/_bwd` equation with the kernel's
operands and static parameters). Nothing is compiled or run. A config whose `train.micro_batch_seqs` is 0 (auto)
is traced at the largest micro-batch that fits a NeuronCore's HBM (`frontier_jax.neuron.memory`); `Traced.memory`
holds the step's estimated peak per core. `fit_memory` is the trainer's check of its own steps, as they run on
its backend, against its devices' memory before anything is compiled or allocated.

`walk(closed_jaxpr)` yields a `Site` per equation, descending into every sub-jaxpr (jit, custom_vjp,
scan, while, cond, shard_map, ...), with how many times the equation runs per call of the program
(the product of the enclosing scans' lengths) and whether it is inside a per-device (shard_map) region.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh

from frontier_jax import ops, optim, ttt
from frontier_jax.neuron import memory as _memory
from frontier_jax.config import Config
from frontier_jax.data.tokenizer import ByteTables
from frontier_jax.model import build
from frontier_jax.ngram import bias as ngram_bias
from frontier_jax.ngram import runtime as ngram_runtime
from frontier_jax.parallel import state_specs
from frontier_jax.policies import dtypes as dtype_policy
from frontier_jax.policies.geometry import split_batch
from frontier_jax.steps import AXIS, make_eval_step, make_optimizer_step, make_train_step, make_ttt_step

KERNEL_PREFIX = "frontier_"  # the kernel-backed ops' primitives (frontier_jax.ops.dispatch)


@dataclasses.dataclass(frozen=True)
class Site:
    eqn: object  # jax.extend.core.JaxprEqn
    multiplicity: int  # times it runs per call of the traced program
    per_device: bool  # inside a shard_map body
    path: tuple[str, ...]  # the enclosing higher-order primitives, outermost first

    @property
    def primitive(self) -> str:
        return self.eqn.primitive.name

    @property
    def is_kernel(self) -> bool:
        return self.primitive.startswith(KERNEL_PREFIX) and bool(self.eqn.params.get("kernel"))


def _sub_jaxprs(eqn) -> Iterator[tuple[object, int]]:
    """(jaxpr, repeat factor) of every jaxpr an equation's parameters hold."""
    repeat = int(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else 1
    for inner in _memory.sub_jaxprs(eqn):
        yield inner, repeat


def walk(closed, multiplicity: int = 1, per_device: bool = False, path: tuple[str, ...] = ()) -> Iterator[Site]:
    """Every equation of `closed` (a ClosedJaxpr or Jaxpr) and of every sub-jaxpr, depth first."""
    jaxpr = getattr(closed, "jaxpr", closed)
    for eqn in jaxpr.eqns:
        yield Site(eqn, multiplicity, per_device, path)
        inside = per_device or eqn.primitive.name == "shard_map"
        for sub, repeat in _sub_jaxprs(eqn):
            yield from walk(sub, multiplicity * repeat, inside, path + (eqn.primitive.name,))


def kernel_sites(closed) -> list[Site]:
    """The kernel calls of a traced program (see `trace_steps`)."""
    return [s for s in walk(closed) if s.is_kernel]


@dataclasses.dataclass(frozen=True)
class Traced:
    """The programs of one config at one device count, and the shapes they were traced at."""

    programs: dict  # name -> ClosedJaxpr: "train", "train (exact-max attention)", "eval", "optimizer"[, "ttt"]
    num_devices: int
    global_micro: int
    accum: int
    memory: _memory.Fit  # the micro-batch per device and the step's estimated peak against a device's memory


def _abstract(tree):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def on_neuron(cfg: Config) -> tuple[dtype_policy.Dtypes, optim.Optimizer]:
    """(dtypes, optimizer) of `cfg` on Neuron: its dtype policy there and the optimizer built for it (the command
    lines trace with these; the trainer hands `trace_steps` the ones it resolved and built itself)."""
    dtypes = dtype_policy.resolve(cfg, "neuron")
    return dtypes, optim.build_optimizer(cfg.optim, dtypes.muon_ns)


class StepPrograms:
    """The trainer's steps of one config on an abstract mesh of `num_devices`, traced on demand (nothing is
    compiled or allocated): the train step per micro-batch size (cached), the eval and optimizer steps."""

    def __init__(self, cfg: Config, num_devices: int, dtypes: dtype_policy.Dtypes, tx: optim.Optimizer,
                 model_fn=build, eval_model_fn=None):
        t = cfg.train
        self.cfg, self.tx, self.num_devices = cfg, tx, num_devices
        self.seqs_per_step = t.tokens_per_step // t.seq_len
        split_batch(self.seqs_per_step, 1, num_devices)  # a step the devices cannot share fails here, in one line
        self.mesh = AbstractMesh((num_devices,), (AXIS,))
        self.graphdef, params = nnx.split(nnx.eval_shape(lambda: model_fn(cfg, dtypes.compute)))
        self.eval_graphdef = self.graphdef if eval_model_fn is None else nnx.split(
            nnx.eval_shape(lambda: eval_model_fn(cfg, dtypes.compute)))[0]
        self.params = _abstract(params)
        self.opt_state = jax.eval_shape(tx.init, self.params)
        self.specs = state_specs(self.opt_state, num_devices, cfg.parallel.zero1)
        self.bias_fn, self.aux = None, None
        if cfg.ngram.enabled:
            self.bias_fn, self.aux = ngram_runtime.bias_fn, _abstract(ngram_bias.empty_tables(cfg.ngram))
        self._train: dict = {}

    def train(self, micro_seqs: int, exact: bool = False):
        """The train step at `micro_seqs` sequences per device per micro-batch."""
        if (micro_seqs, exact) not in self._train:
            cfg, T = self.cfg, self.cfg.train.seq_len
            global_micro, accum = split_batch(self.seqs_per_step, micro_seqs, self.num_devices)
            late_qat = cfg.optim.late_qat_threshold > 0  # the trainer's step then takes the late-QAT flag
            step = make_train_step(self.graphdef, self.tx, self.bias_fn, mesh=self.mesh, state_specs=self.specs,
                                   head_dim=cfg.model.head_dim, attention_exact=exact, late_qat=late_qat).jitted
            tok = jax.ShapeDtypeStruct((accum, global_micro, T), jnp.int32)
            qat = (jax.ShapeDtypeStruct((), jnp.bool_),) if late_qat else ()
            self._train[(micro_seqs, exact)] = jax.make_jaxpr(step)(self.params, self.opt_state, tok, tok, _F32,
                                                                    _F32, self.aux, *qat)
        return self._train[(micro_seqs, exact)]

    def eval(self):
        cfg = self.cfg
        V, T, B = cfg.model.vocab_size, cfg.train.seq_len, cfg.train.val_batch_seqs
        tables = ByteTables(np.zeros(V, np.int32), np.zeros(V, bool), np.zeros(V, bool))
        eval_step = make_eval_step(self.eval_graphdef, tables, self.bias_fn, mesh=self.mesh).jitted
        tok = jax.ShapeDtypeStruct((B, T), jnp.int32)
        return jax.make_jaxpr(eval_step)(self.params, tok, tok, tok, self.aux)

    def optimizer(self):
        update = make_optimizer_step(self.tx, mesh=self.mesh, state_specs=self.specs).jitted
        return jax.make_jaxpr(update)(self.params, self.opt_state, self.params, _F32, _F32)

    def ttt(self):
        """Test-time training's SGD step (`steps.make_ttt_step` with `ttt.sgd`, the exact-max qk_attention forward)
        at its largest row count (`ttt.step_rows`) of train.seq_len. (Its scoring step is the eval step's program
        with the exact-max forward, the train step's kernels.)"""
        cfg, T = self.cfg, self.cfg.train.seq_len
        tx = ttt.sgd(cfg.ttt)
        rows = ttt.step_rows(cfg, self.num_devices)[0]
        step = make_ttt_step(self.graphdef, tx, self.bias_fn, mesh=self.mesh, attention_exact=True).jitted
        tok = jax.ShapeDtypeStruct((rows, T), jnp.int32)
        valid = jax.ShapeDtypeStruct((rows,), jnp.int32)
        return jax.make_jaxpr(step)(self.params, jax.eval_shape(tx.init, self.params), tok, tok, valid, _F32, self.aux)

    def fit(self, limit: _memory.DeviceMemory, strict: bool) -> _memory.Fit:
        """The micro-batch per device (the config's, or auto's choice) and its estimated peak (`memory.fit`)."""
        return _memory.fit(self.cfg.name, self.cfg.train.micro_batch_seqs, self.seqs_per_step // self.num_devices,
                           lambda m: _memory.estimate_bytes([self.train(m)]), limit,
                           fixed=lambda: _memory.estimate_bytes([self.eval()]), strict=strict)


_F32 = jax.ShapeDtypeStruct((), jnp.float32)


def fit_memory(cfg: Config, num_devices: int, dtypes: dtype_policy.Dtypes, tx: optim.Optimizer,
               limit: _memory.DeviceMemory) -> _memory.Fit:
    """The trainer's check before anything is compiled or allocated: its steps traced as they run here (the
    configured kernel table, not Neuron's), the micro-batch per device (`train.micro_batch_seqs`, or auto's
    choice) against `limit`; DoesNotFit (exit 2) when the step cannot fit. The estimates are kept per process
    for the programs they depend on (`_program_key`): a second run of the same step is not traced again."""
    known = _ESTIMATES.setdefault(_program_key(cfg, num_devices, dtypes), {})
    steps: list[StepPrograms] = []

    def traced() -> StepPrograms:
        if not steps:
            steps.append(StepPrograms(cfg, num_devices, dtypes, tx))
        return steps[0]

    def estimate(m: int) -> int:
        if m not in known:
            known[m] = _memory.estimate_bytes([traced().train(m)])
        return known[m]

    def fixed() -> int:
        if "eval" not in known:
            known["eval"] = _memory.estimate_bytes([traced().eval()])
        return known["eval"]

    t = cfg.train
    split_batch(t.tokens_per_step // t.seq_len, 1, num_devices)  # a step the devices cannot share: one line
    return _memory.fit(cfg.name, t.micro_batch_seqs, t.tokens_per_step // t.seq_len // num_devices, estimate, limit,
                       fixed=fixed, strict=True)


_ESTIMATES: dict[str, dict] = {}  # fit_memory's estimates per `_program_key`


def _program_key(cfg: Config, num_devices: int, dtypes: dtype_policy.Dtypes) -> str:
    """What the traced steps depend on: the model, optimizer and n-gram sections, the step's shape, ZeRO-1, the
    device count, the dtypes, the backend and the configured kernel table."""
    t = cfg.train
    return json.dumps([dataclasses.asdict(cfg.model), dataclasses.asdict(cfg.optim), dataclasses.asdict(cfg.ngram),
                       [t.seq_len, t.tokens_per_step, t.val_batch_seqs], cfg.parallel.zero1, num_devices,
                       dataclasses.asdict(dtypes), jax.default_backend(),
                       [(r.op, r.impl) for r in ops.kernel_table()]], sort_keys=True, default=str)


def trains_at_test(cfg: Config) -> bool:
    """Whether the run trains at test time (ttt.enabled with epochs > 0): its SGD step is one of its programs."""
    return cfg.ttt.enabled and cfg.ttt.epochs > 0


def trace_steps(cfg: Config, num_devices: int, dtypes: dtype_policy.Dtypes, tx: optim.Optimizer, *, model_fn=build,
                eval_model_fn=None, only: tuple[str, ...] | None = None) -> Traced:
    """The trainer's steps for `cfg` on `num_devices` NeuronCores (one trn1.2xlarge chip is 2 NeuronCores, 2 JAX
    devices), in `dtypes` with the optimizer `tx`, traced with the kernel calls in place (module docstring), at
    the config's micro-batch or, for train.micro_batch_seqs=0, the largest that fits a NeuronCore's HBM
    (`Traced.memory` says whether the step fits). `model_fn(cfg, compute_dtype)` builds the model both steps use
    (the trainer's: `model.build`); `eval_model_fn`, when given, the one the eval step uses instead (what the
    one-forward check compares, frontier_jax.submission.forward). `only`: trace just these programs (default all
    four, and "ttt" with ttt.enabled; the estimate is then of the train step and those)."""
    names = ("train", "train (exact-max attention)", "eval", "optimizer") + (("ttt",) if trains_at_test(cfg) else ())
    with ops.kernel_primitives(cfg.model):  # an op whose kernel lacks a model switch traces its reference
        steps = StepPrograms(cfg, num_devices, dtypes, tx, model_fn, eval_model_fn)
        fit = steps.fit(_memory.device_memory("neuron"), strict=False)
        make = {"train": lambda: steps.train(fit.micro_seqs),
                "train (exact-max attention)": lambda: steps.train(fit.micro_seqs, exact=True),
                "eval": steps.eval, "optimizer": steps.optimizer, "ttt": steps.ttt}
        programs = {name: make[name]() for name in names if only is None or name in only}
    global_micro, accum = split_batch(steps.seqs_per_step, fit.micro_seqs, num_devices)
    traced = [steps.train(fit.micro_seqs), *programs.values()]
    fit = dataclasses.replace(fit, estimate=_memory.estimate_bytes(traced))  # every traced program's peak
    return Traced(programs, num_devices, global_micro, accum, fit)
