"""Causal GQA attention (flash style), forward and backward as NKI kernels for trn1, plain
(`attention_fwd` / `_bwd`: the causal_attention op) and with the model's QK-norm, RoPE and query gain
fused in (`qk_attention_fwd` / `_bwd`: the qk_attention op, what the model runs).

Spec: frontier_jax.ops.reference.causal_attention: o = softmax(q k^T / sqrt(K) + causal mask) v, softmax
in fp32, G kv heads each shared by R = H/G query heads. Shapes: q [B, T, H, K], k/v [B, T, G, K]
(the model's layout: rows of one head are strided in HBM, K contiguous elements each), K <= 128.
reference.qk_attention: the same on rope(rms_norm(q)) * gain and rope(rms_norm(k)) (weightless
RMSNorm over K, eps = fp32 epsilon; half-split RoPE; cos/sin [T, K/2] fp32 holding values rounded to
q's dtype, as the reference casts them; the gain broadcast over 128 rows, fp32).

QK-norm + RoPE (+ gain) run on chip inside both fused kernels (kernels_nki/attention_parts.py: `prep_tile`
in the forward, `prep_grad` in the backward); this replaces four DMA-bound kernel calls per layer and
micro-batch (QK-norm of q and k, rope_gain, rope) (docs/kernels/attention.md).

XSA (xsa_on, a compile-time constant of both fused kernels; reference.xsa): o = a - (a . u) u per query head, u =
v / max(||v||, 1e-12) its kv head's unit value vector, applied to each query tile's o in SBUF before o leaves
(`attention_parts.xsa_out`: GpSimd products, one VectorE row sum, one VectorE scalar_tensor_tensor per block); the
forward also writes c = a . u per row (xc_BHT1, fp32, lse's layout), the backward's residual. The backward
(`attention_bwd._xsa_units`, side work between the attention's steps) turns dO into da = dO - (dO . u) u in SBUF
before the attention's backward reads it and adds XSA's share of dv; the attention's rowsum(da a) is rowsum(dO o) of
XSA's output and cotangent (both orthogonal to u, reference.xsa_bwd), so it is made as without XSA. Extra HBM
traffic: xc out and in (4 B per row and head); u comes from the v tiles already on chip.

The fused forward (`_fwd_bounded`), with a per-head shift instead of the running row max. QK-norm
bounds every score: ||rope(rms_norm(x))|| <= sqrt(K) (RoPE is a rotation), so |scale q.k| <= B_h =
sqrt(K) |g_h| (1 + 2^-5) (the margin covers the roundings of the normed rows, of cos / sin and of the
gain to the input dtype: together below 2^-6). The softmax is shift-invariant, so p = exp(scale s - m_h)
with the constant m_h = B_h - SHIFT_OFFSET (35) gives the same o and lse = m_h + log l as the row-max
shift, exactly in real arithmetic. The row sum l then lies in [e^(35 - 2 B_h), T e^35]: ScalarE's log
is documented for inputs in [2^-64, 2^64] = e^+-44.36 (nki.api.shared.rst, Supported Activation
Functions; the emulator's rule activation.input_range), which holds for T <= 4096 and B_h <= 39
(frontier_jax.ops.SHIFT_MAX_T / SHIFT_LIMIT, checked there: gains |g| <= 4.73 at K = 64); every p <= e^35
(o' <= T e^35 max|v|: no fp32 overflow), and each row's largest term >= e^-43, so the terms within e^-17
of it (all that an fp32 sum of the row keeps) stay normal floats (fp32 and bf16: normal down to e^-87.3).
A longer sequence or a larger gain runs the exact-max forward (`_fwd`, exact_max=True; the trainer picks it on the host
before the step, from the gains). Without a row max
the scores are only ever needed key-major: per (batch, kv head) k^T [K, T] (built once, reused by the R
query heads) and [v | 1] tiles; per query head q^T [K, T] (normed, rotated, transposed once); per chunk
of 512 queries (one fp32 PSUM bank) and 128-key tile j up to the chunk's end: s^T = k_j q^T (stationary
k^T [K, 128], moving q^T [K, <= 512] from query max(chunk start, 128 j): blocks above the diagonal are
never issued; a 64-row tile), p^T = exp(scale s^T - m_h) by one ScalarE instruction straight out of PSUM
(the shift is its bias; the diagonal block's s^T gets NEG above the diagonal first, by a 0/1-stationary
matmul against the key-major causal bias, so that p^T = 0 there), and o'_i
+= p^T_i [v_j | 1] for each query tile i of the chunk (stationary p^T [keys, 128 queries], moving [v | 1]
[keys, K + 1]), all accumulating in one PSUM bank across the whole key range (no rescaling: the shift
never changes). Out: o = o' / l, lse = m_h + log l. Every TensorE instruction is useful work except the
transposes (q^T / k^T, and o's and lse's to their DMA layouts below).

The exact-max forward (`_fwd`: the plain kernel's, and the fused one's fallback), per (batch, kv head):
 k as 128-key row tiles, k^T [K, T] (transposed once per kv head and
reused by its R query heads), v as [keys, K + 1] tiles with a ones column. Per query head and 128-query
tile (the last ragged, sliced): q^T by one transpose; keys 0 .. t0+rows only, in chunks of 512 (one fp32
PSUM bank of scores): blocks above the diagonal are never issued. Per chunk (`_fwd_chunk`): s = q k^T
query-major (stationary q^T [K, rows], moving k^T [K, 512]), its diagonal block masked by one more
matmul into its PSUM scores (identity stationary, is_stationary_onezero, against a [128, 128] 0/-1e30
bias built once per call by GpSimd affine_select); the exact running row max m on VectorE from PSUM;
then per 128-key block p^T directly in key-major layout: s^T = k q^T again (a second row-tiled matmul,
named "recompute": the emulator counts it not useful) plus -m as one K = 1 matmul accumulated into the
same PSUM tile (ones stationary, -m as a [1, rows] row: the [rows, 1] column, rounded to the input
dtype, transposed once per chunk), ScalarE exp(scale (s - m)) straight out of PSUM, the diagonal
block's p^T zeroed above the diagonal by GpSimd affine_select; o' += p [v | 1] (stationary p^T [keys,
rows], moving [v | 1] [keys, K + 1]) in PSUM, whose last column is the row sum l. A later chunk
rescales the fp32 SBUF accumulator by exp(scale (m_old - m_new)) (one instruction for o and l). No p^T
transposes, nor their PSUM copies on the ScalarE / VectorE that bound the kernel: the recomputed s^T
and the shift cost TensorE, which has room. Out: o = o' / l (input dtype), lse = scale m + log l [B, H,
T, 1] fp32 (the backward's residual); the T x T scores never leave PSUM/SBUF.

Backward, per (batch, kv head), recomputing p = exp(scale s - lse) chunk by chunk (no max, no sum),
the diagonal block's scores masked as in the forward (NEG added by the 0/1-stationary matmul: the exp
gives p = 0 above the diagonal): dp = dO v^T (stationary dO^T, moving v^T); ds = p (dp - Di), Di =
rowsum(dO o) per query: dp - Di leaves PSUM on ScalarE (its bias) and the product with p runs on GpSimd
(both in SBUF; VectorE shares GpSimd's SBUF port and ScalarE's PSUM port); dv += p^T dO and dk += ds^T q
contract over the query rows (stationary p / ds, moving dO / q) and accumulate in PSUM across all R
query heads and query tiles of the kv head (T K / 65536 banks each); dq += ds k needs ds^T (a
transpose). dq and dk take the
1/sqrt(K) scale when leaving PSUM. The fused backward loads q^T / k^T saved by the forward (qgT, krT)
instead of transposing the rows again; a chunk's ds^T blocks leave PSUM together (one copy when every
block is full) on ScalarE, and its dq matmuls issue a step later (`bwd_heads`).

TensorE: a contraction over K = 64 runs in row tiling mode on the 64-row half of the PE array whose
partitions hold its operands, so that matmuls on the two halves run in parallel (nki/api/nki/isa/__init__.py
nc_matmul, "Tiling mode": 2 x 64-row tiles on NeuronCore-v2; a row tile multiplies its own partitions: rule
strict.row_tile_partitions of kernels_nki.emulator.rules): dO v^T of a kv head's two query heads, whose dO^T
are stacked on the two halves (v^T on both). q k^T, whose q^T and k^T sit on partitions 0 .. 63 only, runs
on the whole array. Every transpose is `kernels_nki.tiles.transpose`: two <= 64-row
halves on the two row tiles, a [128, 128] transpose streaming 64 identity columns per tile, not 128
(a [rows, K <= 64] tile on two 64 x 64 tiles: column tiling, the same "Tiling mode"). At K = 64 two heads'
transposes share one PSUM tile (the second on the column tile at 64: PE column c writes PSUM partition c)
and one copy out of it (`tiles.stacked_transpose`; `perm_rows` for the forward's o, the backward's dO^T of a
kv head's two query heads, whose dp matmul runs on the row tile of their half, v^T on both halves).

DMA layout (kernels_nki/attention_layout.py, `seq_dma`): every [B, T, X, K] operand and output moves whole
sequences, one DMA per tensor and sequence for every head at once (one more for a ragged last 128-row tile),
into or out of an SBUF tile [128, (T / 128) X K] whose 128-row block i, head x is a [128, K] view (`block`).
Two row orders: natural (partition p of block i holds row 128 i + p; a buffer is one row's X K contiguous
elements) for the tensors the causal blocking reads or makes row by row: v in the forward, the backward's q,
k and inverse RMS and its gradients dq, dk, dv (stored as made, from natural rows: their stores are the
only buffers under 2 KiB a partition the backward adds, 1 KiB for dq and 512 B for dk / dv at the model's
shape, in place of two TensorE transposes per block and head and their PSUM copies on the ScalarE that
bounds the backward); consecutive (`perm`: with n = T // 128, partition p holds rows p n .. p n + n - 1,
one contiguous run of n X K elements, block i < n its rows p n + i) for the forward's q and k and the saved
rows (qg, qinv, kr, kinv), and the backward's v, dO and o (v^T and dO^T are read; dO's rows are dO^T
transposed back, `rows_from_transpose`; o only for -Di = -rowsum(dO o), whose [rows, 1] columns reach
natural order like lse's, `neg_rowdot`): their work is row by row (QK-norm, RoPE with cos / sin loaded in the same
layout, the gain), and their transposes q^T / k^T, the only consumers in natural order, land in natural
order through a stride-n free-axis SBUF destination (`natural_cols`). The forward's o leaves in the
consecutive layout too: each head's natural 128-row blocks go through its natural [K, T] transpose and back
per block from the stride-n columns (`perm_rows`, two TensorE transposes per block). The transposed residuals
qgT / krT
([K, T] per head, T contiguous elements per partition) move by one DMA per (sequence, head); the backward
makes its qg / kr rows from them by TensorE transposes (`rows_from_transpose`) and never reads qg_BTHK /
kr_BTGK. lse [B, H, T,
1] moves as one sequence's [H, T] rows (T contiguous fp32 per partition): the forward's [rows, 1] columns
(all heads of a query tile side by side) become rows by one fp32 TensorE transpose per query tile
(`lse_store`), the backward's columns come back the same way (`neg_lse_load`). The query gains arrive once
per call ([128, H]), cos / sin once per call per layout (`rope_tiles`), dg once per sequence ([1, H]).

Instruction order: each engine issues its stream in order, and the compiler may reorder independent
instructions (aws-neuron-sdk nki/get-started/nki-language-guide.rst) by rules AWS does not publish, so the
kernels write an order that overlaps the engines by itself, interleaving independent chains: per kv head the (chunk, key tile) steps of the bounded forward and the (query tile, key
chunk) steps of the backward run two steps (backward: one, its dq matmuls a step later) apart
(`pipelined`) and alternate between the R query heads, with the next kv head's prep (k^T, [v | 1], q^T; in a
sequence's last kv head the next sequence's loads and its first kv head's prep) as side work between them;
the row-wise prep (`prep_tile`) and its gradient (`prep_grad`) issue each step for every tile of a head
before the next step. The backward runs as jobs, one per (sequence, kv head), whose set-up (loads, rows and
transposes) and tail (`prep_grad`, the gain's gradient, stores) are side work spread between the
neighbouring job's steps (kernels_nki/attention_bwd.py).
"""


