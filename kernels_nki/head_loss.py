"""Tied output head + softcap + cross-entropy (per-token losses) as NKI kernels for trn1, fwd and bwd.

Spec: frontier_jax.reference.head_loss: l = softcap * tanh(x emb^T / softcap) (+ an optional sparse
bias: one (token id, value) pair per position and source), loss = logsumexp(l) - l[target], fp32.

Layout: 128 tokens per tile on the partition axis (the last tile ragged, sliced), the vocabulary in
chunks of 512 on the free axis. emb^T [D, V] is built once per call by TensorE transposes and stays
in SBUF; z = x emb^T for one chunk is D/128 bf16 matmuls into one fp32 PSUM bank (stationary x^T
[D_k, tokens], moving emb^T [D_k, 512]). The full [tokens, V] logits never reach HBM: per chunk,
ScalarE computes tanh and the softcap scale, VectorE adds the sparse bias (an iota == id mask
times the value, 2 ops per source), picks the target logit (mask, row sum) and the chunk max, and
ScalarE's exp with a fused row sum feeds an online log-sum-exp (running max m, running sum
s <- s * exp(m_old - m_new) + sum(exp(l - m_new))). Outputs: loss [N, 1] and lse [N, 1] (fp32; the
lse is the backward's residual).

Backward (per token, recomputing the chunk's logits): dl = g * (exp(l - lse) - onehot(target)),
dz = dl * (1 - tanh^2); d bias_vals[n, s] = dl[n, ids[n, s]] (the n-gram bias values are learned);
dx = dz emb (dz^T by TensorE transposes as stationary, emb rows as moving, accumulated over the
whole vocabulary in one PSUM bank); demb = dz^T x contracts over the tokens of a 512-token block in
PSUM, then one VectorE add per block into fp32 SBUF accumulators, cast at the end.

x^T uses TensorE transposes (D/128 per 128-token tile), copied out of PSUM by ScalarE. At AWS's
documented engine rates (two-input VectorE instructions at ~2N cycles) both kernels are VectorE-bound
(the online softmax / gradient passes over every logit), so the transposes go where there is room:
VectorE 32x32 transposes (16 instructions per 128x128 block, each at the 64-cycle minimum) cost ~8x
more engine time than a TensorE transpose plus its ScalarE copy, and made the forward 1.9x slower.
The price is TensorE useful/issued: the x^T transposes are 128/V of the matmul columns (kernels_nki
.report: 0.887 forward, 0.888 backward at V=1024, D=512, N=65536), below the issue-15 target of 0.9, for a
shorter kernel. SBUF per partition: emb^T and emb
rows 2 x V x D x 2 / 128 bytes, the demb accumulators V x D x 4 / 128 (32 KiB in all at V=1024,
D=512; V=8192 needs D <= 256).

NeuronCore-v2 (trn1) rules this kernel follows (AWS docs, aws-neuron-sdk): PSUM is evacuated by
ScalarE `activation(op=nl.copy)` or VectorE, never ScalarE `tensor_copy` (unsupported on v2:
nki/api/nki/isa/__init__.py, tensor_copy); TensorE transposes write PSUM in their input's dtype
(isa docs nc_transpose); `activation`'s bias is always an [N, 1] fp32 tile (v2 takes no
immediate bias: isa docs activation "Layout"); `tensor_scalar` operands are fp32 columns (ids and
targets cast on VectorE first: isa docs tensor_scalar); exp has no range limit and log's input
(the running sum, in [1, V]) is inside its documented range [2^-64, 2^64]
(nki/api/nki.api.shared.rst, activation functions table); no `is` / `is not` in kernel code (NKI
0.3 compiler: release-notes/components/nki.rst, 0.3.0 breaking changes).
"""

import nki
import nki.isa as nisa
import nki.language as nl

VC = 512  # vocabulary chunk (one PSUM bank of fp32)
XT_PE = 1000  # every XT_PE-th 128-column block of x^T is transposed on TensorE, the others by VectorE 32x32
NB = 512  # tokens per demb block in the backward


def _cdiv(a, b):
    return (a + b - 1) // b


