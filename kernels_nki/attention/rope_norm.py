"""QK-norm + RoPE (+ the query gain) on chip for the attention kernels (a kernel-helper file): `prep_tile` (the
forward: rms_norm, rotation, gain of raw rows), `prep_grad` (the backward through them), `rope_tiles` (cos / sin
tables per 128-row block), `gain_tile` / `gain_column`. The math and engine choices: docs/kernels/attention.md,
"QK-norm, RoPE and gain".
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.attention.layout import block, seq_dma
from kernels_nki.attention.state import Gain, RopeTile
from kernels_nki.tiles import EPS, cdiv, row_tiles


def prep_head(x_sb, H, h, T, tables, gain, outs):
    """`prep_tile` of every 128-row tile of query head h (x_sb: the sequence's `seq_tile`), written to outs (the
    sequence's `saved_tiles`: qg, qinv) -> the y views."""
    n = cdiv(T, nl.tile_size.pmax)
    K = x_sb.shape[1] // (n * H)
    items = [(block(x_sb, i, h, H, K), rows, tables[i], (block(outs.qg, i, h, H, K), block(outs.qinv, i, h, H, 1)))
             for i, _, rows in row_tiles(T)]
    return [y for y, _ in prep_tile(items, gain, outs.qinv[:, h:(n - 1) * H + h + 1:H])]


def rope_tiles(cos_TK2, sin_TK2, perm=False):
    """Per 128-row block a `RopeTile` in fp32 SBUF, built once per call from cos / sin [T, K / 2] (fp32 in HBM): the
    tables `rotate` multiplies by, for the rows of a `seq_tile`'s blocks in its layout (`perm`: `seq_dma`'s); cos
    and sin each arrive by one DMA in that layout (plus one for a ragged last block)."""
    T, K2 = cos_TK2.shape
    P = nl.tile_size.pmax
    nt = cdiv(T, P)
    cos_sb = nl.ndarray((P, nt * K2), dtype=nl.float32, buffer=nl.sbuf)
    sin_sb = nl.ndarray((P, nt * K2), dtype=nl.float32, buffer=nl.sbuf)
    for t, x_TK2 in ((cos_sb, cos_TK2), (sin_sb, sin_TK2)):
        seq_dma(t, x_TK2.reshape((1, T, 1, K2)), 0, True, perm)
    tiles = []
    for i, _, r in row_tiles(T):
        c2 = nl.ndarray((P, 2 * K2), dtype=nl.float32, buffer=nl.sbuf)
        ns = nl.ndarray((P, K2), dtype=nl.float32, buffer=nl.sbuf)
        c, sn = cos_sb[:, i * K2:(i + 1) * K2], sin_sb[:, i * K2:(i + 1) * K2]
        nisa.tensor_copy(dst=c2[0:r, 0:K2], src=c[0:r], engine=nisa.engine.gpsimd)
        nisa.tensor_copy(dst=c2[0:r, K2:2 * K2], src=c[0:r], engine=nisa.engine.gpsimd)
        nisa.activation(dst=ns[0:r], op=nl.copy, data=sn[0:r], scale=-1.0)
        tiles.append(RopeTile(cos2=c2, sin=sn, neg_sin=ns))
    return tiles


def rotate(items, inverse, engine):
    """The half-split rotation of each item's rows, as stages (each issued for every item before the next:
    independent chains interleave on the engines' in-order instruction streams).

    Args:
        items: [(dst, x_f, rows, cs)]: dst[0:rows] = x_f (fp32 [P, K]) rotated by the rows' angles (cs: `RopeTile`).
        inverse: by minus the angles (the backward).
        engine: the engine of the four instructions per item (SBUF operands only).

    Returns:
        The stages: x [cos, cos], [x2 (+-sin), x1 (-+sin)], their sum (reference.rope).
    """
    P = nl.tile_size.pmax
    tmp = [nl.ndarray((P, x_f.shape[1]), dtype=nl.float32, buffer=nl.sbuf) for _, x_f, _, _ in items]
    es = [nl.ndarray((P, x_f.shape[1]), dtype=nl.float32, buffer=nl.sbuf) for _, x_f, _, _ in items]

    def cos_part():
        for (dst, x_f, rows, cs), a in zip(items, tmp):
            nisa.tensor_tensor(dst=a[0:rows], data1=x_f[0:rows], data2=cs.cos2[0:rows], op=nl.multiply,
                               engine=engine)

    def sin_part():
        for (dst, x_f, rows, cs), e in zip(items, es):
            K2 = x_f.shape[1] // 2
            nisa.tensor_tensor(dst=e[0:rows, 0:K2], data1=x_f[0:rows, K2:2 * K2],
                               data2=(cs.neg_sin if inverse else cs.sin)[0:rows], op=nl.multiply, engine=engine)
            nisa.tensor_tensor(dst=e[0:rows, K2:2 * K2], data1=x_f[0:rows, 0:K2],
                               data2=(cs.sin if inverse else cs.neg_sin)[0:rows], op=nl.multiply, engine=engine)

    def total():
        for (dst, x_f, rows, cs), a, e in zip(items, tmp, es):
            nisa.tensor_tensor(dst=dst[0:rows], data1=a[0:rows], data2=e[0:rows], op=nl.add, engine=engine)

    return [cos_part, sin_part, total]


def prep_tile(items, gain, inv_all):
    """rope(qk_norm(x)) [* gain] of raw row tiles, in fp32 (reference.rms_norm, reference.rope / rope_gain), each
    step for every item before the next.

    Args:
        items: [(x_t, rows, cs, out)]: raw [rows, K] tiles, their `RopeTile`, out the (y in dt, inv) views to write.
        gain: () or the head's `Gain`.
        inv_all: the items' inv views side by side as one [P, n] view, written at once when every item is full.

    Returns:
        [(y [P, K] in dt, inv = rsqrt(mean(x^2) + eps) fp32 [P, 1])].

    Notes:
        The squares on GpSimd, each row's sum on VectorE into column k of one [P, n] tile; r = rsqrt(sum(x^2) + K eps)
        = inv / sqrt(K) by GpSimd tensor_scalar (GpSimd tensor_scalar is documented for rsqrt only:
        aws-neuron-sdk nki/api/nki/isa/__init__.py tensor_scalar `engine`); x r (gain) sqrt(K) on VectorE; inv on
        ScalarE; the rotation on GpSimd.
    """
    P = nl.tile_size.pmax
    gp = nisa.engine.gpsimd
    n = len(items)
    first, *_ = items
    x0, _, _, _ = first
    K = x0.shape[1]
    full = all(rows == P for _, rows, _, _ in items)
    xss, outs = [], []
    r_all = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    rs = [r_all[:, k:k + 1] for k in range(n)]
    sqs = []
    for x_t, rows, cs, out in items:
        sq = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=sq[0:rows], data1=x_t[0:rows], data2=x_t[0:rows], op=nl.multiply, engine=gp)
        sqs.append(sq)
    for (x_t, rows, cs, out), sq, r_P1 in zip(items, sqs, rs):
        nisa.tensor_reduce(dst=r_P1[0:rows], op=nl.add, data=sq[0:rows], axis=1, keepdims=True)
    for rows, r_P1 in [(P, r_all)] if full else [(rows, r_P1) for (_, rows, _, _), r_P1 in zip(items, rs)]:
        nisa.tensor_scalar(dst=r_P1[0:rows], data=r_P1[0:rows], op0=nl.add, operand0=K * EPS, op1=nl.rsqrt,
                           operand1=0.0, engine=gp)
    for (x_t, rows, cs, out), r_P1 in zip(items, rs):
        xs = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=xs[0:rows], data=x_t[0:rows], op0=nl.multiply, operand0=r_P1[0:rows],
                           op1=nl.multiply, operand1=gain.col[0:rows] if gain else K ** 0.5)
        xss.append(xs)
    if full:
        nisa.activation(dst=inv_all, op=nl.copy, data=r_all, scale=K ** 0.5)
        invs = [inv_all[:, k:k + 1] for k in range(n)]
    else:
        invs = []
        for (x_t, rows, cs, (_, inv_P1)), r_P1 in zip(items, rs):
            nisa.activation(dst=inv_P1[0:rows], op=nl.copy, data=r_P1[0:rows], scale=K ** 0.5)
            invs.append(inv_P1)
    for (x_t, rows, cs, (y, _)), inv_P1 in zip(items, invs):
        outs.append((y, inv_P1))
    for stage in rotate([(y, xs, rows, cs) for (y, _), xs, (_, rows, cs, _) in zip(outs, xss, items)], False, gp):
        stage()
    return outs


