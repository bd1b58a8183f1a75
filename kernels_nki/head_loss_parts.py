"""Backward helpers of the head_loss kernels (`kernels_nki/head_loss.py`, whose docstring holds the spec and the
layout; a kernel-helper file, no @nki.jit): z = x emb^T, a row tile's r = (t^2 - 1) dl, the demb block update."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.tiles import cdiv

VC = 512  # vocabulary chunk (one PSUM bank of fp32)


def z_chunk(xT, embT, c0, vc, rows, D):
    """z = x emb^T for vocab c0:c0+vc: D/128 matmuls into one fp32 PSUM bank (returned)."""
    P = nl.tile_size.pmax
    z_ps = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(cdiv(D, P)):
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
    for s in nl.affine_range(S):
        nisa.tensor_scalar(dst=hot[0:rows, 0:vc], data=iota_PV[0:rows, c0:c0 + vc], op0=nl.equal,
                           operand0=cols[0:rows, 1 + s:2 + s], op1=nl.multiply, operand1=corr[0:rows, s:s + 1])
        nisa.tensor_tensor(dst=r, data1=r, data2=hot[0:rows, 0:vc], op=nl.add,
                           engine=nisa.engine.gpsimd)


def demb_block(acc, blk_s, V, D):
    """demb += dz^T x over a block's row tiles (PSUM accumulation), one VectorE add per block into fp32 SBUF."""
    P = nl.tile_size.pmax
    x_s, dz_s, rows_s = blk_s
    for v in nl.affine_range(cdiv(V, P)):
        vr = min(P, V - v * P)
        for d in nl.affine_range(cdiv(D, VC)):
            dc = min(VC, D - d * VC)
            g_ps = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum)
            for st in nl.affine_range(len(rows_s)):
                nisa.nc_matmul(dst=g_ps[0:vr, 0:dc], stationary=dz_s[st][0:rows_s[st], v * P:v * P + vr],
                               moving=x_s[st][0:rows_s[st], d * VC:d * VC + dc])
            a = acc[v][0:vr, d * VC:d * VC + dc]
            nisa.tensor_tensor(dst=a, data1=a, data2=g_ps[0:vr, 0:dc], op=nl.add)


def bwd_r(st, iota_PV, V, S, softcap):
    """Row tile second stage: r = (t^2 - 1) dl [P, V] fp32 (`r_chunk`)."""
    P = nl.tile_size.pmax
    t_PV, cols, corr, neg_lse, neg_g, rows, dx_g = st[3]
    st[4] = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.affine_range(cdiv(V, VC)):
        r_chunk(st[4], t_PV, iota_PV, cols, corr, neg_lse, c * VC, min(VC, V - c * VC), rows, S, softcap)
