"""Half-split rotary embedding (RoPE) forward and backward as NKI kernels for trn1, NKI 0.3+ API.

Spec: frontier_jax.reference.rope: y = (x1 cos + x2 sin, x2 cos - x1 sin) on x [B, T, H, K] with
x1, x2 the two halves of the head dim. The backward is the inverse rotation, i.e. the same kernel
with sin negated: dx = (dy1 cos - dy2 sin, dy2 cos + dy1 sin).

cos/sin [T, K/2] are host constants computed once per sequence length
(`frontier_jax.model._rope_tables`); `frontier_jax.ops` casts them to x's dtype, as the reference
does, before the call. Layout: tokens of one sequence on the partition axis (tiles of 128 along T,
the last ragged), (head, k) on the free axis. For each T tile the cos/sin rows are DMA'd once into
[P, H, K/2] tiles (one copy per head, so the elementwise ops need no broadcast) and reused for
every sequence of the batch, so their traffic is 1/(2B) of x's. Six VectorE ops per tile
(4 products, 2 fused multiply-adds).

NeuronCore-v2 (trn1) rules this kernel follows (AWS docs, aws-neuron-sdk): VectorE `tensor_tensor` /
`scalar_tensor_tensor` on SBUF tiles of equal shape with an fp32 immediate operand0 (no broadcast:
nki/api/nki/isa/__init__.py, tensor_tensor and scalar_tensor_tensor; release-notes/components/nki.rst,
"Binary operations do not support broadcasting"), free-axis strided views up to 3 free dims (trn1
arch guide nki/guides/architecture/trainium_inferentia2_arch.rst, "Accessing SBUF/PSUM tensors"),
every tile starting at partition 0 (same section), HBM reached only by `dma_copy`; `tensor_scalar`'s
operand and `activation`'s scale a [P, 1] fp32 column (nki/api/nki/isa/__init__.py, tensor_scalar,
activation); `activation_reduce` sums the free axis (same file).

`rope_gain_fwd` / `rope_gain_bwd` fuse the per-head query gain, y = rope(x) * g[h]
(frontier_jax.reference.rope_gain), into the rotation. The forward scales fp32 copies of the cos/sin
tiles by g[h] once per T tile (2 H small VectorE ops, amortised over the batch), so the gain costs no
per-token work and no HBM pass. The backward rotates dy back (r = rope^-1(dy)), writes dx = r g[h]
(ScalarE `activation` copy with the gain column as its scale) and accumulates the gain's gradient per
(t, h), the sum over b, k of r x (= dy . rope(x), the rotation being orthogonal; the product on
VectorE, its sum over k on ScalarE), returned as fp32 partials [T, H] that frontier_jax.ops sums over
T. The gain comes broadcast over the partitions as [128, H] fp32 (the fused optimizers' convention for
runtime scalars, frontier_jax.ops.scalars_PK). At the model's shapes every RoPE kernel is
VectorE-bound (two-input instructions at ~2N cycles: 6N per element for the rotation, AWS's arch guide
cost model), 2.8x its DMA time forward; see `python -m kernels_nki.report`.
"""

import nki
import nki.isa as nisa
import nki.language as nl


def _tables(cos_TK2, sin_TK2, t0, rows, H, K2):
    """cos/sin rows t0:t0+rows DMA'd into [P, H, K/2] tiles, one copy per head (no broadcast needed)."""
    P = nl.tile_size.pmax
    cos_PHK2 = nl.ndarray((P, H, K2), dtype=cos_TK2.dtype, buffer=nl.sbuf)
    sin_PHK2 = nl.ndarray((P, H, K2), dtype=sin_TK2.dtype, buffer=nl.sbuf)
    for h in nl.affine_range(H):
        nisa.dma_copy(dst=cos_PHK2[0:rows, h], src=cos_TK2[t0:t0 + rows])
        nisa.dma_copy(dst=sin_PHK2[0:rows, h], src=sin_TK2[t0:t0 + rows])
    return cos_PHK2, sin_PHK2