import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.attention_bwd import bwd
from kernels_nki.attention_layout import block, lse_store, natural_cols, perm_rows, seq_dma, seq_tile
from kernels_nki.attention_parts import (
    causal_bias, dims, gain_column, gain_tile, half_matmul, kv_head, kv_head_saved, prep_head, rope_tiles,
    saved_outputs, v_aug, xsa_out, xsa_units)
from kernels_nki.attention_steps import KC, bounded_heads, scores
from kernels_nki.tiles import cdiv, identity, transpose

SHIFT_OFFSET = 35.0  # the bounded forward's shift m_h = B_h - SHIFT_OFFSET (module docstring)
BOUND_MARGIN = 1.0 + 2.0 ** -5  # B_h = sqrt(K) |g_h| BOUND_MARGIN


def _fwd_chunk(qT, kT, vs, t0, rows, c0, kc, bias, scale, state, last, dt):
    """One key chunk of the online softmax (the module docstring, Forward); state = (-m, acc), () for the
    first chunk -> the new state: -m the fp32 value of the shift in use (minus the running row max of the
    raw scores, rounded to dt); acc = p [v | 1] so far, the PSUM tile itself when the first chunk is also
    the `last`, else an fp32 SBUF accumulator. (An empty tuple, not None: NKI 0.3 rejects `is`.)"""
    K = qT.shape[0]
    P = nl.tile_size.pmax
    ident = bias[0]
    s_ps = scores(qT, kT, t0, rows, c0, kc, bias, True)
    m_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m_P1[0:rows], op=nl.maximum, data=s_ps[0:rows, 0:kc], axis=1, keepdims=True)
    if state:
        nisa.tensor_tensor(dst=m_P1[0:rows], data1=m_P1[0:rows], data2=state[0][0:rows], op=nl.maximum,
                           engine=nisa.engine.gpsimd)
    negm = nl.ndarray((P, 1), dtype=dt, buffer=nl.sbuf)  # -m rounded to dt: the shift the matmul adds
    nisa.activation(dst=negm[0:rows], op=nl.copy, data=m_P1[0:rows], scale=-1.0)
    negm_f = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=negm_f[0:rows], src=negm[0:rows], engine=nisa.engine.gpsimd)
    negm_row = nl.ndarray((1, P), dtype=dt, buffer=nl.sbuf)
    transpose(negm_row[0:1, 0:rows], negm[0:rows], rows, 1, ident)
    ones_row = bias[2]  # [0:1] of the [128, 128] ones tile: the K = 1 stationary
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
    negm_old, acc = state
    # corr = exp(scale (m_old - m_new)); acc = acc corr + o'
    b_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=b_P1[0:rows], data=negm_f[0:rows], op0=nl.multiply, operand0=scale)
    corr_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=corr_P1[0:rows], op=nl.exp, data=negm_old[0:rows], bias=b_P1[0:rows], scale=-scale)
    nisa.scalar_tensor_tensor(dst=acc[0:rows], data=acc[0:rows], op0=nl.multiply, operand0=corr_P1[0:rows],
                              op1=nl.add, operand1=o_ps[0:rows, 0:K + 1])
    return negm_f, acc


