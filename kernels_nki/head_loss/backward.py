"""head_loss_bwd: dx, demb (and d bias_vals) of the per-token loss (spec `frontier_jax.ops.reference.head_loss_bwd`),
recomputing t = tanh(x emb^T / softcap) per row tile. Layout, engines and the stage order:
docs/kernels/head_loss.md."""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.head_loss.bias import bias_grad, sources
from kernels_nki.head_loss.chunks import (VC, column, dz_T, emb_tiles, iota, r_chunk, tanh_chunk, token_columns,
                                          x_T, z_chunk)
from kernels_nki.head_loss.state import BwdGroup, BwdTile
from kernels_nki.packing import blocks, load, rows_per_partition, store, tile
from kernels_nki.tiles import accumulate_weight_grad, identity, pipeline, row_tiles

DZ_BYTES = 32 * 1024  # SBUF bytes per partition for one demb block's dz tiles
Z_BANKS = 2  # vocabulary chunks whose z (PSUM) and dz^T (SBUF) may wait for a later stage


def _group(x_ND, targets_N1, lse_N1, dloss_N1, bias_ids_NS, g, S, R, dt):
    """Row group g's operands (a BwdGroup): x, the target and id columns, -lse, g and -g; its dx tile."""
    P = nl.tile_size.pmax
    _, parts, nr = g
    x = load(x_ND, g, dt, R)
    cols, idx = token_columns(targets_N1, bias_ids_NS, g, S, R)
    neg_lse, dloss = load(lse_N1, g, nl.float32, R), load(dloss_N1, g, nl.float32, R)
    nisa.tensor_scalar(dst=neg_lse[0:parts, 0:nr], data=neg_lse[0:parts, 0:nr], op0=nl.multiply, operand0=-1.0)
    neg_dloss = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_dloss[0:parts, 0:nr], data=dloss[0:parts, 0:nr], op0=nl.multiply, operand0=-1.0)
    return BwdGroup(x=x, cols=cols, idx=idx, neg_lse=neg_lse, dloss=dloss, neg_dloss=neg_dloss,
                    dx=nl.ndarray((P, x.shape[1]), dtype=dt, buffer=nl.sbuf))


def _z(tl, embT, V, D, softcap, ident):
    """The z stage: x^T (out of PSUM by ScalarE) and z = x emb^T per vocabulary chunk, left in its PSUM bank for
    the t stage; past Z_BANKS chunks PSUM cannot hold them, and t = tanh(z / softcap) is taken at once."""
    P = nl.tile_size.pmax
    rows = tl.rows
    tl.x_PD = tile(tl.group.x, tl.g, tl.j, D)
    xT = x_T(tl.x_PD, rows, ident, False)
    chunks = row_tiles(V, VC)
    if len(chunks) > Z_BANKS:
        tl.t_PV = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
        for _, c0, vc in chunks:
            tanh_chunk(tl.t_PV, xT, embT, c0, vc, rows, D, softcap)
    else:
        tl.z_ps = [z_chunk(xT, embT, c0, vc, rows, D) for _, c0, vc in chunks]


def _t(tl, bias_vals_NS, dvals_NS, V, S, softcap):
    """The t stage: t = tanh(z / softcap) [P, V] fp32 out of the z stage's PSUM banks (ScalarE) and, with a bias,
    its corrections and d bias_vals (`bias.bias_grad`)."""
    P = nl.tile_size.pmax
    rows, j, grp = tl.rows, tl.j, tl.group
    chunks = row_tiles(V, VC)
    if len(chunks) <= Z_BANKS:
        tl.t_PV = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
        for c, c0, vc in chunks:
            nisa.activation(dst=tl.t_PV[0:rows, c0:c0 + vc], op=nl.tanh, data=tl.z_ps[c][0:rows, 0:vc],
                            scale=1.0 / softcap)
        tl.z_ps = None
    if S:
        tg = nl.ndarray((P, 1 + S), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=tg[0:rows], data=tl.t_PV[0:rows], indices=grp.idx[0:rows, j])
        tl.corr = bias_grad(grp.cols[0:rows, j], column(bias_vals_NS, tl.g, j), tg, grp.neg_lse[0:rows, j:j + 1],
                            grp.dloss[0:rows, j:j + 1], rows, S, softcap, dvals_NS, tl.g, j)


