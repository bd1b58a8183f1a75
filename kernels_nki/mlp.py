"""The block's MLP branch with its pre-norm and residual add, y = x + act(rms_norm(x) W_fc)^2 W_proj, forward and
backward as fused NKI kernels for trn1 (the `norm_mlp` op); act = LeakyReLU(negative_slope), a compile-time
constant >= 0 (0: relu, the baseline's relu^2; 0.5: the record's). r = act(h), h = xn W_fc, a = r r.

Spec: frontier_jax.ops.reference.resid_norm_mlp_fwd / resid_norm_mlp_bwd. The layout, the stages, the engine and
port choices and the NeuronCore-v2 rules they follow (with the AWS documents) are docs/kernels/mlp.md.
"""

from dataclasses import dataclass

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import blocks, columns, groups, load, store, tile
from kernels_nki.tiles import (EPS, accumulate_weight_grad, identity, norm_grad_rows, pipeline, row_tiles, transpose,
                               transpose_to_psum)

NB = 512  # tokens per forward group (gemm_moving_fmax: the forward's h^T has the tokens as moving free dim)
NW = 1024  # tokens per backward group: no backward matmul streams tokens as its moving free dim, and the
# weight gradients contract over the whole group in PSUM before one fp32 SBUF add (half the adds of 512)
NW_MAX_F = 1024  # a wider MLP's backward takes groups of NB tokens: its per-group tiles (a, dh' [tokens, F], their
# transposes, rT) and the fp32 weight-gradient accumulators fit the 192 KiB SBUF partition (`bwd_group`)
RT_TOKENS = 2048  # tokens per stored act(h)^T tile [128 F-rows, RT_TOKENS]: 4 KiB per partition in bf16


def bwd_group(F):
    """Tokens per backward group for MLP width F: NW up to NW_MAX_F, else NB, which keeps the backward's live SBUF
    under the NeuronCore-v2 partition's 192 KiB at F = 1536 (the record's 3 x 512) and D = 512 (aws-neuron-sdk
    nki/guides/architecture/trainium_inferentia2_arch.rst, "Memory": 24 MiB SBUF = 128 x 192 KiB; a kernel
    past it spills through HBM, nki/get-started/about/memory-hierarchy-overview.rst)."""
    return NW if F <= NW_MAX_F else NB


@dataclass
class FwdGroup(nl.NKIObject):
    """One forward group's tiles, filled stage by stage and released when stage C has stored y."""
    g: tuple  # the row group (r0, parts, R)
    rt0: int  # the first token of the act(h)^T tile the group's r^T columns go to
    opens: bool  # the group is its act(h)^T tile's first (stage B allocates the tile)
    closes: bool  # ... and its last (stage B stores the tile)
    x_g = None  # A: x's group tile [128, R D], kept for the residual add
    xn = None  # A: rms_norm(x) row tiles [parts, D]; T replaces them by xn^T, D/128 tiles [D_k, NB]
    aT = None  # B: a^T, F/128 tiles [F_j, NB], the tokens in order


@dataclass
class BwdGroup(nl.NKIObject):
    """One backward group's tiles, filled stage by stage and released when stage E has stored dx."""
    g: tuple  # the row group (r0, parts, R)
    x_s = None  # A: x's row tiles [parts, D]
    dy_g = None  # A: dy's group tile [128, R D]; E writes dx over it
    dy_s = None  # A: dy's row tiles (views of dy_g)
    xn_s = None  # A: rms_norm(x) row tiles
    inv = None  # A: the forward's inverse RMS [parts, R] fp32
    rT = None  # A: act(h)^T [F_j, group tokens], the tokens in order; released by B
    dyT = None  # A: dy^T [D_k, group tokens], row tile j at columns j*128 ..; released by B
    a_s = None  # B: a = r r row tiles [parts, F]; released by D_proj
    dh_s = None  # B: dh' = act'(h) r da row tiles [parts, F]


def _load_rows(w_RC, dt):
    """A [R, C] HBM matrix as ceil(R/128) SBUF row tiles [128, C]."""
    C = w_RC.shape[1]
    out = []
    for _, r0, rows in row_tiles(w_RC.shape[0]):
        t = nl.ndarray((nl.tile_size.pmax, C), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rows], src=w_RC[r0:r0 + rows])
        out.append(t)
    return out