def _fwd(q_BTHK, k_BTGK, v_BTGK, rope, xsa=False):
    """The forward of both kernels; rope: () or (cos_TK2, sin_TK2, g_PH) for QK-norm + RoPE + gain, which
    also writes the normed, rotated q / k and their inverse RMS (`saved_outputs`) for the backward; xsa: the XSA
    epilogue on each query tile's o (`xsa_out`), which also writes the rows' o . u (`xsa_c`)."""
    B, T, H, K, G, R, P, dt, scale = dims(q_BTHK, k_BTGK)
    o_BTHK = nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm)
    lse_BHT1 = nl.ndarray((B, H, T, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    saved = saved_outputs(B, T, H, G, K, dt) if rope else ()
    xc_BHT1 = xsa_c(B, H, T) if xsa else None
    bias = causal_bias(dt)
    ident32 = identity(nl.float32)
    tables = rope_tiles(rope[0], rope[1], perm=True) if rope else ()
    g_sb = gain_tile(rope[2]) if rope else None
    for b in range(B):
        q_sb, k_sb = seq_tile(q_BTHK, dt, b, perm=True), seq_tile(k_BTGK, dt, b, perm=True)
        v_sb = seq_tile(v_BTGK, dt, b)
        o_sb, lse_sb = seq_tile(o_BTHK, dt), nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf)
        c_sb = nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf) if xsa else None
        outs = _saved_tiles(saved, dt)
        for g in range(G):
            u = xsa_units(v_sb, G, g, T)[0] if xsa else None
            if rope:
                k_tiles, kT = kv_head_saved(k_sb, G, g, T, dt, bias[0], tables, (outs[2], outs[3]), saved[5], b,
                                            perm=True)
            else:
                k_tiles, kT, _ = kv_head(k_sb, G, g, T, dt, bias[0], perm=True)
            vs = v_aug(v_sb, G, g, T, dt)
            for r in range(R):
                h = g * R + r
                gain = gain_column(g_sb, h, K) if rope else ()
                qT_h = nl.ndarray((K, T), dtype=dt, buffer=nl.sbuf)
                o_nat = nl.ndarray((P, cdiv(T, P) * K), dtype=dt, buffer=nl.sbuf)  # o in natural blocks
                ys = (prep_head(q_sb, H, h, T, tables, gain, outs, dt) if rope else
                      [block(q_sb, i, h, H, K) for i in range(cdiv(T, P))])
                for i in range(cdiv(T, P)):
                    rows = min(P, T - i * P)
                    transpose(natural_cols(qT_h, i, T, True), ys[i][0:rows], rows, K, bias[0], on_vector=not rope)
                for i in range(cdiv(T, P)):
                    t0 = i * P
                    rows = min(P, T - t0)
                    qT = qT_h[0:K, t0:t0 + rows]
                    state = ()
                    chunks = cdiv(t0 + rows, KC)
                    for c in range(chunks):
                        c0 = c * KC
                        state = _fwd_chunk(qT, kT, vs, t0, rows, c0, min(KC, t0 + rows - c0), bias, scale,
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
                perm_rows(o_sb, H, (h,), (o_nat,), T, bias[0], dt)
                if rope:
                    nisa.dma_copy(dst=saved[4][b, h], src=qT_h)
        _store_seq(o_BTHK, lse_BHT1, saved, o_sb, lse_sb, outs, b, ident32, o_perm=True)
        if xsa:
            lse_store(xc_BHT1, b, c_sb, ident32)
    return (o_BTHK, lse_BHT1) + saved + ((xc_BHT1,) if xsa else ())


def xsa_c(B, H, T):
    """The XSA forward's extra output xc_BHT1 (fp32): each row's o . u (o: the attention's output before XSA, u its
    kv head's unit value vector), in lse's layout; the backward's residual (`xsa_out`, attention_bwd.py)."""
    return nl.ndarray((B, H, T, 1), dtype=nl.float32, buffer=nl.shared_hbm)


def _saved_tiles(saved, dt):
    """The SBUF `seq_tile`s of one batch of the fused forward's row outputs (qg, qinv, kr, kinv), () without."""
    if not saved:
        return ()
    return (seq_tile(saved[0], dt), seq_tile(saved[1], nl.float32), seq_tile(saved[2], dt),
            seq_tile(saved[3], nl.float32))


def _store_seq(o_BTHK, lse_BHT1, saved, o_sb, lse_sb, outs, b, ident32, o_perm=False):
    """One batch's forward outputs to HBM: o (in the `perm` layout with o_perm), lse and the saved rows, one DMA
    each (`seq_dma`, `lse_store`)."""
    seq_dma(o_sb, o_BTHK, b, False, o_perm)
    lse_store(lse_BHT1, b, lse_sb, ident32)
    for sb, dst in zip(outs, saved[0:4]):
        seq_dma(sb, dst, b, False, perm=True)


@nki.jit
def attention_fwd(q_BTHK, k_BTGK, v_BTGK):
    """(o_BTHK in q's dtype, lse_BHT1 fp32): causal GQA attention and the log-sum-exp of each row."""
    return _fwd(q_BTHK, k_BTGK, v_BTGK, ())


def _neg_shift(g_P1):
    """-m_h = SHIFT_OFFSET - sqrt(K) |g_h| BOUND_MARGIN as an fp32 [P, 1] column (module docstring), from the
    head's `gain_column` (g_h sqrt(K)): the bias of the bounded forward's exp (every partition, i.e. key)."""
    P = nl.tile_size.pmax
    n_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=n_P1, data=g_P1, op0=nl.abs, operand0=0.0, op1=nl.multiply, operand1=-BOUND_MARGIN)
    nisa.tensor_scalar(dst=n_P1, data=n_P1, op0=nl.add, operand0=SHIFT_OFFSET)
    return n_P1