def _r(tl, iota_PV, V, S, softcap):
    """The r stage: r = (t^2 - 1) dl [P, V] fp32 (`chunks.r_chunk` per vocabulary chunk)."""
    rows, j, grp = tl.rows, tl.j, tl.group
    tl.r_PV = nl.ndarray((nl.tile_size.pmax, V), dtype=nl.float32, buffer=nl.sbuf)
    for _, c0, vc in row_tiles(V, VC):
        r_chunk(tl.r_PV, tl.t_PV, iota_PV, grp.cols[0:rows, j], tl.corr, grp.neg_lse[0:rows, j:j + 1], c0, vc,
                rows, S, softcap)
    tl.t_PV, tl.corr = None, None


def _dz(tl, V, ident):
    """The dz stage: dz = -g r (ScalarE) in x's dtype and, with at most Z_BANKS vocabulary chunks, each chunk's dz^T
    (`chunks.dz_T`); past Z_BANKS the dx stage makes each chunk's dz^T right before its matmuls."""
    rows, j = tl.rows, tl.j
    neg_g = tl.group.neg_dloss[0:rows, j:j + 1]
    chunks = row_tiles(V, VC)
    tl.dz_PV = nl.ndarray((nl.tile_size.pmax, V), dtype=ident.dtype, buffer=nl.sbuf)
    for _, c0, vc in chunks:
        nisa.activation(dst=tl.dz_PV[0:rows, c0:c0 + vc], op=nl.copy, data=tl.r_PV[0:rows, c0:c0 + vc], scale=neg_g)
    tl.r_PV = None
    if len(chunks) <= Z_BANKS:
        tl.dzT = [dz_T(tl.dz_PV, c0, vc, rows, ident) for _, c0, vc in chunks]