def _emb_tiles(emb_VD, dt):
    """emb as V/128 row tiles [v, D] and emb^T as D/128 tiles [d, V] (TensorE transposes, once per call)."""
    V, D = emb_VD.shape
    P = nl.tile_size.pmax
    rows, embT = [], [nl.ndarray((P, V), dtype=dt, buffer=nl.sbuf) for _ in range(_cdiv(D, P))]
    for v in nl.affine_range(_cdiv(V, P)):
        vr = min(P, V - v * P)
        e_t = nl.ndarray((P, D), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=e_t[0:vr], src=emb_VD[v * P:v * P + vr])
        for k in nl.affine_range(_cdiv(D, P)):
            dk = min(P, D - k * P)
            t_ps = nl.ndarray((dk, vr), dtype=dt, buffer=nl.psum)
            nisa.nc_transpose(dst=t_ps, data=e_t[0:vr, k * P:k * P + dk])
            nisa.activation(dst=embT[k][0:dk, v * P:v * P + vr], op=nl.copy, data=t_ps)
        rows.append(e_t)
    return rows, embT


def _x_tile(x_ND, r0, rows, dt):
    """Token rows r0:r0+rows as a [P, D] tile and as D/128 tiles of x^T [d, rows] (TensorE transposes,
    out of PSUM by ScalarE)."""
    N, D = x_ND.shape
    P = nl.tile_size.pmax
    x_PD = nl.ndarray((P, D), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_PD[0:rows], src=x_ND[r0:r0 + rows])
    xT = []
    for k in nl.affine_range(_cdiv(D, P)):
        dk = min(P, D - k * P)
        t_ps = nl.ndarray((dk, rows), dtype=dt, buffer=nl.psum)
        nisa.nc_transpose(dst=t_ps, data=x_PD[0:rows, k * P:k * P + dk])
        t = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
        nisa.activation(dst=t[0:dk, 0:rows], op=nl.copy, data=t_ps)
        xT.append(t)
    return x_PD, xT


def _column(src_N1, r0, rows, dtype):
    """Rows r0:r0+rows of an [N, C] HBM array as an fp32 SBUF tile [P, C] (cast on VectorE if needed)."""
    P = nl.tile_size.pmax
    C = src_N1.shape[1]
    raw = nl.ndarray((P, C), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=raw[0:rows], src=src_N1[r0:r0 + rows])
    if dtype == nl.float32:
        return raw
    out = nl.ndarray((P, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out[0:rows], src=raw[0:rows])
    return out


def _chunk_logits(xT, embT, iota_PV, c0, vc, rows, D, softcap, ids_PS, vals_PS, S):
    """(tanh(z / softcap), l = softcap * tanh + bias), both fp32 [P, VC] SBUF, for vocab c0:c0+vc."""
    P = nl.tile_size.pmax
    z_ps = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(_cdiv(D, P)):
        dk = min(P, D - k * P)
        nisa.nc_matmul(dst=z_ps[0:rows, 0:vc], stationary=xT[k][0:dk, 0:rows], moving=embT[k][0:dk, c0:c0 + vc])
    t_t = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=t_t[0:rows, 0:vc], op=nl.tanh, data=z_ps[0:rows, 0:vc], scale=1.0 / softcap)
    l_t = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=l_t[0:rows, 0:vc], op=nl.copy, data=t_t[0:rows, 0:vc], scale=softcap)
    for s in nl.affine_range(S):
        b_t = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=b_t[0:rows, 0:vc], data=iota_PV[0:rows, c0:c0 + vc], op0=nl.equal,
                           operand0=ids_PS[0:rows, s:s + 1], op1=nl.multiply, operand1=vals_PS[0:rows, s:s + 1])
        nisa.tensor_tensor(dst=l_t[0:rows, 0:vc], data1=l_t[0:rows, 0:vc], data2=b_t[0:rows, 0:vc], op=nl.add)
    return t_t, l_t