def scale_rows(dst, x, rows, s_P1):
    """dst[0:rows] = x[0:rows] * s (an fp32 [P, 1] column) on VectorE (SBUF only, beside ScalarE's PSUM work)."""
    nisa.tensor_scalar(dst=dst[0:rows], data=x[0:rows], op0=nl.multiply, operand0=s_P1[0:rows])


def prep_grad(items, rot_engine, dg_P1=None, done=None):
    """The gradient through `prep_tile`, as stages (each step for every item before the next).

    Args:
        items: [(dst, d_f, rows, cs, norm)]: dst[0:rows] = the gradient of d_f (fp32 [P, K], w.r.t. the output
            rows); norm: the rows' `RowNorm`, its inv the final scale (inv gain / sqrt(K) with a gain).
        rot_engine: the inverse rotation's engine.
        dg_P1: with a gain, += c per row, -1 / K times the gain's gradient (d . rope(xn) = w . xn = dot, the
            rotation being orthogonal).
        done: a callable, the last stage's end.

    Returns:
        The stages: the inverse rotation's, then w (-xn / K), c = rowsum(...) = -dot / K, w + xn c, dx = inv (w +
        xn c) (reference.rms_norm_bwd after rope_gain_bwd).

    Notes:
        Products and sums of tiles on GpSimd, row sums, [P, 1] columns and the scalings by them on VectorE.
    """
    P = nl.tile_size.pmax
    gp = nisa.engine.gpsimd
    first, *_ = items
    _, d0, _, _, _ = first
    K = d0.shape[1]
    ws = [nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf) for _ in items]
    rot = rotate([(w, d_f, rows, cs) for w, (_, d_f, rows, cs, _) in zip(ws, items)], True, rot_engine)
    prods = [nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf) for _ in items]
    cs_ = [nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf) for _ in items]

    def products():
        for (dst, d_f, rows, cs, norm), w, prod in zip(items, ws, prods):
            nisa.tensor_tensor(dst=prod[0:rows], data1=w[0:rows], data2=norm.xk[0:rows], op=nl.multiply, engine=gp)

    def sums():
        for (dst, d_f, rows, cs, norm), prod, c_P1 in zip(items, prods, cs_):
            nisa.tensor_reduce(dst=c_P1[0:rows], op=nl.add, data=prod[0:rows], axis=1, keepdims=True)
        if dg_P1 != None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
            for (dst, d_f, rows, cs, norm), c_P1 in zip(items, cs_):
                nisa.tensor_tensor(dst=dg_P1[0:rows], data1=dg_P1[0:rows], data2=c_P1[0:rows], op=nl.add,
                                   engine=gp)

    def centre():
        for (dst, d_f, rows, cs, norm), prod, c_P1 in zip(items, prods, cs_):
            scale_rows(prod, norm.xn, rows, c_P1)
        for (dst, d_f, rows, cs, norm), prod, w in zip(items, prods, ws):
            nisa.tensor_tensor(dst=w[0:rows], data1=w[0:rows], data2=prod[0:rows], op=nl.add, engine=gp)

    def out():
        for (dst, d_f, rows, cs, norm), w in zip(items, ws):
            scale_rows(dst, w, rows, norm.inv)
        if done != None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
            done()

    return rot + [products, sums, centre, out]


def gain_tile(g_PH):
    """The query gains as an fp32 [P, H] tile (g_PH: the gain broadcast over 128 rows), loaded once per call."""
    P, H = g_PH.shape
    g_sb = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g_sb, src=g_PH)
    return g_sb


def gain_column(g_sb, h, K):
    """Head h's `Gain`: its gain times sqrt(K) (undoing `prep_tile`'s rsqrt(sum x^2 + K eps) = inv / sqrt(K)) as an
    fp32 [P, 1] column, from `gain_tile`."""
    P = nl.tile_size.pmax
    g_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=g_P1, data=g_sb[0:P, h:h + 1], op0=nl.multiply, operand0=K ** 0.5)
    return Gain(col=g_P1)
