"""Weightless RMSNorm forward and backward as NKI kernels for trn1 (NeuronCore-v2), NKI 0.3+ API.

Spec: frontier_jax.ops.reference.rms_norm (fp32 math, eps = float32 epsilon, output in the input dtype).
Layout: rows on the partition axis, R = 4096 // D consecutive rows per partition (a full tile is
128 x R rows, [P, R, D] in SBUF, one DMA each way: partition p reads rows r0 + p R .. + R, contiguous
in HBM), then the rest as 128 x R' rows and a last tile of fewer than 128 single rows (sliced, never
padded): `kernels_nki.packing`'s row groups. R = 8 for the model's [tokens, D = 512] activations, R = 64 for the
per-head QK-norm shape
[tokens x heads, head_dim = 64], so the per-tile [P, R] column work (rsqrt, the backward's
coefficient) is shared by R rows instead of paid per 64-element row.

Per tile:
- forward: 1 load, per row a ScalarE square + row sum (`activation_reduce`), one ScalarE rsqrt over
  the tile's [P, R] sums, per row a VectorE scale by the inverse-RMS column, 2 stores (y and the fp32
  inverse RMS, the residual the backward reuses instead of recomputing).
- backward: 3 loads, dy * x on GpSimd (one pass over the tile, SBUF only), its row sums on ScalarE,
  e = -mean(dy x) inv^3 for the tile's rows in 3 small VectorE instructions, then per row x e on
  ScalarE (e the [P, 1] scale) and dx = dy inv + x e on VectorE (`scalar_tensor_tensor`, inv the
  [P, 1] operand): dx = inv * (dy - x * mean(dy*x) * inv^2).
Per element: forward ScalarE 1 pass (+ the 64-cycle reduce charge per row), VectorE 1; backward GpSimd
1, ScalarE 2 (+ 64 per row), VectorE one two-input pass (~2N cycles). VectorE and GpSimd share one SBUF
port (trn1 arch guide nki/guides/architecture/trainium_inferentia2_arch.rst, "Data Movement / Performance
Consideration"), so the backward's GpSimd product and VectorE pass serialise (the schedule,
`kernels_nki.emulator.schedule`, models the port; the busiest-engine bound does not).

NeuronCore-v2 (trn1) rules this kernel follows (AWS docs, aws-neuron-sdk): `activation`'s bias is an
[N, 1] tile (eps, memset once per call), not an immediate (v3+ only: nki/api/nki/isa/__init__.py,
activation "Layout"); its scale is an fp32 immediate or [N, 1] fp32 tile (same section); rsqrt's
input mean(x^2) + eps lies in its valid range [2^-87, 2^97] for |x| < 2^48 (eps = 2^-23 is the
floor; nki/api/nki.api.shared.rst, activation functions table); every tile starts at partition 0;
`tensor_tensor` runs on GpSimd when asked, and GpSimd touches no PSUM (isa docs tensor_tensor `engine`,
tensor_copy); HBM rows are addressed with raw `.ap()` access patterns (nki/get-started/
nki-language-guide.rst, "Low-level raw access pattern").
"""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import GROUP_ELEMS, groups, rows_ap, rows_per_partition
from kernels_nki.tiles import EPS

ROW_ELEMS = GROUP_ELEMS  # elements per partition of a full tile: R = ROW_ELEMS // D rows per partition


def _rows(a_NC, r0, parts, R):
    """Rows r0:r0+parts*R of an [N, C] HBM array as [parts, R*C]: partition p holds rows r0+p*R..+R."""
    return rows_ap(a_NC, (r0, parts, R))


def _fwd_tile(x_ND, y_ND, inv_N1, eps_P1, r0, parts, R):
    D = x_ND.shape[1]
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    x = nl.ndarray((P, R, D), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=x[0:parts], src=_rows(x_ND, r0, parts, R))
    # sum of squares per row (ScalarE); the squares land in y, overwritten below
    y = nl.ndarray((P, R, D), dtype=dt, buffer=nl.sbuf)
    ss = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
    for j in range(R):
        nisa.activation_reduce(dst=y[0:parts, j], op=nl.square, data=x[0:parts, j], reduce_op=nl.add,
                               reduce_res=ss[0:parts, j:j + 1])
    inv = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=inv[0:parts], op=nl.rsqrt, data=ss[0:parts], scale=1.0 / D, bias=eps_P1[0:parts])
    for j in range(R):
        nisa.tensor_scalar(dst=y[0:parts, j], data=x[0:parts, j], op0=nl.multiply, operand0=inv[0:parts, j:j + 1])
    nisa.dma_copy(dst=_rows(y_ND, r0, parts, R), src=y[0:parts])
    nisa.dma_copy(dst=_rows(inv_N1, r0, parts, R), src=inv[0:parts])


