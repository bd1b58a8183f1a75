"""The block's MLP branch with its pre-norm and residual add, y = x + act(rms_norm(x) W_fc)^2 W_proj, forward
and backward as fused NKI kernels for trn1 (the `norm_mlp` op). act = LeakyReLU(negative_slope), a compile-time
constant >= 0 (0: relu, the baseline's relu^2; 0.5: the record's). Below, r = act(h) (relu(h) for slope 0).

The activation: with slope 0, r = relu(h) leaves PSUM on ScalarE (one instruction); with a slope > 0, h leaves
PSUM by a ScalarE copy (rounded to x's dtype, as the reference computes h) and VectorE makes r = max(h, slope h)
(min for slope > 1) in place (`_leaky`: scalar_tensor_tensor, one instruction). The backward's derivative factor
r act'(h) is act(r) itself (r for r > 0, slope r below: a slope >= 0 keeps h's sign in r), so the stored r is
all it reads, one VectorE instruction more per element (a negative slope would lose the sign: ops refuses it
visibly, the op's declared switch).

Spec: frontier_jax.ops.reference.resid_norm_mlp_fwd / resid_norm_mlp_bwd (x + mlp(rms_norm(x)); weights
already cast to x's dtype by frontier_jax.ops, which folds the block's residual scale s into W_proj's
columns, x + s mlp = x + act(.)^2 (W_proj diag s), and derives dW_proj and ds from the kernel's fp32
dW_proj; the forward also returns the backward's residuals inv_N1 = rsqrt(mean(x^2) + eps), fp32, eps =
float32 epsilon, and rT_FN = act(h)^T [F, N] in x's dtype (h = xn W_fc, which the reference computes in
x's dtype, so the stored r is exactly the reference's); the backward's dx includes dy, the residual's
pass-through). The residual add costs no HBM traffic: the forward adds the x tile it loaded for the norm
as y leaves PSUM (VectorE), the backward adds the dy tile it loaded anyway to dx (GpSimd, SBUF only).

Layout. x, y, dy and dx move in packed row groups (`kernels_nki.packing`): NB / 128 = 4 rows per partition in the
forward (a group of NB = 512 tokens, the moving-tile maximum: h^T streams the group's tokens), NW / 128 = 8 in the
backward (NW = 1024 tokens; NB for F > NW_MAX_F: `bwd_group`), one DMA per operand and group (4 / 8 KiB per
partition at D = 512, bf16), the group's [N, 1] inv one [128, R] DMA. Row tile j of a group holds tokens r0 + p R +
j (partition p). The forward's xn^T is written with row tile j's tokens at the free-axis columns j, j + R, ... (the
group's tokens in order), so h^T, act(h)^T and a^T have the tokens in order: act(h)^T leaves for HBM as [128
F-rows, RT_TOKENS = 2048 tokens] tiles (4 KiB per partition), and y's row tile j takes a^T's columns j, j + R, ...
as its stationary operand, giving the rows that match x's row tile j for the residual add and y's group tile. The
backward loads act(h)^T [128 F-rows, group tokens] (the tokens in order) and transposes the columns of row tile j;
dy^T and dh'^T hold row tile j at columns j*128 .. (only ever that row tile's stationary operand). Weights resident
in SBUF for the whole call (the backward holds W_fc^T and W_proj^T), all matmuls bf16 into fp32 PSUM. The
normalised activation never exists in HBM: per row tile the norm costs ScalarE passes over the x tile already in
SBUF (forward: the squares' row sum, an rsqrt on the [P, 1] column and xn = inv x in fp32, cast to x's dtype as the
reference; backward: xn = inv x from the stored inv).

Forward, per group: stage A (x in, inv, xn), stage T (xn^T by TensorE transposes), stage B (h^T = W_fc^T xn^T directly
in the [F, tokens] layout; ScalarE r = act(h) from PSUM into the stored act(h)^T tile, a^T = r r in SBUF, every
other F-tile on GpSimd, the rest ScalarE), stage C (y = a W_proj with a^T as the stationary operand: a needs no
transpose; + x as y leaves PSUM; y out). Program order per group k: A(k + 1), B(k), T(k + 1), C(k - 1) (C's matmuls
cover the PSUM copies of T's transposes), so that each engine's in-order stream (trn1 arch guide
nki/guides/architecture/trainium_inferentia2_arch.rst, "NeuronCore-v2 Compute Engines") has the other engines' inputs
ready. Transposes: each 128-token transpose runs as two matmuls of 64 tokens against the identity in the two 64-row
tiles of the PE array, which run in parallel (the documented TensorE transpose in row tiling mode;
kernels_nki/projection.py has the details and the AWS sources), into fp32 PSUM.

Backward: STORES act(h) instead of recomputing h. The forward already holds r^T = act(h)^T in SBUF in the
[F, tokens] layout, so storing it costs DMA and no TensorE work; the backward loads it and transposes it on
TensorE to token-major r (F/128 128 x 128 transposes per 128 tokens, two 64-row halves each), copied out of
PSUM once on ScalarE, a = r r from that SBUF copy (GpSimd), instead of recomputing h = xn W_fc (an N x D x F
matmul) from xn^T (D/128 more transposes). The price is HBM: rT is N x F x 2 bytes per layer per micro-batch
kept between forward and backward (128 MiB per layer at N = 65536, F = 1024), and N x F x 2 more bytes moved
each way.

Backward per group, in stages: A (x, dy, inv, rT in; xn = inv x; dy^T by transposes), B (per row tile da = dy
W_proj^T token-major in PSUM, r token-major by transposes of rT's columns of the row tile, r and da out of PSUM
(ScalarE copies), a = r r and dh' = r da (GpSimd, SBUF only) (dh = 2 dh': the 2 is applied exactly, on the fp32
results of dx and dW_fc)), B' (every row tile's dh'^T by transposes), D (dW_proj += a^T dy and dW_fc += xn^T dh'
contract over the group's NW tokens in fp32 PSUM, copied out by ScalarE, then one GpSimd add into fp32 SBUF
accumulators per group), E (g/2 = dh'^T-stationary x W_fc^T in PSUM, token-major, then the norm's backward on
it: dx = 2 inv (g/2 + x c), c = -mean((g/2) x) inv^2 (`kernels_nki.tiles.norm_grad_rows`: g/2 out of
PSUM, x c, the row sum and the 2 inv scale on ScalarE; (g/2) x and g/2 + x c on GpSimd), + dy on GpSimd,
written over dy's group tile and stored). VectorE keeps only [P, 1] columns: its two-input instructions would hold the
VectorE/ScalarE PSUM port or the VectorE/GpSimd SBUF port twice as long (trn1 arch guide, "Data Movement"; "Vector
Engine / Performance Consideration"). Program order per group k: B(k), then group k - 1's B', dW_fc's D and E (so
TensorE never waits on the GpSimd products of the group it has just issued; k - 1's tiles released before k + 1's
arrive), A(k + 1), dW_proj's D(k). W_fc^T and W_proj^T are built once per call. TensorE transposes per 128 tokens:
D/128 (dy^T) + 2 F/128 (r, dh'^T), the floor of this design (dy, r and dh' are each needed in both layouts: a
contraction over D for da, over the tokens for the weight gradients, over F for dx).

NeuronCore-v2 (trn1) rules this kernel follows (AWS docs, aws-neuron-sdk): a TensorE transpose is a
matmul with the data stationary and an identity moving (nki/api/nki/isa/__init__.py, nc_transpose;
nc_matmul "Transpose mode"), here written as nc_matmul(is_transpose=True) into fp32 PSUM in row
tiling mode (nc_matmul "Tiling mode": 64-row tiles on NeuronCore-v2, stationary <= 64 rows); PSUM is
evacuated by ScalarE `activation(op=nl.copy)` (tensor_copy on ScalarE is not supported on v2: isa
docs tensor_copy) or VectorE; a VectorE instruction reads at most one tensor input from PSUM (isa
docs tensor_tensor / scalar_tensor_tensor "Memory types"); GpSimd runs tensor_tensor on SBUF operands only
(isa docs tensor_tensor: "Vector Engine or GpSimd Engine", "GpSimd Engine cannot access PSUM"); matmuls are bf16 (or fp32) pairs into
fp32 PSUM, stationary free <= 128, moving free <= 512 (isa docs nc_matmul; trn1 arch guide
nki/guides/architecture/trainium_inferentia2_arch.rst "Tile Size"); activation's bias is an [N, 1]
tile and its scale an fp32 [N, 1] tile (isa docs activation); rsqrt's input mean(x^2) + eps >= eps is
in its valid range (nki/api/nki.api.shared.rst); operands of more than 64 partitions start at
partition 0, of 33-64 at 0 or 64 (a transpose's second half starts at 64; arch guide, "Accessing
SBUF/PSUM tensors using compute engines").
"""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import blocks, columns, groups, load, store, tile
from kernels_nki.tiles import EPS, accumulate_weight_grad, cdiv, identity, norm_grad_rows, transpose, transpose_to_psum

