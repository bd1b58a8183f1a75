"""Helpers of the projection kernels (`kernels_nki/projection.py`; a kernel-helper file, no @nki.jit): PSUM
evacuation, the TensorE (and VectorE) transposes of a row tile, the weights' SBUF tiles, the matmul of a row
tile into PSUM banks of 512 columns, the fused RMSNorm's forward statistic and backward of one row tile, and
the backward's dw accumulation over a block of row tiles.
The layout and the AWS sources behind each rule are in projection.py's docstring.
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.tiles import accumulate_weight_grad, cdiv, norm_grad_columns, norm_grad_combine, norm_grad_products, norm_grad_sum, \
    transpose_to_psum

W = 512  # moving columns per matmul: one fp32 PSUM bank (gemm_moving_fmax)
PSUM_BANKS = 8  # 2 MiB PSUM = 16 KiB per partition (trn1 arch guide, "Memory"), in 2 KiB banks of 512 fp32


def evacuate(dst, src, on_vector, scale=None, scaled=False):
    """PSUM -> SBUF with the cast to dst's dtype (with `scaled`, times the per-row fp32 [P, 1] `scale`), on
    VectorE or ScalarE (spreading the two engines' load). A Python flag, not a comparison of a tile with
    None, says whether to scale."""
    if on_vector and scaled:
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=scale)
    elif on_vector:
        nisa.tensor_copy(dst=dst, src=src, engine=nisa.engine.vector)
    elif scaled:
        nisa.activation(dst=dst, op=nl.copy, data=src, scale=scale)
    else:
        nisa.activation(dst=dst, op=nl.copy, data=src)


def transposed(t, rows, cols, dt, ident, first_on_vector=True, on_scalar=False):
    """[cols/128 tiles of [128, 128]]: t[0:rows, 0:cols] transposed in 128-column slices (TensorE), copied out
    of PSUM alternately by VectorE and ScalarE (with `on_scalar`, all by ScalarE)."""
    P = nl.tile_size.pmax
    out = []
    for i in range(cdiv(cols, P)):
        k = min(P, cols - i * P)
        t_ps = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
        transpose_to_psum(t_ps[0:k, 0:rows], t[0:rows, i * P:i * P + k], rows, ident)
        tT = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
        evacuate(tT[0:k, 0:rows], t_ps[0:k, 0:rows], (i % 2 == 0) == first_on_vector and not on_scalar)
        out.append(tT)
    return out


def row_tile(src_NX, r0, rows, dt):
    """src_NX[r0:r0+rows] as a [128, X] SBUF tile in dt (the DMA casts)."""
    P = nl.tile_size.pmax
    t = nl.ndarray((P, src_NX.shape[1]), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:rows], src=src_NX[r0:r0 + rows])
    return t


def weight_tiles(w_IO, dt):
    """w_IO as I/128 SBUF tiles [<=128, O] in dt (the contraction rows on partitions)."""
    P = nl.tile_size.pmax
    I, O = w_IO.shape
    tiles = []
    for i in range(cdiv(I, P)):
        k = min(P, I - i * P)
        t = nl.ndarray((k, O), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=w_IO[i * P:i * P + k])
        tiles.append(t)
    return tiles


def chunks(K):
    """A contraction of K rows in chunks of at most 128 (the partitions): their sizes."""
    P = nl.tile_size.pmax
    return [min(P, K - i * P) for i in range(cdiv(K, P))]


def part_chunks(widths):
    """The chunks of a contraction over parts laid side by side (q, k, v): each part's own `chunks`, so that a
    part's transposed row tiles line up with them."""
    return [k for w in widths for k in chunks(w)]


def pieces(parts, c0, c1):
    """[(s, a, b, off)]: columns c0:c1 of the tiles `parts` laid side by side, as part s's own columns a:b, at
    offset off from c0."""
    out, start = [], 0
    for s in range(len(parts)):
        end = start + parts[s].shape[1]
        lo, hi = max(c0, start), min(c1, end)
        if lo < hi:
            out.append((s, lo - start, hi - start, lo - c0))
        start = end
    return out


def weight_transposed(w_IO, dt, ident, ks):
    """w_IO^T as SBUF tiles [128, I], one per chunk of w's O columns in `ks` (TensorE transposes, once per call)."""
    P = nl.tile_size.pmax
    I = w_IO.shape[0]
    wT = [nl.ndarray((P, I), dtype=dt, buffer=nl.sbuf) for _ in ks]
    for i in range(cdiv(I, P)):
        k = min(P, I - i * P)
        w_t = row_tile(w_IO, i * P, k, dt)
        c0 = 0
        for j in range(len(ks)):
            t_ps = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
            transpose_to_psum(t_ps[0:ks[j], 0:k], w_t[0:k, c0:c0 + ks[j]], k, ident)
            evacuate(wT[j][0:ks[j], i * P:i * P + k], t_ps[0:ks[j], 0:k], j % 2 == 1)
            c0 += ks[j]
    return wT


def products(lhsT, rhs, ks, O, rows):
    """lhsT^T @ rhs over a contraction in chunks `ks` as O/512 fp32 PSUM tiles [rows, 512]: lhsT as [128, rows]
    tiles, rhs as [128, O] tiles (tile i holds chunk i's contraction rows)."""
    P = nl.tile_size.pmax
    out = []
    for o in range(cdiv(O, W)):
        w = min(W, O - o * W)
        ps = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum)
        for i in range(len(ks)):
            nisa.nc_matmul(dst=ps[0:rows, 0:w], stationary=lhsT[i][0:ks[i], 0:rows],
                           moving=rhs[i][0:ks[i], o * W:o * W + w])
        out.append(ps)
    return out


