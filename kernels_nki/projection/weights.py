"""The projection kernels' weights in SBUF (a kernel-helper file: no @nki.jit): w's row tiles (the forward's
moving operand) and w^T's (the backward's), loaded once per call."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.projection.matmul import evacuate, ps, sb
from kernels_nki.tiles import row_tiles, transpose_to_psum


def weight_tiles(w_IO, dt):
    """w_IO as I/128 SBUF tiles [<=128, O] in dt (the contraction rows on partitions)."""
    I, O = w_IO.shape
    tiles = []
    for _, i0, k in row_tiles(I):
        t = nl.ndarray((k, O), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=w_IO[i0:i0 + k])
        tiles.append(t)
    return tiles


def weight_transposed(w_IO, dt, ident, ks):
    """w_IO^T as SBUF tiles [128, I], one per chunk of w's O columns in `ks` (TensorE transposes, once per call;
    the copies out of PSUM alternate ScalarE and VectorE)."""
    P = nl.tile_size.pmax
    I, O = w_IO.shape
    wT = [sb(I, dt) for _ in ks]
    for _, i0, k in row_tiles(I):
        w_t = sb(O, dt)
        nisa.dma_copy(dst=w_t[0:k], src=w_IO[i0:i0 + k])
        c0 = 0
        for j, kc in enumerate(ks):
            t_ps = ps(P)
            transpose_to_psum(t_ps[0:kc, 0:k], w_t[0:k, c0:c0 + kc], k, ident)
            evacuate(wT[j][0:kc, i0:i0 + k], t_ps[0:kc, 0:k], j % 2 == 1)
            c0 += kc
    return wT
