"""The checks on the model's forward: one forward for training and evaluation, causal scores, a normalized
distribution. They run the project's code at the run's config (the run's recorded code must be the code here).

One forward. Both steps are traced as the trainer builds them (`frontier_jax.neuron.program.trace_steps`,
the config's model, optimizer and n-gram bias; nothing compiled). Every equation of a jaxpr carries the Python
call stack that made it; its frames in the model's own source files (the files of every nnx.Module class
in the model) are its model call path, e.g. GPT.__call__:142 > GPT.hidden:133 > Block.__call__:89. The
rule holds when the eval step's model paths all occur in the train step, the eval step reaches them
through the model's `__call__` (the function the train step differentiates: its paths also carry
transposed equations), and every operation the model's own code writes in the eval step (not inside an
op: a reshape, a cast, a scale by a constant) is one the train step has at the same path with the same
literal operands. An eval-only branch (`if not training: logits = logits * s`, a flag that nnx's
`Module.eval()` sets, the eval step calling `model.hidden` and a head of its own) shows as an eval path
or a literal the train step lacks, named by file and line. What each step does with the forward's
per-token losses (the train step's mean and gradient, the eval step's masked sums and byte counts) is
`frontier_jax.steps`' code, outside the model.

Causal and normalized (parameter-golf's conditions 1 and 2) are measured: the run's architecture at a
small width (`probe_config`: the same code, layers, heads, vocabulary and n-gram orders), random weights
(the zero-initialised projections too) and n-gram tables built from the probe's own tokens, so the bias
is active, and the per-token losses of the forward both steps call (one compiled program of V rows).
Causal: the losses of the positions before t do not change when the tokens from t on change (and the loss
at t-1 does change with token t-1, else the measurement says nothing). Normalized: at every position,
exp(-loss) summed over all V possible targets is 1.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.extend.core import Literal, jaxprs_in_params

from frontier_jax import optim
from frontier_jax.config import Config
from frontier_jax.contest.codebytes import PROJECT_PACKAGES
from frontier_jax.contest.rules import FAIL, NOT_CHECKABLE, PASS, Verdict
from frontier_jax.model import build
from frontier_jax.neuron import program
from frontier_jax.policies import dtypes as dtype_policy

PROBE_WIDTH_PER_HEAD = 8  # probe_config's head dim
PROBE_SEQ = 32
PROBE_TABLE_LOG2 = 12
CAUSAL_RTOL = 1e-6
NORMALIZED_TOL = 1e-4
SHOW = 3  # findings named per verdict


# ----------------------------------------------------------------------------- one forward


def model_files(cfg: Config, *model_fns) -> frozenset[str]:
    """The source files of every nnx.Module class (and its project base classes) in the models."""
    files = set()
    dtype = jnp.float32
    for fn in model_fns:
        model = nnx.eval_shape(lambda: fn(cfg, dtype))
        for _, node in nnx.iter_graph(model):
            if not isinstance(node, nnx.Module):
                continue
            for cls in type(node).__mro__:
                if (isinstance(cls, type) and issubclass(cls, nnx.Module) and cls is not nnx.Module
                        and not cls.__module__.startswith("flax")):
                    files.add(str(Path(inspect.getsourcefile(cls)).resolve()))
    return frozenset(files)


def _project_dirs() -> tuple[str, ...]:
    return tuple(str(Path(sys.modules[p].__file__).resolve().parent) + "/" for p in PROJECT_PACKAGES
                 if p in sys.modules and getattr(sys.modules[p], "__file__", None))


@dataclasses.dataclass
class ForwardSites:
    """A step's model call paths and the operations written in the model's own code, by path."""

    paths: set = dataclasses.field(default_factory=set)  # tuples of (file, function, line), outermost first
    ops: set = dataclasses.field(default_factory=set)  # (path, primitive, literal operands)
    rooted: bool = False  # a path passes through the model's __call__
    transposed: bool = False  # a model path carries a transposed (backward) equation


def forward_sites(closed, files: frozenset[str], root: str) -> ForwardSites:
    """The model paths of a traced step (module docstring); `root`: the model's __call__ qualname."""
    out = ForwardSites()
    project = _project_dirs()
    for site in program.walk(closed):
        tb = site.eqn.source_info.traceback
        if tb is None:
            continue
        frames = [(_resolved(f.file_name), f.function_name, f.line_num) for f in tb.frames]
        path = tuple(reversed([f for f in frames if f[0] in files]))
        if not path:
            continue
        out.paths.add(path)
        out.rooted |= any(fn == root for _, fn, _ in path)
        out.transposed |= "transpose" in str(site.eqn.source_info.name_stack)
        inner = next((f for f in frames if f[0] in files or f[0].startswith(project)), None)
        leaf = not list(jaxprs_in_params(site.eqn.params))
        if leaf and inner is not None and inner[0] in files:
            lits = tuple(repr(np.asarray(v.val).tolist()) for v in site.eqn.invars if isinstance(v, Literal))
            out.ops.add((path, site.primitive, lits))
    return out


