"""The fused head + softcap + cross-entropy NKI kernels (under the emulator), with and without a sparse bias."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from helpers import KERNEL_TOL as TOL
from helpers import assert_close_max as _assert_close
from frontier_jax import ops
from frontier_jax.ops import reference as ref
from kernels_nki import emulator, registry



@pytest.fixture(scope="module")
def kernels():
    return registry.load_emulated("head_loss")


def _case(N, D, V, S, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D)).astype(dtype)
    emb = (rng.standard_normal((V, D)) * 0.3).astype(dtype)
    tg = rng.integers(0, V, N).astype(np.int32)
    ids = rng.integers(0, V, (N, S)).astype(np.int32)  # a miss is a 0 value (ngram.bias), ids stay in [0, V)
    vals = (rng.standard_normal((N, S)) * 2).astype(np.float32)
    if S >= 3:
        ids[:, 1] = ids[:, 0]  # two sources voting for the same token
        ids[: N // 2, 2] = tg[: N // 2]  # and the bias hitting the target
    return x, emb, tg, ids, vals


@pytest.mark.parametrize("dtype,N,D,V,S", [
    ("float32", 150, 64, 256, 0), ("float32", 150, 64, 256, 3), ("float32", 130, 160, 1024, 0),
    ("float32", 40, 32, 8192, 3), ("bfloat16", 130, 64, 1024, 2)])
def test_loss_and_gradients_match_reference(kernels, dtype, N, D, V, S):
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    x, emb, tg, ids, vals = _case(N, D, V, S, np_dtype, N + V + S)
    f32 = lambda a: jnp.asarray(np.asarray(a).astype(np.float32))
    bias = (jnp.asarray(ids), None) if S else (None, None)
    fn = lambda x, e, v: ref.head_loss(x, e, jnp.asarray(tg), 30.0, bias[0], v if S else None)
    loss_ref, vjp = jax.vjp(fn, f32(x), f32(emb), f32(vals))
    b_ids, b_vals = (ids, vals) if S else (None, None)  # no bias: None, never a zero-size [N, 0] tensor
    loss, lse = kernels.head_loss_fwd(x, emb, tg[:, None], b_ids, b_vals, softcap=30.0)
    assert loss.shape == (N, 1) and loss.dtype == np.float32
    _assert_close(loss[:, 0], loss_ref, TOL[dtype])  # the loss equals the reference cross-entropy
    g = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    got = kernels.head_loss_bwd(x, emb, tg[:, None], b_ids, b_vals, lse, g[:, None], softcap=30.0)
    want = vjp(jnp.asarray(g))
    assert len(got) == (3 if S else 2) and got[0].dtype == got[1].dtype == np_dtype
    for a, b in zip(got, want):
        _assert_close(a, b, TOL[dtype])


def test_counts_at_baseline_shapes_no_logits_in_hbm(kernels):
    """At the baseline's shapes the backward is TensorE-bound and the forward's TensorE time is within 1% of its
    ScalarE time (tanh over the vocabulary), its bound; every x^T block, dz^T block and emb^T block is a
    TensorE transpose (VectorE 32 x 32 transposes pay their per-instruction overhead in the schedule, more than
    the TensorE time they save), a matmul against the identity on two 64-row tiles of the PE array
    (`kernels_nki.tiles.transpose_to_psum`), so TensorE issues exactly the useful MACs plus 128^3 / 2 per
    transposed block; the [N, V] logits never reach HBM; the target logit is one GpSimd gather per token tile
    (and the identity one GpSimd select per call)."""
    N, D, V = 65536, 512, 1024
    ins = (((N, D), "bfloat16"), ((V, D), "bfloat16"), ((N, 1), "int32"), None, None)
    fwd = emulator.count(kernels.head_loss_fwd, *ins, softcap=30.0)
    bwd = emulator.count(kernels.head_loss_bwd, *ins, ((N, 1), "float32"), ((N, 1), "float32"), softcap=30.0)
    block, emb_blocks = 128 ** 3 // 2, (V // 128) * (D // 128)
    assert fwd.pe_macs_useful == N * D * V and bwd.pe_macs_useful == 3 * N * D * V  # bwd: z recomputed, dx, demb
    assert fwd.pe_macs_issued - fwd.pe_macs_useful == block * ((N // 128) * (D // 128) + emb_blocks)
    assert bwd.pe_macs_issued - bwd.pe_macs_useful == block * ((N // 128) * (D // 128 + V // 128) + emb_blocks)
    est = emulator.estimate(fwd)
    assert est.engine_s["tensor"] >= 0.99 * est.total_s and emulator.estimate(bwd).bound == "tensor"
    assert fwd.gpsimd_instructions == N // 128 + 1  # a gather per token tile, the identity (no iota)
    assert fwd.dma_bytes == N * D * 2 + V * D * 2 + 4 * N + 8 * N  # x, emb, targets in; loss, lse out


@pytest.mark.parametrize("S", [0, 3])
def test_max_shifted_log_sum_exp_when_the_fixed_shift_is_out_of_range(kernels, S):
    """softcap 40 at V = 1024: (V + S) e^40 > 2^64, so the kernel shifts by the row's max logit (softcap
    max t, or a biased logit) instead of by max(0, biased logits); large logits, the loss still matches."""
    x, emb, tg, ids, vals = _case(130, 64, 1024, S, np.float32, 5)
    x = x * 8.0  # |z| up to ~40: logits near +-softcap
    bias = (jnp.asarray(ids), jnp.asarray(vals)) if S else (None, None)
    loss_ref = ref.head_loss(jnp.asarray(x), jnp.asarray(emb), jnp.asarray(tg), 40.0, *bias)
    b = (ids, vals) if S else (None, None)
    loss, lse = kernels.head_loss_fwd(x, emb, tg[:, None], *b, softcap=40.0)
    _assert_close(loss[:, 0], loss_ref, TOL["float32"])


def test_negative_bias_on_the_leading_logit(kernels):
    """The biased ids enter the log-sum-exp as corrections exp(L - m) - exp(softcap t - m) to the unbiased
    sum: a negative bias (-6) on each token's leading logit still matches the dense reference in fp32."""
    N, D, V, S = 130, 64, 256, 2
    x, emb, tg, ids, vals = _case(N, D, V, S, np.float32, 9)
    z = x @ emb.T
    lead = z.argmax(1).astype(np.int32)
    ids[:, 0], ids[:, 1] = lead, lead  # both sources on the leading token (a duplicate)
    vals[:, 0], vals[:, 1] = -4.0, -2.0
    loss_ref = ref.head_loss(jnp.asarray(x), jnp.asarray(emb), jnp.asarray(tg), 30.0, jnp.asarray(ids),
                             jnp.asarray(vals))
    loss, _ = kernels.head_loss_fwd(x, emb, tg[:, None], ids, vals, softcap=30.0)
    _assert_close(loss[:, 0], loss_ref, TOL["float32"])


