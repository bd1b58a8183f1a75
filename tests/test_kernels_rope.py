"""The RoPE NKI kernels (under the emulator) against frontier_jax.reference.rope, forward and backward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from conftest import KERNEL_TOL as TOL
from conftest import assert_close_max as _assert_close
from frontier_jax import ops
from frontier_jax import reference as ref
from kernels_nki import emulator, registry



@pytest.fixture(scope="module")
def kernels():
    return registry.load_emulated("rope")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(2, 150, 3, 64), (1, 37, 2, 16)])  # T not a multiple of 128
def test_forward_and_backward_match_reference(kernels, shape, dtype):
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np_dtype)
    dy = rng.standard_normal(shape).astype(np_dtype)
    cos, sin = ref.rope_tables(shape[1], shape[3], 10000.0)
    c, s = cos.astype(np_dtype), sin.astype(np_dtype)  # ops casts the host tables to x's dtype
    x32, c32, s32 = (a.astype(np.float32) for a in (x, c, s))
    y_ref, vjp = jax.vjp(lambda x: ref.rope(x, c32, s32), jnp.asarray(x32))
    y = kernels.rope_fwd(x, c, s)
    assert y.dtype == np_dtype
    _assert_close(y, y_ref, TOL[dtype])
    _assert_close(kernels.rope_bwd(dy, c, s), vjp(jnp.asarray(dy.astype(np.float32)))[0], TOL[dtype])


def test_cos_sin_loaded_once_per_sequence_tile(kernels):
    """cos/sin rows are fetched once per T tile and reused across the batch: DMA = x in + y out + tables."""
    B, T, H, K = 8, 200, 4, 64
    c = emulator.count(kernels.rope_fwd, ((B, T, H, K), "bfloat16"), ((T, K // 2), "bfloat16"), ((T, K // 2), "bfloat16"))
    assert c.dma_bytes == 2 * B * T * H * K * 2 + 2 * H * T * (K // 2) * 2
    assert c.pe_macs_issued == 0


@pytest.mark.parametrize("dtype", [jnp.bfloat16])  # fp32 is covered kernel-level above
def test_op_routed_through_emulated_kernel_matches_reference(dtype):
    x = jax.random.normal(jax.random.key(0), (2, 70, 4, 32), jnp.float32).astype(dtype)
    cos, sin = ref.rope_tables(70, 32, 10000.0)
    w = jax.random.normal(jax.random.key(1), (32,), jnp.float32).astype(dtype)
    loss = lambda f: lambda x: jnp.sum((f(x, cos, sin) * w).astype(jnp.float32) ** 2)
    run = lambda f: jax.jit(lambda x: (f(x, cos, sin), jax.grad(loss(f))(x)))(x)
    y_ref, g_ref = run(ref.rope)
    with ops.emulated(["rope"]):
        y_emu, g_emu = run(ops.rope)
    tol = TOL["bfloat16" if dtype == jnp.bfloat16 else "float32"]
    _assert_close(y_emu, y_ref, tol)
    _assert_close(g_emu, g_ref, tol)
