"""Backward helpers of the head_loss kernels (`kernels_nki/head_loss.py`, whose docstring holds the spec and the
layout; a kernel-helper file, no @nki.jit): z = x emb^T, a row tile's r = (t^2 - 1) dl, its dz and dz^T, dx = dz emb,
the demb block update."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import store
from kernels_nki.tiles import accumulate_weight_grad, cdiv, transpose_to_psum

VC = 512  # vocabulary chunk (one PSUM bank of fp32)
Z_BANKS = 2  # backward: PSUM banks of z (and of dz^T) that may wait while the other stages run


def z_chunk(xT, embT, c0, vc, rows, D):
    """z = x emb^T for vocab c0:c0+vc: D/128 matmuls into one fp32 PSUM bank (returned)."""
    P = nl.tile_size.pmax
    z_ps = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum)
    for k in range(cdiv(D, P)):
        dk = min(P, D - k * P)
        nisa.nc_matmul(dst=z_ps[0:rows, 0:vc], stationary=xT[k][0:dk, 0:rows], moving=embT[k][0:dk, c0:c0 + vc])
    return z_ps


def r_chunk(r_PV, t_PV, iota_PV, cols, corr, neg_lse, c0, vc, rows, S, softcap):
    """r[:, c0:c0+vc] = (t^2 - 1) dl (dz = -g r), dl = softmax - onehot(target): exp and t^2 on ScalarE, the
    one-hot compare on VectorE, p - onehot on GpSimd, (t^2 - 1)(p - onehot) on VectorE (one two-input pass), the
    bias ids' corrections (a compare on VectorE and an add on GpSimd per source)."""
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


def demb_block(acc, blk_s, V, D):
    """demb += dz^T x over a block's row tiles (PSUM accumulation), one VectorE add per block into fp32 SBUF
    (`accumulate_weight_grad`, on_vector: ScalarE is the busier engine here)."""
    x_s, dz_s, rows_s = blk_s

    def matmuls(g_ps, v0, vr, d0, dc):
        for x, dz, rows in zip(x_s, dz_s, rows_s):
            nisa.nc_matmul(dst=g_ps[0:vr, 0:dc], stationary=dz[0:rows, v0:v0 + vr], moving=x[0:rows, d0:d0 + dc])

    accumulate_weight_grad(acc, V, D, VC, matmuls, on_vector=True)


def bwd_r(st, iota_PV, V, S, softcap):
    """Row tile second stage: r = (t^2 - 1) dl [P, V] fp32 (`r_chunk`)."""
    P = nl.tile_size.pmax
    t_PV, cols, corr, neg_lse, neg_g, rows, dx_g = st[3]
    st[4] = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
    for c in range(cdiv(V, VC)):
        r_chunk(st[4], t_PV, iota_PV, cols, corr, neg_lse, c * VC, min(VC, V - c * VC), rows, S, softcap)


def bwd_dz(st, V, ident):
    """Row tile third stage, first half: dz = -g r (ScalarE) and, with at most Z_BANKS vocabulary chunks, dz^T:
    every chunk's scaling, then every chunk's transposes (TensorE against `ident`, the identity in dz's dtype,
    into fp32 PSUM), then every chunk's copy out (ScalarE), issued before the next row tile's r, so that neither
    engine waits on the other (`bwd_dx` takes them)."""
    dz_PV = st[2]
    t_PV, cols, corr, neg_lse, neg_g, rows, dx_g = st[3]
    chunks = [(c * VC, min(VC, V - c * VC)) for c in range(cdiv(V, VC))]
    for c0, vc in chunks:
        nisa.activation(dst=dz_PV[0:rows, c0:c0 + vc], op=nl.copy, data=st[4][0:rows, c0:c0 + vc], scale=neg_g)
    if len(chunks) > Z_BANKS:  # PSUM holds no more: the transposes wait for `bwd_dx`
        st.append([None] * len(chunks))
        return
    ps = [_dz_T(dz_PV, c0, vc, rows, V, ident) for c0, vc in chunks]
    st.append([_dz_copy(t, vc, ident.dtype) for t, (c0, vc) in zip(ps, chunks)])


def _dz_T(dz_PV, c0, vc, rows, V, ident):
    """A vocabulary chunk's dz^T slices side by side in one fp32 [128, 512] PSUM tile (`tiles.transpose_to_psum`:
    TensorE transposes against `ident`, each overwriting its columns)."""
    P = nl.tile_size.pmax
    dzT_ps = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum)
    for jv in range(cdiv(vc, P)):
        v0 = c0 + jv * P
        vj = min(P, V - v0)
        transpose_to_psum(dzT_ps[0:vj, jv * P:jv * P + rows], dz_PV[0:rows, v0:v0 + vj], rows, ident)
    return dzT_ps


def _dz_copy(dzT_ps, vc, dt):
    """A chunk's dz^T out of PSUM (ScalarE, one copy per chunk) into SBUF, the dx matmuls' stationary."""
    P = nl.tile_size.pmax
    nv = cdiv(vc, P)
    dzT = nl.ndarray((P, VC), dtype=dt, buffer=nl.sbuf)
    vm = min(P, vc)
    nisa.activation(dst=dzT[0:vm, 0:nv * P], op=nl.copy, data=dzT_ps[0:vm, 0:nv * P])
    return dzT


def bwd_dx(st, emb_rows, V, D, ident, dx_ND, last):
    """Row tile third stage: dx = dz emb (dz^T, `bwd_dz`'s, as stationary; emb rows as moving; accumulated over
    the vocabulary in one PSUM bank) -> a callable moving it into the group's dx tile (and, for the group's
    `last` row tile, storing the group to dx_ND), for the caller to issue after the next row tile's z matmuls."""
    P = nl.tile_size.pmax
    jr = st[0][2]
    t_PV, cols, corr, neg_lse, neg_g, rows, dx_g = st[3]
    dx_ps = [nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum) for _ in range(cdiv(D, VC))]
    for c in range(cdiv(V, VC)):
        c0 = c * VC
        vc = min(VC, V - c0)
        nv = cdiv(vc, P)
        dzT = st[5][c]
        if dzT == None:  # noqa: E711 (NKI has no `is`)
            dzT = _dz_copy(_dz_T(st[2], c0, vc, rows, V, ident), vc, ident.dtype)
        for jv in range(nv):
            v0 = c0 + jv * P
            vj = min(P, V - v0)
            for d in range(cdiv(D, VC)):
                dc = min(VC, D - d * VC)
                nisa.nc_matmul(dst=dx_ps[d][0:rows, 0:dc], stationary=dzT[0:vj, jv * P:jv * P + rows],
                               moving=emb_rows[v0 // P][0:vj, d * VC:d * VC + dc])

    def out():
        for d in range(cdiv(D, VC)):
            dc, o0 = min(VC, D - d * VC), jr * D + d * VC
            nisa.activation(dst=dx_g[0:rows, o0:o0 + dc], op=nl.copy, data=dx_ps[d][0:rows, 0:dc])
        if last:
            store(dx_ND, st[0][1], dx_g)
    return out
