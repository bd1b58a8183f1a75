"""frontier_jax.neuron.kernel_calls: the step's kernel calls and the work between them, read off the traced step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from frontier_jax.neuron import kernel_calls as kc
from frontier_jax.config import apply_overrides, load_config

REPO = Path(__file__).resolve().parents[1]
SMALL = ["model.num_layers=2", "model.num_kv_heads=1", "model.model_dim=96", "model.num_heads=3"]


def small_config():
    cfg = apply_overrides(load_config(REPO / "configs" / "tiny.py"), SMALL)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_len=50, tokens_per_step=1200,
                                                              micro_batch_seqs=3))  # 2 micro-batches per core


@pytest.fixture(scope="module")
def traced():
    cfg = small_config()
    closed = kc.program(cfg)
    return cfg, closed, kc.kernel_calls(cfg, closed)


def test_every_kernel_call_with_its_multiplicity(traced):
    cfg, _, calls = traced
    B, M = kc.microbatches(cfg)
    L = cfg.model.num_layers
    assert (B, M) == (3, 4)
    per = {}
    for c in calls:
        per[(c.op, c.which)] = per.get((c.op, c.which), 0) + c.calls_per_step
    # per micro-batch: every block's attention, MLP and projections, the embedding, head and two plain norms
    assert per[("qk_attention", "fwd")] == per[("qk_attention", "bwd")] == L * M  # the bounded-shift forward only
    assert per[("norm_mlp", "fwd")] == per[("projection", "bwd")] == L * M
    assert per[("mix_norm_projection", "fwd")] == L * M
    assert per[("embed", "fwd")] == per[("head_loss", "bwd")] == M and per[("rms_norm", "fwd")] == 2 * M
    attn = next(c for c in calls if c.op == "qk_attention" and c.which == "fwd")
    assert attn.inputs[0] == ((B, 50, 3, 32), "bfloat16")
    assert dict(attn.constants) == {"exact_max": False, "xsa_on": False}  # the baseline's model: no XSA
    head = next(c for c in calls if c.op == "head_loss")
    assert head.inputs[3] is None and dict(head.constants)["softcap"] == cfg.model.logit_softcap  # no n-gram bias


def test_glue_fused_is_below_unfused(traced):
    """The glue's bytes and MACs of two programs counted by hand, then the traced step's: tanh(x @ w) * 2 with
    x [4, 8], w [8, 16] fp32 runs 3 equations and 4*8*16 MACs; unfused, each equation reads its inputs and writes
    its output (x, w, c; c, d; d, e: 128+512+256 + 256+256 + 256+256 bytes); fused, only x, w and the result
    cross HBM (128+512+256). A scan of length 3 counts its body 3 times."""
    import jax
    import jax.numpy as jnp

    f32 = lambda *shape: jnp.ones(shape, jnp.float32)
    g = kc.glue(None, jax.make_jaxpr(lambda x, w: jnp.tanh(x @ w) * 2.0)(f32(4, 8), f32(8, 16)))
    assert (g.fused_bytes, g.unfused_bytes, g.dot_macs, g.equations) == (896, 1920, 512, 3)
    body = lambda c, _, w: (jnp.tanh(c @ w), None)  # per step: e, d -> f (128+256+128), f -> g (128+128)
    scan = lambda x, w: jax.lax.scan(lambda c, _: body(c, _, w), x, None, length=3)[0]
    g = kc.glue(None, jax.make_jaxpr(scan)(f32(4, 8), f32(8, 8)))
    assert (g.fused_bytes, g.unfused_bytes, g.dot_macs, g.equations) == (3 * 512, 3 * 768, 3 * 4 * 8 * 8, 3 * 2)
    cfg, closed, _ = traced
    g = kc.glue(cfg, closed)
    assert 0 < g.fused_bytes < g.unfused_bytes and g.dot_macs > 0 and g.equations > 0
    assert g.named == {}  # the baseline's model runs none of the recipe's XLA computations


def test_glue_names_the_part_each_named_scope_runs():
    """The model's named XLA computations (model.RECIPE_XLA_OPS) priced apart: in tanh(x @ w) * 2 with the first two
    equations under jax.named_scope("bigram_hash"), that part is 2 equations, 4*8*16 MACs, unfused 128+512+256 +
    256+256 bytes, fused x and w (its result stays in the run); the totals are unchanged. Its gradient's equations
    (under "jvp(bigram_hash)" / "transpose(jvp(bigram_hash))") count too, and so do the equations of a jaxpr called
    under the name."""
    import jax
    import jax.numpy as jnp

    def f(x, w):
        with jax.named_scope("bigram_hash"):
            y = jnp.tanh(x @ w)
        return y * 2.0

    x, w = jnp.ones((4, 8), jnp.float32), jnp.ones((8, 16), jnp.float32)
    g = kc.glue(None, jax.make_jaxpr(f)(x, w))
    assert (g.fused_bytes, g.unfused_bytes, g.dot_macs, g.equations) == (896, 1920, 512, 3)
    assert g.named == {"bigram_hash": {"fused_bytes": 640, "unfused_bytes": 1408, "dot_macs": 512, "equations": 2}}
    grad = kc.glue(None, jax.make_jaxpr(jax.grad(lambda x, w: jnp.sum(f(x, w)), argnums=1))(x, w))
    assert grad.named["bigram_hash"]["dot_macs"] == 2 * 512 and grad.named["bigram_hash"]["equations"] > 2
    def under_jit(x, w):  # the scope's equations inside a jaxpr whose own equations carry no name: inherited
        with jax.named_scope("bigram_hash"):
            y = jax.jit(lambda a, b: jnp.tanh(a @ b))(x, w)
        return y * 2.0

    inner = kc.glue(None, jax.make_jaxpr(under_jit)(x, w))  # (the inner jaxpr's result leaves it: +256 fused)
    assert inner.named == {"bigram_hash": {"fused_bytes": 896, "unfused_bytes": 1408, "dot_macs": 512, "equations": 2}}
