"""frontier_jax.steps: the per-device (shard_map) train / eval / optimizer steps.

With every op routed through the NumPy emulator of its NKI kernel (as on Neuron, a kernel call per op),
one train step on a 4-device mesh with ZeRO-1 state and the fused optimizer kernels finishes, each
kernel call sees a quarter of the rows it sees on one device, and the loss, the gradient norm, the
gradients (Adam's first moment after one step is (1 - b1) g) and the updated parameters equal the
1-device step's; the eval sums equal too; so for configs/record11_tiny.py's model (the record's switches in the
kernels). The qk_attention forward is chosen at trace time."""

from __future__ import annotations

from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_config
from frontier_jax.ops import dispatch
from frontier_jax import trainer, ops, optim
from frontier_jax.data.tokenizer import ByteTables
from frontier_jax.parallel import make_data_parallel
from frontier_jax.policies import dtypes
from frontier_jax.steps import make_eval_step, make_train_step, q_gains

EMULATED = ops.OPS  # every op a training run calls


@pytest.fixture
def calls(monkeypatch):
    """(op, direction) -> the first operand's shape of every kernel call the emulator runs."""
    seen = defaultdict(list)
    real = dispatch.kernel_call

    def record(spec, which, kernel, arrays, static):
        seen[(spec.name, which)].append(tuple(np.shape(arrays[0])))
        return real(spec, which, kernel, arrays, static)

    monkeypatch.setattr(dispatch, "kernel_call", record)
    return seen


def _one_step(cfg, n, x, y):
    dp = make_data_parallel(n, zero1=True)
    tx = optim.build_optimizer(cfg.optim)
    graphdef, params, opt_state, _ = trainer.init_state(cfg, tx, jnp.float32, dp)
    step = make_train_step(graphdef, tx, mesh=dp.mesh, state_specs=dp.state_specs(opt_state),
                           head_dim=cfg.model.head_dim, donate=False)
    lr, mom = (jax.device_put(jnp.float32(v), dp.replicated) for v in (1.0, 0.9))
    p, s, m = step(params, opt_state, dp.put_batch(x, 1), dp.put_batch(y, 1), lr, mom, None)
    V = cfg.model.vocab_size
    tables = ByteTables(np.ones(V, np.int32), np.zeros(V, bool), np.zeros(V, bool))
    ev = make_eval_step(graphdef, tables, mesh=dp.mesh)(p, dp.put_batch(x[0]), dp.put_batch(y[0]),
                                                        dp.put_batch(np.ones_like(x[0])), None)
    return jax.device_get((p, s, m, ev)), [leaf.sharding.spec for leaf in jax.tree_util.tree_leaves(opt_state)]


def _record11_tiny(byte_data):
    """configs/record11_tiny.py (the record's switches: LeakyReLU(0.5)^2, XSA on the last 2 layers, partial RoPE,
    LN scale, BigramHash, SmearGate, value embeddings) in fp32 (its tables and Muon's momentum too: bf16 gradients
    summed per device round apart from one device's sum) at sequences of 64, one micro-batch (the tiny case runs
    two); the optax optimizers (the fused updates' kernels are the tiny case's)."""
    from helpers import REPO
    from frontier_jax.config import apply_overrides, load_config

    return apply_overrides(load_config(REPO / "configs" / "record11_tiny.py"), [
        f"data.data_dir={str(byte_data)!r}", "data.tokenizer='bytes'", "model.compute_dtype='float32'",
        "train.seq_len=64", "train.tokens_per_step=256", "train.micro_batch_seqs=4", "parallel.num_devices=1",
        "train.measure_peak=False", "optim.fused=False", "optim.muon_ns_dtype='float32'",
        "model.embed_dtype='compute'", "optim.muon_momentum_dtype='float32'"])


