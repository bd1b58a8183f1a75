"""Every kernel of kernels_nki.registry against its reference, on three runners with the same inputs:

- `emulator`: the project's NumPy emulator (CI, everywhere);
- `simulate`: AWS's CPU simulator `nki.simulate` (aws-neuron-sdk `nki/guides/nki_simulator.rst`,
  "nki.simulate() - Explicit API"; NEURON_PLATFORM_TARGET_OVERRIDE=trn1 selects NeuronCore-v2, "Target
  Platform"), where the Neuron SDK's `nki` is importable: marked `neuron`;
- `device`: a Neuron device through JAX, the training path (`--kernels strict`: each op's primitive
  lowered to its `@nki.jit` kernel): marked `neuron(device=True)`.

`tests/conftest.py` skips the `neuron` tests elsewhere with the reason. The inputs are the fp32 shapes of
the emulator tests (tests/test_kernels_<module>.py): ragged tiles, GQA, duplicate ids, a sparse bias
with S = 3 and none (S = 0, the kernel gets one stand-in source: frontier_jax.ops.dispatch), any-shape Adam,
a multi-tile Muon matrix. Each runner calls the kernel through `dispatch.kernel_call`, so the kernel
adapters are what is tested, as in training.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import KERNEL_TOL, assert_close_max
from frontier_jax import ops
from frontier_jax.ops import dispatch
from frontier_jax.ops import reference as ref
from frontier_jax.ops import experimental as _experimental  # noqa: F401 (declares the experimental kernels' ops)
from kernels_nki import registry

f32 = np.float32


def _rms(r):
    return (r.standard_normal((300, 512)).astype(f32) * 3 + 0.5,), {}


def _rope(r):
    cos, sin = ref.rope_tables(150, 64, 10000.0)
    return (r.standard_normal((2, 150, 3, 64)).astype(f32), cos, sin), {}


def _rope_gain(r):
    (x, cos, sin), _ = _rope(r)
    return (x, cos, sin, np.broadcast_to(r.standard_normal(3).astype(f32), (128, 3)).copy()), {}


def _norm_projection(r):
    return (r.standard_normal((200, 96)).astype(f32) * 3 + 0.5,
            (r.standard_normal((96, 80)) / np.sqrt(96)).astype(f32)), {}


def _projection(r):
    (x, w), _ = _norm_projection(r)
    return (x, w, r.standard_normal((200, 80)).astype(f32)), {}  # the residual


def _mix_norm_projection(skip):
    def make(r):
        (x, w), _ = _norm_projection(r)
        N, I = x.shape
        mix = (1 + r.standard_normal((2, I)) / 2).astype(f32)
        return (x, r.standard_normal((N, I)).astype(f32), mix, w, r.standard_normal((N, I if skip else 0)).astype(f32),
                (1 + r.standard_normal((1, I if skip else 0)) / 2).astype(f32)), {"widths": (40, 20, 20)}
    return make


def _attention(r):
    B, T, H, G, K = 1, 200, 2, 1, 32
    return tuple(r.standard_normal(s).astype(f32) for s in ((B, T, H, K), (B, T, G, K), (B, T, G, K))), {}


def _qk_attention(r):
    (q, k, v), _ = _attention(r)
    cos, sin = ref.rope_tables(q.shape[1], q.shape[3], 10000.0)
    g_PH = np.broadcast_to(1.5 + 0.3 * r.standard_normal(q.shape[2]).astype(f32), (128, q.shape[2])).copy()
    return (q * 2, k, v, cos, sin, g_PH), {}


def _mlp(r):
    N, D, F = 300, 64, 128
    return (r.standard_normal((N, D)).astype(f32), (r.standard_normal((D, F)) / np.sqrt(D)).astype(f32),
            (r.standard_normal((F, D)) / np.sqrt(F)).astype(f32)), {}


def _embed(r):
    N, V, D = 333, 260, 48
    return ((r.integers(0, 5, N) * (V // 5)).astype(np.int32), r.standard_normal((V, D)).astype(f32)), {}


def _head_loss(S):
    def make(r):
        N, D, V = 150, 64, 256
        return (r.standard_normal((N, D)).astype(f32), (r.standard_normal((V, D)) * 0.3).astype(f32),
                r.integers(0, V, (N, 1)).astype(np.int32), r.integers(0, V, (N, S)).astype(np.int32),
                r.standard_normal((N, S)).astype(f32)), {"softcap": 30.0}
    return make


def _adam(r):
    p, g, m = (r.standard_normal((3, 100)).astype(f32) for _ in range(3))
    v = np.abs(r.standard_normal((3, 100))).astype(f32)
    t = 3
    scal = np.asarray(ops.scalars_PK(0.05 * 0.7, 1 - 0.9 ** t, 1 - 0.95 ** t, 0.0))
    return (p, g, m, v, scal), {"b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1}


def _muon(r):
    p, g, b = (r.standard_normal((200, 136)).astype(f32) for _ in range(3))
    return (p, g, b, np.asarray(ops.scalars_PK(0.04 * 0.8, 0.9))), {"ns_steps": 5, "ns_dtype": "float32"}


# op -> (forward inputs, index of the forward outputs the backward takes as residuals[, the outputs with a
# cotangent, default the first]); the backward's operands are the forward's inputs, those residuals and one
# cotangent shaped like each output with one.
CASES = {
    "rms_norm": (_rms, slice(1, None)),
    "rope": (_rope, None),  # backward: (dy, cos, sin)
    "rope_gain": (_rope_gain, slice(1, None)),  # backward: (x, cos, sin, g, dy)
    "causal_attention": (_attention, slice(0, None)),
    # backward: (q, k, v, cos, sin, g, o, lse, qg, qinv, kr, kinv, qgT, krT, do)
    "qk_attention": (_qk_attention, slice(0, None)),
    "norm_mlp": (_mlp, slice(1, None)),  # backward: (x, w_fc, w_proj, inv, rT, dy)
    "embed": (_embed, slice(1, None)),
    "head_loss": (_head_loss(3), slice(1, None)),
    "head_loss/no-bias": (_head_loss(0), slice(1, None)),
    "projection": (_projection, slice(1, None)),  # backward: (x, w, dy): the residual's cotangent is dy
    "norm_projection": (_norm_projection, slice(1, None)),  # backward: (x, w, inv, dy)
    # backward: (x_in, x0, mix, w, skip, sw, inv, dx of x, dq, dk, dv); no skip: width 0, the kernel gets None
    "mix_norm_projection": (_mix_norm_projection(False), slice(4, None), (0, 1, 2, 3)),
    "mix_norm_projection/skip": (_mix_norm_projection(True), slice(4, None), (0, 1, 2, 3)),
    "adam_update": (_adam, None),
    "muon_update": (_muon, None),
}
RUNS = [(case, which) for case in CASES for which in ("fwd", "bwd")
        if getattr(registry.KERNELS[case.split("/")[0]], which)]


def _arrays(case: str, which: str):
    op = case.split("/")[0]
    spec = dispatch.SPECS[op]
    make, saved, with_cot = (*CASES[case], (0,))[:3]
    r = np.random.default_rng(len(case))
    inputs, static = make(r)
    if which == "fwd":
        return op, inputs, static
    outs = [np.asarray(o) for o in jax.jit(lambda *a: spec.refs["fwd"](*a, **static))(*inputs)]
    forward_only = spec.vjp.forward_only.replace(",", " ").split() if spec.vjp else []
    static = {k: v for k, v in static.items() if k not in forward_only}  # what the backward takes
    cots = tuple(r.standard_normal(outs[i].shape).astype(outs[i].dtype) for i in with_cot)
    if op == "rope":
        return op, (*cots, *inputs[1:]), static
    if op == "projection":  # the residual r is no backward operand (ops.py passes dy through as dr)
        return op, (*inputs[:2], *cots), static
    return op, (*inputs, *outs[saved], *cots), static


def _reference(op, which, arrays, static):
    return [np.asarray(o) for o in jax.jit(lambda *a: dispatch.SPECS[op].refs[which](*a, **static))(*arrays)]


def _check(op, got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert np.shape(a) == b.shape
        assert_close_max(a, b, KERNEL_TOL["float32"])


@pytest.mark.parametrize("case,which", RUNS)
def test_emulator(case, which):
    op, arrays, static = _arrays(case, which)
    kernel = getattr(registry.load_emulated(op), getattr(registry.KERNELS[op], which))
    got = dispatch.kernel_call(dispatch.SPECS[op], which, kernel, arrays, static)
    _check(op, got, _reference(op, which, arrays, static))


@pytest.mark.neuron
@pytest.mark.parametrize("case,which", RUNS)
def test_nki_simulate(case, which, monkeypatch):
    import nki

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")  # NeuronCore-v2 (nki_simulator.rst)
    op, arrays, static = _arrays(case, which)
    kernel = getattr(registry.load_nki(op), getattr(registry.KERNELS[op], which))
    got = dispatch.kernel_call(dispatch.SPECS[op], which, nki.simulate(kernel), arrays, static)
    _check(op, got, _reference(op, which, arrays, static))


@pytest.mark.neuron(device=True)
@pytest.mark.parametrize("case,which", RUNS)
def test_neuron_device(case, which):
    op, arrays, static = _arrays(case, which)
    with jax.default_device(jax.devices("cpu")[0]):
        want = _reference(op, which, arrays, static)
    rows = {r.op: r for r in ops.configure("strict")}  # raises unless every op lowers to its NKI kernel
    try:
        assert rows[op].impl == "nki"
        got = jax.jit(lambda *a: dispatch.SPECS[op](which, *a, **static))(*map(jnp.asarray, arrays))
        _check(op, [np.asarray(g) for g in got], want)
    finally:
        ops.configure("auto")