def _dx(tl, emb_rows, V, D, ident):
    """The dx stage: dx = dz emb into D/512 fp32 PSUM banks (dz^T stationary, emb rows moving, accumulated over
    the vocabulary)."""
    P = nl.tile_size.pmax
    rows = tl.rows
    chunks = row_tiles(V, VC)
    tl.dx_ps = [nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum) for _ in row_tiles(D, VC)]
    for c, c0, vc in chunks:
        dzT = tl.dzT[c] if len(chunks) <= Z_BANKS else dz_T(tl.dz_PV, c0, vc, rows, ident)
        for jv, v0, vj in row_tiles(vc):
            for d, d0, dc in row_tiles(D, VC):
                nisa.nc_matmul(dst=tl.dx_ps[d][0:rows, 0:dc], stationary=dzT[0:vj, jv * P:jv * P + rows],
                               moving=emb_rows[(c0 + v0) // P][0:vj, d0:d0 + dc])
    tl.dzT = None


def _dx_out(tl, D, dx_ND):
    """The dx_out stage: dx out of PSUM into the group's dx tile (ScalarE), the group stored after its last row
    tile."""
    rows, j, grp = tl.rows, tl.j, tl.group
    for d, d0, dc in row_tiles(D, VC):
        nisa.activation(dst=grp.dx[0:rows, j * D + d0:j * D + d0 + dc], op=nl.copy, data=tl.dx_ps[d][0:rows, 0:dc])
    tl.dx_ps = None
    if tl.last:
        store(dx_ND, tl.g, grp.dx)


def _demb(acc, block, V, D):
    """demb += dz^T x over a block's row tiles (PSUM accumulation), one VectorE add per [128, 512] slice into
    the fp32 SBUF accumulators (`tiles.accumulate_weight_grad`, on_vector: ScalarE is the busier engine)."""

    def matmuls(g_ps, v0, vr, d0, dc):
        for tl in block:
            nisa.nc_matmul(dst=g_ps[0:vr, 0:dc], stationary=tl.dz_PV[0:tl.rows, v0:v0 + vr],
                           moving=tl.x_PD[0:tl.rows, d0:d0 + dc])

    accumulate_weight_grad(acc, V, D, VC, matmuls, on_vector=True)


@nki.jit
def head_loss_bwd(x_ND, emb_VD, targets_N1, bias_ids_NS, bias_vals_NS, lse_N1, dloss_N1, softcap=30.0):
    """The backward of `head_loss_fwd`: dz = g (1 - t^2)(softmax - onehot(target)) (+ the bias ids'
    corrections), dx = dz emb, demb = dz^T x.

    Dimensions: N tokens, D width, V vocabulary, S bias sources.
    Args: as `head_loss_fwd`'s, then lse_N1 fp32 [N, 1] (its residual) and dloss_N1 fp32 [N, 1] (g).
    Returns: (dx_ND in x's dtype, demb_VD in emb's dtype[, dvals_NS fp32 [N, S] with a bias]).
    Notes: per row tile, as a stage table (`tiles.pipeline`, step s runs each row's stage on row tile
      s - offset):
        offset 0  z(s): the group's DMAs at its first row tile, x^T, z = x emb^T into PSUM banks
        offset 3  dx_out(s - 3): dx out of PSUM, the group's dx stored after its last row tile
        offset 2  dz(s - 2): dz = -g r, dz^T per vocabulary chunk
        offset 1  r(s - 1): r = (t^2 - 1) dl
        offset 2  dx(s - 2): dx = dz emb into PSUM; after a demb block's last row tile, demb += dz^T x over it
        offset 0  t(s): t = tanh(z / softcap) out of PSUM, the bias corrections and d bias_vals
      docs/kernels/head_loss.md explains the order and the engines."""
    N, D = x_ND.shape
    V = emb_VD.shape[0]
    S = sources(bias_ids_NS, bias_vals_NS)
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    TPB = max(1, DZ_BYTES // (V * (4 if dt == nl.float32 else 2)))  # row tiles per demb block
    dx_ND = nl.ndarray((N, D), dtype=dt, buffer=nl.shared_hbm)
    demb_VD = nl.ndarray((V, D), dtype=emb_VD.dtype, buffer=nl.shared_hbm)
    dvals_NS = nl.ndarray((N, S), dtype=nl.float32, buffer=nl.shared_hbm) if S else None
    ident = identity(dt)
    emb_rows, embT = emb_tiles(emb_VD, ident)
    iota_PV = iota(V)
    acc = [nl.zeros((P, D), dtype=nl.float32, buffer=nl.sbuf) for _ in row_tiles(V)]
    R = rows_per_partition(D, cap=16)
    order = []  # (g, j, ends_block): row tile j of group g holds rows r0 + p R + j
    for blk in blocks(N, R, TPB):
        for k, g in enumerate(blk):
            _, _, nr = g
            order.extend([(g, j, k == len(blk) - 1 and j == nr - 1) for j in range(nr)])
    live = {"group": None, "zs": [], "ts": [], "rs": [], "dzs": [], "dxs": [], "block": []}

    def z(i):
        g, j, ends_block = order[i]
        _, parts, nr = g
        if j == 0:
            live["group"] = _group(x_ND, targets_N1, lse_N1, dloss_N1, bias_ids_NS, g, S, R, dt)
        tl = BwdTile(g=g, j=j, rows=parts, last=j == nr - 1, ends_block=ends_block, group=live["group"])
        _z(tl, embT, V, D, softcap, ident)
        live["zs"].append(tl)

    def t(i):
        tl = live["zs"].pop(0)
        _t(tl, bias_vals_NS, dvals_NS, V, S, softcap)
        live["ts"].append(tl)

    def r(i):
        tl = live["ts"].pop(0)
        _r(tl, iota_PV, V, S, softcap)
        live["rs"].append(tl)

    def dz(i):
        tl = live["rs"].pop(0)
        _dz(tl, V, ident)
        live["dzs"].append(tl)

    def dx(i):
        tl = live["dzs"].pop(0)
        _dx(tl, emb_rows, V, D, ident)
        live["dxs"].append(tl)
        live["block"].append(tl)
        if tl.ends_block:
            _demb(acc, live["block"], V, D)
            live["block"] = []

    def dx_out(i):
        _dx_out(live["dxs"].pop(0), D, dx_ND)

    pipeline(len(order), [(0, z), (3, dx_out), (2, dz), (1, r), (2, dx), (0, t)])
    for v, v0, vr in row_tiles(V):
        out = nl.ndarray((P, D), dtype=emb_VD.dtype, buffer=nl.sbuf)
        nisa.activation(dst=out[0:vr], op=nl.copy, data=acc[v][0:vr])
        nisa.dma_copy(dst=demb_VD[v0:v0 + vr], src=out[0:vr])
    if S:
        return dx_ND, demb_VD, dvals_NS
    return dx_ND, demb_VD
