"""XSA (exclusive self attention) in the attention kernels (a kernel-helper file): `xsa_units` (each kv head's unit
value vectors u), `xsa_out` (the forward's epilogue o - (o . u) u), `xsa_c` (the forward's residual). The
backward's share is `kernels_nki.attention.backward._xsa_units` (docs/kernels/attention.md, "The recipe's
switches").
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.tiles import cdiv, row_tiles


XSA_EPS2 = 1.0e-24  # XSA's norm floor squared: 1 / max(||v||, 1e-12) = rsqrt(max(||v||^2, 1e-24))


def xsa_units(v_sb, G, g, T):
    """XSA's unit value vectors of kv head g (reference.xsa, F.normalize).

    Args:
        v_sb: the sequence's v `seq_tile` (either layout: block i of u is block i of v's).

    Returns:
        (u [P, nt, K] fp32 = v / max(||v||, 1e-12), inv [P, nt] fp32 = 1 / max(||v||, 1e-12) per row, stages): the
        tiles are allocated now and filled as the three stages (squares, norms, u) run.

    Notes:
        The squares (GpSimd) and their row sums (VectorE) for every full block at once, the floor (VectorE) and
        rsqrt on GpSimd in the documented form, tensor_scalar(op0=nl.rsqrt, operand0=0.0) (aws-neuron-sdk
        nki/api/nki.api.shared.rst, "Reverse square root can run on GpSIMD Engine"; the floor 1e-24 ~ 2^-79.7 keeps
        it inside rsqrt's valid input range [2^-87, 2^97], the activation functions table there), u = v inv per
        block (VectorE: a [P, 1] column operand); a ragged last block on its rows only.
    """
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
        for i, _, rows in row_tiles(T):
            nisa.tensor_scalar(dst=u[0:rows, i], data=src[0:rows, i, g * K:(g + 1) * K], op0=nl.multiply,
                               operand0=inv[0:rows, i:i + 1])

    return u, inv, [squares, norms, units]


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



def xsa_c(B, H, T):
    """The XSA forward's extra output xc_BHT1 (fp32): each row's o . u (o: the attention's output before XSA, u its
    kv head's unit value vector), in lse's layout; the backward's residual (`xsa_out`, `backward._xsa_units`)."""
    return nl.ndarray((B, H, T, 1), dtype=nl.float32, buffer=nl.shared_hbm)
