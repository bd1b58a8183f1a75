"""The attention forwards (kernels_nki/attention/kernels.py holds the @nki.jit entry points): `forward_exact`
(the running-row-max online softmax, the plain kernel's and the fused kernel's fallback; `exact_chunk` one key
chunk of it) and `forward_bounded` (the fused kernel's: a per-head constant shift from the QK-norm score bound,
the scores only key-major; its steps `kernels_nki.attention.steps.bounded_heads`). The algorithms, the bound's
derivation, the layouts and the engine choices: docs/kernels/attention.md.
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.attention.layout import block, lse_store, natural_cols, perm_rows, seq_tile
from kernels_nki.attention.rope_norm import gain_column, gain_tile, prep_head, rope_tiles
from kernels_nki.attention.rows import causal_bias, dims, half_matmul, kv_head, kv_head_saved, v_aug
from kernels_nki.attention.saved import residuals, saved_outputs, saved_tiles, store_seq
from kernels_nki.attention.steps import KC, bounded_heads, run_stages, scores
from kernels_nki.attention.xsa import xsa_c, xsa_out, xsa_units
from kernels_nki.tiles import cdiv, identity, pipeline, row_tiles, transpose

SHIFT_OFFSET = 35.0  # the bounded forward's shift m_h = B_h - SHIFT_OFFSET (docs/kernels/attention.md)
BOUND_MARGIN = 1.0 + 2.0 ** -5  # B_h = sqrt(K) |g_h| BOUND_MARGIN


def exact_chunk(qT, kT, vs, t0, rows, c0, kc, bias, scale, state, last, dt):
    """One key chunk of the exact forward's online softmax (docs/kernels/attention.md, "The exact-max forward").

    Args:
        state: (-m, acc), () for the first chunk: -m the fp32 value of the shift in use (minus the running row max
            of the raw scores, rounded to dt); acc = p [v | 1] so far.
        last: the chunk is the query tile's last.

    Returns:
        The new state; acc the PSUM tile itself when the first chunk is also the last, else an fp32 SBUF tile.
    """
    K = qT.shape[0]
    P = nl.tile_size.pmax
    ident = bias.ident
    s_ps = scores(qT, kT, t0, rows, c0, kc, bias, True)
    m_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m_P1[0:rows], op=nl.maximum, data=s_ps[0:rows, 0:kc], axis=1, keepdims=True)
    if state:
        negm_old, acc = state
        nisa.tensor_tensor(dst=m_P1[0:rows], data1=m_P1[0:rows], data2=negm_old[0:rows], op=nl.maximum,
                           engine=nisa.engine.gpsimd)
    negm = nl.ndarray((P, 1), dtype=dt, buffer=nl.sbuf)  # -m rounded to dt: the shift the matmul adds
    nisa.activation(dst=negm[0:rows], op=nl.copy, data=m_P1[0:rows], scale=-1.0)
    negm_f = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=negm_f[0:rows], src=negm[0:rows], engine=nisa.engine.gpsimd)
    negm_row = nl.ndarray((1, P), dtype=dt, buffer=nl.sbuf)
    transpose(negm_row[0:1, 0:rows], negm[0:rows], rows, 1, ident)
    ones_row = bias.ones  # its row 0: the K = 1 stationary
    o_ps = nl.ndarray((P, K + 1), dtype=nl.float32, buffer=nl.psum)
    for j in range(cdiv(kc, P)):
        kr = min(P, kc - j * P)
        k0 = c0 + j * P
        sT_ps = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
        half_matmul(sT_ps[0:kr, 0:rows], kT[0:K, k0:k0 + kr], qT[0:K, 0:rows], None, name="recompute s^T")
        nisa.nc_matmul(dst=sT_ps[0:kr, 0:rows], stationary=ones_row[0:1, 0:kr], moving=negm_row[0:1, 0:rows],
                       accumulate=True, is_stationary_onezero=True)
        pT = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
        nisa.activation(dst=pT[0:kr, 0:rows], op=nl.exp, data=sT_ps[0:kr, 0:rows], scale=scale)
        if k0 == t0:  # the diagonal block: p^T[key, query] = 0 where key > query
            nisa.affine_select(dst=pT[0:kr, 0:rows], pattern=[[1, rows]], offset=0, channel_multiplier=-1,
                               on_true_tile=pT[0:kr, 0:rows], on_false_value=0.0, cmp_op=nl.greater_equal)
        nisa.nc_matmul(dst=o_ps[0:rows, 0:K + 1], stationary=pT[0:kr, 0:rows], moving=vs[k0 // P][0:kr, 0:K + 1])
    if not state:
        if last:
            return negm_f, o_ps
        acc = nl.ndarray((P, K + 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=acc[0:rows], src=o_ps[0:rows, 0:K + 1])
        return negm_f, acc
    # corr = exp(scale (m_old - m_new)); acc = acc corr + o'
    b_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=b_P1[0:rows], data=negm_f[0:rows], op0=nl.multiply, operand0=scale)
    corr_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=corr_P1[0:rows], op=nl.exp, data=negm_old[0:rows], bias=b_P1[0:rows], scale=-scale)
    nisa.scalar_tensor_tensor(dst=acc[0:rows], data=acc[0:rows], op0=nl.multiply, operand0=corr_P1[0:rows],
                              op1=nl.add, operand1=o_ps[0:rows, 0:K + 1])
    return negm_f, acc


def forward_exact(q_BTHK, k_BTGK, v_BTGK, rope, xsa=False):
    """The exact-max forward of both kernels: per (sequence, kv head, query head, query tile) the key chunks'
    online softmax (`exact_chunk`).

    Args:
        rope: () or a `Rope` (cos, sin, gain) for QK-norm + RoPE + gain, which also writes the normed, rotated q / k,
            their inverse RMS and transposes (`saved_outputs`) for the backward.
        xsa: the XSA epilogue on each query tile's o (`xsa_out`), which also writes the rows' o . u (`xsa_c`).

    Returns:
        (o, lse) + the residuals (`residuals`) [+ (xc,)].
    """
    B, T, H, K, G, R, P, dt, scale = dims(q_BTHK, k_BTGK)
    o_BTHK = nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm)
    lse_BHT1 = nl.ndarray((B, H, T, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    saved = saved_outputs(B, T, H, G, K, dt) if rope else ()
    xc_BHT1 = xsa_c(B, H, T) if xsa else None
    bias = causal_bias(dt)
    ident32 = identity(nl.float32)
    tables = rope_tiles(rope.cos, rope.sin, perm=True) if rope else ()
    g_sb = gain_tile(rope.gain) if rope else None
    for b in range(B):
        q_sb, k_sb = seq_tile(q_BTHK, dt, b, perm=True), seq_tile(k_BTGK, dt, b, perm=True)
        v_sb = seq_tile(v_BTGK, dt, b)
        o_sb, lse_sb = seq_tile(o_BTHK, dt), nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf)
        c_sb = nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf) if xsa else None
        outs = saved_tiles(saved, dt)
        for g in range(G):
            u = None
            if xsa:
                u, _, stages = xsa_units(v_sb, G, g, T)
                run_stages(stages)
            if rope:
                k_tiles, kT = kv_head_saved(k_sb, G, g, T, dt, bias.ident, tables, (outs.kr, outs.kinv), saved.krT,
                                            b, perm=True)
            else:
                k_tiles, kT, _ = kv_head(k_sb, G, g, T, dt, bias.ident, perm=True)
            vs = v_aug(v_sb, G, g, T, dt)
            for r in range(R):
                h = g * R + r
                gain = gain_column(g_sb, h, K) if rope else ()
                qT_h = nl.ndarray((K, T), dtype=dt, buffer=nl.sbuf)
                o_nat = nl.ndarray((P, cdiv(T, P) * K), dtype=dt, buffer=nl.sbuf)  # o in natural blocks
                ys = (prep_head(q_sb, H, h, T, tables, gain, outs) if rope else
                      [block(q_sb, i, h, H, K) for i in range(cdiv(T, P))])
                for i, _, rows in row_tiles(T):
                    transpose(natural_cols(qT_h, i, T, True), ys[i][0:rows], rows, K, bias.ident, on_vector=not rope)
                for i, t0, rows in row_tiles(T):
                    qT = qT_h[0:K, t0:t0 + rows]
                    state = ()
                    chunks = cdiv(t0 + rows, KC)
                    for c in range(chunks):
                        c0 = c * KC
                        state = exact_chunk(qT, kT, vs, t0, rows, c0, min(KC, t0 + rows - c0), bias, scale,
                                           state, c == chunks - 1, dt)
                    negm_f, acc = state
                    inv_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.reciprocal(dst=inv_P1[0:rows], data=acc[0:rows, K:K + 1])
                    o_t = block(o_nat, i, 0, 1, K)
                    nisa.tensor_scalar(dst=o_t[0:rows], data=acc[0:rows, 0:K], op0=nl.multiply,
                                       operand0=inv_P1[0:rows])
                    if xsa:
                        xsa_out(o_nat, i, 1, rows, u, c_sb, h, H)()
                    lse_P1 = block(lse_sb, i, h, H, 1)  # scale m + log(l)
                    nisa.activation(dst=lse_P1[0:rows], op=nl.log, data=acc[0:rows, K:K + 1])
                    nisa.activation(dst=lse_P1[0:rows], op=nl.copy, data=negm_f[0:rows], scale=-scale,
                                    bias=lse_P1[0:rows])
                perm_rows(o_sb, H, (h,), (o_nat,), T, bias.ident, dt)
                if rope:
                    nisa.dma_copy(dst=saved.qgT[b, h], src=qT_h)
        store_seq(o_BTHK, lse_BHT1, saved, o_sb, lse_sb, outs, b, ident32, o_perm=True)
        if xsa:
            lse_store(xc_BHT1, b, c_sb, ident32)
    return (o_BTHK, lse_BHT1) + residuals(saved) + ((xc_BHT1,) if xsa else ())


def neg_shift(g_P1):
    """-m_h = SHIFT_OFFSET - sqrt(K) |g_h| BOUND_MARGIN as an fp32 [P, 1] column, from the head's `gain_column`
    (g_h sqrt(K)): the bias of the bounded forward's exp (every partition, i.e. key)."""
    P = nl.tile_size.pmax
    n_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=n_P1, data=g_P1, op0=nl.abs, operand0=0.0, op1=nl.multiply, operand1=-BOUND_MARGIN)
    nisa.tensor_scalar(dst=n_P1, data=n_P1, op0=nl.add, operand0=SHIFT_OFFSET)
    return n_P1


