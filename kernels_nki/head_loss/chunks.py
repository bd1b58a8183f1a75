"""The pieces both head_loss directions use (a kernel-helper file: no @nki.jit): emb^T, x^T, the per-token
columns, z = x emb^T and t = tanh(z / softcap) per vocabulary chunk, r = (t^2 - 1) dl, dz^T. Layout and engine
choices: docs/kernels/head_loss.md."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import row_tile_ap
from kernels_nki.tiles import row_tiles, transpose, transpose_to_psum

VC = 512  # vocabulary chunk (one PSUM bank of fp32)


def emb_tiles(emb_VD, ident):
    """emb as row tiles and emb^T, once per call.

    Dimensions: V vocabulary, D width.
    Args: emb_VD [V, D] HBM; ident the identity in emb's dtype (`tiles.identity`).
    Returns: (rows, embT): V/128 SBUF row tiles [v, D] (dx's moving operand), D/128 SBUF tiles [d, V] (z's
      moving operand), by TensorE transposes through fp32 PSUM (`tiles.transpose`, out by ScalarE)."""
    V, D = emb_VD.shape
    P = nl.tile_size.pmax
    dt = ident.dtype
    d_tiles = row_tiles(D)
    rows, embT = [], [nl.ndarray((P, V), dtype=dt, buffer=nl.sbuf) for _ in d_tiles]
    for _, v0, vr in row_tiles(V):
        e_t = nl.ndarray((P, D), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=e_t[0:vr], src=emb_VD[v0:v0 + vr])
        for k, d0, dk in d_tiles:
            transpose(embT[k][0:dk, v0:v0 + vr], e_t[0:vr, d0:d0 + dk], vr, dk, ident)
        rows.append(e_t)
    return rows, embT


def x_T(x_PD, rows, ident, copy_on_vector):
    """x^T of one row tile: D/128 SBUF tiles [d, rows] (TensorE transposes through fp32 PSUM, out by VectorE
    (copy_on_vector) or ScalarE). x_PD: the [rows, D] row tile."""
    P = nl.tile_size.pmax
    xT = []
    for _, d0, dk in row_tiles(x_PD.shape[1]):
        tt = nl.ndarray((P, P), dtype=ident.dtype, buffer=nl.sbuf)
        transpose(tt[0:dk, 0:rows], x_PD[0:rows, d0:d0 + dk], rows, dk, ident, on_vector=copy_on_vector)
        xT.append(tt)
    return xT


def column(src_NC, g, j):
    """Row tile j of group g of an fp32 [N, C] HBM array as an SBUF tile [P, C] (one DMA)."""
    _, parts, _ = g
    out = nl.ndarray((nl.tile_size.pmax, src_NC.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=out[0:parts], src=row_tile_ap(src_NC, g, j))
    return out


def token_columns(targets_N1, ids_NS, g, S, R):
    """Group g's targets and bias ids, one DMA per operand.

    Args: targets_N1 int32 [N, 1]; ids_NS int32 [N, S] (read when S > 0); g = (r0, parts, rows) a row group;
      R the groups' rows per partition.
    Returns: (cols, idx), [P, R, 1 + S] each: per row tile j (cols[:, j]) the target then the S bias ids, as fp32
      (`tensor_scalar` operands) and as uint32 (`nc_n_gather` indices); int -> fp32 -> uint32 on VectorE,
      exact below 2^24."""
    P = nl.tile_size.pmax
    r0, parts, rows = g
    raw = nl.ndarray((P, R, 1 + S), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=raw[0:parts, 0:rows, 0:1], src=targets_N1.ap(pattern=[[rows, parts], [1, rows], [1, 1]],
                                                                   offset=r0))
    if S:
        nisa.dma_copy(dst=raw[0:parts, 0:rows, 1:1 + S],
                      src=ids_NS.ap(pattern=[[rows * S, parts], [S, rows], [1, S]], offset=r0 * S))
    cols = nl.ndarray((P, R, 1 + S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=cols[0:parts, 0:rows], src=raw[0:parts, 0:rows])
    idx = nl.ndarray((P, R, 1 + S), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=idx[0:parts, 0:rows], src=raw[0:parts, 0:rows])
    return cols, idx


def iota(V):
    """[P, V] fp32, every row 0 .. V - 1 (the backward's one-hot compare values)."""
    iota_PV = nl.ndarray((nl.tile_size.pmax, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=iota_PV, pattern=[[1, V]], offset=0, channel_multiplier=0)
    return iota_PV


def z_chunk(xT, embT, c0, vc, rows, D):
    """z = x emb^T for vocabulary c0 .. c0 + vc: D/128 matmuls (stationary x^T, moving emb^T) into one fp32 PSUM
    bank (returned)."""
    P = nl.tile_size.pmax
    z_ps = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum)
    for k, _, dk in row_tiles(D):
        nisa.nc_matmul(dst=z_ps[0:rows, 0:vc], stationary=xT[k][0:dk, 0:rows], moving=embT[k][0:dk, c0:c0 + vc])
    return z_ps


def tanh_chunk(t_PV, xT, embT, c0, vc, rows, D, softcap):
    """t_PV[:, c0:c0 + vc] = tanh(x emb^T / softcap) (fp32): `z_chunk`, tanh on ScalarE straight out of PSUM."""
    z_ps = z_chunk(xT, embT, c0, vc, rows, D)
    nisa.activation(dst=t_PV[0:rows, c0:c0 + vc], op=nl.tanh, data=z_ps[0:rows, 0:vc], scale=1.0 / softcap)


def r_chunk(r_PV, t_PV, iota_PV, cols, corr, neg_lse, c0, vc, rows, S, softcap):
    """r[:, c0:c0 + vc] = (t^2 - 1) dl (dz = -g r), dl = softmax - onehot(target), plus each bias source's
    correction corr[:, s] at its id: exp and t^2 on ScalarE, the one-hot compares on VectorE, p - onehot and
    the corrections' adds on GpSimd, (t^2 - 1)(p - onehot) on VectorE."""
    P = nl.tile_size.pmax
    p = nl.ndarray((P, vc), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=p[0:rows, 0:vc], op=nl.exp, data=t_PV[0:rows, c0:c0 + vc], scale=softcap,
                    bias=neg_lse[0:rows])
    hot = nl.ndarray((P, vc), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=hot[0:rows, 0:vc], data=iota_PV[0:rows, c0:c0 + vc], op0=nl.equal,
                       operand0=cols[0:rows, 0:1])
    nisa.tensor_tensor(dst=p[0:rows, 0:vc], data1=p[0:rows, 0:vc], data2=hot[0:rows, 0:vc], op=nl.subtract,
                       engine=nisa.engine.gpsimd)
    r = r_PV[0:rows, c0:c0 + vc]
    nisa.activation(dst=r, op=nl.square, data=t_PV[0:rows, c0:c0 + vc])
    nisa.scalar_tensor_tensor(dst=r, data=r, op0=nl.subtract, operand0=1.0,
                              op1=nl.multiply, operand1=p[0:rows, 0:vc])
    for s in range(S):
        nisa.tensor_scalar(dst=hot[0:rows, 0:vc], data=iota_PV[0:rows, c0:c0 + vc], op0=nl.equal,
                           operand0=cols[0:rows, 1 + s:2 + s], op1=nl.multiply, operand1=corr[0:rows, s:s + 1])
        nisa.tensor_tensor(dst=r, data1=r, data2=hot[0:rows, 0:vc], op=nl.add,
                           engine=nisa.engine.gpsimd)


def dz_T(dz_PV, c0, vc, rows, ident):
    """A vocabulary chunk's dz^T: its [v, rows] slices side by side in one fp32 [128, 512] PSUM tile
    (`tiles.transpose_to_psum`, each overwriting its columns), out of PSUM by one ScalarE copy into an SBUF tile
    in ident's dtype (returned: dx's stationary operand)."""
    P = nl.tile_size.pmax
    dzT_ps = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum)
    slices = row_tiles(vc)
    for jv, v0, vj in slices:
        transpose_to_psum(dzT_ps[0:vj, jv * P:jv * P + rows], dz_PV[0:rows, c0 + v0:c0 + v0 + vj], rows, ident)
    width = len(slices) * P
    vm = min(P, vc)
    dzT = nl.ndarray((P, VC), dtype=ident.dtype, buffer=nl.sbuf)
    nisa.activation(dst=dzT[0:vm, 0:width], op=nl.copy, data=dzT_ps[0:vm, 0:width])
    return dzT
