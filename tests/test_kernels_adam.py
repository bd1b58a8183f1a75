"""The fused Adam(W) NKI kernel under the NumPy emulator against its pure-JAX reference (frontier_jax.ops.reference.adam_update)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from frontier_jax import ops
from frontier_jax.ops import reference as ref
from kernels_nki import emulator, registry

HP = dict(b1=0.9, b2=0.95, eps=1e-8)


@pytest.fixture(scope="module")
def kernel():
    return registry.load_emulated("adam_update").adam_update


def _inputs(n, dtype, seed=0, t=3):
    rng = np.random.default_rng(seed)
    p, g, m = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    v = (np.abs(rng.standard_normal(n)) * 0.1).astype(dtype)
    scal = np.asarray(ops.scalars_PK(0.05 * 0.7, 1 - 0.9 ** t, 1 - 0.95 ** t, 0.0))
    return p, g, m, v, scal


def _max_rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.mark.parametrize("n", [7, 384, 1000, 128 * 1100 + 5])  # tail only, exact, ragged, 2 chunks + tail
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fp32_matches_reference(kernel, n, weight_decay):
    args = _inputs(n, np.float32, seed=n)
    outs, _ = emulator.run(kernel, *args, weight_decay=weight_decay, **HP)
    refs = jax.jit(lambda *a: ref.adam_update(*a, weight_decay=weight_decay, **HP))(*args)
    p = args[0]
    # the parameter is compared through its update (p' - p), which is what the kernel computes
    assert _max_rel(outs[0] - p, np.asarray(refs[0]) - p) <= 1e-6
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype and _max_rel(o, r) <= 1e-6


def test_bf16_state_matches_reference(kernel):
    """bf16 parameter and moments (the tied embedding on trn1): fp32 math, one rounding per write."""
    args = _inputs(4096 + 3, ml_dtypes.bfloat16, seed=1)
    outs, _ = emulator.run(kernel, *args, **HP)
    refs = jax.jit(lambda *a: ref.adam_update(*a, weight_decay=0.0, **HP))(*args)
    for o, r in zip(outs, refs):
        assert o.dtype == ml_dtypes.bfloat16 and _max_rel(o, r) <= 2e-2


def test_zero_second_moment_stays_in_sqrt_range_and_matches_reference(kernel):
    """g = v = 0 (a parameter whose gradient is 0) makes v' = 0, outside ScalarE sqrt's valid input
    range: the kernel's 2^-116 sqrt bias keeps it inside and the update still equals the reference."""
    p, g, m, v, scal = _inputs(2 * 128 + 9, np.float32, seed=5)
    g[::3], v[::3] = 0.0, 0.0
    outs, _ = emulator.run(kernel, p, g, m, v, scal, **HP)
    refs = jax.jit(lambda *a: ref.adam_update(*a, weight_decay=0.0, **HP))(p, g, m, v, scal)
    assert np.all(outs[2][::3] == 0.0)
    for o, r in zip(outs, refs):
        assert np.isfinite(o).all() and _max_rel(o, r) <= 1e-6
    assert _max_rel(outs[0][::3] - p[::3], np.asarray(refs[0])[::3] - p[::3]) <= 1e-6


def test_weight_decay_alone_shrinks_by_one_minus_lr_wd(kernel):
    """g = m = v = 0 (a fresh state, zero gradient): the Adam update is 0 and p' = p (1 - lr wd)."""
    p, g, m, v, scal = _inputs(2 * 128 + 9, np.float32, seed=9, t=1)
    g[:], m[:], v[:] = 0.0, 0.0, 0.0
    (p2, m2, v2), _ = emulator.run(kernel, p, g, m, v, scal, weight_decay=0.04, **HP)
    np.testing.assert_allclose(p2, p * (1 - float(scal[0, 0]) * 0.04), rtol=1e-6)
    assert not m2.any() and not v2.any()


def test_moves_the_minimum_hbm_bytes(kernel):
    """p, g, m, v read once, p, m, v written once, plus the [128, 4] fp32 scalars: nothing else."""
    n = 1024 * 512
    for wd in (0.0, 0.04):  # weight decay reads nothing more (p is read anyway)
        c = emulator.count(kernel, *[((n,), "float32")] * 4, ((128, 4), "float32"), weight_decay=wd, **HP)
        assert c.dma_bytes == 7 * 4 * n + 128 * 4 * 4
    assert emulator.estimate(c).bound == "dma"


def test_primitive_emulated_equals_reference_path():
    args = [jnp.asarray(a) for a in _inputs(300, np.float32, seed=5)]
    args[0], args[1], args[2], args[3] = (a.reshape(3, 100) for a in args[:4])  # any shape: flattened inside
    f = jax.jit(lambda *a: ops.adam_update(*a, **HP))
    ref = f(*args)
    assert "frontier_adam_update" in str(jax.make_jaxpr(lambda *a: ops.adam_update(*a, **HP))(*args))
    with ops.emulated(["adam_update"]) as rows:
        assert {r.op: r.impl for r in rows}["adam_update"] == "emulated"
        emu = jax.jit(lambda *a: ops.adam_update(*a, **HP))(*args)
    for e, r in zip(emu, ref):
        assert e.shape == (3, 100) and _max_rel(e, r) <= 1e-6
