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
(4 products, 2 fused multiply-adds); DMA-bound at the model's shapes.

NeuronCore-v2 (trn1) rules this kernel follows (AWS docs, aws-neuron-sdk): VectorE `tensor_tensor` /
`scalar_tensor_tensor` on SBUF tiles of equal shape with an fp32 immediate operand0 (no broadcast:
nki/api/nki/isa/__init__.py, tensor_tensor and scalar_tensor_tensor; release-notes/components/nki.rst,
"Binary operations do not support broadcasting"), free-axis strided views up to 3 free dims (trn1
arch guide nki/guides/architecture/trainium_inferentia2_arch.rst, "Accessing SBUF/PSUM tensors"),
every tile starting at partition 0 (same section), HBM reached only by `dma_copy`.
"""

import nki
import nki.isa as nisa
import nki.language as nl


def _rotate(x_BTHK, cos_TK2, sin_TK2, sign):
    B, T, H, K = x_BTHK.shape
    K2 = K // 2
    P = nl.tile_size.pmax
    dt = x_BTHK.dtype
    y_BTHK = nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm)
    for tt in nl.affine_range((T + P - 1) // P):
        t0 = tt * P
        rows = min(P, T - t0)
        cos_PHK2 = nl.ndarray((P, H, K2), dtype=cos_TK2.dtype, buffer=nl.sbuf)
        sin_PHK2 = nl.ndarray((P, H, K2), dtype=sin_TK2.dtype, buffer=nl.sbuf)
        for h in nl.affine_range(H):
            nisa.dma_copy(dst=cos_PHK2[0:rows, h], src=cos_TK2[t0:t0 + rows])
            nisa.dma_copy(dst=sin_PHK2[0:rows, h], src=sin_TK2[t0:t0 + rows])
        c, s = cos_PHK2[0:rows], sin_PHK2[0:rows]
        for b in nl.affine_range(B):
            x_PHK = nl.ndarray((P, H, K), dtype=dt, buffer=nl.sbuf)
            nisa.dma_copy(dst=x_PHK[0:rows], src=x_BTHK[b, t0:t0 + rows])
            x1, x2 = x_PHK[0:rows, :, 0:K2], x_PHK[0:rows, :, K2:K]
            a_PHK2 = nl.ndarray((P, H, K2), dtype=nl.float32, buffer=nl.sbuf)
            b_PHK2 = nl.ndarray((P, H, K2), dtype=nl.float32, buffer=nl.sbuf)
            y_PHK = nl.ndarray((P, H, K), dtype=dt, buffer=nl.sbuf)
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
            nisa.dma_copy(dst=y_BTHK[b, t0:t0 + rows], src=y_PHK[0:rows])
    return y_BTHK


@nki.jit
def rope_fwd(x_BTHK, cos_TK2, sin_TK2):
    """y_BTHK (x's dtype): the rotation; cos/sin [T, K/2] in x's dtype."""
    return _rotate(x_BTHK, cos_TK2, sin_TK2, 1.0)


@nki.jit
def rope_bwd(dy_BTHK, cos_TK2, sin_TK2):
    """dx_BTHK: the inverse rotation of dy (the rotation is orthogonal)."""
    return _rotate(dy_BTHK, cos_TK2, sin_TK2, -1.0)
