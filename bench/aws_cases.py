"""The cases `bench/aws_kernels.py` runs: AWS's kernels with inputs from their repository's own tests, NumPy ports
of their repository's references (`<kernel>_torch.py`) and the tests' tolerances.

Each case names the test it follows (aws-neuron/nki-library `test/integration/nkilib/core/...`). The inputs are
one shape of the test's fast list (small ones: the emulator computes in NumPy); the ports compute what the torch
reference computes, rounding where it rounds (a bf16 torch op rounds its result to bf16). OUT_OF_SCOPE names, per
kernel file that has no case, the documented feature it needs that the emulator's targets (trn1 = NeuronCore-v2,
trn2 = NeuronCore-v3 without LNC > 1 launches) do not run.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16


def bf(x):
    """Round to bf16 (as a torch bf16 op rounds its result), back to float32."""
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def f32(x):
    return np.asarray(x, np.float32)


@dataclasses.dataclass(frozen=True)
class Case:
    repo: str
    path: str  # under the repository's kernel tree
    kernel: str  # the @nki.jit function's name
    name: str
    inputs: Callable  # module -> (args, kwargs)
    reference: Callable  # (args, kwargs) -> output(s)
    rtol: float
    atol: float
    test: str  # the repository test the inputs and tolerance come from


def _gauss(seed, shape, dtype=np.float32, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


# ----------------------------------------------------------------------------- nki-library core kernels


def _cumsum_inputs(m):
    np.random.seed(42)
    return (np.random.randn(64, 4, 1024).astype(BF16),), {}


def _cascaded_max_inputs(m):
    np.random.seed(42)
    return (np.random.randn(8, 1, 3168).astype(np.float32),), {}


def _rope_inputs(m, contiguous=True):
    x = _gauss(1, (64, 2, 4, 16), BF16)
    cos, sin = _gauss(2, (32, 2, 16), BF16), _gauss(3, (32, 2, 16), BF16)
    return (x, cos, sin), dict(lnc_shard=True, contiguous_layout=contiguous, relayout_in_sbuf=False)


def _rope_ref(args, kw):
    """rope_torch.py: per (b, h), x [d, S] -> [S, d]; contiguous layout interleaves the halves first; bf16 ops."""
    x, cos, sin = (f32(a) for a in args)
    d, B, H, S = x.shape
    out = np.empty_like(x)
    for b in range(B):
        for h in range(H):
            t = x[:, b, h, :].T
            if kw["contiguous_layout"]:
                t = np.stack([t[:, : d // 2], t[:, d // 2:]], axis=-1).reshape(S, d)
            c, s = cos[:, b, :].T, sin[:, b, :].T
            xr, xi = t[:, 0::2], t[:, 1::2]
            o_r = bf(bf(xr * c) - bf(xi * s))
            o_i = bf(bf(xr * s) + bf(xi * c))
            o = np.stack([o_r, o_i], axis=-1).reshape(S, d)
            if kw["contiguous_layout"]:
                o = np.concatenate([o[:, 0::2], o[:, 1::2]], axis=1)
            out[:, b, h, :] = o.T
    return out


def _outproj_cte_inputs(m):
    B, S, H, N, D = 1, 128, 512, 2, 64  # the test's (1, 128, 3072, 16, 64) at a smaller H, N
    att = np.random.default_rng(4).random((B, N, D, S)).astype(BF16)
    w = np.random.default_rng(5).random((N * D, H)).astype(BF16)
    bias = _gauss(6, (1, H), BF16, 100.0)
    return (att, w, bias), {}


def _outproj_cte_ref(args, kw):
    att, w, bias = (f32(a) for a in args)
    B, N, D, S = att.shape
    x = att.transpose(0, 3, 1, 2).reshape(B, S, N * D)
    return bf(x @ w + bias)


CASES: tuple[Case, ...] = (
    Case("nki-library", "core/cumsum/cumsum.py", "cumsum", "cumsum bf16 [64,4,1024]", _cumsum_inputs,
         lambda a, kw: bf(np.cumsum(f32(a[0]), axis=-1)), 1e-2, 1e-3, "core/cumsum/test_cumsum.py fast list"),
    Case("nki-library", "core/max/cascaded_max.py", "cascaded_max", "cascaded_max f32 [8,1,3168]",
         _cascaded_max_inputs, lambda a, kw: (a[0].max(-1, keepdims=True), a[0].argmax(-1)[..., None].astype(np.int32)),
         1e-5, 1e-5, "core/max/test_cascaded_max.py unit list"),
    Case("nki-library", "core/embeddings/rope.py", "RoPE", "RoPE d64 contiguous", _rope_inputs, _rope_ref,
         2 ** -7, 1e-3, "core/embeddings/test_rope.py"),
    Case("nki-library", "core/embeddings/rope.py", "RoPE", "RoPE d64 interleaved",
         lambda m: _rope_inputs(m, contiguous=False), _rope_ref, 2 ** -7, 1e-3, "core/embeddings/test_rope.py"),
    Case("nki-library", "core/output_projection/output_projection_cte/output_projection_cte.py",
         "output_projection_cte", "output_projection_cte bf16", _outproj_cte_inputs, _outproj_cte_ref, 2e-2, 1e-5,
         "core/output_projection/test_output_proj_cte.py bf16 unit"),
)

OUT_OF_SCOPE: dict[tuple[str, str], str] = {}
