"""Tied output head + softcap + cross-entropy (per-token losses) as NKI kernels for trn1, fwd and bwd.

Spec: frontier_jax.ops.reference.head_loss: l = softcap * tanh(x emb^T / softcap) (+ an optional sparse
bias: one (token id, value) pair per position and source), loss = logsumexp(l) - l[target], fp32.

Layout: row tiles of 128 tokens on the partition axis, the vocabulary on the free axis. The token-major
operands move in packed row groups (`kernels_nki.packing`): R = 4096 / D rows per partition (8 at D = 512),
x (and dx) one DMA per group, the [N, 1] columns (targets, lse, dloss, loss out) one [128, R] DMA per group
(the bias ids [128, R, S]); row tile j of a group holds tokens r0 + p R + j. emb^T [D, V] is built once per call
by TensorE transposes and stays in SBUF; per chunk
of 512 vocabulary entries z = x emb^T is D/128 bf16 matmuls into one fp32 PSUM bank (stationary x^T
[D_k, tokens], moving emb^T [D_k, 512]) and ScalarE writes t = tanh(z / softcap) for the whole
vocabulary into one fp32 [P, V] SBUF tile. The [tokens, V] logits never reach HBM.

Forward, per tile: t at the target (and at the S bias ids) by one GpSimd `nc_n_gather` (per-partition
indices, SBUF only) instead of a masked pass over V; one ScalarE `activation_reduce` exp(softcap t - m)
with its row sum (softcap folded into the scale). No max pass: |l| <= softcap off the bias ids, so a
fixed shift keeps the sum inside log's valid range [2^-64, 2^64] whenever (V + S) e^softcap <= 2^64
(nki/api/nki.api.shared.rst, activation functions table; softcap 30 at V = 1024 qualifies): m = 0
without a bias, m = max(0, max_s L_s) with one (L_s the biased logit at id_s); beyond that range
m = the row's max logit (a VectorE max over t). The bias enters sparsely: per token and source, B_s
= the summed values of the sources naming id_s and mult_s = how many name it (S compares of [P, S]
rows, VectorE), and the sum gains sum_s (exp(L_s - m) - exp(softcap t_s - m)) / mult_s (each id
once). Precision of that correction: the unbiased sum carries the biased ids' terms before they are
replaced, so a bias of -b on the ids that hold most of the probability mass costs up to ~e^b ulps of
the sum (a test checks -6 on the leading logit against the dense fp32 reference).
Outputs: loss [N, 1] and lse [N, 1] (fp32; the lse is the backward's residual).

Backward (per tile, recomputing t): dl = exp(softcap t - lse) - onehot(target), dz = g (1 - t^2) dl:
exp and t^2 on ScalarE, the one-hot compare against an iota row on VectorE (`tensor_scalar`), p -
onehot on GpSimd, (t^2 - 1)(p - onehot) on VectorE (one two-input pass), -g r on ScalarE into the bf16
dz tile. With a bias, each source adds its sparse correction (t_s^2 - 1)(p_b - p_0) / mult_s at id_s
(a VectorE compare times the [P, 1] coefficient, a GpSimd add: 1N each per source) and d bias_vals =
g (p_b[id_s] - [id_s == target]) comes from the gathered values. dx = dz emb (dz^T by TensorE
transposes, a 512-entry chunk's four side by side in one PSUM bank, out of PSUM by one ScalarE copy per
chunk, as stationary; emb rows as moving; accumulated over the vocabulary in one PSUM bank); demb = dz^T x
contracts over the tokens of a block (DZ_BYTES of dz tiles, 2048 tokens at V = 1024) in PSUM, then one VectorE
add per block into fp32 SBUF accumulators.

x^T and dz^T are TensorE transposes, out of PSUM by VectorE (forward) / ScalarE (backward). The forward's
program order puts row tile t + 1's x^T before row tile t - 1's loss; the backward's runs row tile t's z = x
emb^T, row tile t - 3's dx out of PSUM, row tile t - 2's dz and dz^T, row tile t - 1's r = (t^2 - 1)
dl, row tile t - 2's dx matmuls, then row tile t's t = tanh(z / softcap), so that no engine's next instruction
waits on the one another engine has just been given (z and dz^T wait in Z_BANKS PSUM banks; a larger
vocabulary takes t at once and transposes dz with its dx matmuls) (each engine issues its stream in order:
trn1 arch guide nki/guides/architecture/trainium_inferentia2_arch.rst, "NeuronCore-v2 Compute Engines"; the
compiler may reorder independent instructions, nki/get-started/nki-language-guide.rst, by rules AWS does not
publish, so the order written overlaps the engines by itself). SBUF per partition: emb^T and emb rows 2 x V x D x 2 / 128 bytes, the demb accumulators V x D x 4
/ 128 (V=8192 needs D <= 256).

NeuronCore-v2 (trn1) rules this kernel follows (AWS docs, aws-neuron-sdk): PSUM is evacuated by
ScalarE `activation(op=nl.copy)` or VectorE, never ScalarE `tensor_copy` (unsupported on v2:
nki/api/nki/isa/__init__.py, tensor_copy) and never GpSimd (no PSUM access: isa docs tensor_copy,
nc_n_gather); TensorE transposes are matmuls against the identity into fp32 PSUM (isa docs
nc_matmul: a float32 dst on v2; `kernels_nki.tiles.transpose`), VectorE transposes are at most
32 x 32 (isa docs nc_transpose); `activation`'s bias is always an [N, 1] fp32 tile (v2 takes no
immediate bias: isa docs activation "Layout"); `tensor_scalar` operands are fp32 columns (ids and
targets cast on VectorE first: isa docs tensor_scalar); `nc_n_gather` indices are uint32 (isa docs
nc_n_gather); `tensor_tensor` runs on GpSimd when asked (isa docs tensor_tensor, `engine`); no
`nl.divide` (1 / mult by VectorE `reciprocal`); exp has no range limit and log's input is inside its
documented range (above); no `is` / `is not` in kernel code (NKI 0.3 compiler:
release-notes/components/nki.rst, 0.3.0 breaking changes).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import blocks, groups, load, row_tile_ap, rows_per_partition, store, tile
from kernels_nki.head_loss_parts import VC, Z_BANKS, bwd_dx, bwd_dz, bwd_r, demb_block, z_chunk
from kernels_nki.tiles import cdiv, identity, transpose

DZ_BYTES = 32 * 1024  # SBUF bytes per partition for one demb block's dz tiles (backward)
LOG_MAX = 2.0 ** 64  # log's valid input range on ScalarE is [2^-64, 2^64] (nki/api/nki.api.shared.rst)
E = 2.718281828459045


def _emb_tiles(emb_VD, ident):
    """emb as V/128 row tiles [v, D] and emb^T as D/128 tiles [d, V] (TensorE transposes against `ident`, the
    identity in emb's dtype, through fp32 PSUM: `tiles.transpose`; once per call)."""
    V, D = emb_VD.shape
    P = nl.tile_size.pmax
    dt = ident.dtype
    rows, embT = [], [nl.ndarray((P, V), dtype=dt, buffer=nl.sbuf) for _ in range(cdiv(D, P))]
    for v in range(cdiv(V, P)):
        vr = min(P, V - v * P)
        e_t = nl.ndarray((P, D), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=e_t[0:vr], src=emb_VD[v * P:v * P + vr])
        for k in range(cdiv(D, P)):
            dk = min(P, D - k * P)
            transpose(embT[k][0:dk, v * P:v * P + vr], e_t[0:vr, k * P:k * P + dk], vr, dk, ident)
        rows.append(e_t)
    return rows, embT


def _x_T(x_PD, rows, ident, copy_on_vector):
    """x_PD's D/128 tiles of x^T [d, rows] (x_PD a [rows, D] row tile): TensorE transposes against `ident`
    through fp32 PSUM (`tiles.transpose`), copied out of PSUM by VectorE (copy_on_vector) or ScalarE."""
    D = x_PD.shape[1]
    P = nl.tile_size.pmax
    xT = []
    for k in range(cdiv(D, P)):
        dk = min(P, D - k * P)
        tt = nl.ndarray((P, P), dtype=ident.dtype, buffer=nl.sbuf)
        transpose(tt[0:dk, 0:rows], x_PD[0:rows, k * P:k * P + dk], rows, dk, ident, on_vector=copy_on_vector)
        xT.append(tt)
    return xT


def _column(src_NC, g, j, dtype):
    """Row tile j of group g of an [N, C] HBM array as an fp32 SBUF tile [P, C] (cast on VectorE if needed)."""
    P = nl.tile_size.pmax
    C = src_NC.shape[1]
    raw = nl.ndarray((P, C), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=raw[0:g[1]], src=row_tile_ap(src_NC, g, j))
    if dtype == nl.float32:
        return raw
    out = nl.ndarray((P, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out[0:g[1]], src=raw[0:g[1]])
    return out


def _token_columns(targets_N1, ids_NS, g, S, R):
    """(cols [P, R, 1+S] fp32, idx [P, R, 1+S] uint32) of group g: per row tile j (cols[:, j]) the target then
    the S bias ids of each token, as fp32 (for `tensor_scalar` operands, which are fp32: isa docs
    tensor_scalar) and as uint32 gather indices (nc_n_gather's index dtype); int -> fp32 -> uint32 on VectorE,
    exact below 2^24. One DMA per operand and group."""
    P = nl.tile_size.pmax
    r0, p, nr = g
    raw = nl.ndarray((P, R, 1 + S), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=raw[0:p, 0:nr, 0:1], src=targets_N1.ap(pattern=[[nr, p], [1, nr], [1, 1]], offset=r0))
    if S:
        nisa.dma_copy(dst=raw[0:p, 0:nr, 1:1 + S], src=ids_NS.ap(pattern=[[nr * S, p], [S, nr], [1, S]], offset=r0 * S))
    cols = nl.ndarray((P, R, 1 + S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=cols[0:p, 0:nr], src=raw[0:p, 0:nr])
    idx = nl.ndarray((P, R, 1 + S), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=idx[0:p, 0:nr], src=raw[0:p, 0:nr])
    return cols, idx


def _tanh_chunk(t_PV, xT, embT, c0, vc, rows, D, softcap):
    """t_PV[:, c0:c0+vc] = tanh(x emb^T / softcap) for vocab c0:c0+vc (fp32): D/128 matmuls into one PSUM
    bank, tanh on ScalarE straight out of PSUM."""
    P = nl.tile_size.pmax
    z_ps = nl.ndarray((P, VC), dtype=nl.float32, buffer=nl.psum)
    for k in range(cdiv(D, P)):
        dk = min(P, D - k * P)
        nisa.nc_matmul(dst=z_ps[0:rows, 0:vc], stationary=xT[k][0:dk, 0:rows], moving=embT[k][0:dk, c0:c0 + vc])
    nisa.activation(dst=t_PV[0:rows, c0:c0 + vc], op=nl.tanh, data=z_ps[0:rows, 0:vc], scale=1.0 / softcap)


def _bias_stats(cols, vals_PS, tg, rows, S, softcap):
    """Per bias source s, fp32 [P, S]: B_s = the summed values of the sources naming id_s (duplicates add
    up), mult_s = how many sources name id_s, L_s = softcap t[id_s] + B_s (the biased logit at id_s);
    and b_tgt [P, 1], the bias on the target. tg [P, 1 + S]: t gathered at (target, ids)."""
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


def _fixed_shift(V, S, softcap):
    """True when exp(l) needs no max shift: |l| <= softcap off the bias ids, so with a shift m >= 0 the sum
    of exp(l - m) lies in [2^-64, 2^64], log's valid range, whenever (V + S) e^softcap <= 2^64 (and V > S)."""
    return (V + S) * E ** softcap <= LOG_MAX and V > S


def _iota(V):
    P = nl.tile_size.pmax
    iota_PV = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=iota_PV, pattern=[[1, V]], offset=0, channel_multiplier=0)
    return iota_PV


def _shift(t_PV, L, rows, V, S, softcap, fixed):
    """The shift m [P, 1] of the log-sum-exp, or None for none (m = 0): max(0, max_s L_s) with a bias,
    max(softcap max t, max_s L_s) when the fixed shift is out of range; both are logits (or 0 <= a
    logit bound), so the shifted sum stays inside log's range."""
    P = nl.tile_size.pmax
    if S == 0 and fixed:
        return None
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


def _fwd_loss(t_PV, cols, idx, g, j, out, bias_vals_NS, V, S, softcap, fixed, loss_N1, lse_N1):
    """The forward after t = tanh(z / softcap) of row tile j of group g: the gathers, the shifted log-sum-exp
    (with the sparse bias), loss and lse into column j of the group's [P, R] tiles `out`, stored after the
    group's last row tile."""
    P = nl.tile_size.pmax
    rows = g[1]
    # t at the target (and the bias ids): one GpSimd gather per tile
    tg = nl.ndarray((P, 1 + S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_n_gather(dst=tg[0:rows], data=t_PV[0:rows], indices=idx[0:rows])
    L, rmult, b_tgt = _bias_stats(cols, _column(bias_vals_NS, g, j, nl.float32), tg, rows, S, softcap) \
        if S else (None, None, None)
    m = _shift(t_PV, L, rows, V, S, softcap, fixed)
    negm = None
    if m != None:  # noqa: E711
        negm = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=negm[0:rows], data=m[0:rows], op0=nl.multiply, operand0=-1.0)
    # sum of exp(softcap t - m) over the vocabulary: one ScalarE pass (in place; t is not read again)
    se = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=t_PV[0:rows], op=nl.exp, data=t_PV[0:rows], scale=softcap,
                           bias=negm[0:rows] if m != None else None, reduce_op=nl.add,  # noqa: E711
                           reduce_res=se[0:rows])
    if S:  # the bias ids: + (exp(L_s - m) - exp(softcap t_s - m)) / mult_s per source (each id once)
        e1 = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
        e0 = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e1[0:rows], op=nl.exp, data=L[0:rows], bias=negm[0:rows])
        nisa.activation(dst=e0[0:rows], op=nl.exp, data=tg[0:rows, 1:1 + S], scale=softcap, bias=negm[0:rows])
        nisa.tensor_tensor(dst=e1[0:rows], data1=e1[0:rows], data2=e0[0:rows], op=nl.subtract)
        nisa.tensor_tensor(dst=e1[0:rows], data1=e1[0:rows], data2=rmult[0:rows], op=nl.multiply)
        corr = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=corr[0:rows], op=nl.add, data=e1[0:rows], axis=1, keepdims=True)
        nisa.tensor_tensor(dst=se[0:rows], data1=se[0:rows], data2=corr[0:rows], op=nl.add)
    loss_g, lse_g = out
    lse_P1, loss_P1 = lse_g[0:rows, j:j + 1], loss_g[0:rows, j:j + 1]
    nisa.activation(dst=lse_P1, op=nl.log, data=se[0:rows])
    if m != None:  # noqa: E711
        nisa.tensor_tensor(dst=lse_P1, data1=lse_P1, data2=m[0:rows], op=nl.add)
    # loss = lse - (softcap t_target + bias on the target)
    nisa.scalar_tensor_tensor(dst=loss_P1, data=tg[0:rows, 0:1], op0=nl.multiply, operand0=-softcap,
                              op1=nl.add, operand1=lse_P1)
    if S:
        nisa.tensor_tensor(dst=loss_P1, data1=loss_P1, data2=b_tgt[0:rows], op=nl.subtract)
    if j == g[2] - 1:
        store(loss_N1, g, loss_g)
        store(lse_N1, g, lse_g)


