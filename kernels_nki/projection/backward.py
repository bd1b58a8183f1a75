"""`projection`'s backward body (a kernel-helper file: no @nki.jit; the entry point is
`kernels_nki.projection.kernels.projection_bwd`): dx = dy w^T per row tile, dw = x^T dy contracted over the tokens
in PSUM, in one pass or several as the PSUM banks allow (docs/kernels/projection.md, "Layout")."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import groups, load, rows_per_partition, store, tile
from kernels_nki.projection.matmul import PSUM_BANKS, W, chunks, evacuate, matmul_rows, ps, sb, transposed
from kernels_nki.tiles import row_tiles


def dy_group(dy_NO, g, c0, c1, dt, R):
    """Columns c0:c1 of dy's group g as a [128, R (c1 - c0)] tile (row tile j at columns j (c1 - c0) ..)."""
    O = dy_NO.shape[1]
    if c0 == 0 and c1 == O:
        return load(dy_NO, g, dt, R)
    r0, parts, rows = g
    t = sb(R * (c1 - c0), dt)
    nisa.dma_copy(dst=t[0:parts, 0:rows * (c1 - c0)],
                  src=dy_NO.ap(pattern=[[rows * O, parts], [O, rows], [1, c1 - c0]], offset=r0 * O + c0))
    return t


def dw_pass(x_NI, dy_NO, dw_IO, o0, o1, dt, ident, dx_NI=None, wT=None):
    """dw_IO[:, o0*512 : o1*512] = x^T dy over every row tile, I/128 x (o1 - o0) PSUM banks, x and that
    column range of dy read once. With dx_NI/wT it also computes dx = dy w^T in the same pass (dy read
    once in all)."""
    N, I = x_NI.shape
    O = dy_NO.shape[1]
    R = rows_per_partition(I)
    with_dx = dx_NI != None  # noqa: E711 (NKI has no `is`: nki/migration/index.rst)
    c0, c1 = o0 * W, min(O, o1 * W)
    cols, ins = row_tiles(c1 - c0, W), row_tiles(I)
    acc = [[ps() for _ in cols] for _ in ins]
    for g in groups(N, R):
        _, parts, rows = g
        x_g, dy_g = load(x_NI, g, dt, R), dy_group(dy_NO, g, c0, c1, dt, R)
        dx_g = sb(R * I, dt) if with_dx else None
        for j in range(rows):
            x_t, dy_t = tile(x_g, g, j, I), tile(dy_g, g, j, c1 - c0)
            if with_dx:
                matmul_rows(transposed(dy_t, parts, O, dt, ident), wT, chunks(O), [tile(dx_g, g, j, I)], parts)
            for o, oc, w in cols:
                for i, i0, k in ins:
                    nisa.nc_matmul(dst=acc[i][o][0:k, 0:w], stationary=x_t[0:parts, i0:i0 + k],
                                   moving=dy_t[0:parts, oc:oc + w])
        if with_dx:
            store(dx_NI, g, dx_g)
    for o, oc, w in cols:
        for i, i0, k in ins:
            out = sb(W, nl.float32)
            evacuate(out[0:k, 0:w], acc[i][o][0:k, 0:w], i % 2 == 0)
            nisa.dma_copy(dst=dw_IO[i0:i0 + k, c0 + oc:c0 + oc + w], src=out[0:k, 0:w])


def resid_backward(x_NI, dy_NO, dx_NI, dw_IO, ident, wT):
    """dx_NI = dy w^T (wT: w^T's tiles), dw_IO = x^T dy (fp32). With as few PSUM banks as the output
    projection's (I/128 x O/512 = 4, plus dx's and a transpose's) dx and dw share one pass over the tokens;
    with up to 8 dx takes one pass and every dw slice a second; beyond, one pass over x per 512-column slice."""
    N, I = x_NI.shape
    O = dy_NO.shape[1]
    dt = x_NI.dtype
    slices = len(row_tiles(O, W))
    banks = len(row_tiles(I)) * slices  # dw's PSUM banks with every slice at once
    if banks + 2 <= PSUM_BANKS:  # dx's bank and a transpose's fit beside them: one pass for dx and dw
        dw_pass(x_NI, dy_NO, dw_IO, 0, slices, dt, ident, dx_NI, wT)
        return
    R = rows_per_partition(I)
    for g in groups(N, R):
        _, parts, rows = g
        dy_g = load(dy_NO, g, dt, R)
        dx_g = sb(R * I, dt)
        for j in range(rows):
            matmul_rows(transposed(tile(dy_g, g, j, O), parts, O, dt, ident), wT, chunks(O), [tile(dx_g, g, j, I)],
                        parts)
        store(dx_NI, g, dx_g)
    if banks <= PSUM_BANKS:  # every dw slice in one pass over x
        dw_pass(x_NI, dy_NO, dw_IO, 0, slices, dt, ident)
        return
    for o in range(slices):  # one pass over x per 512-column slice
        dw_pass(x_NI, dy_NO, dw_IO, o, o + 1, dt, ident)
