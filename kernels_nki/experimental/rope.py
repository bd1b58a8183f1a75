"""Half-split rotary embedding (RoPE) forward and backward as NKI kernels for trn1, NKI 0.3+ API.

Spec: frontier_jax.ops.reference.rope: y = (x1 cos + x2 sin, x2 cos - x1 sin) on x [B, T, H, K] with
x1, x2 the two halves of the head dim. The backward is the inverse rotation, i.e. the same kernel
with sin negated: dx = (dy1 cos - dy2 sin, dy2 cos + dy1 sin).

cos/sin [T, K/2] are host constants computed once per sequence length
(`frontier_jax.model._rope_tables`); `frontier_jax.ops.experimental` casts them to x's dtype, as the
reference does, before the call. No production op calls these kernels: the model's attention kernel
(kernels_nki/attention/, `qk_attention`) rotates q and k on chip.

Layout: tokens of one sequence on the partition axis (tiles of 128 along T, the last ragged) and,
on the free axis, a chunk of `nb` sequences x all heads x K: one DMA per chunk brings x[b0:b0+nb,
t0:t0+128] in as a [P, nb, H, K] tile (an HBM access pattern with the sequence axis inside the
token axis; nb * H * K * 2 bytes per partition, 12-32 KiB at the model's shapes). For a fixed
k < K/2 the view x[:, :, :, k] ([P, nb, H]) meets cos[t, k] and sin[t, k] only as per-partition
columns, so every product is an instruction with a [P, 1] operand instead of a two-tensor one:
- a = x1[k] cos[k] on ScalarE (`activation` copy, the cos column its scale: one pass),
- y1[k] = x2[k] (sign sin[k]) + a on VectorE (`scalar_tensor_tensor`: the sin column its scalar
  operand, a its tensor operand: one two-input pass, ~2N cycles),
and the same for y2 (b = x2 cos on ScalarE, y2 = x1 (-sign sin) + b on VectorE). Per element: one
ScalarE and one two-input VectorE pass, against three two-input VectorE passes (6N cycles) for
the [P, H, K] full-table layout this replaced. The cos/sin rows of a T tile are DMA'd once and
turned into fp32 [P, K/2] columns (cos, sin, -sin) once per T tile, reused for the whole batch.

`rope_gain_fwd` / `rope_gain_bwd` fuse the per-head query gain, y = rope(x) * g[h]
(frontier_jax.ops.reference.rope_gain), into the rotation. g comes broadcast over the partitions as
[128, H] fp32 (the fused optimizers' convention for runtime scalars, frontier_jax.ops.scalars_PK),
so g[h] is a per-partition column: the forward first scales x by g[h] on ScalarE (one `activation`
per head over the contiguous [P, nb, K] view), then rotates. The backward rotates dy back
(r = rope^-1(dy), fp32), writes dx = r g[h] (ScalarE, per head) and the gain's gradient per (t, h),
the sum over b, k of r x (= dy . rope(x), the rotation being orthogonal): the product r x on GpSimd
(`tensor_tensor`, SBUF only: GpSimd cannot reach PSUM), its sum over (b, k) on ScalarE
(`activation_reduce`, per head), one partial per (t, h, chunk), summed over the chunks on VectorE
and returned as fp32 partials [T, H] that frontier_jax.ops.experimental sums over T.

Engine time per element at the model's shapes (`python -m frontier_jax.kernel_report`, cost model of
kernels_nki/emulator/cost.py): rope and rope_gain forward ScalarE 1 (rope_gain 2) pass, VectorE one
two-input pass; rope_gain backward ScalarE 3, VectorE 1 two-input, GpSimd 1; every RoPE kernel is
DMA-bound at the model's shapes. NOT in the cost model:
the views x[:, :, :, k] step K elements (128 B) along the minor free axis, above the 16 B at which
SBUF gives an engine its full bandwidth (trn1 arch guide, "Data Movement / Performance
Consideration": about half the bandwidth beyond 16 B), so the strided passes may run up to ~2x
longer on hardware; and VectorE and GpSimd share one SBUF port (same section), so the backward's
GpSimd product and VectorE pass serialise (their sum stays under the DMA time at the model's shapes).

NeuronCore-v2 (trn1) rules this kernel follows (AWS docs, aws-neuron-sdk): `activation`'s scale is
an fp32 immediate or [P, 1] fp32 tile and it reads one tensor (nki/api/nki/isa/__init__.py,
activation; trn1 arch guide "Scalar Engine"); `scalar_tensor_tensor` takes a scalar/[P, 1] operand0
and an equally shaped tensor operand1 (isa docs scalar_tensor_tensor); `tensor_tensor` runs on
GpSimd when asked (isa docs tensor_tensor, `engine`) and GpSimd touches no PSUM (isa docs
tensor_copy / iota); free-axis views up to 4 free dims (arch guide, "Accessing SBUF/PSUM tensors");
every tile starts at partition 0 (same section); HBM is reached only by `dma_copy`, with raw
`.ap()` access patterns on HBM tensors (nki/get-started/nki-language-guide.rst, "Low-level raw
access pattern"); `activation_reduce` sums the whole free extent (isa docs activation_reduce).
"""