def _fwd_bounded(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, xsa=False):
    """The fused forward with the per-head bounded shift (module docstring); same outputs as `_fwd`."""
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
    negms = [_neg_shift(gain[0]) for gain in gains]
    maskT = causal_bias(dt, key_major=True)[1]
    def load(b):  # one sequence's SBUF tiles: q, k, v loaded, o, lse and the saved rows to fill
        return {"b": b, "q": seq_tile(q_BTHK, dt, b, perm=True), "k": seq_tile(k_BTGK, dt, b, perm=True),
                "v": seq_tile(v_BTGK, dt, b), "o": seq_tile(o_BTHK, dt),
                "lse": nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf),
                "c": nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf) if xsa else None,
                "outs": _saved_tiles(saved, dt)}

    def prep(sq, g):  # units making kv head g's k^T, [v | 1] tiles and its query heads' q^T into res
        res = {"qTs": [nl.ndarray((K, T), dtype=dt, buffer=nl.sbuf) for _ in range(R)]}
        b, outs = sq["b"], sq["outs"]

        def kside():
            res["kT"] = kv_head_saved(sq["k"], G, g, T, dt, ident, tables, (outs[2], outs[3]), saved[5], b,
                                      perm=True)[1]
            res["vs"] = v_aug(sq["v"], G, g, T, dt)

        def xside():  # XSA's unit values u: staged, their stages units of their own
            res["u"] = xsa_units(sq["v"], G, g, T, xs.append)[0]

        def qside(r):
            h = g * R + r
            ys = prep_head(sq["q"], H, h, T, tables, gains[h], outs, dt)
            for i in range(cdiv(T, P)):
                rows = min(P, T - i * P)
                transpose(natural_cols(res["qTs"][r], i, T, True), ys[i][0:rows], rows, K, ident, on_vector=False)
            nisa.dma_copy(dst=saved[4][b, h], src=res["qTs"][r])

        xs = []
        if xsa:
            xside()
        return res, [kside] + xs + [lambda r=r: qside(r) for r in range(R)]

    cur = load(0)
    res, units = prep(cur, 0)
    for u in units:
        u()
    for b in range(B):
        nseq = None
        for g in range(G):  # the next kv head's (the next sequence's first) prep as side work
            if g + 1 < G:
                nxt, units = prep(cur, g + 1)
            elif b + 1 < B:
                nseq = load(b + 1)
                nxt, units = prep(nseq, 0)
            else:
                nxt, units = {}, []
            hs = [g * R + r for r in range(R)]
            bounded_heads(res["qTs"], res["kT"], res["vs"], [negms[h] for h in hs], (cur["o"], cur["lse"], H), hs,
                          scale, dt, ident, maskT, units, (res["u"], cur["c"]) if xsa else ())
            res = nxt
        _store_seq(o_BTHK, lse_BHT1, saved, cur["o"], cur["lse"], cur["outs"], b, ident32, o_perm=True)
        if xsa:
            lse_store(xc_BHT1, b, cur["c"], ident32)
        cur = nseq
    return (o_BTHK, lse_BHT1) + saved + ((xc_BHT1,) if xsa else ())