@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny", "record11_tiny"])
def test_emulated_kernels_on_four_devices_equal_one_device(byte_data, calls, config):
    if config == "tiny":
        cfg = tiny_config(byte_data, "model.model_dim=128", "model.num_heads=2", "model.num_kv_heads=1",
                          "train.seq_len=128", "optim.fused=True", "optim.muon_ns_dtype='float32'")
        emulated = EMULATED
    else:
        cfg, emulated = _record11_tiny(byte_data), tuple(op for op in EMULATED if op not in ops.FUSED_OPTIMIZER_OPS)
    rng = np.random.default_rng(0)
    micro = 2 if config == "tiny" else 1  # micro-batches of 4 sequences (1 per device)
    x = rng.integers(0, 256, (micro, 4, cfg.train.seq_len)).astype(np.int32)
    y = np.roll(x, -1, axis=2)
    with ops.emulated(emulated):
        one, _ = _one_step(cfg, 1, x, y)
        rows_one = {k: sorted(v) for k, v in calls.items()}
        calls.clear()
        four, specs = _one_step(cfg, 4, x, y)
        rows_four = {k: v for k, v in calls.items()}
    assert any("data" in spec for spec in specs)  # ZeRO-1: some state sharded over the 4 devices
    per_token = {k for k in rows_one if k[0] not in ops.FUSED_OPTIMIZER_OPS}
    assert {op for op, _ in rows_one} == set(emulated)  # every op ran its emulated kernel
    for key in per_token:  # each device's call: a quarter of the rows, four times as many calls
        assert len(rows_four[key]) == 4 * len(rows_one[key])
        assert {s[0] * 4 for s in rows_four[key]} == {s[0] for s in rows_one[key]}, key
    for key in set(rows_one) - per_token:  # the update: every device on the whole (gathered) parameter
        assert sorted(rows_four[key]) == sorted(rows_one[key] * 4)
    (p1, s1, m1, e1), (p4, s4, m4, e4) = one, four
    np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-5)
    np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-4)
    np.testing.assert_allclose(m4["score_bound"], m1["score_bound"], rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(s4), jax.tree_util.tree_leaves(s1)):  # Adam's moments ((1 - b1) g,
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)  # (1 - b2) g^2), Muon's buffers (g), the counts
    for a, b in zip(jax.tree_util.tree_leaves(p4), jax.tree_util.tree_leaves(p1)):  # Adam's first step is
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-4)  # lr * g / (|g| + eps): ~sign(g) where g ~ eps
    np.testing.assert_allclose(e4[0], e1[0], rtol=1e-5)
    assert int(e4[1]) == int(e1[1]) == x[0].size and int(e4[2]) == int(e1[2])


def test_score_bound_metric_is_the_updated_gains_bound(byte_data):
    """The train step returns ops.score_bound of the gains after its update: the next step's choice."""
    cfg = tiny_config(byte_data)
    dp = make_data_parallel(1)
    tx = optim.build_optimizer(cfg.optim, dtypes.resolve(cfg, jax.default_backend()).muon_ns)
    graphdef, params, opt_state, _ = trainer.init_state(cfg, tx, jnp.float32, dp)
    step = make_train_step(graphdef, tx, mesh=dp.mesh, head_dim=cfg.model.head_dim, donate=False)
    x = np.random.default_rng(0).integers(0, 256, (1, 4, cfg.train.seq_len)).astype(np.int32)
    p, s = params, opt_state
    for _ in range(2):  # the zero-initialised output projections give the gains no gradient in step 1
        p, s, m = step(p, s, x, np.roll(x, -1, axis=2), jnp.float32(1.0), jnp.float32(0.9), None)
    want = ops.score_bound([np.asarray(g) for g in q_gains(p)], cfg.model.head_dim)
    assert float(m["score_bound"]) == pytest.approx(float(want), rel=1e-6)
    assert float(m["score_bound"]) != pytest.approx(float(ops.score_bound(q_gains(params), cfg.model.head_dim)))