def _fwd_group(x_ND, targets_N1, bias_ids_NS, g, S, R, dt):
    """Group g's x tile, target (and id) columns and the [P, R] loss and lse tiles its row tiles fill."""
    P = nl.tile_size.pmax
    out = (nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf), nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf))
    return load(x_ND, g, dt, R), _token_columns(targets_N1, bias_ids_NS, g, S, R), out


@nki.jit
def head_loss_fwd(x_ND, emb_VD, targets_N1, bias_ids_NS=None, bias_vals_NS=None, softcap=30.0):
    """(loss_N1, lse_N1), fp32. bias_ids_NS int32 / bias_vals_NS fp32 [N, S >= 1], or None: no bias. Token tile
    t + 1's x^T comes before tile t - 1's loss in program order (an order that overlaps the engines without the
    compiler's reordering: module docstring)."""
    N, D = x_ND.shape
    V = emb_VD.shape[0]
    S = _sources(bias_ids_NS, bias_vals_NS)
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    fixed = _fixed_shift(V, S, softcap)
    loss_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    lse_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    ident = identity(dt)
    _, embT = _emb_tiles(emb_VD, ident)
    R = rows_per_partition(D, cap=16)
    tiles = [(g, j) for g in groups(N, R) for j in range(g[2])]  # row tile j of group g: rows r0 + p R + j
    grp = _fwd_group(x_ND, targets_N1, bias_ids_NS, tiles[0][0], S, R, dt)
    xT = _x_T(tile(grp[0], tiles[0][0], 0, D), tiles[0][0][1], ident, True)
    prev = None
    for t in range(len(tiles)):
        g, j = tiles[t]
        t_PV = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(cdiv(V, VC)):
            _tanh_chunk(t_PV, xT, embT, c * VC, min(VC, V - c * VC), g[1], D, softcap)
        cur = (t_PV, grp[1][0][0:g[1], j], grp[1][1][0:g[1], j], g, j, grp[2])
        if t + 1 < len(tiles):
            g1, j1 = tiles[t + 1]
            if j1 == 0:
                grp = _fwd_group(x_ND, targets_N1, bias_ids_NS, g1, S, R, dt)
            xT = _x_T(tile(grp[0], g1, j1, D), g1[1], ident, True)
        if prev != None:  # noqa: E711
            _fwd_loss(prev[0], prev[1], prev[2], prev[3], prev[4], prev[5], bias_vals_NS, V, S, softcap, fixed,
                      loss_N1, lse_N1)
        prev = cur
    _fwd_loss(prev[0], prev[1], prev[2], prev[3], prev[4], prev[5], bias_vals_NS, V, S, softcap, fixed, loss_N1, lse_N1)
    return loss_N1, lse_N1


