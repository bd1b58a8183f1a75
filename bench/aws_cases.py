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
    rtol: float | tuple  # one per compared output, or one for all
    atol: float | tuple
    test: str  # the repository test the inputs and tolerance come from
    compare: str = "max"  # nki-library's maxAllClose (bench.aws_kernels.close); "allclose" for np.allclose
    target: str | None = None  # a fixed target (else the script's --target)
    outputs: tuple[int, ...] | None = None  # the kernel outputs the test validates (default: all)
    unpack: Callable | None = None  # (outputs, args) -> the arrays the test's validator compares


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


def _rope_hf_inputs(m, backward=False):
    np.random.seed(42)
    B, QH, KH, S, D = 1, 4, 2, 128, 64  # the test's (1, 32, 8, 256, 128, float32) at fewer heads, one tile
    q, k = np.random.randn(B, QH, S, D).astype(np.float32), np.random.randn(B, KH, S, D).astype(np.float32)
    cos, sin = np.random.randn(B, S, D).astype(np.float32), np.random.randn(B, S, D).astype(np.float32)
    return (q, k, np.zeros_like(q), np.zeros_like(k), cos, sin, None, backward), {}


def _rope_hf_ref(args, kw):
    """rope_hf_torch.py: x cos + rotate_half(x) sin (backward: x cos + rotate_half_backward(x sin))."""
    q, k, _, _, cos, sin, _, backward = args
    c, s = cos[:, None], sin[:, None]
    half = q.shape[-1] // 2
    rot = lambda x: np.concatenate([-x[..., half:], x[..., :half]], -1)  # noqa: E731
    rot_b = lambda x: np.concatenate([x[..., half:], -x[..., :half]], -1)  # noqa: E731
    f = (lambda x: x * c + rot_b(x * s)) if backward else (lambda x: x * c + rot(x) * s)
    return f(q), f(k)


def _attention_cte_inputs(m):
    rng = np.random.default_rng(0)
    bs, d, S = 1, 64, 256
    q, k = rng.random((bs, d, S)).astype(BF16), rng.random((bs, d, S)).astype(BF16)
    v = rng.random((bs, S, d)).astype(BF16)
    return (q, k, v), dict(scale=0.125, causal_mask=True, tp_q=False, tp_k=False, tp_out=False)