def forward_bounded(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, xsa=False):
    """The fused forward with the per-head bounded shift (docs/kernels/attention.md, "The bounded-shift forward");
    the same outputs as `forward_exact`. One job per (sequence, kv head): its prep (k^T, [v | 1], the query heads'
    q^T; a sequence's loads with its first kv head's) and its steps (`bounded_heads`), the next job's prep side work
    between them:

        pipeline(jobs, [(0, prep),     # job n's tiles; its units run now (n = 0) or as job n - 1's side work
                        (1, steps)])   # bounded_heads(job n, side = job n + 1's prep units); a sequence's stores
    """
    B, T, H, K, G, R, P, dt, scale = dims(q_BTHK, k_BTGK)
    o_BTHK = nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm)
    lse_BHT1 = nl.ndarray((B, H, T, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    saved = saved_outputs(B, T, H, G, K, dt)
    xc_BHT1 = xsa_c(B, H, T) if xsa else None
    ident = identity(dt)
    ident32 = identity(nl.float32)
    tables = rope_tiles(cos_TK2, sin_TK2, perm=True)
    g_sb = gain_tile(g_PH)
    gains = [gain_column(g_sb, h, K) for h in range(H)]
    negms = [neg_shift(gain.col) for gain in gains]
    maskT = causal_bias(dt, key_major=True).mask
    jobs = [(b, g) for b in range(B) for g in range(G)]
    seqs = [None] * B  # per sequence its SBUF tiles while live
    preps, pending = [], []  # prepared jobs' tiles, their units not yet run, oldest first

    def load(b):  # one sequence's SBUF tiles: q, k, v loaded, o, lse and the saved rows to fill
        return {"b": b, "q": seq_tile(q_BTHK, dt, b, perm=True), "k": seq_tile(k_BTGK, dt, b, perm=True),
                "v": seq_tile(v_BTGK, dt, b), "o": seq_tile(o_BTHK, dt),
                "lse": nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf),
                "c": nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf) if xsa else None,
                "outs": saved_tiles(saved, dt)}

    def prep(n):  # job n's k^T, [v | 1] tiles and its query heads' q^T, made by units
        b, g = jobs[n]
        if g == 0:
            seqs[b] = load(b)
        sq = seqs[b]
        outs = sq["outs"]
        res = {"qTs": [nl.ndarray((K, T), dtype=dt, buffer=nl.sbuf) for _ in range(R)]}

        def kside():
            _, res["kT"] = kv_head_saved(sq["k"], G, g, T, dt, ident, tables, (outs.kr, outs.kinv), saved.krT, b,
                                         perm=True)
            res["vs"] = v_aug(sq["v"], G, g, T, dt)

        def qside(r):
            h = g * R + r
            ys = prep_head(sq["q"], H, h, T, tables, gains[h], outs)
            for i, t0, rows in row_tiles(T):
                transpose(natural_cols(res["qTs"][r], i, T, True), ys[i][0:rows], rows, K, ident, on_vector=False)
            nisa.dma_copy(dst=saved.qgT[b, h], src=res["qTs"][r])

        xs = []  # XSA's unit values u: their stages units of their own
        if xsa:
            res["u"], _, xs = xsa_units(sq["v"], G, g, T)
        units = [kside] + xs + [lambda r=r: qside(r) for r in range(R)]
        preps.append(res)
        if n == 0:
            run_stages(units)
        else:
            pending.append(units)

    def steps(n):
        b, g = jobs[n]
        res, sq = preps.pop(0), seqs[b]
        units = pending.pop(0) if n + 1 < len(jobs) else []
        hs = [g * R + r for r in range(R)]
        bounded_heads(res["qTs"], res["kT"], res["vs"], [negms[h] for h in hs], (sq["o"], sq["lse"], H), hs,
                      scale, dt, ident, maskT, units, (res["u"], sq["c"]) if xsa else ())
        if g == G - 1:
            store_seq(o_BTHK, lse_BHT1, saved, sq["o"], sq["lse"], sq["outs"], b, ident32, o_perm=True)
            if xsa:
                lse_store(xc_BHT1, b, sq["c"], ident32)
            seqs[b] = None

    pipeline(len(jobs), [(0, prep), (1, steps)])
    return (o_BTHK, lse_BHT1) + residuals(saved) + ((xc_BHT1,) if xsa else ())
