"""Fused Muon update of one weight matrix as an NKI kernel for trn1 (NeuronCore-v2), NKI 0.3+ API.

Spec: frontier_jax.ops.reference.muon_update (reference.muon_direction -> + wd p -> scale by -lr -> apply):
    buf' = mom * buf + g;  ge = g + mom * buf'                  (Nesterov; in buf's dtype, see below)
    X    = ge in PyTorch orientation [out, in], transposed if tall, cast to the NS dtype, / ||X||_F
    5 x  A = X X^T;  B = b A + c A A;  X = a X + B X            (quintic Newton-Schulz)
    u    = round_ns(X back in [in, out] * s)   (shape_scale "update")  or  X back * s in fp32  ("lr")
    p'   = p - lr * (u + wd * p)               (s = sqrt(max(1, out / in)), wd the static weight_decay)
A bfloat16 buffer is the record's momentum: g rounded to bf16, buf' = bf16(bf16(mom * buf) + g) and ge
rounded to bf16 (one VectorE instruction more per row tile); a float32 one is the baseline's, all fp32.
HBM traffic is the minimum: p, g, buf read once, p' and buf' written once (20 B per element with an fp32
buffer, 16 B with a bf16 one; weight decay reads nothing more) plus one [128, 2] fp32 tensor of runtime
scalars (lr, momentum), every row identical. The
Newton-Schulz iterate never leaves the chip: X [R, C] (R = min(in, out) <= C) is held twice, as
R-row tiles (X, the moving operand of B X) and as C-row tiles (X^T, both operands of X X^T), both
in the NS dtype; after each iteration X^T is rebuilt from X by TensorE transposes (matmuls against the
identity on 64-row tiles of the PE array, R C 64 MACs, cheaper than a second B X product). A and B are R-row tiles [P, R].

Limits (checked by the emulator): R <= 512 per PSUM bank row in the transposes is chunked, so any
R, C work; SBUF holds ~ (3 C + 3 R) * 2 B + 16 KiB of scratch per partition for R, C <= ~4096 in bf16.
All baseline and frontier14 matrices (R <= 512, C <= 1024: ~25 KiB per partition) fit.

NeuronCore-v2 (trn1) rules this kernel follows (AWS docs, aws-neuron-sdk): TensorE transposes are
matmuls against the identity into fp32 PSUM (nki/api/nki/isa/__init__.py, nc_matmul "Transpose mode" and
"Data types": no native transpose mode, a float32 dst on NeuronCore-v2; nc_transpose, whose dst would
take bf16 data's dtype, is not used: `kernels_nki.tiles`) and PSUM is
read back by VectorE `tensor_copy`, named explicitly (GpSimd cannot read PSUM, ScalarE tensor_copy
is unsupported on v2: isa docs tensor_copy); no divide
(not an ALU operator: nki/api/nki.api.shared.rst operator table; release-notes/components/nki.rst
lists nl.divide as unsupported): x / n is x * reciprocal(n) on VectorE; `tensor_scalar` operands
and `activation` scales are fp32 (isa docs tensor_scalar, activation), so the NS constants are fp32
columns of their fp32 values, each product by one rounded once on its write to the NS dtype (torch's
bf16 tensor times a Python float, the reference's rule); sqrt's input is clamped into
its valid range [2^-116, 2^118] (nki.api.shared.rst, activation functions table), which changes
only an all-zero gradient's norm (0, whose update stays 0).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.tiles import identity, row_tiles, transpose_to_psum

NS_A, NS_B, NS_C = 3.4445, -4.7750, 2.0315  # = frontier_jax.ops.reference.NS_COEFFS
NS_EPS = 1e-7  # = frontier_jax.ops.reference.NS_EPS
PSUM_N = 512  # fp32 columns of one PSUM bank (nl.tile_size.psum_fmax)
SQRT_MIN, SQRT_MAX = 2.0 ** -116, 2.0 ** 118  # ScalarE sqrt's valid input range (nki.api.shared.rst)


def _constants(values, P):
    """The compile-time constants as an fp32 [P, len(values)] tile (memset in fp32): the reference multiplies by
    them in fp32 as torch multiplies a bf16 tensor by a Python float (a * X, b * A, c * AA, + eps, * scale), each
    product rounded once on its write. fp32 tiles because `tensor_scalar` / `activation` scale operands must be
    float32 (isa docs)."""
    n = len(values)
    out = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    for i in range(n):
        nisa.memset(dst=out[:, i:i + 1], value=values[i])
    return out


def _transpose(src, src_rows, src_cols, ident):
    """C-row tiles [P, src_rows] of the transpose of R-row tiles `src` (each [P, src_cols]): TensorE transposes
    against `ident` (the identity in the NS dtype) into fp32 PSUM (`tiles.transpose_to_psum`), a bank's row of
    them out by one VectorE copy."""
    P = nl.tile_size.pmax
    out = []
    for _, j0, cj in row_tiles(src_cols):
        t = nl.ndarray((P, src_rows), dtype=ident.dtype, buffer=nl.sbuf)
        for _, n0, nw in row_tiles(src_rows, PSUM_N):
            pt = nl.ndarray((P, nw), dtype=nl.float32, buffer=nl.psum)
            for i, r0, ri in row_tiles(src_rows):
                if n0 <= r0 < n0 + nw:
                    transpose_to_psum(pt[0:cj, r0 - n0:r0 - n0 + ri], src[i][0:ri, j0:j0 + cj], ri, ident)
            nisa.tensor_copy(dst=t[0:cj, n0:n0 + nw], src=pt[0:cj, 0:nw], engine=nisa.engine.vector)
        out.append(t)
    return out


def _gram(lhs, rhs, k_rows, M, N, combine):
    """lhs^T @ rhs for lhs, rhs given as k-row tiles, in [<=128, <=512] PSUM blocks; `combine` stores each."""
    P = nl.tile_size.pmax
    for m, r0, rm in row_tiles(M):
        for _, n0, nw in row_tiles(N, PSUM_N):
            pt = nl.ndarray((P, nw), dtype=nl.float32, buffer=nl.psum)
            for k, _, rk in row_tiles(k_rows):
                nisa.nc_matmul(dst=pt[0:rm, 0:nw], stationary=lhs[k][0:rk, r0:r0 + rm], moving=rhs[k][0:rk, n0:n0 + nw])
            combine(m, r0, rm, n0, nw, pt)


@nki.jit
def muon_update(p_IO, g_IO, buf_IO, scal_P2, ns_steps=5, ns_dtype="bfloat16", weight_decay=0.0,
                shape_scale="update"):
    """(p', buf') of one [in, out] fp32 matrix, the momentum in buf's dtype; scal_P2 [128, 2] fp32 rows [lr,
    momentum]."""
    I, O = p_IO.shape
    P = nl.tile_size.pmax
    dt = nl.bfloat16 if ns_dtype == "bfloat16" else nl.float32
    bt = buf_IO.dtype  # the momentum's dtype: float32 (the baseline) or bfloat16 (the record)
    low = bt != nl.float32
    wide = O <= I  # PyTorch [out, in] is not tall: X = ge^T, natural [in, out] tiles are X^T
    R, C = (O, I) if wide else (I, O)
    scale = max(1.0, O / I) ** 0.5
    k_P5 = _constants((NS_A, NS_B, NS_C, NS_EPS, scale), P)  # columns: a, b, c, eps, scale
    po_IO = nl.ndarray((I, O), dtype=p_IO.dtype, buffer=nl.shared_hbm)
    bo_IO = nl.ndarray((I, O), dtype=buf_IO.dtype, buffer=nl.shared_hbm)
    s_P2 = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s_P2, src=scal_P2)
    nlr_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=nlr_P1, data=s_P2[:, 0:1], op0=nl.multiply, operand0=-1.0)
    mom_P1 = s_P2[:, 1:2]

    # ---- momentum, Nesterov, cast to the NS dtype, per-partition sums of squares (natural [in, out] tiles)
    nat = []
    ss_P1 = nl.zeros((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    for _, i0, ri in row_tiles(I):
        g_t = nl.ndarray((P, O), dtype=g_IO.dtype, buffer=nl.sbuf)
        b_t = nl.ndarray((P, O), dtype=buf_IO.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=g_t[0:ri], src=g_IO[i0:i0 + ri])
        nisa.dma_copy(dst=b_t[0:ri], src=buf_IO[i0:i0 + ri])
        gm = g_t
        if low:  # the record's bf16 momentum: g rounded, then a rounding after the multiply and after the add
            gm = nl.ndarray((P, O), dtype=bt, buffer=nl.sbuf)
            nisa.tensor_copy(dst=gm[0:ri], src=g_t[0:ri])
            nisa.tensor_scalar(dst=b_t[0:ri], data=b_t[0:ri], op0=nl.multiply, operand0=mom_P1[0:ri])
            nisa.tensor_tensor(dst=b_t[0:ri], data1=b_t[0:ri], data2=gm[0:ri], op=nl.add)
        else:
            nisa.scalar_tensor_tensor(dst=b_t[0:ri], data=b_t[0:ri], op0=nl.multiply, operand0=mom_P1[0:ri],
                                      op1=nl.add, operand1=g_t[0:ri])
        nisa.dma_copy(dst=bo_IO[i0:i0 + ri], src=b_t[0:ri])
        x_t = nl.ndarray((P, O), dtype=dt, buffer=nl.sbuf)
        recast = low and dt != bt  # a bf16 momentum's ge is rounded to bf16 before an fp32 Newton-Schulz
        ge = nl.ndarray((P, O), dtype=bt, buffer=nl.sbuf) if recast else x_t
        nisa.scalar_tensor_tensor(dst=ge[0:ri], data=b_t[0:ri], op0=nl.multiply, operand0=mom_P1[0:ri],
                                  op1=nl.add, operand1=gm[0:ri])
        if recast:
            nisa.tensor_copy(dst=x_t[0:ri], src=ge[0:ri])
        sq_t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=g_t[0:ri], op=nl.square, data=x_t[0:ri], reduce_op=nl.add,
                               reduce_res=sq_t[0:ri])
        nisa.tensor_tensor(dst=ss_P1[0:ri], data1=ss_P1[0:ri], data2=sq_t[0:ri], op=nl.add)
        nat.append(x_t)

    # ---- Frobenius norm on every partition (ones-matmul), rounded to the NS dtype as the reference does
    ones_PP = nl.ones((P, P), dtype=nl.float32, buffer=nl.sbuf)
    tot_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=tot_P1, stationary=ones_PP, moving=ss_P1)
    # clamped into sqrt's valid input range: only an all-zero matrix (tot = 0) is moved, and it stays 0
    totc_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=totc_P1, data=tot_P1, op0=nl.maximum, operand0=SQRT_MIN, op1=nl.minimum,
                       operand1=SQRT_MAX)
    nrm_P1 = nl.ndarray((P, 1), dtype=dt, buffer=nl.sbuf)
    nisa.activation(dst=nrm_P1, op=nl.sqrt, data=totc_P1)
    nisa.tensor_scalar(dst=nrm_P1, data=nrm_P1, op0=nl.add, operand0=k_P5[:, 3:4])
    # x / n as x * (1 / n): the ISA has no divide (nki.api.shared.rst operator table; NKI release
    # notes: nl.divide unsupported); VectorE's reciprocal is the precise one (nki.api.shared.rst)
    rn_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rn_P1, data=nrm_P1)
    for i, _, ri in row_tiles(I):
        nisa.tensor_scalar(dst=nat[i][0:ri], data=nat[i][0:ri], op0=nl.multiply, operand0=rn_P1[0:ri])

    # ---- Newton-Schulz on chip: X as R-row tiles, X^T as C-row tiles
    ident = identity(dt)
    if wide:
        xt, x = nat, _transpose(nat, C, R, ident)
    else:
        x, xt = nat, _transpose(nat, R, C, ident)
    for it in range(ns_steps):
        a_t = [nl.ndarray((P, R), dtype=dt, buffer=nl.sbuf) for _ in row_tiles(R)]
        b_t = [nl.ndarray((P, R), dtype=dt, buffer=nl.sbuf) for _ in row_tiles(R)]
        xn = [nl.ndarray((P, C), dtype=dt, buffer=nl.sbuf) for _ in row_tiles(R)]

        def store_a(m, r0, rm, n0, nw, pt):  # A = X X^T
            nisa.tensor_copy(dst=a_t[m][0:rm, n0:n0 + nw], src=pt[0:rm, 0:nw], engine=nisa.engine.vector)

        # Every product and term is rounded to the NS dtype as the reference (and the baseline's bf16
        # torch code) rounds it: 5 bf16 iterations amplify rounding differences in small singular
        # directions ~3.4x each, so matching the rounding points matters more than the extra passes.
        def store_b(m, r0, rm, n0, nw, pt):  # B = b A + c (A A)
            aa = nl.ndarray((P, nw), dtype=dt, buffer=nl.sbuf)
            nisa.tensor_copy(dst=aa[0:rm], src=pt[0:rm, 0:nw], engine=nisa.engine.vector)
            nisa.activation(dst=aa[0:rm], op=nl.copy, data=aa[0:rm], scale=k_P5[0:rm, 2:3])
            ba = nl.ndarray((P, nw), dtype=dt, buffer=nl.sbuf)
            nisa.activation(dst=ba[0:rm], op=nl.copy, data=a_t[m][0:rm, n0:n0 + nw], scale=k_P5[0:rm, 1:2])
            nisa.tensor_tensor(dst=b_t[m][0:rm, n0:n0 + nw], data1=ba[0:rm], data2=aa[0:rm], op=nl.add)

        def store_x(m, r0, rm, n0, nw, pt):  # X' = a X + B X
            bx = nl.ndarray((P, nw), dtype=dt, buffer=nl.sbuf)
            nisa.tensor_copy(dst=bx[0:rm], src=pt[0:rm, 0:nw], engine=nisa.engine.vector)
            ax = nl.ndarray((P, nw), dtype=dt, buffer=nl.sbuf)
            nisa.activation(dst=ax[0:rm], op=nl.copy, data=x[m][0:rm, n0:n0 + nw], scale=k_P5[0:rm, 0:1])
            nisa.tensor_tensor(dst=xn[m][0:rm, n0:n0 + nw], data1=ax[0:rm], data2=bx[0:rm], op=nl.add)

        _gram(xt, xt, C, R, R, store_a)
        _gram(a_t, a_t, R, R, R, store_b)  # A, B symmetric: A[k, m]^T = A[m, k]
        _gram(b_t, x, R, R, C, store_x)
        x = xn
        if it < ns_steps - 1 or wide:
            xt = _transpose(x, R, C, ident)

    # ---- shape scale (rounded to the NS dtype, or in fp32 with the lr), + wd p, p' = p - lr * u ([in, out] tiles)
    out = xt if wide else x
    for i, i0, ri in row_tiles(I):
        u = out[i]
        if scale != 1.0 and shape_scale == "lr":
            u = nl.ndarray((P, O), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=u[0:ri], data=out[i][0:ri], op0=nl.multiply, operand0=scale)
        elif scale != 1.0:
            nisa.tensor_scalar(dst=u[0:ri], data=u[0:ri], op0=nl.multiply, operand0=k_P5[0:ri, 4:5])
        p_t = nl.ndarray((P, O), dtype=p_IO.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=p_t[0:ri], src=p_IO[i0:i0 + ri])
        if weight_decay:  # u + wd p in fp32 (decoupled weight decay, with the learning rate below)
            ud = nl.ndarray((P, O), dtype=nl.float32, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(dst=ud[0:ri], data=p_t[0:ri], op0=nl.multiply, operand0=weight_decay,
                                      op1=nl.add, operand1=u[0:ri])
            u = ud
        nisa.scalar_tensor_tensor(dst=p_t[0:ri], data=u[0:ri], op0=nl.multiply, operand0=nlr_P1[0:ri],
                                  op1=nl.add, operand1=p_t[0:ri])
        nisa.dma_copy(dst=po_IO[i0:i0 + ri], src=p_t[0:ri])
    return po_IO, bo_IO