def _bias_grad(cols, vals_PS, tg, neg_lse, g_P1, rows, S, softcap, dvals_NS, gj):
    """With a bias: stores d bias_vals = g (p[id_s] - [id_s == target]) (the biased softmax p), and
    returns corr [P, S], what each source adds to r = (t^2 - 1) dl at id_s on top of the unbiased
    softmax: (t_s^2 - 1)(p[id_s] - exp(softcap t_s - lse)) / mult_s (a duplicated id gets its share once
    per source naming it)."""
    P = nl.tile_size.pmax
    L, rmult, _ = _bias_stats(cols, vals_PS, tg, rows, S, softcap)
    pb = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    p0 = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=pb[0:rows], op=nl.exp, data=L[0:rows], bias=neg_lse[0:rows])
    nisa.activation(dst=p0[0:rows], op=nl.exp, data=tg[0:rows, 1:1 + S], scale=softcap, bias=neg_lse[0:rows])
    dv = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=dv[0:rows], data=cols[0:rows, 1:1 + S], op0=nl.equal, operand0=cols[0:rows, 0:1],
                              op1=nl.subtract, operand1=pb[0:rows], reverse1=True)
    nisa.tensor_scalar(dst=dv[0:rows], data=dv[0:rows], op0=nl.multiply, operand0=g_P1[0:rows])
    nisa.dma_copy(dst=row_tile_ap(dvals_NS, gj[0], gj[1]), src=dv[0:rows])
    corr = nl.ndarray((P, S), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=pb[0:rows], data1=pb[0:rows], data2=p0[0:rows], op=nl.subtract)
    nisa.tensor_tensor(dst=pb[0:rows], data1=pb[0:rows], data2=rmult[0:rows], op=nl.multiply)
    nisa.activation(dst=corr[0:rows], op=nl.square, data=tg[0:rows, 1:1 + S])
    nisa.scalar_tensor_tensor(dst=corr[0:rows], data=corr[0:rows], op0=nl.subtract, operand0=1.0, op1=nl.multiply,
                              operand1=pb[0:rows])
    return corr