@nki.jit
def qk_attention_fwd(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, exact_max=False, xsa_on=False):
    """(o_BTHK, lse_BHT1, qg_BTHK, qinv_BTH1, kr_BTGK, kinv_BTG1, qgT_BHKT, krT_BGKT[, xc_BHT1]) of attention over
    rope(qk_norm(q)) * gain and rope(qk_norm(k)): q and k arrive raw (the projection's output); cos/sin [T,
    K/2] fp32 (values rounded to q's dtype by the caller, as the reference casts them), g_PH the query gain
    broadcast over 128 rows, fp32; qg / kr, the inverse RMS of each row and qg / kr transposed are the
    backward's residuals. exact_max (a
    compile-time constant): the running-row-max softmax (`_fwd`) instead of the bounded shift
    (`_fwd_bounded`, valid while every head's bound B_h <= frontier_jax.ops.SHIFT_LIMIT: ops chooses). xsa_on (a
    compile-time constant): o is XSA's output (reference.xsa: each head's own value's component removed, its kv
    head's), applied to each query tile's o as it leaves PSUM (the epilogue, `xsa_out`), and xc_BHT1, each row's
    o . u before it, is one more residual."""
    if exact_max:
        return _fwd(q_BTHK, k_BTGK, v_BTGK, (cos_TK2, sin_TK2, g_PH), xsa_on)
    return _fwd_bounded(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, xsa_on)