import nki
import nki.isa as nisa
import nki.language as nl

CHUNK_BYTES = 64 * 1024  # SBUF bytes per partition a chunk of sequences may use (of 192 KiB on trn1)


def _chunk(B, H, K, dt, tiles, fp32_tiles):
    """Sequences per chunk: as many as fit CHUNK_BYTES per partition (at least 1, at most B) with
    `tiles` [P, nb, H, K] tiles of x's dtype and `fp32_tiles` fp32 ones live."""
    size = 4 if dt == nl.float32 else 2
    return max(1, min(B, CHUNK_BYTES // (H * K * (tiles * size + fp32_tiles * 4))))


def _columns(cos_TK2, sin_TK2, t0, rows, sign):
    """fp32 [P, K/2] columns of T rows t0:t0+rows: (cos, sign sin, -sign sin), once per T tile."""
    P, K2 = nl.tile_size.pmax, cos_TK2.shape[1]
    raw_c = nl.ndarray((P, K2), dtype=cos_TK2.dtype, buffer=nl.sbuf)
    raw_s = nl.ndarray((P, K2), dtype=sin_TK2.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=raw_c[0:rows], src=cos_TK2[t0:t0 + rows])
    nisa.dma_copy(dst=raw_s[0:rows], src=sin_TK2[t0:t0 + rows])
    c = nl.ndarray((P, K2), dtype=nl.float32, buffer=nl.sbuf)
    ps = nl.ndarray((P, K2), dtype=nl.float32, buffer=nl.sbuf)
    ns = nl.ndarray((P, K2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=c[0:rows], src=raw_c[0:rows])
    nisa.tensor_scalar(dst=ps[0:rows], data=raw_s[0:rows], op0=nl.multiply, operand0=sign)
    nisa.tensor_scalar(dst=ns[0:rows], data=raw_s[0:rows], op0=nl.multiply, operand0=-sign)
    return c, ps, ns


def _load(src_BTHK, b0, nb, nbj, t0, rows, dtype):
    """src[b0:b0+nbj, t0:t0+rows] as an SBUF tile [P, nb, H, K] (tokens on partitions), one DMA."""
    B, T, H, K = src_BTHK.shape
    P = nl.tile_size.pmax
    t = nl.ndarray((P, nb, H, K), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:rows, 0:nbj], src=_hbm_view(src_BTHK, b0, nbj, t0, rows))
    return t


def _hbm_view(a_BTHK, b0, nbj, t0, rows):
    """a[b0:b0+nbj, t0:t0+rows] ordered (token, sequence, head, k): the token axis outermost."""
    B, T, H, K = a_BTHK.shape
    return a_BTHK.ap(pattern=[[H * K, rows], [T * H * K, nbj], [1, H * K]], offset=(b0 * T + t0) * H * K)


def _rotate_chunk(y, x, cols, rows, nbj):
    """y[0:rows, 0:nbj] = the rotation of x (any dtypes): per k < K/2 two ScalarE products with the
    cos column and two VectorE multiply-adds with the +-sin columns."""
    P = nl.tile_size.pmax
    _, nb, H, K = x.shape
    K2 = K // 2
    c, ps, ns = cols
    for k in range(K2):
        x1, x2 = x[0:rows, 0:nbj, :, k], x[0:rows, 0:nbj, :, K2 + k]
        a = nl.ndarray((P, nb, H), dtype=nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((P, nb, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=a[0:rows, 0:nbj], op=nl.copy, data=x1, scale=c[0:rows, k:k + 1])
        nisa.activation(dst=b[0:rows, 0:nbj], op=nl.copy, data=x2, scale=c[0:rows, k:k + 1])
        nisa.scalar_tensor_tensor(dst=y[0:rows, 0:nbj, :, k], data=x2, op0=nl.multiply, operand0=ps[0:rows, k:k + 1],
                                  op1=nl.add, operand1=a[0:rows, 0:nbj])
        nisa.scalar_tensor_tensor(dst=y[0:rows, 0:nbj, :, K2 + k], data=x1, op0=nl.multiply,
                                  operand0=ns[0:rows, k:k + 1], op1=nl.add, operand1=b[0:rows, 0:nbj])


def _gain(g_PH):
    """The [128, H] fp32 gain (every row the same) in SBUF, loaded once per call."""
    P, H = nl.tile_size.pmax, g_PH.shape[1]
    gain_PH = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=gain_PH, src=g_PH[0:P])
    return gain_PH


def _scale_heads(dst, src, gain_PH, rows, nbj):
    """dst[:, :, h] = src[:, :, h] * g[h] on ScalarE, one `activation` per head ([P, nb, K] views)."""
    H = src.shape[2]
    for h in range(H):
        nisa.activation(dst=dst[0:rows, 0:nbj, h], op=nl.copy, data=src[0:rows, 0:nbj, h],
                        scale=gain_PH[0:rows, h:h + 1])


def _rotate(x_BTHK, cos_TK2, sin_TK2, sign, g_PH):
    """rope(x) (sign 1) or its inverse (sign -1), each head scaled by g[h] unless g_PH is None."""
    B, T, H, K = x_BTHK.shape
    P = nl.tile_size.pmax
    dt = x_BTHK.dtype
    gained = g_PH != None  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
    nb = _chunk(B, H, K, dt, 2, 1 if gained else 0)  # x, y (and x g in fp32)
    y_BTHK = nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm)
    if gained:
        gain_PH = _gain(g_PH)
    for tt in range((T + P - 1) // P):
        t0 = tt * P
        rows = min(P, T - t0)
        cols = _columns(cos_TK2, sin_TK2, t0, rows, sign)
        for bc in range((B + nb - 1) // nb):
            b0 = bc * nb
            nbj = min(nb, B - b0)
            x = _load(x_BTHK, b0, nb, nbj, t0, rows, dt)
            if gained:  # x g[h] in fp32 first (one ScalarE pass), then the rotation of that
                xg = nl.ndarray((P, nb, H, K), dtype=nl.float32, buffer=nl.sbuf)
                _scale_heads(xg, x, gain_PH, rows, nbj)
                x = xg
            y = nl.ndarray((P, nb, H, K), dtype=dt, buffer=nl.sbuf)
            _rotate_chunk(y, x, cols, rows, nbj)
            nisa.dma_copy(dst=_hbm_view(y_BTHK, b0, nbj, t0, rows), src=y[0:rows, 0:nbj])
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
    P = nl.tile_size.pmax
    dt = x_BTHK.dtype
    nb = _chunk(B, H, K, dt, 3, 1)  # dy, x, dx and r in fp32
    nchunks = (B + nb - 1) // nb
    dx_BTHK = nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm)
    dg_TH = nl.ndarray((T, H), dtype=nl.float32, buffer=nl.shared_hbm)
    gain_PH = _gain(g_PH)
    for tt in range((T + P - 1) // P):
        t0 = tt * P
        rows = min(P, T - t0)
        cols = _columns(cos_TK2, sin_TK2, t0, rows, -1.0)
        part_PHC = nl.ndarray((P, H, nchunks), dtype=nl.float32, buffer=nl.sbuf)  # one partial per chunk
        for bc in range(nchunks):
            b0 = bc * nb
            nbj = min(nb, B - b0)
            dy = _load(dy_BTHK, b0, nb, nbj, t0, rows, dt)
            x = _load(x_BTHK, b0, nb, nbj, t0, rows, dt)
            r = nl.ndarray((P, nb, H, K), dtype=nl.float32, buffer=nl.sbuf)
            _rotate_chunk(r, dy, cols, rows, nbj)
            dx = nl.ndarray((P, nb, H, K), dtype=dt, buffer=nl.sbuf)
            _scale_heads(dx, r, gain_PH, rows, nbj)
            nisa.dma_copy(dst=_hbm_view(dx_BTHK, b0, nbj, t0, rows), src=dx[0:rows, 0:nbj])
            # the gain's gradient: r x on GpSimd (in place of r), its sum over (b, k) per head on ScalarE
            nisa.tensor_tensor(dst=r[0:rows, 0:nbj], data1=r[0:rows, 0:nbj], data2=x[0:rows, 0:nbj], op=nl.multiply,
                               engine=nisa.engine.gpsimd)
            for h in range(H):
                nisa.activation_reduce(dst=r[0:rows, 0:nbj, h], op=nl.copy, data=r[0:rows, 0:nbj, h],
                                       reduce_op=nl.add, reduce_res=part_PHC[0:rows, h, bc:bc + 1])
        acc_PH = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=acc_PH[0:rows], op=nl.add, data=part_PHC[0:rows], axis=2)
        nisa.dma_copy(dst=dg_TH[t0:t0 + rows], src=acc_PH[0:rows])
    return dx_BTHK, dg_TH