NB = 512  # tokens per forward group (gemm_moving_fmax: the forward's h^T has the tokens as moving free dim)
NW = 1024  # tokens per backward group: no backward matmul streams tokens as its moving free dim, and the
# weight gradients contract over the whole group in PSUM before one fp32 SBUF add (half the adds of 512)
NW_MAX_F = 1024  # a wider MLP's backward takes groups of NB tokens: its per-group tiles (a, dh' [tokens, F], their
# transposes, rT) and the fp32 weight-gradient accumulators fit the 192 KiB SBUF partition (`bwd_group`)
RT_TOKENS = 2048  # tokens per stored act(h)^T tile [128 F-rows, RT_TOKENS]: 4 KiB per partition in bf16


def bwd_group(F):
    """Tokens per backward group for MLP width F: NW up to NW_MAX_F, else NB, which keeps the backward's live SBUF
    under the NeuronCore-v2 partition's 192 KiB at F = 1536 (the record's 3 x 512) and D = 512 (aws-neuron-sdk
    nki/guides/architecture/trainium_inferentia2_arch.rst, "Memory": 24 MiB SBUF = 128 x 192 KiB; a kernel
    past it spills through HBM, nki/get-started/about/memory-hierarchy-overview.rst)."""
    return NW if F <= NW_MAX_F else NB