def _bwd_group(x_ND, targets_N1, lse_N1, dloss_N1, bias_ids_NS, g, S, R, dt):
    """A backward group's token-major operands: (x, [target, bias ids] columns, gather indices, -lse, g, -g,
    the dx group tile)."""
    P = nl.tile_size.pmax
    rows = g[1]
    x_g = load(x_ND, g, dt, R)
    cols_g, idx_g = _token_columns(targets_N1, bias_ids_NS, g, S, R)
    neg_lse_g, g_g = load(lse_N1, g, nl.float32, R), load(dloss_N1, g, nl.float32, R)
    nisa.tensor_scalar(dst=neg_lse_g[0:rows, 0:g[2]], data=neg_lse_g[0:rows, 0:g[2]], op0=nl.multiply, operand0=-1.0)
    neg_g_g = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_g_g[0:rows, 0:g[2]], data=g_g[0:rows, 0:g[2]], op0=nl.multiply, operand0=-1.0)
    return x_g, cols_g, idx_g, neg_lse_g, g_g, neg_g_g, nl.ndarray((P, x_g.shape[1]), dtype=dt, buffer=nl.sbuf)


def _bwd_tanh(grp, g, jr, embT, V, D, softcap, ident):
    """Row tile jr of group g, first stage: x^T and z = x emb^T into fp32 PSUM banks (`_z_chunk`), left there for
    `_bwd_t`."""
    P = nl.tile_size.pmax
    x_g, cols_g, idx_g, neg_lse_g, g_g, neg_g_g, dx_g = grp
    rows = g[1]
    x_PD = tile(x_g, g, jr, D)
    xT = _x_T(x_PD, rows, ident, False)
    cols, idx = cols_g[0:rows, jr], idx_g[0:rows, jr]
    neg_lse, g_P1, neg_g = neg_lse_g[0:rows, jr:jr + 1], g_g[0:rows, jr:jr + 1], neg_g_g[0:rows, jr:jr + 1]
    if cdiv(V, VC) > Z_BANKS:  # z cannot wait in PSUM: t at once (`_bwd_t` takes it as it is)
        z_ps = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(cdiv(V, VC)):
            _tanh_chunk(z_ps, xT, embT, c * VC, min(VC, V - c * VC), rows, D, softcap)
    else:
        z_ps = [z_chunk(xT, embT, c * VC, min(VC, V - c * VC), rows, D) for c in range(cdiv(V, VC))]
    return [None, x_PD, (z_ps, cols, idx, neg_lse, g_P1, neg_g, rows, dx_g, g, jr)]


