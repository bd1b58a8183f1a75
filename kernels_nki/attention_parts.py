"""Helpers of the attention kernels (kernels_nki/attention.py): a kernel-helper file (no @nki.jit; the NKI
compiler inlines the functions a kernel calls, whichever file holds them; under the emulator
`kernels_nki.emulator.loader` loads it for the kernel file).

- Loading rows: `head_rows` (a 128-row block of one head and its transpose), `kv_head` (all blocks of a kv
  head and k^T), `v_aug` ([v | 1] tiles: p [v | 1] carries the softmax's row sums in its last column); the
  layouts they read: kernels_nki/attention_layout.py.
- QK-norm + RoPE (+ gain), fused (`prep_tile`): each raw q / k row block, once loaded, is normed and rotated
  in SBUF before its transpose, in fp32 (rounded once to the input dtype): the row sums of squares,
  rsqrt(sum + K eps) (one GpSimd tensor_scalar: GpSimd tensor_scalar is documented for rsqrt only), the
  scaling by it times sqrt(K) (times the gain: `gain_column` folds sqrt(K) in) and the rotation as x [cos,
  cos] + [x2 sin, -x1 sin] (four GpSimd tensor_tensor instructions; `rotate`). The forward writes the
  normed, rotated q / k and each row's inverse RMS (`saved_outputs`, into `seq_tile`s); the backward reads
  them (and forms xn = x inv from the raw rows) and takes dq / dk back through them (`prep_grad`): w =
  rope^-1(d), dot = rowsum(w xn), dx = gain inv (w - xn dot / K); the gain's gradient is rowsum(w xn)
  summed over the rows.
- `half_matmul`: a contraction over K <= 64 rows whose operands sit on one half of the partitions runs on
  that 64-row half of the PE array (row tiling mode, nki/api/nki/isa/__init__.py nc_matmul, "Tiling mode":
  2 x 64-row tiles on NeuronCore-v2), so that two such matmuls on different halves run in parallel.
- `causal_bias`: the identity (the moving side of every transpose), the 0 / -1e30 causal bias of a
  diagonal block and a ones tile, built once per call by GpSimd affine_select.
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.attention_layout import block, natural_cols, seq_dma
from kernels_nki.tiles import EPS, cdiv, identity, stacked_transpose, transpose

NEG = -1.0e30  # masked raw score: exp(scale * NEG - ...) is exactly 0


def dims(q_BTHK, k_BTGK):
    """(B, T, H, K, G, R query heads per kv head, P partitions, dtype, softmax scale 1/sqrt(K))."""
    B, T, H, K = q_BTHK.shape
    G = k_BTGK.shape[2]
    return B, T, H, K, G, H // G, nl.tile_size.pmax, q_BTHK.dtype, 1.0 / (K ** 0.5)


def causal_bias(dt, key_major=False):
    """(identity, bias, ones), [128, 128] each in dt, built once per call: bias is 0 where key j <= query p,
    NEG above (the forward's row max sees it via identity^T bias accumulated into the scores); the identity
    is also the moving side of every transpose (`kernels_nki.tiles.transpose`), ones[0:1] the shift matmul's stationary.
    key_major: the bias transposed (NEG where key p > query j), for key-major scores."""
    P = nl.tile_size.pmax
    zero = nl.zeros((P, P), dtype=dt, buffer=nl.sbuf)
    one = nl.ones((P, P), dtype=dt, buffer=nl.sbuf)
    bias = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
    d = 1 if key_major else -1
    nisa.affine_select(dst=bias, pattern=[[d, P]], offset=0, channel_multiplier=-d, on_true_tile=zero,
                       on_false_value=NEG, cmp_op=nl.greater_equal)
    return identity(dt), bias, one


def head_rows(t, rows, dt, ident, transposed, vec=False, saved=(), tT=None):
    """A 128-row tile of one head, t (a [P, K] `block` view), and its [K, 128] transpose (leaving PSUM on
    VectorE with `vec`, else ScalarE; into tT, a [K, >= rows] view, when given). With `saved` = (y, inv, yT),
    the forward's outputs as views, the tile is replaced by y (norm = (xn, inv, -xn / K) for `prep_grad`, xn =
    x inv on VectorE) and the transpose is yT, loaded, not transposed. -> (tile, transpose or None, norm or ())."""
    K = t.shape[1]
    P = nl.tile_size.pmax
    norm = ()
    if saved:
        y, inv_P1, yT = saved
        xn = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        scale_rows(xn, t, rows, inv_P1)
        xk = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)  # -xn / K, from x on VectorE
        nisa.tensor_scalar(dst=xk[0:rows], data=t[0:rows], op0=nl.multiply, operand0=inv_P1[0:rows], op1=nl.multiply,
                           operand1=-1.0 / K)
        t, norm = y, (xn, inv_P1, xk)
        if transposed:
            return t, yT, norm
    if not transposed:
        return t, None, norm
    if tT is None:
        tT = nl.ndarray((K, P), dtype=dt, buffer=nl.sbuf)
    transpose(tT[0:K, 0:rows], t[0:rows], rows, K, ident, on_vector=vec)
    return t, tT, norm


def kv_head(x_sb, G, g, T, dt, ident, tables=(), saved=(), vec=False, out=(), perm=False, dup=False):
    """All T rows of kv head g (x_sb: the batch's `seq_tile`): 128-row tile views [keys, K], the transpose
    [K, T] (leaving PSUM on VectorE with `vec`, else ScalarE) and each tile's norm (`head_rows`): with `tables`
    (cos/sin tiles) the forward's rotated, normed rows (`prep_tile`), written to out = (y seq tile, inv seq
    tile); with `saved` = (kr seq tile, kinv seq tile, krT [K, T] SBUF) the backward's. x_sb, tables and out
    in one layout (`perm`, `seq_dma`); the transpose in natural row order (`natural_cols`); with `dup` (K = 64)
    a [128, T] transpose holding it twice, on both halves of the partitions (`stacked_transpose`), beside both
    halves of a stacked pair of query heads' tiles."""
    P = nl.tile_size.pmax
    nt = cdiv(T, P)
    K = x_sb.shape[1] // (nt * G)
    xT = saved[2] if saved else nl.ndarray((2 * K if dup else K, T), dtype=dt, buffer=nl.sbuf)
    rows = [min(P, T - i * P) for i in range(nt)]
    views = [block(x_sb, i, g, G, K) for i in range(nt)]
    if tables:
        ys = prep_tile([(views[i], rows[i], tables[i], (block(out[0], i, g, G, K), block(out[1], i, g, G, 1)))
                        for i in range(nt)], (), dt, out[1][:, g:(nt - 1) * G + g + 1:G])
        tiles, norms = [y for y, _ in ys], [inv for _, inv in ys]
    elif saved:
        got = [head_rows(views[i], rows[i], dt, None, False,
                         saved=(block(saved[0], i, g, G, K), block(saved[1], i, g, G, 1), None)) for i in range(nt)]
        tiles, norms = [t for t, _, _ in got], [n for _, _, n in got]
    else:
        tiles, norms = views, [()] * nt
    if not saved:
        for i in range(nt):
            if dup:
                stacked_transpose(natural_cols(xT, i, T, perm), [tiles[i], tiles[i]], rows[i], ident)
            else:
                transpose(natural_cols(xT, i, T, perm), tiles[i][0:rows[i]], rows[i], K, ident, on_vector=vec)
    return tiles, xT, norms


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