def _load_rows(w_RC, dt):
    """A [R, C] HBM matrix as ceil(R/128) SBUF row tiles [128, C]."""
    R, C = w_RC.shape
    P = nl.tile_size.pmax
    tiles = []
    for i in range(cdiv(R, P)):
        r = min(P, R - i * P)
        t = nl.ndarray((P, C), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:r], src=w_RC[i * P:i * P + r])
        tiles.append(t)
    return tiles


def _transposed_rows(tiles, R, C, dt, ident):
    """Row tiles of a [R, C] matrix -> row tiles of its [C, R] transpose."""
    P = nl.tile_size.pmax
    out = [nl.ndarray((P, R), dtype=dt, buffer=nl.sbuf) for _ in range(cdiv(C, P))]
    for i in range(cdiv(R, P)):
        r = min(P, R - i * P)
        for j in range(cdiv(C, P)):
            c = min(P, C - j * P)
            transpose(out[j][0:c, i * P:i * P + r], tiles[i][0:r, j * P:j * P + c], r, c, ident)
    return out


def _group_T(tiles, g, dt, ident, width, natural):
    """Group g's row tiles [parts, D] -> D/128 tiles of the transpose [D_k, width]: row tile j's tokens at the
    columns `columns(g, j)` (the group's tokens in order) with `natural`, else at j*128 .. j*128 + parts."""
    P = nl.tile_size.pmax
    D = tiles[0].shape[1]
    p = g[1]
    xT = [nl.ndarray((P, width), dtype=dt, buffer=nl.sbuf) for _ in range(cdiv(D, P))]
    for j in range(len(tiles)):
        cols = columns(g, j) if natural else slice(j * P, j * P + p)
        for k in range(cdiv(D, P)):
            dk = min(P, D - k * P)
            transpose(xT[k][0:dk, cols], tiles[j][0:p, k * P:k * P + dk], p, dk, ident)
    return xT


def _scaled(x_t, inv, rows, dt):
    """rms_norm(x) of a row tile: x * inv per row (ScalarE, fp32 math, cast to dt as the reference)."""
    xn = nl.ndarray((nl.tile_size.pmax, x_t.shape[1]), dtype=dt, buffer=nl.sbuf)
    nisa.activation(dst=xn[0:rows], op=nl.copy, data=x_t[0:rows], scale=inv[0:rows])
    return xn