def test_late_qat_flag_is_traced_and_fake_quantizes_the_side_projections(byte_data):
    """The late-QAT flag is a runtime argument: switching it on does not recompile the step (one compiled program
    for both values); on, the step's loss is the forward with BigramHash's and the value embeddings' projections
    replaced by their int6 grid values (reference.fake_int6, the record's per-output-row scale), off the plain one."""
    from flax import nnx

    from frontier_jax.ops import reference

    cfg = tiny_config(byte_data, "model.bigram_buckets=64", "model.bigram_dim=32", "model.ve_layers=(1,)",
                      "model.ve_dim=16", "optim.late_qat_threshold=0.15")
    dp = make_data_parallel(1)
    tx = optim.build_optimizer(cfg.optim, dtypes.resolve(cfg, jax.default_backend()).muon_ns)
    graphdef, params, opt_state, _ = trainer.init_state(cfg, tx, jnp.float32, dp)
    # away from the init, whose zero output projections and BigramHash table hide both projections from the loss
    rng = np.random.default_rng(0)  # (NumPy: JAX's random draws for every leaf compile for seconds)
    params = jax.tree_util.tree_map(lambda p: p + (0.1 * rng.standard_normal(p.shape)).astype(p.dtype), params)
    step = make_train_step(graphdef, tx, mesh=dp.mesh, donate=False, late_qat=True)
    x = np.random.default_rng(1).integers(0, 256, (1, 4, cfg.train.seq_len)).astype(np.int32)
    y = np.roll(x, -1, axis=2)
    losses = {}
    for flag in (False, True, False):
        _, _, m = step(params, opt_state, x, y, jnp.float32(0.1), jnp.float32(0.9), None, jnp.bool_(flag))
        losses.setdefault(flag, float(m["loss"]))
    assert step._cache_size() == 1
    loss_of = jax.jit(lambda p: jnp.mean(nnx.merge(graphdef, p)(x[0], y[0])))  # the plain forward, compiled once
    plain = float(loss_of(params))
    model = nnx.merge(graphdef, params)
    for mod in (model.bigram, model.ve_shared):
        mod.proj[...] = reference.fake_int6(mod.proj[...], jnp.float32)
    quantized = float(loss_of(nnx.split(model)[1]))
    assert losses[False] == pytest.approx(plain, rel=1e-6) and losses[True] == pytest.approx(quantized, rel=1e-6)
    assert abs(quantized - plain) > 1e-4  # the grid moves the loss: the flag reached the projections


@pytest.mark.slow
def test_each_eval_window_starts_fresh(byte_data):
    """A window's sums depend neither on the rows beside it nor on what precedes it in the stream: each row of an
    eval batch starts at its own position 0 (the record's sliding windows too), so a batch scores as its rows
    scored one by one, and a window cut from the middle of the stream scores the same beside other rows."""
    cfg = tiny_config(byte_data)
    dp = make_data_parallel(1, zero1=False)
    tx = optim.build_optimizer(cfg.optim, "float32")
    graphdef, params, _, _ = trainer.init_state(cfg, tx, jnp.float32, dp)
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree_util.tree_leaves(params))))
    params = jax.tree_util.tree_map(lambda p: p + 0.05 * jax.random.normal(next(keys), p.shape, p.dtype), params)
    V, T = cfg.model.vocab_size, cfg.train.seq_len
    tables = ByteTables(np.ones(V, np.int32), np.zeros(V, bool), np.zeros(V, bool))
    ev = make_eval_step(graphdef, tables, mesh=dp.mesh)
    rng = np.random.default_rng(0)
    stream = rng.integers(0, V, 3 * T + 1).astype(np.int32)
    x = np.stack([stream[s:s + T] for s in (0, T // 2, 2 * T)])  # row 1: a window from the middle of the stream
    y = np.stack([stream[s + 1:s + T + 1] for s in (0, T // 2, 2 * T)])
    mask = np.ones_like(x)
    mask[1, : T // 4] = 0

    def sums(x, y, rows):
        m = np.zeros_like(mask)
        m[rows] = mask[rows]
        return np.asarray(jax.device_get(ev(params, x, y, m, None)), np.float64)

    together = sums(x, y, [0, 1, 2])
    assert together[0] == pytest.approx(sum(sums(x, y, [r])[0] for r in range(3)), rel=1e-6)
    assert together[1:].tolist() == [3 * T - T // 4, 3 * T - T // 4]
    other = rng.integers(0, V, x.shape).astype(np.int32)
    other[1], other_y = x[1], rng.integers(0, V, x.shape).astype(np.int32)
    other_y[1] = y[1]
    assert sums(other, other_y, [1])[0] == pytest.approx(sums(x, y, [1])[0], rel=1e-6)  # other neighbours