def _bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK, rope, xc_BHT1=None):
    """The backward of both kernels; rope: () or (cos_TK2, sin_TK2, g_PH, qg, qinv, kr, kinv, qgT, krT) (the
    fused forward's inputs and saved outputs); xc_BHT1: XSA's residual, None without XSA. -> (dq, dk, dv) and, with
    rope, dg_BH1 (kernels_nki/attention_bwd.py: the plan of its jobs)."""
    return bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK, rope, xc_BHT1)


@nki.jit
def attention_bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK):
    """(dq_BTHK, dk_BTGK, dv_BTGK) in the inputs' dtype; dk/dv summed over the R query heads of each kv head."""
    return _bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK, ())


@nki.jit
def qk_attention_bwd(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, g_PH, o_BTHK, lse_BHT1, qg_BTHK, qinv_BTH1,
                     kr_BTGK, kinv_BTG1, qgT_BHKT, krT_BGKT, xc_BHT1, do_BTHK, xsa_on=False):
    """(dq, dk, dv, dg_BH1): the gradients of qk_attention_fwd w.r.t. the raw q and k, v, and the query
    gain per (batch, head), fp32 (the caller sums over the batch). xsa_on (a compile-time constant): o is XSA's
    output and do its cotangent, xc_BHT1 the forward's o . u (None without XSA)."""
    return _bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK,
                (cos_TK2, sin_TK2, g_PH, qg_BTHK, qinv_BTH1, kr_BTGK, kinv_BTG1, qgT_BHKT, krT_BGKT),
                xc_BHT1 if xsa_on else None)
