"""TensorE work of the projection kernels (a kernel-helper file: no @nki.jit): a row tile's transposes, the
matmul of a row tile into PSUM banks of 512 columns, and the copies out of PSUM. Engine and port choices:
docs/kernels/projection.md."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.tiles import row_tiles, transpose_to_psum

W = 512  # moving columns per matmul: one fp32 PSUM bank (gemm_moving_fmax)
PSUM_BANKS = 8  # 2 MiB PSUM = 16 KiB per partition (trn1 arch guide, "Memory"), in 2 KiB banks of 512 fp32


def sb(cols, dt):
    """A fresh [128, cols] SBUF tile in dt."""
    return nl.ndarray((nl.tile_size.pmax, cols), dtype=dt, buffer=nl.sbuf)


def ps(cols=W):
    """A fresh [128, cols] fp32 PSUM tile (one bank at 512 columns)."""
    return nl.ndarray((nl.tile_size.pmax, cols), dtype=nl.float32, buffer=nl.psum)


def evacuate(dst, src, on_vector, scale=None, scaled=False):
    """PSUM -> SBUF with the cast to dst's dtype (with `scaled`, times the per-row fp32 [P, 1] `scale`), on
    VectorE or ScalarE. A Python flag, not a comparison of a tile with None, says whether to scale."""
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
    for i, c0, k in row_tiles(cols):
        t_ps = ps(P)
        transpose_to_psum(t_ps[0:k, 0:rows], t[0:rows, c0:c0 + k], rows, ident)
        tT = sb(P, dt)
        evacuate(tT[0:k, 0:rows], t_ps[0:k, 0:rows], (i % 2 == 0) == first_on_vector and not on_scalar)
        out.append(tT)
    return out


def chunks(K):
    """A contraction of K rows in chunks of at most 128 (the partitions): their sizes."""
    return [k for _, _, k in row_tiles(K)]


def part_chunks(widths):
    """The chunks of a contraction over parts laid side by side (q, k, v): each part's own `chunks`, so that a
    part's transposed row tiles line up with them."""
    return [k for w in widths for k in chunks(w)]


def pieces(parts, c0, c1):
    """[(s, a, b, off)]: columns c0:c1 of the tiles `parts` laid side by side, as part s's own columns a:b, at
    offset off from c0."""
    out, start = [], 0
    for s, part in enumerate(parts):
        end = start + part.shape[1]
        lo, hi = max(c0, start), min(c1, end)
        if lo < hi:
            out.append((s, lo - start, hi - start, lo - c0))
        start = end
    return out


def products(lhsT, rhs, ks, O, rows):
    """lhsT^T @ rhs over a contraction in chunks `ks` as O/512 fp32 PSUM tiles [rows, 512]: lhsT as [128, rows]
    tiles, rhs as [128, O] tiles (tile i holds chunk i's contraction rows)."""
    out = []
    for _, o0, w in row_tiles(O, W):
        acc = ps()
        for i, k in enumerate(ks):
            nisa.nc_matmul(dst=acc[0:rows, 0:w], stationary=lhsT[i][0:k, 0:rows], moving=rhs[i][0:k, o0:o0 + w])
        out.append(acc)
    return out


def matmul_rows(lhsT, rhs, ks, dsts, rows, scale=None, scaled=False):
    """The tiles dsts laid side by side ([rows, O] together, SBUF, their dtype) = lhsT^T @ rhs (`products`),
    leaving PSUM alternately on VectorE and ScalarE; with `scaled` times the per-row fp32 [rows, 1] `scale`."""
    O = 0
    for d in dsts:
        O += d.shape[1]
    n, cols = 0, row_tiles(O, W)
    for o, acc in enumerate(products(lhsT, rhs, ks, O, rows)):
        _, o0, w = cols[o]
        for s, a, b, off in pieces(dsts, o0, o0 + w):
            evacuate(dsts[s][0:rows, a:b], acc[0:rows, off:off + b - a], n % 2 == 0,
                     scale[0:rows] if scaled else None, scaled)
            n += 1