def half_matmul(dst, stationary, moving, half, name=None):
    """nc_matmul; with `half` (0 / 1) a contraction of <= 64 rows whose operands both sit on that half of the
    partitions (64 half .. 64 half + 63) runs on the 64-row tile of the PE array there (row tiling mode,
    NeuronCore-v2 or newer: nki/api/nki/isa/__init__.py nc_matmul, "Tiling mode"), so that two such matmuls
    on different halves run in parallel; `half` None: the whole array (a row tile multiplies its own
    partitions: rule strict.row_tile_partitions of kernels_nki.emulator.rules). `name`: the instruction's name
    (a "recompute..." name marks a product computed a second time: kernels_nki.emulator counts it not
    useful)."""
    if half != None and stationary.shape[0] <= 64:  # noqa: E711 (NKI has no `is`)
        nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, tile_position=(half * 64, 0),
                       tile_size=(64, 128), name=name)
    else:
        nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, name=name)


def kv_head_saved(k_sb, G, g, T, dt, ident, tables, outs, krT_BGKT, b, vec=False, perm=False):
    """The fused forward's k side (`kv_head` with the rope tables): its normed, rotated rows and their inverse
    RMS written to outs = (kr seq tile, kinv seq tile), the transpose stored to krT_BGKT[b, g] (one DMA)
    -> (tiles, transpose)."""
    k_tiles, kT, _ = kv_head(k_sb, G, g, T, dt, ident, tables, vec=vec, out=outs, perm=perm)
    nisa.dma_copy(dst=krT_BGKT[b, g], src=kT)
    return k_tiles, kT