def _transposed_rows(tiles, R, C, dt, ident):
    """Row tiles of a [R, C] matrix -> row tiles of its [C, R] transpose."""
    out = [nl.ndarray((nl.tile_size.pmax, R), dtype=dt, buffer=nl.sbuf) for _ in row_tiles(C)]
    for i, r0, rows in row_tiles(R):
        for j, c0, cols in row_tiles(C):
            transpose(out[j][0:cols, r0:r0 + rows], tiles[i][0:rows, c0:c0 + cols], rows, cols, ident)
    return out


def _group_T(tiles, g, D, dt, ident, width, natural):
    """Group g's row tiles [parts, D] -> D/128 tiles of the transpose [D_k, width]: row tile j's tokens at the
    columns `columns(g, j)` (the group's tokens in order) with `natural`, else at j*128 .. j*128 + parts."""
    P = nl.tile_size.pmax
    _, parts, _ = g
    xT = [nl.ndarray((P, width), dtype=dt, buffer=nl.sbuf) for _ in row_tiles(D)]
    for j in range(len(tiles)):
        cols = columns(g, j) if natural else slice(j * P, j * P + parts)
        for k, d0, dk in row_tiles(D):
            transpose(xT[k][0:dk, cols], tiles[j][0:parts, d0:d0 + dk], parts, dk, ident)
    return xT


def _scaled(x_t, inv, rows, dt):
    """rms_norm(x) of a row tile: x * inv per row (ScalarE, fp32 math, cast to dt as the reference)."""
    xn = nl.ndarray((nl.tile_size.pmax, x_t.shape[1]), dtype=dt, buffer=nl.sbuf)
    nisa.activation(dst=xn[0:rows], op=nl.copy, data=x_t[0:rows], scale=inv[0:rows])
    return xn


def _leaky(dst, src, slope):
    """dst = LeakyReLU(src, slope): max(src, slope src), min for slope > 1 (one VectorE scalar_tensor_tensor from
    SBUF). Applied to r = act(h) it gives r act'(h), the backward's factor (docs/kernels/mlp.md)."""
    nisa.scalar_tensor_tensor(dst=dst, data=src, op0=nl.multiply, operand0=slope,
                              op1=nl.maximum if slope <= 1.0 else nl.minimum, operand1=src)