def _bwd_t(st, bias_vals_NS, dvals_NS, V, S, softcap, dt):
    """Row tile first stage, second half: t = tanh(z / softcap) [P, V] fp32 out of PSUM (ScalarE) and, with a
    bias, the sparse corrections (`_bias_grad`). Returns the state `head_loss_parts.bwd_r`, `bwd_dz` and `bwd_dx`
    take."""
    P = nl.tile_size.pmax
    z_ps, cols, idx, neg_lse, g_P1, neg_g, rows, dx_g, g, jr = st[2]
    t_PV = z_ps if cdiv(V, VC) > Z_BANKS else nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
    for c in range(cdiv(V, VC) if cdiv(V, VC) <= Z_BANKS else 0):
        vc = min(VC, V - c * VC)
        nisa.activation(dst=t_PV[0:rows, c * VC:c * VC + vc], op=nl.tanh, data=z_ps[c][0:rows, 0:vc],
                        scale=1.0 / softcap)
    corr = None
    if S:
        tg = nl.ndarray((P, 1 + S), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=tg[0:rows], data=t_PV[0:rows], indices=idx[0:rows])
        corr = _bias_grad(cols, _column(bias_vals_NS, g, jr, nl.float32), tg, neg_lse, g_P1, rows, S, softcap,
                          dvals_NS, (g, jr))
    dz_PV = nl.ndarray((P, V), dtype=dt, buffer=nl.sbuf)
    return [st[0], st[1], dz_PV, (t_PV, cols, corr, neg_lse, neg_g, rows, dx_g), None]