def _fwd_inputs(x_ND, inv_N1, g, eps, dt):
    """Forward stage A of group g: x in, inv = rsqrt(mean(x^2) + eps) (ScalarE squares with their row sum, then
    rsqrt on the column; stored) and xn = inv x (ScalarE); stage T (`_fwd_T`) transposes xn."""
    P = nl.tile_size.pmax
    D, R = x_ND.shape[1], NB // P
    p = g[1]
    x_g = load(x_ND, g, dt, R)  # kept for the residual add
    inv = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
    xn_s = []
    for j in range(g[2]):
        x_t = tile(x_g, g, j, D)
        sq = nl.ndarray((P, D), dtype=dt, buffer=nl.sbuf)  # discarded: only the row sum is kept
        ss = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=sq[0:p], op=nl.square, data=x_t, reduce_op=nl.add, reduce_res=ss[0:p])
        nisa.activation(dst=inv[0:p, j:j + 1], op=nl.rsqrt, data=ss[0:p], scale=1.0 / D, bias=eps[0:p])
        xn_s.append(_scaled(x_t, inv[0:p, j:j + 1], p, dt))
    store(inv_N1, g, inv)
    return [g, x_g, xn_s]


def _fwd_T(st, dt, ident):
    """Forward stage T: xn^T by TensorE transposes, the group's tokens in order along the free axis."""
    st[2] = _group_T(st[2], st[0], dt, ident, NB, True)


def _leaky(dst, src, slope):
    """dst = LeakyReLU(src, slope) = max(src, slope src) for 0 < slope <= 1 (min for slope > 1): one VectorE
    scalar_tensor_tensor from SBUF ((data * slope) max data; VectorE only, isa docs scalar_tensor_tensor; its
    operands in SBUF: ScalarE reads PSUM). Applied to a LeakyReLU output l it gives l l'(h) (l for l > 0, slope l
    below: the sign of l is h's for slope > 0), the factor of the activation's derivative the backward needs."""
    nisa.scalar_tensor_tensor(dst=dst, data=src, op0=nl.multiply, operand0=slope,
                              op1=nl.maximum if slope <= 1.0 else nl.minimum, operand1=src)


def _fwd_hidden(st, wfc, rT_s, b0, dt, slope):
    """Forward stage B: h^T = W_fc^T xn^T per 128 F-rows ([F_j, tokens] PSUM), r = LeakyReLU(h, slope) (slope 0: relu
    on ScalarE leaving PSUM; else h leaves PSUM by a ScalarE copy in x's dtype, as the reference rounds it, and
    `_leaky` makes r in place) into the block's stored rT tile, a^T = r r (SBUF; every other F-tile on GpSimd, the
    rest ScalarE)."""
    P = nl.tile_size.pmax
    g, x_g, xT = st
    nb = g[1] * g[2]
    D, F = x_g.shape[1] // (NB // P), wfc[0].shape[1]
    aT = []
    for jf in range(cdiv(F, P)):
        fj = min(P, F - jf * P)
        h_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
        for k in range(cdiv(D, P)):
            dk = min(P, D - k * P)
            nisa.nc_matmul(dst=h_ps[0:fj, 0:nb], stationary=wfc[k][0:dk, jf * P:jf * P + fj], moving=xT[k][0:dk, 0:nb])
        r_T = rT_s[jf][0:fj, g[0] - b0:g[0] - b0 + nb]
        if slope == 0.0:
            nisa.activation(dst=r_T, op=nl.relu, data=h_ps[0:fj, 0:nb])
        else:
            nisa.activation(dst=r_T, op=nl.copy, data=h_ps[0:fj, 0:nb])
            _leaky(r_T, r_T, slope)
        a_T = nl.ndarray((P, NB), dtype=dt, buffer=nl.sbuf)
        # relu: half on GpSimd (idle in the forward; VectorE pays 2N), ScalarE having the longer stream; LeakyReLU:
        # all on GpSimd while VectorE makes r (of all, a third or half on ScalarE, the shortest schedule at D = 512,
        # F = 1536: kernels_nki/emulator/schedule.py's central reading)
        if jf % 2 == 0 or slope != 0.0:
            nisa.tensor_tensor(dst=a_T[0:fj, 0:nb], data1=r_T, data2=r_T, op=nl.multiply, engine=nisa.engine.gpsimd)
        else:
            nisa.activation(dst=a_T[0:fj, 0:nb], op=nl.square, data=r_T)
        aT.append(a_T)
    return aT