def _attention_cte_ref(args, kw):
    """attention_cte_torch.py without prior, sink, window or CP: softmax(scale q^T k, causal) v, fp32."""
    q, k, v = (f32(a) for a in args)
    s = kw["scale"] * np.einsum("bdq,bdk->bqk", q, k)
    S = s.shape[-1]
    s = np.where(np.tri(S, dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return bf((p / p.sum(-1, keepdims=True)) @ v)


def _outproj_tkg_inputs(m, bias=True):
    B, N, S, D, H = 4, 8, 4, 64, 3072  # the test's [4, 8, 4, 64, 3072, NONE, bias, transpose_out=False]
    rng = np.random.default_rng(0)
    att, w = rng.random((D, B, N, S)).astype(BF16), rng.random((D * N, H)).astype(BF16)
    b = (rng.standard_normal((1, H)) * 100).astype(BF16) if bias else None
    return (att, w, b), dict(TRANSPOSE_OUT=False, OUT_IN_SB=False)


def _outproj_tkg_ref(args, kw):
    """output_projection_tkg_torch.py: [D, B, N, S] -> [B*S, N*D] @ weight (+ bias), fp32."""
    att, w, b = args
    D, B, N, S = att.shape
    out = f32(att).transpose(1, 3, 2, 0).reshape(B * S, N * D) @ f32(w)
    return out + f32(b) if b is not None else out


def _qkv_inputs(m, B, S):
    """RMS-norm fused q/k/v projection; S > 96 or B*S > 128 selects qkv_cte, else qkv_tkg (qkv.py)."""
    rng = np.random.default_rng(0)
    H, I = 512, 384
    x = rng.standard_normal((B, S, H)).astype(BF16)
    w = (rng.standard_normal((H, I)) / np.sqrt(H)).astype(BF16)
    g = rng.standard_normal((1, H)).astype(BF16)
    return (x, w), dict(fused_norm_type=m.NormType.RMS_NORM, gamma_norm_weights=g, norm_eps=1e-6)


def _qkv_ref(args, kw):
    x, w = (f32(a) for a in args)
    n = x / np.sqrt((x * x).mean(-1, keepdims=True) + kw["norm_eps"]) * f32(kw["gamma_norm_weights"])
    return n @ w


def _softmax_rows(s):
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    return e / e.sum(-1, keepdims=True), (mx + np.log(e.sum(-1, keepdims=True)))[:, 0]


def _attention_bwd_inputs(m):
    """The test's generate_inputs (causal, softmax_scale 1.0, mixed precision) at B = H = 1, S = 256, d = 64: o and
    the log-sum-exp [B, H, 128, S / 128] from the forward (attention_bwd_torch.compute_o_lse)."""
    rng = np.random.default_rng(0)
    B, H, d, S = 1, 1, 64, 256
    q, k, v, dy = (rng.standard_normal((B, H, d, S)).astype(BF16) for _ in range(4))
    Q, K, V = (f32(x)[0, 0].T for x in (q, k, v))
    p, lse = _softmax_rows(np.where(np.tri(S, dtype=bool), Q @ K.T, -np.inf))
    o = (p @ V).T[None, None].astype(BF16)
    lse = lse.reshape(S // 128, 128).T[None, None].astype(np.float32)
    return (q, k, v, o, dy, lse), dict(use_causal_mask=True, mixed_precision=True, softmax_scale=1.0)


def _attention_bwd_ref(args, kw):
    """attention_bwd_torch.py's gradients of softmax(scale q^T k, causal) v, in fp32: dq, dk, dv [B, H, d, S]."""
    q, k, v, o, dy, _ = args
    Q, K, V, O, dO = (f32(x)[0, 0].T for x in (q, k, v, o, dy))
    scale, S = kw["softmax_scale"], Q.shape[0]
    p, _ = _softmax_rows(np.where(np.tri(S, dtype=bool), scale * Q @ K.T, -np.inf))
    ds = p * (dO @ V.T - (dO * O).sum(-1, keepdims=True))
    return tuple(g.T[None, None] for g in (scale * ds @ K, scale * ds.T @ Q, p.T @ dO))


_TOPK_MODULE = []


def _topk_inputs(m):
    """test_topk.py's input_generator at LNC 1: the config and its rotational constants built by the module's own
    host functions (create_topk_config, create_rotational_topk_config, prepare_rotational_constants)."""
    np.random.seed(42)
    B, S, V, K = 1, 4, 1024, 8
    inp = np.random.randn(B * S, V).astype(np.float32)
    tc = m.create_topk_config(inp_shape=(B, S, V), inp_dtype=np.float32, k=K, sorted=True, num_programs=1)
    x = inp.reshape(tc.BxS, tc.vocab_size)
    cfg = m.prepare_rotational_constants(m.create_rotational_topk_config(inp_shape=x.shape, topk_config=tc))
    _TOPK_MODULE[:] = [m]
    return (x, cfg), {}


def _topk_ref(args, kw):
    """topk_torch_ref values (torch.topk, sorted); the test validates values only (ties may reorder indices)."""
    for m in _TOPK_MODULE:
        m.cleanup_rotational_constants()
    x, cfg = args
    return -np.sort(-x, axis=1)[:, : cfg.topk_config.k]


def _rmsnorm_quant_inputs(m):
    """test_rmsnorm_quant.py: uniform(0, 10) bf16 hidden and gamma, row quantization, RMS norm, eps 1e-6."""
    rng = np.random.default_rng(0)
    B, S, H = 1, 128, 512
    x, g = rng.uniform(0, 10, (B, S, H)).astype(BF16), rng.uniform(0, 10, (H,)).astype(BF16)
    kargs = m.RmsNormQuantKernelArgs(quantization_type=m.QuantizationType.ROW, lower_bound=0.0,
                                     norm_type=m.NormType.RMS_NORM, eps=1e-6)
    return (x, g, kargs), {}


def _rmsnorm_quant_unpack(out, args):
    """The validator's split of the [B, S, H + 4] fp8 output: H fp8 values, then one fp32 dequant scale's bytes."""
    H = args[0].shape[-1]
    raw = np.ascontiguousarray(out).view(np.uint8).reshape(*out.shape[:-1], H + 4)
    values = raw[..., :H].view(ml_dtypes.float8_e4m3).astype(np.float32)
    return values, np.ascontiguousarray(raw[..., H:]).view(np.float32)


def _rmsnorm_quant_ref(args, kw):
    """The test's rmsnorm_quant_ref (row quantization, no lower bound): x / (rms + eps) * gamma, scaled to the
    fp8 range 240 by its row abs-max; returns (fp8 values as fp32, dequant scale)."""
    x, g = f32(args[0]), f32(args[1])
    norm = x / (np.sqrt((x * x).mean(-1, keepdims=True)) + args[2].eps) * g
    deq = np.abs(norm).max(-1, keepdims=True) / 240.0
    return (norm / deq).astype(ml_dtypes.float8_e4m3).astype(np.float32), deq.astype(np.float32)


def _matmul_inputs(m, M, K, N):
    """matrix_multiplication_torch.py: torch.rand bf16 lhs [M, K], rhs [K, N]; the kernels take lhs.T."""
    rng = np.random.default_rng(0)
    lhs, rhs = rng.random((M, K)).astype(BF16), rng.random((K, N)).astype(BF16)
    return (np.ascontiguousarray(lhs.T), rhs), {}


def _matmul_ref(args, kw):
    return bf(f32(args[0]).T @ f32(args[1]))


_SAMPLES_MM = "tutorials/matrix_multiplication/matrix_multiplication_nki_kernels.py"
_MM_TEST = "tutorials/matrix_multiplication/matrix_multiplication_torch.py (torch.allclose atol 1e-4, rtol 1e-2)"

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
    Case("nki-library", "core/embeddings/rope_hf.py", "rope_hf", "rope_hf f32 forward", _rope_hf_inputs,
         _rope_hf_ref, 1e-6, 1e-6, "core/embeddings/test_rope_hf.py"),
    Case("nki-library", "core/embeddings/rope_hf.py", "rope_hf", "rope_hf f32 backward",
         lambda m: _rope_hf_inputs(m, backward=True), _rope_hf_ref, 1e-6, 1e-6, "core/embeddings/test_rope_hf.py"),
    Case("nki-library", "core/attention/attention_cte.py", "attention_cte", "attention_cte bf16 causal d64",
         _attention_cte_inputs, _attention_cte_ref, 2e-2, 1e-5,
         "core/attention/test_attention_cte.py (relative_accuracy 2e-2, absolute 1e-5)"),
    Case("nki-library", "core/output_projection/output_projection_tkg.py", "output_projection_tkg",
         "output_projection_tkg bias", _outproj_tkg_inputs, _outproj_tkg_ref, 2e-2, 1e-5,
         "core/output_projection/test_output_proj_tkg.py"),
    Case("nki-library", "core/output_projection/output_projection_tkg.py", "output_projection_tkg",
         "output_projection_tkg no bias", lambda m: _outproj_tkg_inputs(m, bias=False), _outproj_tkg_ref, 2e-2,
         1e-5, "core/output_projection/test_output_proj_tkg.py"),
    Case("nki-library", "core/qkv/qkv.py", "qkv", "qkv rms_norm cte [1,128,512]", lambda m: _qkv_inputs(m, 1, 128),
         _qkv_ref, 2e-2, 1e-5, "core/qkv/test_qkv_cte.py (threshold (2e-2, 1e-5))"),
    Case("nki-library", "core/qkv/qkv.py", "qkv", "qkv rms_norm tkg [4,4,512]", lambda m: _qkv_inputs(m, 4, 4),
         _qkv_ref, 2e-2, 1e-5, "core/qkv/test_qkv_tkg.py"),
    Case("nki-library", "core/attention/attention_bwd.py", "attention_bwd", "attention_bwd bf16 causal",
         _attention_bwd_inputs, _attention_bwd_ref, 2e-2, 1e-5, "core/attention/test_attention_bwd.py"),
    Case("nki-library", "core/attention/attention_bwd.py", "attention_bwd", "attention_bwd bf16 causal (trn2)",
         _attention_bwd_inputs, _attention_bwd_ref, 2e-2, 1e-5, "core/attention/test_attention_bwd.py",
         target="trn2"),
    Case("nki-library", "core/topk/rotational_topk.py", "rotational_topk", "rotational_topk f32 k=8 V=1024",
         _topk_inputs, _topk_ref, 1e-3, 1e-5, "core/topk/test_topk.py (values validated)", outputs=(0,)),
    Case("nki-library", "core/rmsnorm/rmsnorm_quant.py", "rmsnorm_quant_kernel", "rmsnorm_quant row fp8",
         _rmsnorm_quant_inputs, _rmsnorm_quant_ref, (0.072, 0.007), (1e-8, 1e-8),
         "core/rmsnorm/test_rmsnorm_quant.py (norm_values_rtol 0.072, deq_scale_rtol 0.007, maxAllClose)",
         unpack=_rmsnorm_quant_unpack),
    # ------------------------------------------------------------------------- nki-samples
    Case("nki-samples", _SAMPLES_MM, "nki_matmul_basic_", "matmul basic [64,128]x[128,512]",
         lambda m: _matmul_inputs(m, 64, 128, 512), _matmul_ref, 1e-2, 1e-4, _MM_TEST, compare="allclose"),
    *(Case("nki-samples", _SAMPLES_MM, fn, f"{fn.strip('_')} [4096,1024]x[1024,2048]",
           lambda m: _matmul_inputs(m, 4096, 1024, 2048), _matmul_ref, 1e-2, 1e-4, _MM_TEST, compare="allclose")
      for fn in ("nki_matmul_tiled_", "nki_matmul_hoist_load_", "nki_matmul_block_free_dimension_",
                 "nki_matmul_fully_optimized_")),
)

_LNC2 = "its tests launch it at LNC 2 only (logical_nc_config=2: NeuronCore-v3+, release-notes NKI 0.4.0), which " \
    "the emulator does not run"
_MX = "MX matmuls (nisa.nc_matmul_mx / quantize_mx: 'Available only on NeuronCore-v4 and newer', nki/api/nki/isa); " \
    "its tests exclude trn1 and trn2"
OUT_OF_SCOPE: dict[tuple[str, str], str] = {
    ("nki-library", "core/moe/moe_cte/moe_cte.py"): "MoE CTE: every non-MX implementation is documented (TRN2) "
    "(moe_cte.py MoECTEImplementation) and " + _LNC2 + " (test_moe_cte.py BWMM_LNC2_TEST_CASES)",
    ("nki-library", "core/moe/moe_cte/bwmm_shard_on_I.py"): "shard_on_i / _hybrid / _dropping: documented (TRN2) in "
    "moe_cte.py; " + _LNC2,
    ("nki-library", "core/moe/moe_cte/bwmm_shard_on_block.py"): "shard_on_block: documented (TRN2) in moe_cte.py; "
    + _LNC2,
    ("nki-library", "core/moe/moe_cte/bwmm_shard_on_I_mx.py"): _MX,
    ("nki-library", "core/moe/moe_cte/bwmm_shard_on_block_mx.py"): _MX,
    ("nki-library", "core/moe/moe_tkg/all_expert_mx_impl.py"): _MX,
    ("nki-library", "core/moe/moe_tkg/down_projection_mx.py"): _MX,
    ("nki-library", "core/moe/moe_tkg/gate_up_projection_mx.py"): _MX,
    ("nki-library", "core/moe_block/moe_block_tkg.py"): _LNC2 + " (test_moe_block_tkg.py: lnc 2 in every case)",
    ("nki-library", "core/subkernels/find_nonzero_indices.py"): "nisa.nonzero_with_count ('Available only on "
    "NeuronCore-v3 and newer', nki/api/nki/isa); " + _LNC2,
    ("nki-library", "core/subkernels/indexed_flatten.py"): "a runtime DMA address (.ap(scalar_offset=) from an SBUF "
    "value), not emulated; " + _LNC2,
    ("nki-library", "core/topk/rotational_topk_utils.py"): "helper file of rotational_topk (its @nki.jit subkernels "
    "run inside the rotational_topk case)",
    ("nki-samples", "tutorials/mxfp-matmul/mx_kernels.py"): _MX.split(";")[0],
}