@nki.jit
def rmsnorm_fwd(x_ND):
    """(y_ND in x's dtype, inv_N1 float32) with inv = rsqrt(mean(x^2) + eps) per row."""
    N, D = x_ND.shape
    P = nl.tile_size.pmax
    y_ND = nl.ndarray((N, D), dtype=x_ND.dtype, buffer=nl.shared_hbm)
    inv_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    eps_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)  # v2: activation's bias is a tile
    nisa.memset(dst=eps_P1, value=EPS)
    for r0, parts, rr in groups(N, rows_per_partition(D, ROW_ELEMS)):  # 128 x R rows, then the rest
        _fwd_tile(x_ND, y_ND, inv_N1, eps_P1, r0, parts, rr)
    return y_ND, inv_N1


def _bwd_tile(x_ND, inv_N1, dy_ND, dx_ND, r0, parts, R):
    D = x_ND.shape[1]
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    x = nl.ndarray((P, R, D), dtype=dt, buffer=nl.sbuf)
    dy = nl.ndarray((P, R, D), dtype=dy_ND.dtype, buffer=nl.sbuf)
    inv = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x[0:parts], src=_rows(x_ND, r0, parts, R))
    nisa.dma_copy(dst=dy[0:parts], src=_rows(dy_ND, r0, parts, R))
    nisa.dma_copy(dst=inv[0:parts], src=_rows(inv_N1, r0, parts, R))
    # dot = sum(dy * x) per row: the product on GpSimd (SBUF only), the row sums on ScalarE
    work = nl.ndarray((P, R, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=work[0:parts], data1=dy[0:parts], data2=x[0:parts], op=nl.multiply,
                       engine=nisa.engine.gpsimd)
    dot = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
    for j in range(R):
        nisa.activation_reduce(dst=work[0:parts, j], op=nl.copy, data=work[0:parts, j], reduce_op=nl.add,
                               reduce_res=dot[0:parts, j:j + 1])
    # e = -dot inv^3 / D for the tile's rows at once (3 small VectorE instructions)
    i2 = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=i2[0:parts], data1=inv[0:parts], data2=inv[0:parts], op=nl.multiply)
    e = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=e[0:parts], data=dot[0:parts], op0=nl.multiply, operand0=-1.0 / D, op1=nl.multiply,
                              operand1=i2[0:parts])
    nisa.tensor_tensor(dst=e[0:parts], data1=e[0:parts], data2=inv[0:parts], op=nl.multiply)
    # dx = dy inv + x e: x e on ScalarE (e its [P, 1] scale), the multiply-add on VectorE
    dx = nl.ndarray((P, R, D), dtype=dt, buffer=nl.sbuf)
    for j in range(R):
        nisa.activation(dst=work[0:parts, j], op=nl.copy, data=x[0:parts, j], scale=e[0:parts, j:j + 1])
        nisa.scalar_tensor_tensor(dst=dx[0:parts, j], data=dy[0:parts, j], op0=nl.multiply,
                                  operand0=inv[0:parts, j:j + 1], op1=nl.add, operand1=work[0:parts, j])
    nisa.dma_copy(dst=_rows(dx_ND, r0, parts, R), src=dx[0:parts])


@nki.jit
def rmsnorm_bwd(x_ND, inv_N1, dy_ND):
    """dx_ND (x's dtype) = inv * (dy - x * mean(dy * x) * inv^2), fp32 math, per row."""
    N, D = x_ND.shape
    dx_ND = nl.ndarray((N, D), dtype=x_ND.dtype, buffer=nl.shared_hbm)
    for r0, parts, rr in groups(N, rows_per_partition(D, ROW_ELEMS)):
        _bwd_tile(x_ND, inv_N1, dy_ND, dx_ND, r0, parts, rr)
    return dx_ND