def _fwd_inputs(grp, x_ND, inv_N1, eps, dt):
    """Forward stage A: x in, inv = rsqrt(mean(x^2) + eps) stored, xn = inv x (ScalarE)."""
    P = nl.tile_size.pmax
    D = x_ND.shape[1]
    g = grp.g
    _, parts, R = g
    grp.x_g = load(x_ND, g, dt, NB // P)
    inv = nl.ndarray((P, NB // P), dtype=nl.float32, buffer=nl.sbuf)
    grp.xn = []
    for j in range(R):
        x_t = tile(grp.x_g, g, j, D)
        sq = nl.ndarray((P, D), dtype=dt, buffer=nl.sbuf)  # discarded: only the row sum is kept
        ss = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=sq[0:parts], op=nl.square, data=x_t, reduce_op=nl.add, reduce_res=ss[0:parts])
        nisa.activation(dst=inv[0:parts, j:j + 1], op=nl.rsqrt, data=ss[0:parts], scale=1.0 / D, bias=eps[0:parts])
        grp.xn.append(_scaled(x_t, inv[0:parts, j:j + 1], parts, dt))
    store(inv_N1, g, inv)


def _fwd_hidden(grp, wfc, rT_s, D, F, dt, slope):
    """Forward stage B: h^T = W_fc^T xn^T per F-tile ([F_j, tokens] PSUM), r = act(h) leaving PSUM into the block's
    r^T tile, a^T = r r (SBUF)."""
    P = nl.tile_size.pmax
    r0, parts, R = grp.g
    nb = parts * R
    grp.aT = []
    for jf, f0, fj in row_tiles(F):
        h_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
        for k, d0, dk in row_tiles(D):
            nisa.nc_matmul(dst=h_ps[0:fj, 0:nb], stationary=wfc[k][0:dk, f0:f0 + fj], moving=grp.xn[k][0:dk, 0:nb])
        r_T = rT_s[jf][0:fj, r0 - grp.rt0:r0 - grp.rt0 + nb]
        if slope == 0.0:
            nisa.activation(dst=r_T, op=nl.relu, data=h_ps[0:fj, 0:nb])
        else:
            nisa.activation(dst=r_T, op=nl.copy, data=h_ps[0:fj, 0:nb])
            _leaky(r_T, r_T, slope)
        a_T = nl.ndarray((P, NB), dtype=dt, buffer=nl.sbuf)
        if jf % 2 == 0 or slope != 0.0:  # relu: every other F-tile on GpSimd; LeakyReLU: all (docs/kernels/mlp.md)
            nisa.tensor_tensor(dst=a_T[0:fj, 0:nb], data1=r_T, data2=r_T, op=nl.multiply, engine=nisa.engine.gpsimd)
        else:
            nisa.activation(dst=a_T[0:fj, 0:nb], op=nl.square, data=r_T)
        grp.aT.append(a_T)


def _fwd_out(grp, wproj, y_ND, dt):
    """Forward stage C: y's row tile j = x + a W_proj, a^T's columns of row tile j's tokens stationary, x added as
    y leaves PSUM (VectorE); y out (one DMA per group)."""
    P = nl.tile_size.pmax
    g = grp.g
    _, parts, R = g
    D = y_ND.shape[1]
    y_g = nl.ndarray((P, NB // P * D), dtype=dt, buffer=nl.sbuf)
    for j in range(R):
        for _, c0, dc in row_tiles(D, NB):
            y_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
            for a_T, w in zip(grp.aT, wproj):
                fj = w.shape[0]
                nisa.nc_matmul(dst=y_ps[0:parts, 0:dc], stationary=a_T[0:fj, columns(g, j)], moving=w[0:fj, c0:c0 + dc])
            y0 = j * D + c0
            nisa.tensor_tensor(dst=y_g[0:parts, y0:y0 + dc], data1=y_ps[0:parts, 0:dc],
                               data2=grp.x_g[0:parts, y0:y0 + dc], op=nl.add)
    store(y_ND, g, y_g)


def _fwd_groups(N):
    """The forward's groups of NB tokens as (g, rt0, opens, closes) (FwdGroup's fields), in runs whose r^T leaves
    as one RT_TOKENS tile per F-tile."""
    P = nl.tile_size.pmax
    out = []
    for blk in blocks(N, NB // P, RT_TOKENS // P):
        (rt0, _, _), *_ = blk
        for i, g in enumerate(blk):
            out.append((g, rt0, i == 0, i == len(blk) - 1))
    return out


@nki.jit
def norm_mlp_fwd(x_ND, w_fc_DF, w_proj_FD, negative_slope=0.0):
    """y = x + act(rms_norm(x) W_fc)^2 W_proj, act = LeakyReLU(negative_slope), fused (docs/kernels/mlp.md).

    Dimensions:
        N tokens, D model width, F MLP width; groups of NB = 512 tokens (4 per partition).

    Args:
        x_ND: [N, D] bf16 or fp32.
        w_fc_DF, w_proj_FD: [D, F], [F, D] in x's dtype (W_proj's columns scaled by the residual scale).
        negative_slope: the compile-time slope >= 0 (0: relu).

    Returns:
        y_ND [N, D] (x's dtype), inv_N1 [N, 1] fp32 = rsqrt(mean(x^2) + eps), rT_FN [F, N] = act(h)^T (x's dtype),
        the backward's residuals.

    Notes:
        The stage table, per group k (program order within a step; pipeline(len(groups), table)):
            (0, A: x in, inv, xn)      (1, B: h^T, r^T, a^T; r^T out at a tile's last group)
            (0, T: xn^T)               (2, C: y = x + a W_proj, y out)
        i.e. A(k), B(k - 1), T(k), C(k - 2).
    """
    N, D = x_ND.shape
    F = w_fc_DF.shape[1]
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    y_ND = nl.ndarray((N, D), dtype=dt, buffer=nl.shared_hbm)
    inv_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    rT_FN = nl.ndarray((F, N), dtype=dt, buffer=nl.shared_hbm)
    ident = identity(dt)
    eps = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)  # v2: activation's bias is a tile
    nisa.memset(dst=eps, value=EPS)
    wfc = _load_rows(w_fc_DF, dt)  # [D_k, F]
    wproj = [t[0:fj] for t, (_, _, fj) in zip(_load_rows(w_proj_FD, dt), row_tiles(F))]  # [F_j, D]
    gs = _fwd_groups(N)
    to_T, to_B, to_C, rT_open = [], [], [], []

    def inputs(k):  # A
        g, rt0, opens, closes = gs[k]
        grp = FwdGroup(g=g, rt0=rt0, opens=opens, closes=closes)
        _fwd_inputs(grp, x_ND, inv_N1, eps, dt)
        to_T.append(grp)

    def transposes(k):  # T
        grp = to_T.pop(0)
        grp.xn = _group_T(grp.xn, grp.g, D, dt, ident, NB, True)
        to_B.append(grp)

    def hidden(k):  # B
        grp = to_B.pop(0)
        if grp.opens:
            rT_open.append([nl.ndarray((P, RT_TOKENS), dtype=dt, buffer=nl.sbuf) for _ in row_tiles(F)])
        rT_s, = rT_open
        _fwd_hidden(grp, wfc, rT_s, D, F, dt, negative_slope)
        if grp.closes:  # the tile's act(h)^T out
            r0, parts, R = grp.g
            nt = r0 + parts * R - grp.rt0
            for jf, f0, fj in row_tiles(F):
                nisa.dma_copy(dst=rT_FN[f0:f0 + fj, grp.rt0:grp.rt0 + nt], src=rT_s[jf][0:fj, 0:nt])
            rT_open.pop()
        to_C.append(grp)

    def output(k):  # C
        _fwd_out(to_C.pop(0), wproj, y_ND, dt)

    pipeline(len(gs), [(0, inputs), (1, hidden), (0, transposes), (2, output)])
    return y_ND, inv_N1, rT_FN


def _norm_dx(dx, g, x_t, inv, dy_t, rows):
    """dx = dy + 2 inv (g/2 + x c) for one row tile, g/2 (g: the gradient of rms_norm(x)) as fp32 PSUM chunks of
    NB columns (`kernels_nki.tiles.norm_grad_rows`); the 2 inv scale on ScalarE, + dy on GpSimd."""
    P = nl.tile_size.pmax
    work = norm_grad_rows(g, x_t, inv, rows, NB)
    two_inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=two_inv[0:rows], data=inv[0:rows], op0=nl.multiply, operand0=2.0)
    nisa.activation(dst=work[0:rows], op=nl.copy, data=work[0:rows], scale=two_inv[0:rows])
    nisa.tensor_tensor(dst=dx[0:rows], data1=work[0:rows], data2=dy_t[0:rows], op=nl.add, engine=nisa.engine.gpsimd)


def _act_rows(a_t, dh_t, rT, tok, rows, da_ps, c0, fc, dt, ident, slope):
    """Columns c0 .. c0 + fc of one row tile (its tokens at the columns `tok` of rT): r token-major by TensorE
    transposes into one PSUM tile; r and da leave PSUM on ScalarE; a = r r and dh' = m da on GpSimd, m = r act'(h)
    (slope 0: r; else `_leaky`(r) on VectorE)."""
    P = nl.tile_size.pmax
    r_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
    for jj, f0, fj in row_tiles(fc):
        transpose_to_psum(r_ps[0:rows, f0:f0 + fj], rT[c0 // P + jj][0:fj, tok], fj, ident)
    cols = slice(c0, c0 + fc)
    r = nl.ndarray((P, NB), dtype=dt, buffer=nl.sbuf)  # exact: rT holds r in dt
    nisa.activation(dst=r[0:rows, 0:fc], op=nl.copy, data=r_ps[0:rows, 0:fc])
    da = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.sbuf)  # exact: PSUM holds da in fp32
    nisa.activation(dst=da[0:rows, 0:fc], op=nl.copy, data=da_ps[0:rows, 0:fc])
    nisa.tensor_tensor(dst=a_t[0:rows, cols], data1=r[0:rows, 0:fc], data2=r[0:rows, 0:fc], op=nl.multiply,
                       engine=nisa.engine.gpsimd)  # a = act(h)^2
    m = r
    if slope != 0.0:
        m = nl.ndarray((P, NB), dtype=dt, buffer=nl.sbuf)
        _leaky(m[0:rows, 0:fc], r[0:rows, 0:fc], slope)
    nisa.tensor_tensor(dst=dh_t[0:rows, cols], data1=m[0:rows, 0:fc], data2=da[0:rows, 0:fc], op=nl.multiply,
                       engine=nisa.engine.gpsimd)


def _bwd_inputs(grp, x_ND, inv_N1, rT_FN, dy_ND, dt, ident):
    """Backward stage A: x, dy, inv and rT in; xn = inv x (ScalarE) and dy^T (TensorE)."""
    P = nl.tile_size.pmax
    D, F = x_ND.shape[1], rT_FN.shape[0]
    nw = bwd_group(F)
    g = grp.g
    n0, parts, R = g
    x_g = load(x_ND, g, dt, nw // P)
    grp.dy_g = load(dy_ND, g, dt, nw // P)
    grp.inv = load(inv_N1, g, nl.float32, nw // P)
    grp.x_s = [tile(x_g, g, j, D) for j in range(R)]
    grp.dy_s = [tile(grp.dy_g, g, j, D) for j in range(R)]
    grp.xn_s = [_scaled(grp.x_s[j], grp.inv[0:parts, j:j + 1], parts, dt) for j in range(R)]
    grp.rT = []
    for _, f0, fj in row_tiles(F):
        t = nl.ndarray((P, nw), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:fj, 0:parts * R], src=rT_FN[f0:f0 + fj, n0:n0 + parts * R])
        grp.rT.append(t)
    grp.dyT = _group_T(grp.dy_s, g, D, dt, ident, nw, False)


def _bwd_hidden(grp, wprojT, D, F, dt, ident, slope):
    """Backward stage B: per row tile da = dy W_proj^T (token-major PSUM), then `_act_rows`: a and dh'."""
    P = nl.tile_size.pmax
    _, parts, R = grp.g
    grp.a_s, grp.dh_s = [], []
    for j in range(R):
        a_t = nl.ndarray((P, F), dtype=dt, buffer=nl.sbuf)
        dh_t = nl.ndarray((P, F), dtype=dt, buffer=nl.sbuf)
        for _, c0, fc in row_tiles(F, NB):
            da_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
            for k, d0, dk in row_tiles(D):
                nisa.nc_matmul(dst=da_ps[0:parts, 0:fc], stationary=grp.dyT[k][0:dk, j * P:j * P + parts],
                               moving=wprojT[k][0:dk, c0:c0 + fc])
            _act_rows(a_t, dh_t, grp.rT, columns(grp.g, j), parts, da_ps, c0, fc, dt, ident, slope)
        grp.a_s.append(a_t)
        grp.dh_s.append(dh_t)
    grp.rT, grp.dyT = None, None  # spent: their SBUF is free for the next group's stage A


def _bwd_hT(grp, F, dt, ident):
    """Backward stage B': every row tile's dh'^T by TensorE transposes (row tile j at columns j*128 ..)."""
    P = nl.tile_size.pmax
    _, parts, R = grp.g
    dhT = [nl.ndarray((P, bwd_group(F)), dtype=dt, buffer=nl.sbuf) for _ in row_tiles(F)]
    for j in range(R):
        for jf, f0, fj in row_tiles(F):
            transpose(dhT[jf][0:fj, j * P:j * P + parts], grp.dh_s[j][0:parts, f0:f0 + fj], parts, fj, ident)
    return dhT


def _accumulate(acc, lhs_s, rhs_s, parts, K, C):
    """acc[i] ([128, C] fp32 SBUF) += lhs^T rhs over the row tiles (lhs_s [parts, K], rhs_s [parts, C] tiles)."""
    def matmuls(g_ps, k0, ki, c0, cw):
        for lhs, rhs in zip(lhs_s, rhs_s):
            nisa.nc_matmul(dst=g_ps[0:ki, 0:cw], stationary=lhs[0:parts, k0:k0 + ki], moving=rhs[0:parts, c0:c0 + cw])

    accumulate_weight_grad(acc, K, C, NB, matmuls)


def _bwd_dx(grp, dhT, wfcT, F, dx_ND):
    """Backward stage E: g/2 = dh' W_fc^T token-major in PSUM, the norm's backward, + dy: dx written over dy's group
    tile (dy's last use: stage D precedes it) and stored."""
    P = nl.tile_size.pmax
    g = grp.g
    _, parts, R = g
    D = dx_ND.shape[1]
    for j in range(R):
        gr = []
        for _, c0, dc in row_tiles(D, NB):
            dx_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
            for h_T, w, (_, _, fj) in zip(dhT, wfcT, row_tiles(F)):
                nisa.nc_matmul(dst=dx_ps[0:parts, 0:dc], stationary=h_T[0:fj, j * P:j * P + parts],
                               moving=w[0:fj, c0:c0 + dc])
            gr.append(dx_ps)
        _norm_dx(grp.dy_s[j], gr, grp.x_s[j], grp.inv[0:parts, j:j + 1], grp.dy_s[j], parts)
    store(dx_ND, g, grp.dy_g)


@nki.jit
def norm_mlp_bwd(x_ND, w_fc_DF, w_proj_FD, inv_N1, rT_FN, dy_ND, negative_slope=0.0):
    """The backward of `norm_mlp_fwd` from its residuals; h is not recomputed (docs/kernels/mlp.md).

    Dimensions:
        N tokens, D model width, F MLP width; groups of `bwd_group(F)` tokens (NW = 1024, NB above F = 1024).

    Args:
        x_ND, w_fc_DF, w_proj_FD, negative_slope: as `norm_mlp_fwd`.
        inv_N1, rT_FN: the forward's residuals.
        dy_ND: [N, D] the gradient of y.

    Returns:
        dx_ND [N, D] = dy + the MLP's and the norm's backward (x's dtype), dw_fc_DF [D, F] (x's dtype),
        dw_proj_FD [F, D] fp32.

    Notes:
        The stage table, per group k (program order within a step; pipeline(len(groups), table)):
            (0, A: x, dy, inv, rT in; xn; dy^T)      (0, B: da, r, a, dh')
            (1, B' D_fc E: dh'^T, dW_fc += xn^T dh', dx out)      (0, D_proj: dW_proj += a^T dy)
        i.e. A(k), B(k), B'/D_fc/E(k - 1), D_proj(k).
    """
    N, D = x_ND.shape
    F = w_fc_DF.shape[1]
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    dx_ND = nl.ndarray((N, D), dtype=dt, buffer=nl.shared_hbm)
    dwfc_DF = nl.ndarray((D, F), dtype=dt, buffer=nl.shared_hbm)
    dwproj_FD = nl.ndarray((F, D), dtype=nl.float32, buffer=nl.shared_hbm)  # fp32: ops.py derives ds from it
    ident = identity(dt)
    wfcT = _transposed_rows(_load_rows(w_fc_DF, dt), D, F, dt, ident)  # [F_j, D]
    wprojT = _transposed_rows(_load_rows(w_proj_FD, dt), F, D, dt, ident)  # [D_k, F]
    acc_fc = [nl.zeros((P, F), dtype=nl.float32, buffer=nl.sbuf) for _ in row_tiles(D)]
    acc_proj = [nl.zeros((P, D), dtype=nl.float32, buffer=nl.sbuf) for _ in row_tiles(F)]
    gs = groups(N, bwd_group(F) // P)
    to_B, to_D, to_E = [], [], []

    def inputs(k):  # A
        grp = BwdGroup(g=gs[k])
        _bwd_inputs(grp, x_ND, inv_N1, rT_FN, dy_ND, dt, ident)
        to_B.append(grp)

    def hidden(k):  # B
        grp = to_B.pop(0)
        _bwd_hidden(grp, wprojT, D, F, dt, ident, negative_slope)
        to_D.append(grp)

    def proj_grad(k):  # D_proj: contracts the group's tokens in PSUM, one fp32 SBUF add per group
        grp = to_D.pop(0)
        _, parts, _ = grp.g
        _accumulate(acc_proj, grp.a_s, grp.dy_s, parts, F, D)
        grp.a_s = None
        to_E.append(grp)

    def finish(k):  # B', D_fc, E: after B(k + 1), so TensorE never waits on the group's last dh'
        grp = to_E.pop(0)
        _, parts, _ = grp.g
        dhT = _bwd_hT(grp, F, dt, ident)
        _accumulate(acc_fc, grp.xn_s, grp.dh_s, parts, D, F)
        _bwd_dx(grp, dhT, wfcT, F, dx_ND)

    pipeline(len(gs), [(0, inputs), (0, hidden), (1, finish), (0, proj_grad)])
    for k, d0, dk in row_tiles(D):
        out = nl.ndarray((P, F), dtype=dt, buffer=nl.sbuf)
        nisa.activation(dst=out[0:dk], op=nl.copy, data=acc_fc[k][0:dk], scale=2.0)
        nisa.dma_copy(dst=dwfc_DF[d0:d0 + dk], src=out[0:dk])
    for jf, f0, fj in row_tiles(F):
        nisa.dma_copy(dst=dwproj_FD[f0:f0 + fj], src=acc_proj[jf][0:fj])
    return dx_ND, dwfc_DF, dwproj_FD