@functools.lru_cache(maxsize=None)
def _resolved(file: str) -> str:
    return str(Path(file).resolve())


def _where(path) -> str:
    file, fn, line = path[-1]
    return f"{Path(file).name}:{line} ({' > '.join(f'{f}:{n}' for _, f, n in path)})"


def one_forward(cfg: Config, platform: str = "cpu", model_fn=build, eval_model_fn=None) -> Verdict:
    """The one-forward rule for `cfg` (module docstring). `model_fn` / `eval_model_fn`: the models the steps
    are built from (the trainer builds both from `model.build`; a test gives another eval model)."""
    eval_fn = eval_model_fn or model_fn
    dtypes = dtype_policy.resolve(cfg, platform)
    traced = program.trace_steps(cfg, 1, dtypes, optim.build_optimizer(cfg.optim, dtypes.muon_ns), model_fn=model_fn,
                                 eval_model_fn=eval_model_fn, only=("train", "eval"))
    files = model_files(cfg, model_fn, eval_fn)
    root = _call_name(cfg, model_fn)
    train = forward_sites(traced.programs["train"], files, root)
    ev_sites = forward_sites(traced.programs["eval"], files, _call_name(cfg, eval_fn))
    if not ev_sites.paths:
        return Verdict("one_forward", FAIL, "the eval step calls no model code")
    if not (train.rooted and train.transposed):
        return Verdict("one_forward", FAIL, f"the train step does not differentiate {root}")
    if not ev_sites.rooted:
        return Verdict("one_forward", FAIL, f"the eval step runs model code without calling {root}: "
                                            + "; ".join(_where(p) for p in sorted(ev_sites.paths)[:SHOW]))
    only_paths = sorted(ev_sites.paths - train.paths)
    only_ops = sorted(o for o in ev_sites.ops - train.ops if o[0] in train.paths)
    if only_paths or only_ops:
        shown = [f"{_where(p)}" for p in only_paths[:SHOW]]
        shown += [f"{_where(p)}: {prim} {', '.join(lits)}".rstrip() for p, prim, lits in only_ops[:SHOW]]
        return Verdict("one_forward", FAIL, f"eval-only model code ({len(only_paths)} call path(s), {len(only_ops)} "
                                            f"operation(s) the train step does not run): " + "; ".join(shown))
    return Verdict("one_forward", PASS,
                   f"the eval step's {len(ev_sites.paths)} model call paths and {len(ev_sites.ops)} operations of "
                   f"the model's own code ({', '.join(sorted(Path(f).name for f in files))}) all occur in the "
                   f"train step's differentiated {root} (both steps traced at the run's config: "
                   f"{cfg.model.num_layers} layers, n-gram bias {'on' if cfg.ngram.enabled else 'off'})")


def _call_name(cfg: Config, model_fn) -> str:
    """The qualified name of the model's __call__ (the function the train step differentiates)."""
    return type(nnx.eval_shape(lambda: model_fn(cfg, jnp.float32))).__call__.__qualname__


# ----------------------------------------------------------------------------- causal, normalized


def probe_config(cfg: Config) -> Config:
    """The run's architecture at a small width (a head dim of PROBE_WIDTH_PER_HEAD, or the rotated dims of a partial
    RoPE when more) and sequence length, float32 (the probes' model); its final evaluation's windows (eval, ttt)
    are not the probes' and are left out."""
    m = cfg.model
    model = dataclasses.replace(m, model_dim=m.num_heads * max(PROBE_WIDTH_PER_HEAD, m.rope_dims),
                                compute_dtype="float32")
    train = dataclasses.replace(cfg.train, seq_len=PROBE_SEQ, tokens_per_step=PROBE_SEQ, micro_batch_seqs=1,
                                val_max_tokens=0)
    ngram = cfg.ngram
    if ngram.enabled:
        ngram = dataclasses.replace(ngram, table_log2_size=min(ngram.table_log2_size, PROBE_TABLE_LOG2))
    evaluation = dataclasses.replace(cfg.eval, seq_len=0, stride=0, score="roundtrip")
    return dataclasses.replace(cfg, model=model, train=train, ngram=ngram, eval=evaluation,
                               ttt=dataclasses.replace(cfg.ttt, enabled=False))


def _random_params(abstract, rng):
    """N(0, 0.5^2) for every parameter of an abstract parameter tree (numpy: nothing to compile)."""
    return jax.tree_util.tree_map(lambda a: jnp.asarray((0.5 * rng.standard_normal(a.shape)).astype(a.dtype)), abstract)