def matmul_rows(lhsT, rhs, ks, dsts, rows, scale=None, scaled=False):
    """The tiles dsts laid side by side ([rows, O] together, SBUF, their dtype) = lhsT^T @ rhs (`products`),
    leaving PSUM alternately on VectorE and ScalarE; with `scaled` times the per-row fp32 [rows, 1] `scale`."""
    O = 0
    for d in dsts:
        O += d.shape[1]
    n = 0
    for o, ps in enumerate(products(lhsT, rhs, ks, O, rows)):
        w = min(W, O - o * W)
        for s, a, b, off in pieces(dsts, o * W, o * W + w):
            evacuate(dsts[s][0:rows, a:b], ps[0:rows, off:off + b - a], n % 2 == 0,
                     scale[0:rows] if scaled else None, scaled)
            n += 1


def inv_rms(inv, x_t, rows, eps_P1):
    """inv[0:rows] ([rows, 1] fp32) = rsqrt(mean(x^2) + eps) per row of x_t (ScalarE: the squares with their row
    sum, then rsqrt on the column; as kernels_nki/rmsnorm.py)."""
    P = nl.tile_size.pmax
    D = x_t.shape[1]
    sq = nl.ndarray((P, D), dtype=x_t.dtype, buffer=nl.sbuf)  # discarded: only the row sum is kept
    ss = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=sq[0:rows], op=nl.square, data=x_t[0:rows], reduce_op=nl.add, reduce_res=ss[0:rows])
    nisa.activation(dst=inv[0:rows], op=nl.rsqrt, data=ss[0:rows], scale=1.0 / D, bias=eps_P1[0:rows])


def norm_bwd_stages(dx, g, x_t, inv, rows, dxo=None):
    """The RMSNorm backward of one row tile into dx ([rows, D] in its dtype): dx = inv (g + x c)
    (`kernels_nki.tiles.norm_grad_rows`: g as fp32 PSUM tiles of 512 columns, copied out by ScalarE, x c ScalarE's
    per-partition scale, g x and x c + g on GpSimd: two-input element-wise work costs GpSimd N cycles where VectorE
    pays 2N on the SBUF port they share), the final scale on ScalarE; with `dxo` (the gradient x receives along the
    residual path, a [P, D] tile) dx = inv (g + x c) + dxo, the scale on ScalarE (fp32) and the add on GpSimd.
    As five functions, each taking the previous one's result (g x, its row sum, the [P, 1] column c, x c + g, dx:
    one engine's step each, so that a caller interleaving them over row tiles never has an engine wait on the
    step just before); the first releases g (its PSUM banks) once it is read."""
    held = [g]

    def products(_):
        return norm_grad_products(held.pop(), x_t, rows, W)

    def total(st):
        return norm_grad_sum(st, rows)

    def column(st):
        return norm_grad_columns(st, x_t, inv, rows)

    def work(st):
        return norm_grad_combine(st, x_t, rows)

    def out(wk):
        if dxo != None:  # noqa: E711 (NKI has no `is`: nki/migration/index.rst)
            nisa.activation(dst=wk[0:rows], op=nl.copy, data=wk[0:rows], scale=inv[0:rows])
            nisa.tensor_tensor(dst=dx[0:rows], data1=wk[0:rows], data2=dxo[0:rows], op=nl.add,
                               engine=nisa.engine.gpsimd)
        else:
            nisa.activation(dst=dx[0:rows], op=nl.copy, data=wk[0:rows], scale=inv[0:rows])
        return None

    return products, total, column, work, out


def dw_block(acc, xn_s, dy_s, I, O):
    """acc[i] += xn^T dy over a block's row tiles (dy's row tiles per part, side by side: `pieces`;
    `accumulate_weight_grad`). A slice of several parts holds one accumulation group per part in its bank, so the
    flag is explicit: the block's first row tile overwrites, the rest accumulate."""
    def matmuls(g_ps, k0, k, o0, w):
        for s, (p, xn) in enumerate(xn_s):
            for t, a, b, off in pieces(dy_s[s], o0, o0 + w):
                nisa.nc_matmul(dst=g_ps[0:k, off:off + b - a], stationary=xn[0:p, k0:k0 + k],
                               moving=dy_s[s][t][0:p, a:b], accumulate=s > 0)

    accumulate_weight_grad(acc, I, O, W, matmuls)