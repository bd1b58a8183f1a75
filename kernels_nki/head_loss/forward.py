"""head_loss_fwd: the tied output head, softcap and fp32 cross-entropy per token, with the optional sparse bias
(spec `frontier_jax.ops.reference.head_loss_fwd`). Layout, engines and the log-sum-exp shift:
docs/kernels/head_loss.md."""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.head_loss.bias import bias_stats, sources
from kernels_nki.head_loss.chunks import VC, column, emb_tiles, tanh_chunk, token_columns, x_T
from kernels_nki.head_loss.state import FwdGroup, FwdTile
from kernels_nki.packing import groups, load, rows_per_partition, store, tile
from kernels_nki.tiles import identity, pipeline, row_tiles

LOG_MAX = 2.0 ** 64  # log's valid input range on ScalarE is [2^-64, 2^64] (nki/api/nki.api.shared.rst)
E = 2.718281828459045


def fixed_shift(V, S, softcap):
    """True when exp(l) needs no max shift: |l| <= softcap off the bias ids, so with a shift m >= 0 the sum
    of exp(l - m) lies in [2^-64, 2^64], log's valid range, whenever (V + S) e^softcap <= 2^64 (and V > S)."""
    return (V + S) * E ** softcap <= LOG_MAX and V > S


def _shift(t_PV, L, rows, V, S, softcap, fixed):
    """The log-sum-exp's shift m [P, 1] (called when S > 0 or the fixed shift is out of range; else m = 0):
    max(0, max_s L_s) with a bias, max(softcap max t, max_s L_s) when the fixed shift is out of range; both are
    logits (or 0 <= a logit bound), so the shifted sum stays inside log's range."""
    P = nl.tile_size.pmax
    m = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    if S:
        nisa.tensor_reduce(dst=m[0:rows], op=nl.maximum, data=L[0:rows], axis=1, keepdims=True)
        if fixed:
            nisa.tensor_scalar(dst=m[0:rows], data=m[0:rows], op0=nl.maximum, operand0=0.0)
    if not fixed:
        mt = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mt[0:rows], op=nl.maximum, data=t_PV[0:rows, 0:V], axis=1, keepdims=True)
        if S:
            nisa.scalar_tensor_tensor(dst=m[0:rows], data=mt[0:rows], op0=nl.multiply, operand0=softcap,
                                      op1=nl.maximum, operand1=m[0:rows])
        else:
            nisa.tensor_scalar(dst=m[0:rows], data=mt[0:rows], op0=nl.multiply, operand0=softcap)
    return m


def _loss(tl, bias_vals_NS, V, S, softcap, fixed, loss_N1, lse_N1):
    """The loss stage of row tile `tl` (a FwdTile with t): the gathers, the shifted log-sum-exp with the sparse
    bias, loss and lse into column j of the group's [P, R] tiles, stored after the group's last row tile."""
    P = nl.tile_size.pmax
    g, j, grp, t_PV = tl.g, tl.j, tl.group, tl.t_PV
    _, rows, nr = g  # rows: the tokens of each row tile (partitions), nr: the group's row tiles
    cols, idx = grp.cols[0:rows, j], grp.idx[0:rows, j]
    # t at the target (and the bias ids): one GpSimd gather per tile
    tg = nl.ndarray((P, 1 + S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_n_gather(dst=tg[0:rows], data=t_PV[0:rows], indices=idx[0:rows])
    shifted = S > 0 or not fixed
    L, rmult, b_tgt = bias_stats(cols, column(bias_vals_NS, g, j), tg, rows, S, softcap) if S else (None, None, None)
    neg_m = None
    if shifted:
        m = _shift(t_PV, L, rows, V, S, softcap, fixed)
        neg_m = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_m[0:rows], data=m[0:rows], op0=nl.multiply, operand0=-1.0)
    # sum of exp(softcap t - m) over the vocabulary: one ScalarE pass (in place; t is not read again)
    se = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=t_PV[0:rows], op=nl.exp, data=t_PV[0:rows], scale=softcap,
                           bias=neg_m[0:rows] if shifted else None, reduce_op=nl.add, reduce_res=se[0:rows])
    if S:  # the bias ids: + (exp(L_s - m) - exp(softcap t_s - m)) / mult_s per source (each id once)
        e1 = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
        e0 = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e1[0:rows], op=nl.exp, data=L[0:rows], bias=neg_m[0:rows])
        nisa.activation(dst=e0[0:rows], op=nl.exp, data=tg[0:rows, 1:1 + S], scale=softcap, bias=neg_m[0:rows])
        nisa.tensor_tensor(dst=e1[0:rows], data1=e1[0:rows], data2=e0[0:rows], op=nl.subtract)
        nisa.tensor_tensor(dst=e1[0:rows], data1=e1[0:rows], data2=rmult[0:rows], op=nl.multiply)
        corr = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=corr[0:rows], op=nl.add, data=e1[0:rows], axis=1, keepdims=True)
        nisa.tensor_tensor(dst=se[0:rows], data1=se[0:rows], data2=corr[0:rows], op=nl.add)
    lse_P1, loss_P1 = grp.lse[0:rows, j:j + 1], grp.loss[0:rows, j:j + 1]
    nisa.activation(dst=lse_P1, op=nl.log, data=se[0:rows])
    if shifted:
        nisa.tensor_tensor(dst=lse_P1, data1=lse_P1, data2=m[0:rows], op=nl.add)
    # loss = lse - (softcap t_target + bias on the target)
    nisa.scalar_tensor_tensor(dst=loss_P1, data=tg[0:rows, 0:1], op0=nl.multiply, operand0=-softcap,
                              op1=nl.add, operand1=lse_P1)
    if S:
        nisa.tensor_tensor(dst=loss_P1, data1=loss_P1, data2=b_tgt[0:rows], op=nl.subtract)
    if j == nr - 1:
        store(loss_N1, g, grp.loss)
        store(lse_N1, g, grp.lse)