def _fwd_out(st, aT, wproj, y_ND, dt):
    """Forward stage C: y's row tile j = x + a W_proj with a^T's columns of row tile j's tokens as the stationary
    operand (the residual added as y leaves PSUM, VectorE), y out (one DMA per group)."""
    P = nl.tile_size.pmax
    g, x_g, xT = st
    p = g[1]
    D = y_ND.shape[1]
    y_g = nl.ndarray((P, NB // P * D), dtype=dt, buffer=nl.sbuf)
    for j in range(g[2]):
        for c in range(cdiv(D, NB)):
            dc = min(NB, D - c * NB)
            y_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
            for jf in range(len(aT)):
                fj = wproj[jf].shape[0]
                nisa.nc_matmul(dst=y_ps[0:p, 0:dc], stationary=aT[jf][0:fj, columns(g, j)],
                               moving=wproj[jf][0:fj, c * NB:c * NB + dc])
            c0 = j * D + c * NB
            nisa.tensor_tensor(dst=y_g[0:p, c0:c0 + dc], data1=y_ps[0:p, 0:dc], data2=x_g[0:p, c0:c0 + dc], op=nl.add)
    store(y_ND, g, y_g)


@nki.jit
def norm_mlp_fwd(x_ND, w_fc_DF, w_proj_FD, negative_slope=0.0):
    """(y_ND (x's dtype) = x + act(rms_norm(x) W_fc)^2 W_proj, inv_N1 = rsqrt(mean(x^2) + eps) fp32,
    rT_FN = act(h)^T in x's dtype, the backward's residual), act = LeakyReLU(negative_slope) (a compile-time
    constant >= 0; 0: relu). Per group k the stages run in the program order A(k + 1), B(k), T(k + 1), C(k - 1)."""
    N, D = x_ND.shape
    F = w_fc_DF.shape[1]
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    y_ND = nl.ndarray((N, D), dtype=dt, buffer=nl.shared_hbm)
    inv_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    rT_FN = nl.ndarray((F, N), dtype=dt, buffer=nl.shared_hbm)
    ident = identity(dt)
    eps = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)  # v2: activation's bias is a tile
    nisa.memset(dst=eps, value=EPS)
    wfc = _load_rows(w_fc_DF, dt)  # [D_k, F]
    wproj = [t[0:min(P, F - i * P)] for i, t in enumerate(_load_rows(w_proj_FD, dt))]  # [F_j, D]
    blks = blocks(N, NB // P, RT_TOKENS // P)  # consecutive groups whose act(h)^T leaves as one tile per F_j
    gs = [(b, g) for b in range(len(blks)) for g in blks[b]]
    st = _fwd_inputs(x_ND, inv_N1, gs[0][1], eps, dt)
    _fwd_T(st, dt, ident)
    rT_s, prev = None, None
    for k in range(len(gs)):
        b, g = gs[k]
        b0 = blks[b][0][0]
        nxt = _fwd_inputs(x_ND, inv_N1, gs[k + 1][1], eps, dt) if k + 1 < len(gs) else None
        if g == blks[b][0]:
            rT_s = [nl.ndarray((P, RT_TOKENS), dtype=dt, buffer=nl.sbuf) for _ in range(cdiv(F, P))]
        aT = _fwd_hidden(st, wfc, rT_s, b0, dt, negative_slope)
        if g == blks[b][-1]:  # the block's act(h)^T out
            nt = g[0] + g[1] * g[2] - b0
            for jf in range(cdiv(F, P)):
                fj = min(P, F - jf * P)
                nisa.dma_copy(dst=rT_FN[jf * P:jf * P + fj, b0:b0 + nt], src=rT_s[jf][0:fj, 0:nt])
        if nxt != None:  # noqa: E711 (NKI has no `is`)
            _fwd_T(nxt, dt, ident)
        if prev != None:  # noqa: E711
            _fwd_out(prev[0], prev[1], wproj, y_ND, dt)
        prev, st = (st, aT), nxt
    _fwd_out(prev[0], prev[1], wproj, y_ND, dt)
    return y_ND, inv_N1, rT_FN


def _norm_dx(dx, g, x_t, inv, dy_t, rows):
    """dx ([rows, D], its dtype) for one row tile: dy (the residual's pass-through) plus the norm's backward,
    given g/2 (g: the gradient of rms_norm(x)) as fp32 PSUM chunks of 512 columns: dx = dy + 2 inv (g/2 + x c)
    (`kernels_nki.tiles.norm_grad_rows`); the 2 inv scale on ScalarE, the add of dy on GpSimd (SBUF only,
    idle otherwise)."""
    P = nl.tile_size.pmax
    work = norm_grad_rows(g, x_t, inv, rows, NB)
    two_inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=two_inv[0:rows], data=inv[0:rows], op0=nl.multiply, operand0=2.0)
    nisa.activation(dst=work[0:rows], op=nl.copy, data=work[0:rows], scale=two_inv[0:rows])
    nisa.tensor_tensor(dst=dx[0:rows], data1=work[0:rows], data2=dy_t[0:rows], op=nl.add, engine=nisa.engine.gpsimd)


def _relu_rows(a_t, dh_t, rT, tok, rows, da_ps, c, fc, dt, ident, slope):
    """Columns c*NB .. c*NB+fc of one row tile from the stored rT [F_j, tokens] tiles (the row tile's tokens at
    the columns `tok`): r = act(h) token-major by TensorE transposes into one PSUM tile; r and da leave PSUM
    on ScalarE (one input each), a = r r and dh' = m da on GpSimd from SBUF, m = r act'(h) (slope 0: r itself, relu'
    being 0 where r is; else `_leaky`(r) on VectorE, which has room in the backward). VectorE and ScalarE share one PSUM
    port and VectorE and GpSimd one SBUF port (trn1 arch guide, "Data Movement"): a VectorE product reading da
    from PSUM costs ~2N VectorE cycles on the PSUM port ("Vector Engine / Performance Consideration"), ScalarE's
    one-input copy N cycles at a higher clock ("Compute Engine" table), so the port carries less."""
    P = nl.tile_size.pmax
    F = a_t.shape[1]
    r_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
    for jj in range(cdiv(fc, P)):
        j = c * NB // P + jj
        fj = min(P, F - j * P)
        transpose_to_psum(r_ps[0:rows, jj * P:jj * P + fj], rT[j][0:fj, tok], fj, ident)
    cols = slice(c * NB, c * NB + fc)
    r = nl.ndarray((P, NB), dtype=dt, buffer=nl.sbuf)  # exact: rT holds r in dt
    nisa.activation(dst=r[0:rows, 0:fc], op=nl.copy, data=r_ps[0:rows, 0:fc])
    da = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.sbuf)  # exact: PSUM holds da in fp32
    nisa.activation(dst=da[0:rows, 0:fc], op=nl.copy, data=da_ps[0:rows, 0:fc])
    nisa.tensor_tensor(dst=a_t[0:rows, cols], data1=r[0:rows, 0:fc], data2=r[0:rows, 0:fc], op=nl.multiply,
                       engine=nisa.engine.gpsimd)  # a = act(h)^2
    m = r
    if slope != 0.0:
        m = nl.ndarray((P, NB), dtype=dt, buffer=nl.sbuf)
        _leaky(m[0:rows, 0:fc], r[0:rows, 0:fc], slope)
    nisa.tensor_tensor(dst=dh_t[0:rows, cols], data1=m[0:rows, 0:fc], data2=da[0:rows, 0:fc], op=nl.multiply,
                       engine=nisa.engine.gpsimd)


