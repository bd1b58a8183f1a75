"""Where the train step's time goes: each op family's forward+backward timed alone, at its real shape.

    python -m bench.profile_ops [--cases tiny-8k baseline-shaped-8k] [--rounds 5] [--variants]

Every op family is a separately jitted function of (inputs) -> scalar, differentiated with
jax.value_and_grad, called at the shapes one train step uses and multiplied by how many times the
step calls it (e.g. 2 rms_norms per block). All functions, the full forward+backward and the full
step (optimizer included) are timed interleaved, `--rounds` rounds, median per function, so load on
a shared CPU moves them together. `--variants` adds, in the same interleaved run, the paths before the speed work (the custom_vjp
primitives for reference ops, dense masked attention; `before_paths`), the full step on them, Muon NS
in the other dtype, and jax.nn.dot_product_attention at short sequences.
Also prints the compiled step's HLO cost analysis FLOPs against `ModelConfig.flops_per_token`.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import CASES, PROFILE_CASES, random_batch
from frontier_jax import ops, optim
from frontier_jax.ops import reference as ref
from frontier_jax.config import apply_overrides
from frontier_jax.policies.dtypes import resolve as resolve_dtypes
from frontier_jax.ops import experimental as xops
from frontier_jax.run.host import tune_allocator
from frontier_jax.model import _rope_tables, build
from frontier_jax.steps import make_train_step


@contextlib.contextmanager
def before_paths(on: bool = True):
    """The code paths before the speed work: custom_vjp primitives for reference ops, dense masked attention."""
    if not on:
        yield
        return
    saved = ref.attention_block
    ref.attention_block = lambda T: T
    try:
        with ops.through_primitives():
            yield
    finally:
        ref.attention_block = saved


def _compile(fn, *args, before=False):
    """AOT-compiled now (so the path chosen at trace time sticks)."""
    with before_paths(before):
        return jax.jit(fn).lower(*args).compile()


def _grad_fn(f, args, ct, before=False):
    """Compiled value_and_grad of sum(f(*args) * cotangent) w.r.t. all `args`."""
    def loss(*a):
        return jnp.vdot(f(*a[:-1]).astype(jnp.float32), a[-1])

    return _compile(jax.value_and_grad(loss, argnums=tuple(range(len(args)))), *args, ct, before=before)


def _thunk(fn, *args):
    return lambda: jax.block_until_ready(fn(*args))


def _families(cfg, B: int, T: int, variants: bool, dtype=jnp.float32) -> dict:
    """name -> (thunk, calls per step)."""
    m = cfg.model
    D, H, G, K, V, L = m.model_dim, m.num_heads, m.num_kv_heads, m.head_dim, m.vocab_size, m.num_layers
    F, N = m.mlp_hidden, B * T
    r = np.random.default_rng(0)
    a = lambda *s: jnp.asarray(r.standard_normal(s).astype(np.float32) * 0.1, dtype)
    ids = jnp.asarray(r.integers(0, V, N), jnp.int32)
    cos, sin = _rope_tables(T, K, m.rope_base)
    fams = {}

    def add(name, f, args, calls, before=False):
        out = jax.eval_shape(f, *args)
        ct = a(*out.shape).astype(jnp.float32)
        fams[name] = (_thunk(_grad_fn(f, args, ct, before), *args, ct), calls)

    x_ND = a(N, D)
    wq, wk, wv, wo = a(D, H * K), a(D, G * K), a(D, G * K), a(H * K, D)
    def qkv_out(x, wq, wk, wv, wo):  # the pre-attention rms_norm runs inside norm_qkv_projection
        q, k, v = xops.norm_qkv_projection(x, wq, wk, wv)
        return q @ wo + jnp.sum(k * v)

    add("norm + dense qkv+out proj", qkv_out, (x_ND, wq, wk, wv, wo), L)
    add("norm + mlp (relu^2, 2 matmuls)", ops.norm_mlp, (x_ND, a(D, F), a(F, D), a(D)), L)
    q, k, v = a(B, T, H, K), a(B, T, G, K), a(B, T, G, K)
    add("qk_attention (qk-norm, rope, gain, attn)", lambda q, k, v, g: ops.qk_attention(q, k, v, cos, sin, g),
        (q, k, v, a(H) + 1.5), L)  # what model.Block calls
    add("attention core alone", xops.causal_attention, (q, k, v), L)
    add("rms_norm [N,D] (embed, final)", ops.rms_norm, (x_ND,), 2)
    add("rms_norm q,k", lambda q, k: ops.rms_norm(q).sum(-1) + ops.rms_norm(k).sum((-1, -2))[..., None],
        (q, k), L)
    add("rope q,k", lambda q, k: xops.rope(q, cos, sin).sum(-1) + xops.rope(k, cos, sin).sum((-1, -2))[..., None],
        (q, k), L)
    emb = a(V, D)
    add("head: tied logits+softcap+CE", lambda x, e: ops.head_loss(x, e, ids, m.logit_softcap), (x_ND, emb), 1)
    add("embedding gather", lambda e: ops.embed(ids, e), (emb,), 1)
    if variants:  # the same families on the paths before the speed work (primitives, dense attention)
        add("  before: norm + mlp via custom_vjp", ops.norm_mlp, (x_ND, a(D, F), a(F, D), a(D)), L, True)
        add("  before: attention dense via custom_vjp", xops.causal_attention, (q, k, v), L, True)
        add("  before: rms_norm [N,D] via custom_vjp", ops.rms_norm, (x_ND,), 2, True)
        add("  before: rope q,k via custom_vjp", lambda q, k: xops.rope(q, cos, sin).sum(-1)
            + xops.rope(k, cos, sin).sum((-1, -2))[..., None], (q, k), L, True)
        add("  before: head via custom_vjp", lambda x, e: ops.head_loss(x, e, ids, m.logit_softcap), (x_ND, emb), 1, True)
        if T <= 256:
            add("  jax.nn.dot_product_attention xla", _dpa, (q, k, v), L)
    return fams


def _dpa(q, k, v):
    H, G = q.shape[2], k.shape[2]
    k, v = jnp.repeat(k, H // G, axis=2), jnp.repeat(v, H // G, axis=2)
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def _optimizer_thunks(cfg, params, variants: bool) -> dict:
    out = {}
    grads = jax.tree_util.tree_map(lambda p: jnp.full(p.shape, 1e-3, p.dtype), params)
    dts = (cfg.optim.muon_ns_dtype,) + (tuple(d for d in ("bfloat16", "float32") if d != cfg.optim.muon_ns_dtype)
                                        if variants else ())
    for dt in dts:
        tx = optim.build_optimizer(apply_overrides(cfg, [f"optim.muon_ns_dtype={dt!r}"]).optim)
        st = tx.init(params)
        upd = jax.jit(lambda g, s, p, tx=tx: tx.update(g, s, p, lr_scale=1.0, momentum=0.95))
        name = "optimizer (Muon NS " + dt + " + Adam)" + ("" if dt == cfg.optim.muon_ns_dtype else " [variant]")
        out[name] = (_thunk(upd, grads, st, params), 1)
    return out


def interleaved(thunks: dict, rounds: int) -> dict:
    for f in thunks.values():  # compile + warm-up
        f()
        f()
    times = {k: [] for k in thunks}
    for _ in range(rounds):
        for k, f in thunks.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def profile_case(name: str, rounds: int, variants: bool, sets=()) -> None:
    case = CASES[name]
    cfg = case.load(*sets)
    cfg = apply_overrides(cfg, [f"optim.muon_ns_dtype={resolve_dtypes(cfg, jax.default_backend()).muon_ns!r}"])
    B, T = case.batch, case.seq_len
    dtype = jnp.float32
    graphdef, params = nnx.split(build(cfg, dtype))
    tx = optim.build_optimizer(cfg.optim)
    step = make_train_step(graphdef, tx, donate=False)
    x, y = (jnp.asarray(a[None]) for a in random_batch(case, cfg.model.vocab_size))  # one micro-batch
    one, mom = jnp.float32(1.0), jnp.float32(0.95)
    opt_state = tx.init(params)
    compiled = step.lower(params, opt_state, x, y, one, mom, None).compile()
    hlo_flops = (compiled.cost_analysis() or {}).get("flops", float("nan"))
    loss = lambda p: jnp.mean(nnx.merge(graphdef, p)(x[0], y[0]))
    fwd_bwd = _compile(jax.value_and_grad(loss), params)
    data = _data_feed_thunk(cfg, B, T)
    thunks = {"FULL train step": (_thunk(compiled, params, opt_state, x, y, one, mom, None), 1),
              "FULL fwd+bwd": (_thunk(fwd_bwd, params), 1)}
    if variants:
        thunks["FULL train step, before paths"] = (_thunk(_compile(
            step, params, opt_state, x, y, one, mom, None, before=True), params, opt_state, x, y, one, mom, None), 1)
    thunks.update(_families(cfg, B, T, variants, dtype))
    thunks.update(_optimizer_thunks(cfg, params, variants))
    thunks["data feed (numpy batch + device_put)"] = (data, 1)
    med = interleaved({k: f for k, (f, _) in thunks.items()}, rounds)
    step_s = med["FULL train step"]
    fpt = cfg.model.flops_per_token(T)
    print(f"\n== {case.describe(cfg)}, float32, {rounds} interleaved rounds (median); "
          f"ns_dtype={cfg.optim.muon_ns_dtype}")
    print(f"   FLOPs/step: flops_per_token x tokens = {fpt * B * T / 1e9:.2f} G; "
          f"HLO cost analysis of the compiled step = {hlo_flops / 1e9:.2f} G")
    print(f"   {'op family (fwd+bwd)':42s} {'calls':>5s} {'ms/call':>9s} {'ms/step':>9s} {'% of step':>9s}")
    accounted = 0.0
    for k, (_, calls) in thunks.items():
        tot = med[k] * calls
        if not k.startswith(("FULL", " ")) and "variant" not in k:
            accounted += tot
        print(f"   {k:42s} {calls:5d} {med[k] * 1e3:9.2f} {tot * 1e3:9.2f} {tot / step_s:9.1%}")
    print(f"   {'sum of families (excl. variants)':42s} {'':5s} {'':9s} {accounted * 1e3:9.2f} {accounted / step_s:9.1%}")
    print(f"   step {step_s * 1e3:.1f} ms = {B * T / step_s:,.0f} tokens/s, {fpt * B * T / step_s / 1e9:.1f} GFLOP/s")


def _data_feed_thunk(cfg, B, T):
    r = np.random.default_rng(1)
    toks = r.integers(0, cfg.model.vocab_size, 4 * B * (T + 1) + 1).astype(np.uint16)

    def feed():
        start = int(r.integers(0, toks.size - B * T - 2))
        chunk = toks[start:start + B * T + 1].astype(np.int32)
        xb, yb = chunk[:-1].reshape(1, B, T), chunk[1:].reshape(1, B, T)
        return jax.block_until_ready((jax.device_put(xb), jax.device_put(yb)))

    return feed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=PROFILE_CASES)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--variants", action="store_true")
    p.add_argument("--set", action="append", default=[], help="config override, e.g. optim.muon_ns_dtype=float32")
    a = p.parse_args(argv)
    tune_allocator("auto")  # as the trainer (frontier_jax.run.host), before the backend starts
    ops.configure("auto")
    print(f"jax {jax.__version__} ({jax.default_backend()})")
    for name in a.cases:
        profile_case(name, a.rounds, a.variants, a.set)
    return 0


if __name__ == "__main__":
    sys.exit(main())
