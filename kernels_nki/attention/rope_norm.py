"""QK-norm + RoPE (+ the query gain) on chip for the attention kernels (a kernel-helper file): `prep_tile` (the
forward: rms_norm, rotation, gain of raw rows), `prep_grad` (the backward through them), `rope_tiles` (cos / sin
tables per 128-row block), `gain_tile` / `gain_column`. The math and engine choices: docs/kernels/attention.md,
"QK-norm, RoPE and gain".
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.attention.layout import block, seq_dma
from kernels_nki.tiles import EPS, cdiv


def prep_head(x_sb, H, h, T, tables, gain, outs, dt):
    """`prep_tile` of every 128-row tile of query head h (x_sb: the batch's `seq_tile`), written to outs = (qg
    seq tile, qinv seq tile) -> the y views."""
    P = nl.tile_size.pmax
    K = x_sb.shape[1] // (cdiv(T, P) * H)
    items = [(block(x_sb, i, h, H, K), min(P, T - i * P), tables[i], (block(outs[0], i, h, H, K),
                                                                       block(outs[1], i, h, H, 1)))
             for i in range(cdiv(T, P))]
    n = cdiv(T, P)
    return [y for y, _ in prep_tile(items, gain, dt, outs[1][:, h:(n - 1) * H + h + 1:H])]


def rope_tiles(cos_TK2, sin_TK2, perm=False):
    """Per 128-row block (cos2 = [cos, cos] [P, K], sin, -sin [P, K/2]) in fp32 SBUF, built once per call
    from cos/sin [T, K/2] (fp32 in HBM): the tables `rotate` multiplies by, for the rows of a `seq_tile`'s
    blocks in its layout (`perm`: `seq_dma`'s); cos and sin each arrive by one DMA in that layout (plus one
    for a ragged last block)."""
    T, K2 = cos_TK2.shape
    P = nl.tile_size.pmax
    nt = cdiv(T, P)
    both = []
    for x_TK2 in (cos_TK2, sin_TK2):
        t = nl.ndarray((P, nt * K2), dtype=nl.float32, buffer=nl.sbuf)
        seq_dma(t, x_TK2.reshape((1, T, 1, K2)), 0, True, perm)
        both.append(t)
    tiles = []
    for i in range(nt):
        r = min(P, T - i * P)
        c2 = nl.ndarray((P, 2 * K2), dtype=nl.float32, buffer=nl.sbuf)
        ns = nl.ndarray((P, K2), dtype=nl.float32, buffer=nl.sbuf)
        c, sn = both[0][:, i * K2:(i + 1) * K2], both[1][:, i * K2:(i + 1) * K2]
        nisa.tensor_copy(dst=c2[0:r, 0:K2], src=c[0:r], engine=nisa.engine.gpsimd)
        nisa.tensor_copy(dst=c2[0:r, K2:2 * K2], src=c[0:r], engine=nisa.engine.gpsimd)
        nisa.activation(dst=ns[0:r], op=nl.copy, data=sn[0:r], scale=-1.0)
        tiles.append((c2, sn, ns))
    return tiles


def rotate(items, inverse, engine, run=None):
    """dst[0:rows] = the half-split rotation of x_f (fp32 [P, K]) by the rows' angles, for each (dst, x_f, rows,
    cs) of items: (x1 cos + x2 sin, x2 cos - x1 sin) as reference.rope, or by minus the angles (`inverse`, the
    backward), as x [cos, cos] + [x2 (+-sin), x1 (-+sin)]: four instructions per item on `engine` (SBUF
    operands only), each step issued for every item before the next (independent chains interleave on the
    engines' in-order instruction streams). run: None (issue now) or a callable given each step as a unit
    (`staged`)."""
    P = nl.tile_size.pmax
    tmp = [nl.ndarray((P, it[1].shape[1]), dtype=nl.float32, buffer=nl.sbuf) for it in items]
    es = [nl.ndarray((P, it[1].shape[1]), dtype=nl.float32, buffer=nl.sbuf) for it in items]

    def cos_part():
        for (dst, x_f, rows, cs), a in zip(items, tmp):
            nisa.tensor_tensor(dst=a[0:rows], data1=x_f[0:rows], data2=cs[0][0:rows], op=nl.multiply, engine=engine)

    def sin_part():
        for (dst, x_f, rows, cs), e in zip(items, es):
            K2 = x_f.shape[1] // 2
            c2, s, ns = cs
            nisa.tensor_tensor(dst=e[0:rows, 0:K2], data1=x_f[0:rows, K2:2 * K2],
                               data2=(ns if inverse else s)[0:rows], op=nl.multiply, engine=engine)
            nisa.tensor_tensor(dst=e[0:rows, K2:2 * K2], data1=x_f[0:rows, 0:K2],
                               data2=(s if inverse else ns)[0:rows], op=nl.multiply, engine=engine)

    def total():
        for (dst, x_f, rows, cs), a, e in zip(items, tmp, es):
            nisa.tensor_tensor(dst=dst[0:rows], data1=a[0:rows], data2=e[0:rows], op=nl.add, engine=engine)

    staged([cos_part, sin_part, total], run)


def staged(stages, run):
    """Each stage now (run None), or handed to run (a unit list's append: `pipelined`'s side work)."""
    for f in stages:
        if run is None:
            f()
        else:
            run(f)


def prep_tile(items, gain, dt, inv_all=None):
    """[(y [P, K] in dt = rope(qk_norm(x)) [* gain], inv = rsqrt(mean(x^2) + eps) fp32 [P, 1])] of raw [rows,
    K] tiles, items = [(x_t, rows, cs, out)] (out: () or the (y, inv) views to write), fp32 math
    (reference.rms_norm, reference.rope / rope_gain); gain: () or (g_P1,) with g_P1 = gain * sqrt(K)
    (`gain_column`). The squares on GpSimd, each row's sum on VectorE into column k of one [P, n] tile; r =
    rsqrt(sum(x^2) + K eps) = inv / sqrt(K) by GpSimd tensor_scalar (add, then rsqrt: GpSimd tensor_scalar
    is documented for rsqrt only, nki/api/nki/isa/__init__.py tensor_scalar `engine`), x r (gain) sqrt(K) by
    one VectorE tensor_scalar per item, inv (a residual for the backward) on ScalarE, the rotation on GpSimd;
    when every item is full, r and inv for all items at once (inv_all: the items' inv views side by side as
    one [P, n] view, written instead of their out views); each step for every item before the next (`rotate`)."""
    P = nl.tile_size.pmax
    gp = nisa.engine.gpsimd
    K = items[0][0].shape[1]
    n = len(items)
    full = all(it[1] == P for it in items)
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
    for (x_t, rows, cs, out), r_P1 in (((None, P, None, None), r_all),) if full else zip(items, rs):
        nisa.tensor_scalar(dst=r_P1[0:rows], data=r_P1[0:rows], op0=nl.add, operand0=K * EPS, op1=nl.rsqrt,
                           operand1=0.0, engine=gp)
    for (x_t, rows, cs, out), r_P1 in zip(items, rs):
        xs = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=xs[0:rows], data=x_t[0:rows], op0=nl.multiply, operand0=r_P1[0:rows],
                           op1=nl.multiply, operand1=gain[0][0:rows] if gain else K ** 0.5)
        xss.append(xs)
    if full and inv_all is not None:
        nisa.activation(dst=inv_all, op=nl.copy, data=r_all, scale=K ** 0.5)
        invs = [inv_all[:, k:k + 1] for k in range(n)]
    else:
        invs = []
        for (x_t, rows, cs, out), r_P1 in zip(items, rs):
            inv_P1 = out[1] if out else nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=inv_P1[0:rows], op=nl.copy, data=r_P1[0:rows], scale=K ** 0.5)
            invs.append(inv_P1)
    for (x_t, rows, cs, out), inv_P1 in zip(items, invs):
        y = out[0] if out else nl.ndarray((P, K), dtype=dt, buffer=nl.sbuf)
        outs.append((y, inv_P1))
    rotate([(y, xs, it[1], it[2]) for (y, _), xs, it in zip(outs, xss, items)], False, gp)
    return outs


def scale_rows(dst, x, rows, s_P1):
    """dst[0:rows] = x[0:rows] * s (an fp32 [P, 1] column) on VectorE (SBUF only, beside ScalarE's PSUM work)."""
    nisa.tensor_scalar(dst=dst[0:rows], data=x[0:rows], op0=nl.multiply, operand0=s_P1[0:rows])


def prep_grad(items, gain, dg_P1, rot_engine, run=None, done=None, prescaled=False):
    """dst[0:rows] = the gradient through `prep_tile` of d_f (fp32 [P, K], w.r.t. its output rows), for each
    (dst, d_f, rows, cs, norm) of items, norm = (xn, inv, -xn / K) (`head_rows`): w = rope^-1(d), c = rowsum(w
    (-xn / K)) = -dot / K, dx = gain inv (w + xn c) (reference.rms_norm_bwd after rope_gain_bwd); with a gain,
    dg_P1 += c, -1 / K times the gain's gradient per row (d . rope(xn) = w . xn = dot, the rotation being
    orthogonal). Products and sums of tiles on GpSimd, row sums, [P, 1] columns and the scalings by them on VectorE;
    each step for every item before the next (`rotate`); run as `staged`, `done` (a callable) the last stage;
    `prescaled`: each norm's inv column is inv gain already."""
    P = nl.tile_size.pmax
    gp = nisa.engine.gpsimd
    K = items[0][1].shape[1]
    ws = [nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf) for _ in items]
    rotate([(w, it[1], it[2], it[3]) for w, it in zip(ws, items)], True, rot_engine, run)
    prods = [nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf) for _ in items]
    cs_ = [nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf) for _ in items]

    def products():
        for (dst, d_f, rows, cs, norm), w, prod in zip(items, ws, prods):
            nisa.tensor_tensor(dst=prod[0:rows], data1=w[0:rows], data2=norm[2][0:rows], op=nl.multiply, engine=gp)

    def sums():
        for (dst, d_f, rows, cs, norm), prod, c_P1 in zip(items, prods, cs_):
            nisa.tensor_reduce(dst=c_P1[0:rows], op=nl.add, data=prod[0:rows], axis=1, keepdims=True)
        if gain:
            for (dst, d_f, rows, cs, norm), c_P1 in zip(items, cs_):
                nisa.tensor_tensor(dst=dg_P1[0:rows], data1=dg_P1[0:rows], data2=c_P1[0:rows], op=nl.add,
                                   engine=gp)

    def centre():
        for (dst, d_f, rows, cs, norm), prod, c_P1 in zip(items, prods, cs_):
            scale_rows(prod, norm[0], rows, c_P1)
        for (dst, d_f, rows, cs, norm), prod, w in zip(items, prods, ws):
            nisa.tensor_tensor(dst=w[0:rows], data1=w[0:rows], data2=prod[0:rows], op=nl.add, engine=gp)

    def out():
        for (dst, d_f, rows, cs, norm), w in zip(items, ws):
            s_P1 = norm[1]
            if gain and not prescaled:
                s_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=s_P1[0:rows], data=norm[1][0:rows], op0=nl.multiply,
                                   operand0=gain[0][0:rows], op1=nl.multiply, operand1=K ** -0.5)
            scale_rows(dst, w, rows, s_P1)
        if done is not None:
            done()

    staged([products, sums, centre, out], run)


def gain_tile(g_PH):
    """The query gains times sqrt(K) as an fp32 [P, H] tile (g_PH: the gain broadcast over 128 rows; sqrt(K)
    undoes `prep_tile`'s rsqrt(sum x^2 + K eps) = inv / sqrt(K)), loaded once per call; K is taken by
    `gain_column`."""
    P, H = g_PH.shape
    g_sb = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g_sb, src=g_PH)
    return g_sb


def gain_column(g_sb, h, K):
    """(g_P1,): head h's gain times sqrt(K), an fp32 [P, 1] column, from `gain_tile`."""
    P = nl.tile_size.pmax
    g_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=g_P1, data=g_sb[0:P, h:h + 1], op0=nl.multiply, operand0=K ** 0.5)
    return (g_P1,)