def _bwd_inputs(x_ND, inv_N1, rT_FN, dy_ND, g, dt, ident):
    """Stage A of the backward for group g: x, dy, inv and rT in; rms_norm(x) (ScalarE) and dy^T (TensorE, row
    tile j at columns j*128 ..)."""
    P = nl.tile_size.pmax
    D, F = x_ND.shape[1], rT_FN.shape[0]
    nw = bwd_group(F)
    R = nw // P
    n0, p, nr = g
    x_g, dy_g, inv = load(x_ND, g, dt, R), load(dy_ND, g, dt, R), load(inv_N1, g, nl.float32, R)
    x_s = [tile(x_g, g, j, D) for j in range(nr)]
    dy_s = [tile(dy_g, g, j, D) for j in range(nr)]
    xn_s = [_scaled(x_s[j], inv[0:p, j:j + 1], p, dt) for j in range(nr)]  # rms_norm(x), ScalarE
    rT = []
    for jf in range(cdiv(F, P)):  # act(h)^T from the forward, [F_j, tokens] (the group's tokens in order)
        fj = min(P, F - jf * P)
        t = nl.ndarray((P, nw), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:fj, 0:p * nr], src=rT_FN[jf * P:jf * P + fj, n0:n0 + p * nr])
        rT.append(t)
    return [g, x_s, dy_s, xn_s, inv, rT, _group_T(dy_s, g, dt, ident, nw, False), dy_g]