def _gain(g_PH):
    """The [128, H] fp32 gain (every row the same) in SBUF, loaded once per call."""
    P, H = nl.tile_size.pmax, g_PH.shape[1]
    gain_PH = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=gain_PH, src=g_PH[0:P])
    return gain_PH


def _gained(tab_PHK2, g_PH, rows, H, K2):
    """An fp32 copy of a [P, H, K/2] table with head h scaled by g[h]."""
    P = nl.tile_size.pmax
    out_PHK2 = nl.ndarray((P, H, K2), dtype=nl.float32, buffer=nl.sbuf)
    for h in nl.affine_range(H):
        nisa.tensor_scalar(dst=out_PHK2[0:rows, h], data=tab_PHK2[0:rows, h], op0=nl.multiply,
                           operand0=g_PH[0:rows, h:h + 1])
    return out_PHK2


def _rotate_tile(y_PHK, x_PHK, c, s, sign, rows, K):
    """y[0:rows] = (x1 c + sign x2 s, x2 c - sign x1 s): six VectorE ops (4 products, 2 fused mul-adds)."""
    P = nl.tile_size.pmax
    H, K2 = x_PHK.shape[1], K // 2
    x1, x2 = x_PHK[0:rows, :, 0:K2], x_PHK[0:rows, :, K2:K]
    a_PHK2 = nl.ndarray((P, H, K2), dtype=nl.float32, buffer=nl.sbuf)
    b_PHK2 = nl.ndarray((P, H, K2), dtype=nl.float32, buffer=nl.sbuf)
    # first half: x1 c + sign * x2 s
    nisa.tensor_tensor(dst=a_PHK2[0:rows], data1=x1, data2=c, op=nl.multiply)
    nisa.tensor_tensor(dst=b_PHK2[0:rows], data1=x2, data2=s, op=nl.multiply)
    nisa.scalar_tensor_tensor(dst=y_PHK[0:rows, :, 0:K2], data=b_PHK2[0:rows], op0=nl.multiply,
                              operand0=sign, op1=nl.add, operand1=a_PHK2[0:rows])
    # second half: x2 c - sign * x1 s
    nisa.tensor_tensor(dst=a_PHK2[0:rows], data1=x2, data2=c, op=nl.multiply)
    nisa.tensor_tensor(dst=b_PHK2[0:rows], data1=x1, data2=s, op=nl.multiply)
    nisa.scalar_tensor_tensor(dst=y_PHK[0:rows, :, K2:K], data=b_PHK2[0:rows], op0=nl.multiply,
                              operand0=-sign, op1=nl.add, operand1=a_PHK2[0:rows])