def test_zero_size_bias_is_rejected_and_none_means_no_bias(kernels):
    """AWS documents no zero-size tensor, so the emulator rejects an [N, 0] bias; None is the no-bias form."""
    x, emb, tg, ids, vals = _case(20, 32, 256, 0, np.float32, 2)
    with pytest.raises(emulator.NkiRuleError, match="tensor.zero_size"):
        kernels.head_loss_fwd(x, emb, tg[:, None], ids, vals, softcap=30.0)
    loss, _ = kernels.head_loss_fwd(x, emb, tg[:, None], None, None, softcap=30.0)
    assert np.isfinite(loss).all()


@pytest.mark.parametrize("with_bias", [False, True])
def test_op_routed_through_emulated_kernel_matches_reference(with_bias):
    x, emb, tg, ids, vals = _case(70, 32, 256, 3, np.float32, 1)
    x, emb, vals = jnp.asarray(x), jnp.asarray(emb), jnp.asarray(vals)
    b_ids = jnp.asarray(ids) if with_bias else None
    f = lambda op: jax.jit(jax.value_and_grad(
        lambda x, e, v: jnp.sum(op(x, e, jnp.asarray(tg), 30.0, b_ids, v if with_bias else None) ** 2),
        argnums=(0, 1, 2)))
    v_ref, g_ref = f(ref.head_loss)(x, emb, vals)
    with ops.emulated(["head_loss"]):
        v_emu, g_emu = f(ops.head_loss)(x, emb, vals)
    _assert_close(v_emu, v_ref, 1e-5)
    for a, b in zip(g_emu, g_ref):
        _assert_close(a, b, 1e-5)
