"""How the attention kernels move rows between HBM and SBUF and between row orders on chip (a kernel-helper file;
docs/kernels/attention.md, "DMA layout").

- `seq_dma` / `seq_tile`: all T rows of one sequence, every head, one DMA per tensor (plus one for a ragged
  last 128-row tile), in natural row order or, with `perm`, n = T // 128 consecutive rows per partition (one
  contiguous run per partition); `block`: one 128-row block of one head as a [128, K] view; `natural_cols`:
  where a `perm` block's rows sit in a natural-order [K, T] transpose (a stride-n free-axis view).
- Between the orders, by TensorE transposes (aws-neuron-sdk nki/api/nki/isa/__init__.py nc_matmul, "Transpose
  mode"; several into one fp32 PSUM bank of 512 columns and out of it by one copy): `rows_from_transpose`
  (natural rows from a natural [K, T] transpose), `perm_rows` (natural rows to the `perm` layout),
  `lse_store` / `neg_lse_load` (the log-sum-exp's [rows, 1] columns to and from [H, T] rows, T contiguous fp32
  per partition in HBM), `neg_rowdot` (the backward's -rowsum(dO o), made in the `perm` layout, as natural
  columns).
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.tiles import HALF, cdiv, row_tiles, transpose, transpose_to_psum

KQ = 4  # 128-column transposes per fp32 PSUM bank of 512 columns


def seq_dma(sb, x_BTXK, b, load, perm=False):
    """Moves all T rows of batch b of x_BTXK ([B, T, X, W]: every head, or a [.., 1] statistic) between HBM and
    the SBUF tile sb [P, n X W]: 128-row tile i, head x at columns (i X + x) W, partition p = row i 128 + p
    (`block`). One DMA for the full tiles (its buffers: the X W contiguous elements of one row), one more for
    a ragged last tile; `load`: HBM -> SBUF, else SBUF -> HBM. With `perm`, of the first n = T // 128 n rows
    partition p holds the n consecutive rows p n .. p n + n - 1 (block i < n: rows p n + i, every partition
    one contiguous run of n X W elements; `natural_cols` finds a block's rows in natural order); a ragged
    last tile as without."""
    B, T, X, W = x_BTXK.shape
    P = nl.tile_size.pmax
    n, tail, XW = T // P, T % P, X * W
    pairs = []
    if n and perm:
        pairs.append((sb[0:P, 0:n * XW], x_BTXK[b, 0:n * P].reshape((P, n * XW))))
    elif n:
        pairs.append((sb[0:P, 0:n * XW], x_BTXK.ap(pattern=[[XW, P], [P * XW, n], [1, XW]], offset=b * T * XW)))
    if tail:
        pairs.append((sb[0:tail, n * XW:(n + 1) * XW], x_BTXK[b, n * P:T].reshape((tail, XW))))
    for on_chip, hbm in pairs:
        if load:
            nisa.dma_copy(dst=on_chip, src=hbm)
        else:
            nisa.dma_copy(dst=hbm, src=on_chip)


def seq_tile(x_BTXK, dt, b=None, perm=False):
    """An SBUF tile for all T rows of one batch of x_BTXK, every head (`seq_dma`'s layout); loaded from batch b
    unless b is None."""
    B, T, X, W = x_BTXK.shape
    t = nl.ndarray((nl.tile_size.pmax, cdiv(T, nl.tile_size.pmax) * X * W), dtype=dt, buffer=nl.sbuf)
    if b != None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        seq_dma(t, x_BTXK, b, True, perm)
    return t


def block(sb, i, x, X, W):
    """The [P, W] view of tile i, head x in a `seq_tile`."""
    c = (i * X + x) * W
    return sb[:, c:c + W]


def natural_cols(xT, i, T, perm):
    """The columns of xT ([K, T] in natural row order) holding block i's rows of a `seq_tile` in its layout
    (`perm`: rows p n + i, a stride-n view, `seq_dma`), [K, rows]."""
    P = nl.tile_size.pmax
    n = T // P
    K = xT.shape[0]
    if perm and i < n:
        return xT[0:K, i:n * P:n]
    return xT[0:K, i * P:min(T, (i + 1) * P)]


def lse_store(lse_BHT1, b, cols, ident32):
    """lse_BHT1[b] ([H, T] contiguous fp32) from cols, a [P, n H] fp32 `seq_tile` of [rows, 1] columns (tile
    i, head h at column i H + h): per tile one TensorE transpose into an [H, T] row tile, then one DMA."""
    B, H, T, _ = lse_BHT1.shape
    P = nl.tile_size.pmax
    rows_HT = nl.ndarray((H, T), dtype=nl.float32, buffer=nl.sbuf)
    for i, t0, r in row_tiles(T):
        transpose(rows_HT[0:H, t0:t0 + r], cols[0:r, i * H:(i + 1) * H], r, H, ident32, on_vector=True)
    nisa.dma_copy(dst=lse_BHT1[b].reshape((H, T)), src=rows_HT)


def neg_lse_load(lse_BHT1, b, ident32, rows_HT, cols, perm=False):
    """-lse_BHT1[b] as [rows, 1] columns into cols, a [P, n H] fp32 tile (`lse_store`'s layout), from rows_HT, its
    [H, T] rows loaded into SBUF: per tile one TensorE transpose, negated leaving PSUM; with `perm`, tile i holds
    the rows of a `perm` block (its stride-n columns of the rows, `natural_cols`)."""
    B, H, T, _ = lse_BHT1.shape
    P = nl.tile_size.pmax
    for i, _, r in row_tiles(T):
        t_ps = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
        transpose_to_psum(t_ps[0:r, 0:H], natural_cols(rows_HT, i, T, perm), H, ident32)
        nisa.activation(dst=cols[0:r, i * H:(i + 1) * H], op=nl.copy, data=t_ps[0:r, 0:H], scale=-1.0)


def rows_from_transpose(dst_sb, X, x, xT, T, ident, p0=0):
    """Head x of dst_sb (a natural-order `seq_tile`) from its transpose xT ([K, T] in SBUF, from partition p0:
    0, or 64 for the upper half of a stacked pair): TensorE transposes of 128 columns each, up to 512 / K blocks
    into one PSUM bank and out of it by one ScalarE copy into the blocks' strided
    [P, m, K] view."""
    K = xT.shape[0]
    P = nl.tile_size.pmax
    nt = cdiv(T, P)
    per = max(1, 512 // K)
    view = dst_sb.reshape((P, nt, X * K))
    for i0 in range(0, nt, per):
        m = min(per, nt - i0)
        rows = min(P, T - (i0 + m - 1) * P)  # only the last block may be ragged
        t_ps = nl.ndarray((P, per * K), dtype=nl.float32, buffer=nl.psum)
        for a in range(m):
            r = min(P, T - (i0 + a) * P)
            transpose_to_psum(t_ps[0:r, a * K:(a + 1) * K], xT[0:K, (i0 + a) * P:(i0 + a) * P + r], K, ident,
                              p0=p0)
        parts = [(0, m, P)] if rows == P else [(0, m - 1, P), (m - 1, 1, rows)]
        for a0, cnt, r in parts:
            if cnt == 0:
                continue
            dst = view[0:r, i0 + a0:i0 + a0 + cnt, x * K:(x + 1) * K]
            src = t_ps[0:r, a0 * K:(a0 + cnt) * K].reshape((r, cnt, K))
            nisa.activation(dst=dst, op=nl.copy, data=src)


def perm_rows(dst_sb, X, xs, srcs, T, ident, dt, src_head=(1, 0)):
    """Heads xs (one or two) of dst_sb (a `perm` `seq_tile`), each from head src_head = (X', x') of its srcs
    entry (a natural-order `seq_tile` of X' heads; default: one head's natural 128-row blocks side by side):
    TensorE transposes to the natural
    [K, T] transpose (4 blocks per PSUM bank, one copy out each), then back per `perm` block from its stride-n
    columns (`natural_cols`; 512 / K blocks per bank, one copy into their strided [P, m, K] view); the copies
    out of PSUM on ScalarE (VectorE's would hold GpSimd's SBUF port too); a ragged last block is natural in
    both layouts (a GpSimd copy). Two heads (K = 64) have their transposes stacked on the two halves of the
    partitions: one copy out of PSUM for both where one head's would fill half of them; each half is
    transposed back on its own 64-row tile of the PE array."""
    P = nl.tile_size.pmax
    SX, sx = src_head
    first, *_ = srcs
    K = first.shape[1] // (cdiv(T, P) * SX)
    if len(xs) == 2 and K != HALF:
        for xi, si in zip(xs, srcs):
            perm_rows(dst_sb, X, (xi,), (si,), T, ident, dt, src_head)
        return
    nt, n = cdiv(T, P), T // P
    S = len(xs)
    span = (S - 1) * HALF + K  # the transposes' partitions
    xT = nl.ndarray((span, T), dtype=dt, buffer=nl.sbuf)
    for i0 in range(0, nt, KQ):
        m = min(KQ, nt - i0)
        t_ps = nl.ndarray((P, KQ * P), dtype=nl.float32, buffer=nl.psum)
        for a in range(m):
            r = min(P, T - (i0 + a) * P)
            for s, si in enumerate(srcs):
                transpose_to_psum(t_ps[s * HALF:s * HALF + K, a * P:a * P + r], block(si, i0 + a, sx, SX, K)[0:r], r,
                                  ident, s * HALF)
        w = min(T, (i0 + m) * P) - i0 * P
        nisa.activation(dst=xT[0:span, i0 * P:i0 * P + w], op=nl.copy, data=t_ps[0:span, 0:w])
    view = dst_sb.reshape((P, nt, X * K))
    per = max(1, 512 // K)
    for s, xi in enumerate(xs):
        for j0 in range(0, n, per):
            m = min(per, n - j0)
            t_ps = nl.ndarray((P, per * K), dtype=nl.float32, buffer=nl.psum)
            for a in range(m):
                cols = natural_cols(xT, j0 + a, T, True)[s * HALF:s * HALF + K]
                transpose_to_psum(t_ps[0:P, a * K:(a + 1) * K], cols, K, ident, p0=s * HALF)
            nisa.activation(dst=view[0:P, j0:j0 + m, xi * K:(xi + 1) * K], op=nl.copy,
                            data=t_ps[0:P, 0:m * K].reshape((P, m, K)))
        if T % P:
            r = T % P
            nisa.tensor_copy(dst=view[0:r, n, xi * K:(xi + 1) * K], src=block(srcs[s], n, sx, SX, K)[0:r],
                             engine=nisa.engine.gpsimd)


def neg_rowdot(a_sb, b_sb, H, T, ident32, out):
    """-rowsum(a b) of every row and head of two `perm` `seq_tile`s (the backward's -Di = -rowsum(dO o)) as
    natural [rows, 1] columns into out, a [P, n H] fp32 tile (`lse_store`'s layout): per block and head the
    product (GpSimd) and its row sum (VectorE) in the `perm` layout, then per block one fp32 TensorE transpose of
    the block's H columns into [H, T] rows in natural order (`natural_cols`) and per natural tile one back.
    -> the stages (per block its sums, then the two transposes)."""
    P = nl.tile_size.pmax
    nt = cdiv(T, P)
    K = a_sb.shape[1] // (nt * H)
    cols = nl.ndarray((P, nt * H), dtype=nl.float32, buffer=nl.sbuf)
    rows_HT = nl.ndarray((H, T), dtype=nl.float32, buffer=nl.sbuf)

    def block_sums(i):
        r = min(P, T - i * P)
        prods = [nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf) for _ in range(H)]
        for h in range(H):
            nisa.tensor_tensor(dst=prods[h][0:r], data1=block(a_sb, i, h, H, K)[0:r],
                               data2=block(b_sb, i, h, H, K)[0:r], op=nl.multiply, engine=nisa.engine.gpsimd)
        for h in range(H):
            nisa.tensor_reduce(dst=cols[0:r, i * H + h:i * H + h + 1], op=nl.add, data=prods[h][0:r], axis=1,
                               negate=True, keepdims=True)

    def to_rows():
        for i, _, r in row_tiles(T):
            transpose(natural_cols(rows_HT, i, T, True), cols[0:r, i * H:(i + 1) * H], r, H, ident32, on_vector=True)

    def to_cols():
        for i, t0, r in row_tiles(T):
            transpose(out[0:r, i * H:(i + 1) * H], rows_HT[0:H, t0:t0 + r], H, r, ident32)

    return [lambda i=i: block_sums(i) for i in range(nt)] + [to_rows, to_cols]