def _rotate(x_BTHK, cos_TK2, sin_TK2, sign, g_PH):
    """rope(x) (sign 1) or its inverse (sign -1), each head scaled by g[h] unless g_PH is None."""
    B, T, H, K = x_BTHK.shape
    K2 = K // 2
    P = nl.tile_size.pmax
    dt = x_BTHK.dtype
    y_BTHK = nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm)
    if g_PH != None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        gain_PH = _gain(g_PH)
    for tt in nl.affine_range((T + P - 1) // P):
        t0 = tt * P
        rows = min(P, T - t0)
        cos_PHK2, sin_PHK2 = _tables(cos_TK2, sin_TK2, t0, rows, H, K2)
        if g_PH != None:  # noqa: E711
            cos_PHK2, sin_PHK2 = _gained(cos_PHK2, gain_PH, rows, H, K2), _gained(sin_PHK2, gain_PH, rows, H, K2)
        c, s = cos_PHK2[0:rows], sin_PHK2[0:rows]
        for b in nl.affine_range(B):
            x_PHK = nl.ndarray((P, H, K), dtype=dt, buffer=nl.sbuf)
            nisa.dma_copy(dst=x_PHK[0:rows], src=x_BTHK[b, t0:t0 + rows])
            y_PHK = nl.ndarray((P, H, K), dtype=dt, buffer=nl.sbuf)
            _rotate_tile(y_PHK, x_PHK, c, s, sign, rows, K)
            nisa.dma_copy(dst=y_BTHK[b, t0:t0 + rows], src=y_PHK[0:rows])
    return y_BTHK


@nki.jit
def rope_fwd(x_BTHK, cos_TK2, sin_TK2):
    """y_BTHK (x's dtype): the rotation; cos/sin [T, K/2] in x's dtype."""
    return _rotate(x_BTHK, cos_TK2, sin_TK2, 1.0, None)


@nki.jit
def rope_bwd(dy_BTHK, cos_TK2, sin_TK2):
    """dx_BTHK: the inverse rotation of dy (the rotation is orthogonal)."""
    return _rotate(dy_BTHK, cos_TK2, sin_TK2, -1.0, None)


@nki.jit
def rope_gain_fwd(x_BTHK, cos_TK2, sin_TK2, g_PH):
    """y_BTHK (x's dtype) = rope(x) * g[h]; g_PH [128, H] fp32, every row the same."""
    return _rotate(x_BTHK, cos_TK2, sin_TK2, 1.0, g_PH)


@nki.jit
def rope_gain_bwd(x_BTHK, cos_TK2, sin_TK2, g_PH, dy_BTHK):
    """(dx_BTHK in x's dtype = g[h] rope^-1(dy), dg_TH fp32 = sum over b, k of rope^-1(dy) x)."""
    B, T, H, K = x_BTHK.shape
    K2 = K // 2
    P = nl.tile_size.pmax
    dt = x_BTHK.dtype
    dx_BTHK = nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm)
    dg_TH = nl.ndarray((T, H), dtype=nl.float32, buffer=nl.shared_hbm)
    gain_PH = _gain(g_PH)
    for tt in nl.affine_range((T + P - 1) // P):
        t0 = tt * P
        rows = min(P, T - t0)
        cos_PHK2, sin_PHK2 = _tables(cos_TK2, sin_TK2, t0, rows, H, K2)
        c, s = cos_PHK2[0:rows], sin_PHK2[0:rows]
        acc_PH = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc_PH[0:rows], value=0.0)
        for b in nl.sequential_range(B):  # acc_PH carries over b
            dy_PHK = nl.ndarray((P, H, K), dtype=dt, buffer=nl.sbuf)
            x_PHK = nl.ndarray((P, H, K), dtype=dt, buffer=nl.sbuf)
            nisa.dma_copy(dst=dy_PHK[0:rows], src=dy_BTHK[b, t0:t0 + rows])
            nisa.dma_copy(dst=x_PHK[0:rows], src=x_BTHK[b, t0:t0 + rows])
            r_PHK = nl.ndarray((P, H, K), dtype=nl.float32, buffer=nl.sbuf)
            _rotate_tile(r_PHK, dy_PHK, c, s, -1.0, rows, K)
            dx_PHK = nl.ndarray((P, H, K), dtype=dt, buffer=nl.sbuf)
            for h in nl.affine_range(H):  # on ScalarE (otherwise idle here): scale by the [P, 1] gain column
                nisa.activation(dst=dx_PHK[0:rows, h], op=nl.copy, data=r_PHK[0:rows, h],
                                scale=gain_PH[0:rows, h:h + 1])
            nisa.dma_copy(dst=dx_BTHK[b, t0:t0 + rows], src=dx_PHK[0:rows])
            # the gain's gradient: sum over k of r x, accumulated over the batch per (t, h)
            prod_PHK = nl.ndarray((P, H, K), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=prod_PHK[0:rows], data1=r_PHK[0:rows], data2=x_PHK[0:rows], op=nl.multiply)
            part_PH = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
            for h in nl.affine_range(H):  # the sums over k on ScalarE (VectorE bounds this kernel)
                nisa.activation_reduce(dst=prod_PHK[0:rows, h], op=nl.copy, data=prod_PHK[0:rows, h],
                                       reduce_op=nl.add, reduce_res=part_PH[0:rows, h:h + 1])
            nisa.tensor_tensor(dst=acc_PH[0:rows], data1=acc_PH[0:rows], data2=part_PH[0:rows], op=nl.add)
        nisa.dma_copy(dst=dg_TH[t0:t0 + rows], src=acc_PH[0:rows])
    return dx_BTHK, dg_TH