def _sources(bias_ids_NS, bias_vals_NS):
    """S, the bias sources: 0 when the caller passes None for both (no zero-size tensors reach a
    kernel: no AWS document defines one). `== None` replaces `is None` as the NKI 0.3 migration guide
    says (nki/migration/index.rst, "Replace is / is not"); NkiTensor defines no `__eq__`
    (nki/api/nki/language/__init__.py), and AWS's NKI Library tests optional tensor arguments the same
    way (aws-neuron/nki-library, nkilib/experimental/conv/conv1d.py: `bias != None`)."""
    if bias_ids_NS == None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        assert bias_vals_NS == None, "bias_ids_NS and bias_vals_NS are both None or both [N, S]"  # noqa: E711
        return 0
    assert bias_ids_NS.shape == bias_vals_NS.shape and bias_ids_NS.shape[1] > 0
    return bias_ids_NS.shape[1]


def _iota(V):
    P = nl.tile_size.pmax
    iota_PV = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=iota_PV, pattern=[[1, V]], offset=0, channel_multiplier=0)
    return iota_PV


@nki.jit
def head_loss_fwd(x_ND, emb_VD, targets_N1, bias_ids_NS=None, bias_vals_NS=None, softcap=30.0):
    """(loss_N1, lse_N1), fp32. bias_ids_NS int32 / bias_vals_NS fp32 [N, S >= 1], or None: no bias."""
    N, D = x_ND.shape
    V = emb_VD.shape[0]
    S = _sources(bias_ids_NS, bias_vals_NS)
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    loss_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    lse_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    _, embT = _emb_tiles(emb_VD, dt)
    iota_PV = _iota(V)
    for t in nl.affine_range(_cdiv(N, P)):
        r0 = t * P
        rows = min(P, N - r0)
        _, xT = _x_tile(x_ND, r0, rows, dt)
        tgt_P1 = _column(targets_N1, r0, rows, nl.int32)
        ids_PS = _column(bias_ids_NS, r0, rows, nl.int32) if S else None
        vals_PS = _column(bias_vals_NS, r0, rows, nl.float32) if S else None
        tl_P1 = nl.zeros((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        m_P1, s_P1 = tl_P1, tl_P1  # rebound by the first chunk (c == 0) before any read
        for c in nl.sequential_range(_cdiv(V, VC)):
            c0 = c * VC
            vc = min(VC, V - c0)
            _, l_t = _chunk_logits(xT, embT, iota_PV, c0, vc, rows, D, softcap, ids_PS, vals_PS, S)
            l = l_t[0:rows, 0:vc]
            junk = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.sbuf)
            part_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(dst=junk[0:rows, 0:vc], data=iota_PV[0:rows, c0:c0 + vc], op0=nl.equal,
                                      operand0=tgt_P1[0:rows], op1=nl.multiply, operand1=l)
            nisa.tensor_reduce(dst=part_P1[0:rows], op=nl.add, data=junk[0:rows, 0:vc], axis=1, keepdims=True)
            nisa.tensor_tensor(dst=tl_P1[0:rows], data1=tl_P1[0:rows], data2=part_P1[0:rows], op=nl.add)
            # online log-sum-exp
            mx_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=mx_P1[0:rows], op=nl.maximum, data=l, axis=1, keepdims=True)
            if c > 0:
                nisa.tensor_tensor(dst=mx_P1[0:rows], data1=mx_P1[0:rows], data2=m_P1[0:rows], op=nl.maximum)
            neg_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=neg_P1[0:rows], data=mx_P1[0:rows], op0=nl.multiply, operand0=-1.0)
            cs_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation_reduce(dst=junk[0:rows, 0:vc], op=nl.exp, data=l, bias=neg_P1[0:rows],
                                   reduce_op=nl.add, reduce_res=cs_P1[0:rows])
            if c > 0:
                corr_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=corr_P1[0:rows], op=nl.exp, data=m_P1[0:rows], bias=neg_P1[0:rows])
                nisa.scalar_tensor_tensor(dst=cs_P1[0:rows], data=s_P1[0:rows], op0=nl.multiply,
                                          operand0=corr_P1[0:rows], op1=nl.add, operand1=cs_P1[0:rows])
            m_P1, s_P1 = mx_P1, cs_P1
        lse_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=lse_P1[0:rows], op=nl.log, data=s_P1[0:rows])
        nisa.tensor_tensor(dst=lse_P1[0:rows], data1=lse_P1[0:rows], data2=m_P1[0:rows], op=nl.add)
        loss_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=loss_P1[0:rows], data1=lse_P1[0:rows], data2=tl_P1[0:rows], op=nl.subtract)
        nisa.dma_copy(dst=loss_N1[r0:r0 + rows], src=loss_P1[0:rows])
        nisa.dma_copy(dst=lse_N1[r0:r0 + rows], src=lse_P1[0:rows])
    return loss_N1, lse_N1


