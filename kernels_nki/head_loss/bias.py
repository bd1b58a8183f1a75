"""The sparse n-gram bias of the head_loss kernels (a kernel-helper file: no @nki.jit): the number of sources,
the per-source statistics at the biased ids, the backward's corrections and d bias_vals. The method and its
precision: docs/kernels/head_loss.md, "The sparse bias"."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import row_tile_ap


def sources(bias_ids_NS, bias_vals_NS):
    """S, the bias sources: 0 when the caller passes None for both (no zero-size tensor reaches a kernel: no
    AWS document defines one). `== None` replaces `is None` (aws-neuron-sdk nki/migration/index.rst, "Replace is
    / is not"; NkiTensor defines no `__eq__`, nki/api/nki/language/__init__.py; AWS nki-library tests optional
    tensors the same way, nkilib/experimental/conv/conv1d.py `bias != None`)."""
    if bias_ids_NS == None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        assert bias_vals_NS == None, "bias_ids_NS and bias_vals_NS are both None or both [N, S]"  # noqa: E711
        return 0
    assert bias_ids_NS.shape == bias_vals_NS.shape and bias_ids_NS.shape[1] > 0
    return bias_ids_NS.shape[1]


def bias_stats(cols, vals_PS, tg, rows, S, softcap):
    """The bias at the biased ids of one row tile.

    Dimensions: P partitions (tokens), S bias sources.
    Args: cols [P, 1 + S] fp32 target and ids; vals_PS [P, S] fp32 values; tg [P, 1 + S] fp32 t gathered at
      (target, ids).
    Returns: (L, rmult, b_tgt): L [P, S] the biased logit at id_s, softcap t[id_s] + B_s (B_s the summed values
      of the sources naming id_s); rmult [P, S] 1 / (how many sources name id_s); b_tgt [P, 1] the bias on the
      target. VectorE: S compares of [P, S] rows."""
    P = nl.tile_size.pmax
    ids = cols[0:rows, 1:1 + S]
    same = nl.ndarray((P, S, S), dtype=nl.float32, buffer=nl.sbuf)
    summed = nl.ndarray((P, S, S), dtype=nl.float32, buffer=nl.sbuf)
    for s in range(S):
        nisa.tensor_scalar(dst=same[0:rows, s], data=ids, op0=nl.equal, operand0=cols[0:rows, 1 + s:2 + s])
        nisa.scalar_tensor_tensor(dst=summed[0:rows, s], data=ids, op0=nl.equal, operand0=cols[0:rows, 1 + s:2 + s],
                                  op1=nl.multiply, operand1=vals_PS[0:rows])
    B = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    mult = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=B[0:rows], op=nl.add, data=summed[0:rows], axis=2)
    nisa.tensor_reduce(dst=mult[0:rows], op=nl.add, data=same[0:rows], axis=2)
    L = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=L[0:rows], data=tg[0:rows, 1:1 + S], op0=nl.multiply, operand0=softcap,
                              op1=nl.add, operand1=B[0:rows])
    hit = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=hit[0:rows], data=ids, op0=nl.equal, operand0=cols[0:rows, 0:1], op1=nl.multiply,
                              operand1=vals_PS[0:rows])
    b_tgt = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=b_tgt[0:rows], op=nl.add, data=hit[0:rows], axis=1, keepdims=True)
    rmult = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rmult[0:rows], data=mult[0:rows])
    return L, rmult, b_tgt


def bias_grad(cols, vals_PS, tg, neg_lse, g_P1, rows, S, softcap, dvals_NS, g, j):
    """The backward at the biased ids of row tile j of group g: stores d bias_vals = g (p[id_s] - [id_s ==
    target]) (p the biased softmax) into dvals_NS.

    Args: as `bias_stats`; neg_lse [P, 1] -lse; g_P1 [P, 1] the loss gradient.
    Returns: corr [P, S], what source s adds to r = (t^2 - 1) dl at id_s on top of the unbiased softmax:
      (t_s^2 - 1)(p[id_s] - exp(softcap t_s - lse)) / mult_s (a duplicated id gets its share once per source)."""
    P = nl.tile_size.pmax
    L, rmult, _ = bias_stats(cols, vals_PS, tg, rows, S, softcap)
    pb = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    p0 = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=pb[0:rows], op=nl.exp, data=L[0:rows], bias=neg_lse[0:rows])
    nisa.activation(dst=p0[0:rows], op=nl.exp, data=tg[0:rows, 1:1 + S], scale=softcap, bias=neg_lse[0:rows])
    dv = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=dv[0:rows], data=cols[0:rows, 1:1 + S], op0=nl.equal, operand0=cols[0:rows, 0:1],
                              op1=nl.subtract, operand1=pb[0:rows], reverse1=True)
    nisa.tensor_scalar(dst=dv[0:rows], data=dv[0:rows], op0=nl.multiply, operand0=g_P1[0:rows])
    nisa.dma_copy(dst=row_tile_ap(dvals_NS, g, j), src=dv[0:rows])
    corr = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=pb[0:rows], data1=pb[0:rows], data2=p0[0:rows], op=nl.subtract)
    nisa.tensor_tensor(dst=pb[0:rows], data1=pb[0:rows], data2=rmult[0:rows], op=nl.multiply)
    nisa.activation(dst=corr[0:rows], op=nl.square, data=tg[0:rows, 1:1 + S])
    nisa.scalar_tensor_tensor(dst=corr[0:rows], data=corr[0:rows], op0=nl.subtract, operand0=1.0, op1=nl.multiply,
                              operand1=pb[0:rows])
    return corr