@nki.jit
def head_loss_bwd(x_ND, emb_VD, targets_N1, bias_ids_NS, bias_vals_NS, lse_N1, dloss_N1, softcap=30.0):
    """(dx_ND in x's dtype, demb_VD in emb's dtype[, dvals_NS fp32 with a bias]); no bias: both None."""
    N, D = x_ND.shape
    V = emb_VD.shape[0]
    S = _sources(bias_ids_NS, bias_vals_NS)
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    TPB = max(1, DZ_BYTES // (V * (4 if dt == nl.float32 else 2)))  # token tiles per demb block
    dx_ND = nl.ndarray((N, D), dtype=dt, buffer=nl.shared_hbm)
    demb_VD = nl.ndarray((V, D), dtype=emb_VD.dtype, buffer=nl.shared_hbm)
    dvals_NS = nl.ndarray((N, S), dtype=nl.float32, buffer=nl.shared_hbm) if S else None
    ident = identity(dt)
    emb_rows, embT = _emb_tiles(emb_VD, ident)
    iota_PV = _iota(V)
    acc = [nl.zeros((P, D), dtype=nl.float32, buffer=nl.sbuf) for _ in range(cdiv(V, P))]
    R = rows_per_partition(D, cap=16)
    blks = blocks(N, R, TPB)
    tiles = [(b, g, jr) for b in range(len(blks)) for g in blks[b] for jr in range(g[2])]
    grp, blk_s = None, ([], [], [])
    nxt, mid, tail = None, None, None
    for t in range(len(tiles) + 2):  # program order: module docstring
        cur, mid = mid, nxt
        nxt = None
        if t < len(tiles):
            b, g, jr = tiles[t]
            if jr == 0:
                grp = _bwd_group(x_ND, targets_N1, lse_N1, dloss_N1, bias_ids_NS, g, S, R, dt)
            nxt = _bwd_tanh(grp, g, jr, embT, V, D, softcap, ident)
            nxt[0] = tiles[t]
        if tail != None:  # noqa: E711 (NKI has no `is`)
            tail()
            tail = None
        if cur != None:  # noqa: E711
            bwd_dz(cur, V, ident)
        if mid != None:  # noqa: E711
            bwd_r(mid, iota_PV, V, S, softcap)
        if cur != None:  # noqa: E711
            cb, cg, cjr = cur[0]
            tail = bwd_dx(cur, emb_rows, V, D, ident, dx_ND, cjr == cg[2] - 1)
            blk_s[0].append(cur[1])
            blk_s[1].append(cur[2])
            blk_s[2].append(cg[1])
            if cjr == cg[2] - 1:
                if cg == blks[cb][-1]:
                    demb_block(acc, blk_s, V, D)
                    blk_s = ([], [], [])
        if nxt != None:  # noqa: E711
            nxt = _bwd_t(nxt, bias_vals_NS, dvals_NS, V, S, softcap, dt)
    if tail != None:  # noqa: E711
        tail()
    for v in range(cdiv(V, P)):
        vr = min(P, V - v * P)
        out = nl.ndarray((P, D), dtype=emb_VD.dtype, buffer=nl.sbuf)
        nisa.activation(dst=out[0:vr], op=nl.copy, data=acc[v][0:vr])
        nisa.dma_copy(dst=demb_VD[v * P:v * P + vr], src=out[0:vr])
    if S:
        return dx_ND, demb_VD, dvals_NS
    return dx_ND, demb_VD