def _bwd_hidden(st, wprojT, dt, ident, slope):
    """Stage B: per row tile da = dy W_proj^T (token-major PSUM), r and a = r^2 from rT, dh' = r da. Returns
    (a_s, dh_s)."""
    P = nl.tile_size.pmax
    g, x_s, dy_s, xn_s, inv, rT, dyT = st[:7]
    p, nr = g[1], g[2]
    D, F = x_s[0].shape[1], wprojT[0].shape[1]
    a_s, dh_s = [], []
    for j in range(nr):
        a_t = nl.ndarray((P, F), dtype=dt, buffer=nl.sbuf)
        dh_t = nl.ndarray((P, F), dtype=dt, buffer=nl.sbuf)
        for c in range(cdiv(F, NB)):
            fc = min(NB, F - c * NB)
            da_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
            for k in range(cdiv(D, P)):
                dk = min(P, D - k * P)
                nisa.nc_matmul(dst=da_ps[0:p, 0:fc], stationary=dyT[k][0:dk, j * P:j * P + p],
                               moving=wprojT[k][0:dk, c * NB:c * NB + fc])
            _relu_rows(a_t, dh_t, rT, columns(g, j), p, da_ps, c, fc, dt, ident, slope)
        a_s.append(a_t)
        dh_s.append(dh_t)
    st[5], st[6] = None, None  # rT and dy^T are spent: their SBUF is free for the next group's stage A
    return a_s, dh_s


def _bwd_hT(g, dh_s, dt, ident):
    """Stage B': every row tile's dh'^T by TensorE transposes (row tile j at columns j*128 ..)."""
    P = nl.tile_size.pmax
    F = dh_s[0].shape[1]
    dhT = [nl.ndarray((P, bwd_group(F)), dtype=dt, buffer=nl.sbuf) for _ in range(cdiv(F, P))]
    for j in range(g[2]):
        for jf in range(cdiv(F, P)):
            fj = min(P, F - jf * P)
            transpose(dhT[jf][0:fj, j * P:j * P + g[1]], dh_s[j][0:g[1], jf * P:jf * P + fj], g[1], fj, ident)
    return dhT


def _accumulate(acc, lhs_s, rhs_s, p, K, C):
    """acc[i] ([128, C] fp32 SBUF) += lhs^T rhs over the row tiles (lhs_s [p, K], rhs_s [p, C] tiles)."""
    def matmuls(g_ps, k0, ki, c0, cw):
        for lhs, rhs in zip(lhs_s, rhs_s):
            nisa.nc_matmul(dst=g_ps[0:ki, 0:cw], stationary=lhs[0:p, k0:k0 + ki], moving=rhs[0:p, c0:c0 + cw])

    accumulate_weight_grad(acc, K, C, NB, matmuls)


def _bwd_dx(st, dhT, wfcT, F, dx_ND, dt):
    """Stage E: g/2 = dh' W_fc^T token-major in PSUM, the norm's backward (the 2 folded into its scale), dx out:
    written over dy's group tile in place (dy's last use: stage D precedes it)."""
    P = nl.tile_size.pmax
    g, x_s, dy_s, inv = st[0], st[1], st[2], st[4]
    p, nr = g[1], g[2]
    D = dx_ND.shape[1]
    for j in range(nr):
        gr = []
        for c in range(cdiv(D, NB)):
            dc = min(NB, D - c * NB)
            dx_ps = nl.ndarray((P, NB), dtype=nl.float32, buffer=nl.psum)
            for jf in range(len(dhT)):
                fj = min(P, F - jf * P)
                nisa.nc_matmul(dst=dx_ps[0:p, 0:dc], stationary=dhT[jf][0:fj, j * P:j * P + p],
                               moving=wfcT[jf][0:fj, c * NB:c * NB + dc])
            gr.append(dx_ps)
        _norm_dx(dy_s[j], gr, x_s[j], inv[0:p, j:j + 1], dy_s[j], p)
    store(dx_ND, g, st[7])