@nki.jit
def head_loss_fwd(x_ND, emb_VD, targets_N1, bias_ids_NS=None, bias_vals_NS=None, softcap=30.0):
    """Per-token loss of softcapped tied logits: l = softcap tanh(x emb^T / softcap) (+ the sparse bias),
    loss = logsumexp(l) - l[target].

    Dimensions: N tokens, D width, V vocabulary, S bias sources.
    Args: x_ND [N, D] (bf16 or fp32); emb_VD [V, D] (x's dtype); targets_N1 int32 [N, 1]; bias_ids_NS int32 and
      bias_vals_NS fp32 [N, S >= 1], or None for both: no bias; softcap (compile-time).
    Returns: (loss_N1, lse_N1) fp32 [N, 1] (the log-sum-exp is the backward's residual).
    Notes: row tiles in packed row groups of R rows per partition; per row tile, as a stage table
      (`tiles.pipeline`, step s runs each row's stage on row tile s - offset):
        offset 1  tanh(s - 1): t = tanh(x emb^T / softcap) [P, V], per 512-vocabulary chunk D/128 matmuls
                  into one PSUM bank, tanh out of it on ScalarE
        offset 0  xT(s): the group's DMAs at its first row tile, x^T by TensorE transposes (out by VectorE)
        offset 2  loss(s - 2): gathers at the target and ids, sum of exp, log, loss and lse
      docs/kernels/head_loss.md explains the layout, the engines and the shift."""
    N, D = x_ND.shape
    V = emb_VD.shape[0]
    S = sources(bias_ids_NS, bias_vals_NS)
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    fixed = fixed_shift(V, S, softcap)
    loss_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    lse_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    ident = identity(dt)
    _, embT = emb_tiles(emb_VD, ident)
    R = rows_per_partition(D, cap=16)
    order = []  # (g, j): row tile j of group g holds rows r0 + p R + j
    for g in groups(N, R):
        _, _, nr = g
        order.extend([(g, j) for j in range(nr)])
    made, tanhs, current = [], [], {}

    def xT(i):
        g, j = order[i]
        _, parts, _ = g
        if j == 0:
            x = load(x_ND, g, dt, R)
            cols, idx = token_columns(targets_N1, bias_ids_NS, g, S, R)
            loss_PR = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
            lse_PR = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
            current["group"] = FwdGroup(x=x, cols=cols, idx=idx, loss=loss_PR, lse=lse_PR)
        grp = current["group"]
        made.append(FwdTile(g=g, j=j, group=grp, xT=x_T(tile(grp.x, g, j, D), parts, ident, True)))

    def tanh(i):
        tl = made.pop(0)
        _, parts, _ = tl.g
        tl.t_PV = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
        for _, c0, vc in row_tiles(V, VC):
            tanh_chunk(tl.t_PV, tl.xT, embT, c0, vc, parts, D, softcap)
        tanhs.append(tl)

    def loss(i):
        _loss(tanhs.pop(0), bias_vals_NS, V, S, softcap, fixed, loss_N1, lse_N1)

    pipeline(len(order), [(1, tanh), (0, xT), (2, loss)])
    return loss_N1, lse_N1