def v_aug(v_sb, G, g, T, dt):
    """All T rows of value head g (v_sb: the batch's `seq_tile`) as 128-row tiles [keys, K + 1]: v and a ones
    column, so that p [v | 1] carries the softmax's row sums in its last column; one [P, n, K + 1] tile (GpSimd
    memset and copy, one more copy for a ragged last tile) -> the n [P, K + 1] views."""
    P = nl.tile_size.pmax
    n, tail = T // P, T % P
    nt = cdiv(T, P)
    K = v_sb.shape[1] // (nt * G)
    aug = nl.ndarray((P, nt, K + 1), dtype=dt, buffer=nl.sbuf)
    nisa.memset(dst=aug[:, :, K:K + 1], value=1.0, engine=nisa.engine.gpsimd)
    src = v_sb.reshape((P, nt, G * K))
    if n:
        nisa.tensor_copy(dst=aug[:, 0:n, 0:K], src=src[:, 0:n, g * K:(g + 1) * K], engine=nisa.engine.gpsimd)
    if tail:
        nisa.tensor_copy(dst=aug[0:tail, n, 0:K], src=src[0:tail, n, g * K:(g + 1) * K], engine=nisa.engine.gpsimd)
    return [aug[:, j, :] for j in range(nt)]


XSA_EPS2 = 1.0e-24  # XSA's norm floor squared: 1 / max(||v||, 1e-12) = rsqrt(max(||v||^2, 1e-24))


def xsa_units(v_sb, G, g, T, run=None):
    """(u [P, nt, K] fp32, inv [P, nt] fp32) of kv head g's rows in v_sb (a `seq_tile`, either layout: block i of
    u is block i of v's): u = v / max(||v||, 1e-12) (reference.xsa's unit value vector, F.normalize) and inv = 1 /
    max(||v||, 1e-12) per row. The squares (GpSimd) and their row sums (VectorE) for every full block at once, the
    floor (VectorE) and rsqrt on GpSimd in the documented form, tensor_scalar(op0=nl.rsqrt, operand0=0.0)
    (aws-neuron-sdk nki/api/nki.api.shared.rst, "Reverse square root can run on GpSIMD Engine"; the floor 1e-24 ~
    2^-79.7 keeps it inside rsqrt's valid input range [2^-87, 2^97], the activation functions table there),
    u = v inv per block (VectorE: a [P, 1] column operand); a ragged last block on its rows only. run: as
    `staged` (the tiles are allocated now, filled as the stages run: the engines alternate, so a stage issued a
    step after the one it reads does not hold its engine's stream)."""
    P = nl.tile_size.pmax
    n, tail = T // P, T % P
    nt = cdiv(T, P)
    K = v_sb.shape[1] // (nt * G)
    src = v_sb.reshape((P, nt, G * K))
    sq = nl.ndarray((P, nt, K), dtype=nl.float32, buffer=nl.sbuf)
    inv = nl.ndarray((P, nt), dtype=nl.float32, buffer=nl.sbuf)
    u = nl.ndarray((P, nt, K), dtype=nl.float32, buffer=nl.sbuf)
    parts = ([(P, 0, n)] if n else []) + ([(tail, n, 1)] if tail else [])

    def squares():
        for rows, i0, m in parts:
            v = src[0:rows, i0:i0 + m, g * K:(g + 1) * K]
            nisa.tensor_tensor(dst=sq[0:rows, i0:i0 + m], data1=v, data2=v, op=nl.multiply, engine=nisa.engine.gpsimd)

    def norms():
        for rows, i0, m in parts:
            nisa.tensor_reduce(dst=inv[0:rows, i0:i0 + m], op=nl.add, data=sq[0:rows, i0:i0 + m], axis=2)
            nisa.tensor_scalar(dst=inv[0:rows, i0:i0 + m], data=inv[0:rows, i0:i0 + m], op0=nl.maximum,
                               operand0=XSA_EPS2)
            nisa.tensor_scalar(dst=inv[0:rows, i0:i0 + m], data=inv[0:rows, i0:i0 + m], op0=nl.rsqrt, operand0=0.0,
                               engine=nisa.engine.gpsimd)

    def units():
        for i in range(nt):
            rows = min(P, T - i * P)
            nisa.tensor_scalar(dst=u[0:rows, i], data=src[0:rows, i, g * K:(g + 1) * K], op0=nl.multiply,
                               operand0=inv[0:rows, i:i + 1])

    staged([squares, norms, units], run)
    return u, inv