@nki.jit
def norm_mlp_bwd(x_ND, w_fc_DF, w_proj_FD, inv_N1, rT_FN, dy_ND, negative_slope=0.0):
    """(dx_ND = dy + the MLP's and norm's backward, dw_fc_DF in x's dtype, dw_proj_FD fp32), from the forward's
    rT_FN = act(h)^T (h is not recomputed: see the module docstring; act = LeakyReLU(negative_slope >= 0)). Per
    group the stages run in the program order B(k), B'(k - 1), D_fc(k - 1), E(k - 1), A(k + 1), D_proj(k) (see the
    module docstring)."""
    N, D = x_ND.shape
    F = w_fc_DF.shape[1]
    P = nl.tile_size.pmax
    dt = x_ND.dtype
    KD, KF = cdiv(D, P), cdiv(F, P)
    dx_ND = nl.ndarray((N, D), dtype=dt, buffer=nl.shared_hbm)
    dwfc_DF = nl.ndarray((D, F), dtype=dt, buffer=nl.shared_hbm)
    dwproj_FD = nl.ndarray((F, D), dtype=nl.float32, buffer=nl.shared_hbm)  # fp32: ops.py derives ds from it
    ident = identity(dt)
    wfcT = _transposed_rows(_load_rows(w_fc_DF, dt), D, F, dt, ident)  # [F_j, D]
    wprojT = _transposed_rows(_load_rows(w_proj_FD, dt), F, D, dt, ident)  # [D_k, F]
    acc_fc = [nl.zeros((P, F), dtype=nl.float32, buffer=nl.sbuf) for _ in range(KD)]
    acc_proj = [nl.zeros((P, D), dtype=nl.float32, buffer=nl.sbuf) for _ in range(KF)]
    gs = groups(N, bwd_group(F) // P)
    st = _bwd_inputs(x_ND, inv_N1, rT_FN, dy_ND, gs[0], dt, ident)
    prev = None

    def finish(pst, dh_s, g):  # stages B', D (dW_fc) and E of a group
        dhT = _bwd_hT(g, dh_s, dt, ident)
        _accumulate(acc_fc, pst[3], dh_s, g[1], D, F)
        _bwd_dx(pst, dhT, wfcT, F, dx_ND, dt)

    for k in range(len(gs)):
        a_s, dh_s = _bwd_hidden(st, wprojT, dt, ident, negative_slope)
        if prev != None:  # noqa: E711 (NKI has no `is`)
            finish(*prev)
        prev = None  # group k - 1's tiles released before group k + 1's
        nxt = _bwd_inputs(x_ND, inv_N1, rT_FN, dy_ND, gs[k + 1], dt, ident) if k + 1 < len(gs) else None
        # weight gradients: contract over the group's tokens in PSUM, one fp32 SBUF add per group; dW_proj's now
        # (a_s released), the rest after B(k + 1): TensorE never waits on the group's last dh'
        _accumulate(acc_proj, a_s, st[2], gs[k][1], F, D)
        prev = (st, dh_s, gs[k])
        st, a_s, dh_s = nxt, None, None
    finish(*prev)
    for k in range(KD):
        dk = min(P, D - k * P)
        out = nl.ndarray((P, F), dtype=dt, buffer=nl.sbuf)
        nisa.activation(dst=out[0:dk], op=nl.copy, data=acc_fc[k][0:dk], scale=2.0)
        nisa.dma_copy(dst=dwfc_DF[k * P:k * P + dk], src=out[0:dk])
    for jf in range(KF):
        fj = min(P, F - jf * P)
        nisa.dma_copy(dst=dwproj_FD[jf * P:jf * P + fj], src=acc_proj[jf][0:fj])
    return dx_ND, dwfc_DF, dwproj_FD