def _probe(cfg: Config, model_fn=build, seed: int = 0):
    """(probe config, graphdef, random params, bias_fn, tables, token stream) for the measured checks."""
    from frontier_jax.ngram import runtime as ngram_runtime
    from frontier_jax.ngram.bias import DeviceTables, host_arrays
    from frontier_jax.ngram.tables import NgramTables

    pc = probe_config(cfg)
    rng = np.random.default_rng(seed)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: model_fn(pc, jnp.float32)))
    params = _random_params(abstract, rng)
    half = rng.integers(0, pc.model.vocab_size, size=4 * PROBE_SEQ)
    stream = np.concatenate([half, half])  # repeated: the n-gram contexts of the second copy are in the tables
    bias_fn, tables = None, None
    if pc.ngram.enabled:
        t = NgramTables.from_config(pc.ngram, chunk_tokens=stream.size)
        t.consume(stream.astype(np.uint16))
        fp, top, conf = host_arrays(t.rows_OK4, pc.ngram.confidence_buckets)
        tables = DeviceTables(jnp.asarray(fp), jnp.asarray(top), jnp.asarray(conf), pc.ngram.min_order)
        bias_fn = ngram_runtime.bias_fn
    return pc, graphdef, params, bias_fn, tables, stream, rng


def causal_and_normalized(cfg: Config, model_fn=build) -> tuple[Verdict, Verdict]:
    """parameter-golf's conditions 1 and 2, measured on the probe model (module docstring): per-token losses of
    the forward both steps call (`model(x, y, *bias_fn(model, x, tables))`, frontier_jax.steps), one compiled
    program of V rows run twice. `model_fn(cfg, dtype)`: the model (the trainer's: `model.build`)."""
    pc, graphdef, params, bias_fn, tables, stream, rng = _probe(cfg, model_fn)
    V, T = pc.model.vocab_size, PROBE_SEQ

    @jax.jit
    def forward(params, x_BT, y_BT):
        """(per-token losses, positions of row 0 with an n-gram bias)"""
        model = nnx.merge(graphdef, params)
        bias = bias_fn(model, x_BT, tables) if bias_fn is not None else (None, None)
        biased = jnp.sum(jnp.any(bias[1][0] != 0, axis=-1)) if bias_fn is not None else 0
        return model(x_BT, y_BT, *bias), biased

    def losses(params, x_BT, y_BT):
        return forward(params, x_BT, y_BT)[0]

    start = 4 * T  # inside the repeated copy of the stream
    x_T, y_T = stream[start:start + T].astype(np.int32), stream[start + 1:start + T + 1].astype(np.int32)
    # causal: row 0 the window; per cut t, one row with the tokens from t on replaced, one with token t-1 changed
    cuts = (1, T // 2, T - 1)
    x_VT, y_VT = np.repeat(x_T[None], V, axis=0), np.repeat(y_T[None], V, axis=0)
    for i, t in enumerate(cuts):
        x_VT[1 + 2 * i, t:] = rng.integers(0, V, size=T - t)
        y_VT[1 + 2 * i, t:] = rng.integers(0, V, size=T - t)
        x_VT[2 + 2 * i, t - 1] = (x_T[t - 1] + 1) % V
    loss_VT, biased = forward(params, x_VT, y_VT)
    loss_VT = np.asarray(loss_VT, np.float64)
    what = (f"the run's architecture at width {pc.model.model_dim}, {T} tokens, random weights"
            + (f", n-gram tables built from the probe's tokens: the bias is on at {int(biased)} of {T} positions"
               if tables is not None else ""))
    worst, insensitive = 0.0, []
    for i, t in enumerate(cuts):
        base = loss_VT[0, :t]
        worst = max(worst, float(np.max(np.abs(loss_VT[1 + 2 * i, :t] - base) / np.maximum(np.abs(base), 1e-30))))
        if loss_VT[2 + 2 * i, t - 1] == base[t - 1]:
            insensitive.append(t)
    if insensitive:
        causal = Verdict("causal", NOT_CHECKABLE, f"the probe's loss at t-1 did not depend on the token at t-1 for "
                                                  f"t in {insensitive} ({what}): the measurement says nothing")
    else:
        ok = worst <= CAUSAL_RTOL
        causal = Verdict("causal", PASS if ok else FAIL,
                         f"changing the tokens from position t on changed the per-token losses before t by at most "
                         f"{worst:.1e} (relative; t in {list(cuts)}; limit {CAUSAL_RTOL:.0e}), changing token t-1 "
                         f"changed the loss at t-1 ({what})")
    # normalized: the same window in every row, row v scored against target v at every position
    x_VT = np.repeat(x_T[None], V, axis=0)
    y_VT = np.repeat(np.arange(V, dtype=np.int32)[:, None], T, axis=1)
    total_T = np.exp(-np.asarray(losses(params, x_VT, y_VT), np.float64)).sum(axis=0)
    err = float(np.abs(total_T - 1.0).max())
    normalized = Verdict("normalized", PASS if err <= NORMALIZED_TOL else FAIL,
                         f"at each of {T} positions the probabilities of all {V} targets (exp(-loss) of the forward "
                         f"the eval step sums) add up to 1 within {err:.1e} (limit {NORMALIZED_TOL:.0e}; {what})")
    return causal, normalized