def xsa_out(o_sb, i0, m, rows, u, c_sb, h, H):
    """XSA of blocks i0 .. i0 + m of one head's output o_sb (its natural blocks [P, nt K], o in dt, rows valid rows
    each), in place, in two halves: the products o u (GpSimd, the blocks together) now, and -> a callable issuing
    the rest (so that VectorE's in-order stream does not wait on GpSimd: issue it a step later): c = o . u per row
    (one VectorE row sum) into head h's columns of c_sb (the `lse_store` layout: tile i, head h at column i H + h:
    the backward's residual), then o - c u per block (one VectorE scalar_tensor_tensor: c the [P, 1] column
    operand) rounded to dt."""
    P = nl.tile_size.pmax
    K = u.shape[2]
    o3 = o_sb.reshape((P, o_sb.shape[1] // K, K))
    c = c_sb[0:P, i0 * H + h:(i0 + m - 1) * H + h + 1:H]
    prod = nl.ndarray((P, m, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod[0:rows], data1=o3[0:rows, i0:i0 + m], data2=u[0:rows, i0:i0 + m], op=nl.multiply,
                       engine=nisa.engine.gpsimd)

    def finish():
        nisa.tensor_reduce(dst=c[0:rows], op=nl.add, data=prod[0:rows], axis=2)
        for a in range(m):
            o_t = o3[0:rows, i0 + a]
            nisa.scalar_tensor_tensor(dst=o_t, data=u[0:rows, i0 + a], op0=nl.multiply, operand0=c[0:rows, a:a + 1],
                                      op1=nl.subtract, operand1=o_t, reverse1=True)
    return finish


def saved_outputs(B, T, H, G, K, dt):
    """(qg_BTHK, qinv_BTH1, kr_BTGK, kinv_BTG1, qgT_BHKT, krT_BGKT): the fused forward's extra outputs, the
    backward's inputs: rope(qk_norm(q)) * gain and rope(qk_norm(k)) in dt, each row's inverse RMS (fp32), and
    the same rows transposed (the forward builds q^T / k^T anyway; the backward loads them instead of
    transposing again)."""
    return (nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm),
            nl.ndarray((B, T, H, 1), dtype=nl.float32, buffer=nl.shared_hbm),
            nl.ndarray((B, T, G, K), dtype=dt, buffer=nl.shared_hbm),
            nl.ndarray((B, T, G, 1), dtype=nl.float32, buffer=nl.shared_hbm),
            nl.ndarray((B, H, K, T), dtype=dt, buffer=nl.shared_hbm),
            nl.ndarray((B, G, K, T), dtype=dt, buffer=nl.shared_hbm))