@nki.jit
def head_loss_bwd(x_ND, emb_VD, targets_N1, bias_ids_NS, bias_vals_NS, lse_N1, dloss_N1, softcap=30.0):
    """(dx_ND in x's dtype, demb_VD in emb's dtype[, dvals_NS fp32 with a bias]); no bias: both None."""
    N, D = x_ND.shape
    V = emb_VD.shape[0]
    S = _sources(bias_ids_NS, bias_vals_NS)
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    dx_ND = nl.ndarray((N, D), dtype=dt, buffer=nl.shared_hbm)
    demb_VD = nl.ndarray((V, D), dtype=emb_VD.dtype, buffer=nl.shared_hbm)
    dvals_NS = nl.ndarray((N, S), dtype=nl.float32, buffer=nl.shared_hbm) if S else None
    emb_rows, embT = _emb_tiles(emb_VD, dt)
    iota_PV = _iota(V)
    acc = [nl.zeros((P, D), dtype=nl.float32, buffer=nl.sbuf) for _ in range(_cdiv(V, P))]
    for blk in nl.affine_range(_cdiv(N, NB)):
        x_s, dz_s, rows_s = [], [], []
        for st in nl.affine_range(_cdiv(min(NB, N - blk * NB), P)):
            r0 = blk * NB + st * P
            rows = min(P, N - r0)
            x_PD, xT = _x_tile(x_ND, r0, rows, dt)
            tgt_P1 = _column(targets_N1, r0, rows, nl.int32)
            ids_PS = _column(bias_ids_NS, r0, rows, nl.int32) if S else None
            vals_PS = _column(bias_vals_NS, r0, rows, nl.float32) if S else None
            neg_P1 = _column(lse_N1, r0, rows, nl.float32)
            nisa.tensor_scalar(dst=neg_P1[0:rows], data=neg_P1[0:rows], op0=nl.multiply, operand0=-1.0)
            g_P1 = _column(dloss_N1, r0, rows, nl.float32)
            dv_PS = nl.zeros((P, S), dtype=nl.float32, buffer=nl.sbuf) if S else None
            dz_PV = nl.ndarray((P, V), dtype=dt, buffer=nl.sbuf)
            dx_ps = [nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum) for _ in range(_cdiv(D, VC))]
            for c in nl.affine_range(_cdiv(V, VC)):
                c0 = c * VC
                vc = min(VC, V - c0)
                t_t, l_t = _chunk_logits(xT, embT, iota_PV, c0, vc, rows, D, softcap, ids_PS, vals_PS, S)
                # dl = exp(l - lse) - onehot(target) (g applied below), in place of l
                nisa.activation(dst=l_t[0:rows, 0:vc], op=nl.exp, data=l_t[0:rows, 0:vc], bias=neg_P1[0:rows])
                nisa.scalar_tensor_tensor(dst=l_t[0:rows, 0:vc], data=iota_PV[0:rows, c0:c0 + vc], op0=nl.equal,
                                          operand0=tgt_P1[0:rows], op1=nl.subtract, operand1=l_t[0:rows, 0:vc],
                                          reverse1=True)
                for s in nl.affine_range(S):
                    junk = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.sbuf)
                    part_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.scalar_tensor_tensor(dst=junk[0:rows, 0:vc], data=iota_PV[0:rows, c0:c0 + vc],
                                              op0=nl.equal, operand0=ids_PS[0:rows, s:s + 1], op1=nl.multiply,
                                              operand1=l_t[0:rows, 0:vc])
                    nisa.tensor_reduce(dst=part_P1[0:rows], op=nl.add, data=junk[0:rows, 0:vc], axis=1, keepdims=True)
                    nisa.tensor_tensor(dst=dv_PS[0:rows, s:s + 1], data1=dv_PS[0:rows, s:s + 1],
                                       data2=part_P1[0:rows], op=nl.add)
                # dz = g * (1 - tanh^2) * dl
                nisa.activation(dst=t_t[0:rows, 0:vc], op=nl.square, data=t_t[0:rows, 0:vc])
                nisa.scalar_tensor_tensor(dst=t_t[0:rows, 0:vc], data=t_t[0:rows, 0:vc], op0=nl.subtract,
                                          operand0=1.0, reverse0=True, op1=nl.multiply, operand1=l_t[0:rows, 0:vc])
                nisa.tensor_scalar(dst=dz_PV[0:rows, c0:c0 + vc], data=t_t[0:rows, 0:vc], op0=nl.multiply,
                                   operand0=g_P1[0:rows])
                # dx += dz emb over this chunk's 128-row vocab tiles
                for j in nl.affine_range(_cdiv(vc, P)):
                    v0 = c0 + j * P
                    vj = min(P, V - v0)
                    dzT_ps = nl.ndarray((vj, rows), dtype=dt, buffer=nl.psum)
                    nisa.nc_transpose(dst=dzT_ps, data=dz_PV[0:rows, v0:v0 + vj])
                    dzT = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
                    nisa.activation(dst=dzT[0:vj, 0:rows], op=nl.copy, data=dzT_ps)
                    for d in nl.affine_range(_cdiv(D, VC)):
                        dc = min(VC, D - d * VC)
                        nisa.nc_matmul(dst=dx_ps[d][0:rows, 0:dc], stationary=dzT[0:vj, 0:rows],
                                       moving=emb_rows[v0 // P][0:vj, d * VC:d * VC + dc])
            for d in nl.affine_range(_cdiv(D, VC)):
                dc = min(VC, D - d * VC)
                dx_t = nl.ndarray((P, VC), dtype=dt, buffer=nl.sbuf)
                nisa.activation(dst=dx_t[0:rows, 0:dc], op=nl.copy, data=dx_ps[d][0:rows, 0:dc])
                nisa.dma_copy(dst=dx_ND[r0:r0 + rows, d * VC:d * VC + dc], src=dx_t[0:rows, 0:dc])
            if S:
                nisa.tensor_scalar(dst=dv_PS[0:rows], data=dv_PS[0:rows], op0=nl.multiply, operand0=g_P1[0:rows])
                nisa.dma_copy(dst=dvals_NS[r0:r0 + rows], src=dv_PS[0:rows])
            x_s.append(x_PD)
            dz_s.append(dz_PV)
            rows_s.append(rows)
        # demb += dz^T x over the block's tokens
        for v in nl.affine_range(_cdiv(V, P)):
            vr = min(P, V - v * P)
            for d in nl.affine_range(_cdiv(D, VC)):
                dc = min(VC, D - d * VC)
                g_ps = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum)
                for st in nl.affine_range(len(rows_s)):
                    nisa.nc_matmul(dst=g_ps[0:vr, 0:dc], stationary=dz_s[st][0:rows_s[st], v * P:v * P + vr],
                                   moving=x_s[st][0:rows_s[st], d * VC:d * VC + dc])
                a = acc[v][0:vr, d * VC:d * VC + dc]
                nisa.tensor_tensor(dst=a, data1=a, data2=g_ps[0:vr, 0:dc], op=nl.add)
    for v in nl.affine_range(_cdiv(V, P)):
        vr = min(P, V - v * P)
        out = nl.ndarray((P, D), dtype=emb_VD.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out[0:vr], src=acc[v][0:vr])
        nisa.dma_copy(dst=demb_VD[v * P:v * P + vr], src=out[0:vr])
    if S:
        return dx_ND, demb_VD, dvals_NS
    return dx_ND, demb_VD
