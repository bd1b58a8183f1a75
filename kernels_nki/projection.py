"""Token-major projections as NKI kernels, trn1: y = r + x w (the attention's output projection with the
block's residual add), y = rms_norm(x) w (the block's pre-attention RMSNorm fused into the q/k/v
projection) and the same with the block's resid_mix (and a decoder block's U-Net skip add) in front
(`mix_norm_projection`, below).

Spec: `projection` (frontier_jax.reference.resid_projection_fwd / projection_bwd): y_NO = r_NO + x_NI @ w_IO
(x, r in the compute dtype, the weight cast to it, fp32 accumulation and add, y in x's dtype); backward
dx_NI = dy_NO @ w_IO^T (x's dtype), dw_IO = x_NI^T @ dy_NO (fp32, summed over all N tokens); r's gradient
is dy itself (ops.py passes it through: no operand, no pass). ops.out_projection folds the block's
residual scale s into w's columns (x + s (o w) = x + o (w diag s)) and derives dw and ds from the fp32
dw of the folded weight, so the kernel needs no reduction over the tokens for ds. `norm_projection` (frontier_jax.reference.norm_projection_fwd / _bwd): y = rms_norm(x) w,
with inv_N1 = rsqrt(mean(x^2) + eps) (fp32, eps = float32 epsilon) as the residual; backward g = dy w^T,
dx = inv (g + x c) with c = -mean(g x) inv^2 (fp32 math), dw = rms_norm(x)^T dy. ops.out_projection
runs `projection`, ops.norm_qkv_projection runs `norm_projection` with q/k/v fused as one [D, (H + 2G) K]
weight; dw leaves in fp32 and ops casts it to the weight's dtype.

The norm is a per-token scale: rms_norm(x) w = inv (x w), so the forward multiplies the output rows by
inv as they leave PSUM (the evacuation happens anyway: ScalarE `activation(scale=inv)` or VectorE
`tensor_scalar`), and inv comes from the x tile already in SBUF (one ScalarE square + row-sum pass and
an rsqrt on the [P, 1] column, as kernels_nki/rmsnorm.py). The normalised activation never exists in HBM.

Forward, per 128-token tile: x arrives token-major, so its 128-column slices are transposed (the
contraction axis I must be on partitions) and copied out of PSUM, alternately by VectorE and ScalarE
(`activation(op=nl.copy)`: NeuronCore-v2 has no ScalarE tensor_copy, nki/api isa docs); then per
512-column slice of w: y[tokens, 512] = sum over I slices of x^T (stationary [128, 128]) x w (moving
[128, 512], SBUF-resident for the call), one PSUM bank, scaled/cast out and stored.
Transposes: TensorE transposes a tile as a matmul with the tile stationary and an identity moving
(isa docs nc_transpose; nc_matmul "Transpose mode": is_transpose=True labels it). Each 128-token
transpose is issued as two matmuls of 64 tokens in the two 64-row tiles of the PE array (nc_matmul
"Tiling mode": row tiles of 64 on NeuronCore-v2, matmuls on different row tiles run in parallel), the
identity's matching 64 x 64 block as the moving operand: 64 x 128 x 64 MACs issued per half (counted,
0 useful) instead of 128 x 128 x 128 for a full-array transpose. The result is fp32 in PSUM (exact: a
bf16 value times 1).

Backward (`projection`): dx the same way with dy^T (transposed per tile) against w^T (transposed once
per call); dw contracts over tokens, which are already on partitions: I/128 PSUM banks per 512-column
slice of w accumulate x (stationary [tokens, 128]) x dy (moving [tokens, 512]) over every token tile.
With as few PSUM banks as the output projection's (I/128 x O/512 = 4, plus dx's and a transpose's) dx
and dw share one pass over the tokens (x and dy read once); with up to 8 dx takes one pass and every dw
slice a second one (dy read twice, x once); beyond, one pass over x per slice.
Backward (`norm_projection`), one pass over the tokens: per tile g = dy w^T in PSUM (token-major, dy^T
by transposes), the norm's backward on it (VectorE g x and x c + g, each reading g from PSUM; ScalarE
the row sum and the inv scale), dx stored; rms_norm(x) = inv x (ScalarE) kept for dw. dw = rms_norm(x)^T
dy accumulates over BLOCK = 16 token tiles in one PSUM bank per [128, 512] slice, then one VectorE add
into fp32 SBUF accumulators ([I/128] x [128, O] fp32: 16 KiB per partition at the baseline), stored once.
This reads x and dy once, where the unfused pair read dy twice and x, dy again in rms_norm's backward.

Engines at the baseline shapes (N = 65536 tokens, D = 512, (H + 2G) K = 1024, bf16; `python -m
kernels_nki.report`, AWS's documented trn1 rates): q/k/v norm_projection forward 795.8 us per call,
TensorE-bound (DMA 745.0, ScalarE 514.9, VectorE 351.3), backward 1592.3 us TensorE-bound (VectorE
1468.5, DMA 999.4, ScalarE 773.9); before the fusion rms_norm + projection took 494.4 + 842.6 and
965.5 + 1686.7 us. Output projection with the residual add: forward 742.1 us DMA-bound (x, w, r in and y
out once; TensorE 415.5, VectorE 702.3: the add as y leaves PSUM and 1 in 8 x^T blocks; ScalarE 163.8: the
other blocks' PSUM copies; before, 495.4 us plus 741 us of glue for the scaled add's 3 HBM passes),
backward 796.2 us TensorE-bound (unchanged). TensorE useful/issued: 0.941 everywhere; the output
projection's forward 0.901: per tile it needs I/128 x^T blocks (2 x 64 x 128 x 64 MACs each on TensorE)
against I/128 x O/512 matmuls of 128 x 128 x 512, 1 - 64/(O + 64) = 0.889 at O = 512 with every block on
TensorE; XT_VE_FWD = 1 of every 8 blocks is transposed by VectorE 32 x 32 transposes instead (16
instructions, SBUF to SBUF: `kernels_nki.tiles.transpose_ve`), which the DMA bound leaves room for (the
other PSUM copies move to ScalarE to make it): 0.901 at the same time.

`mix_norm_projection` (frontier_jax.reference.mix_norm_projection_fwd / _bwd; ops.mix_norm_qkv_projection,
what the model calls): x = m0 x_in' + m1 x0 with x_in' = x_in (+ sw skip), m = resid_mix and sw the skip
weight (fp32 operands holding values of x's dtype, broadcast to every partition once per call by a DMA
whose HBM access pattern has partition stride 0), then norm_projection of x; x is written once (the
residual stream the block continues with). The mix is 3 (5 with a skip) element-wise ops per tile on
GpSimd (`tensor_tensor(engine=gpsimd)`, isa docs tensor_tensor; GpSimd reads SBUF only, and nothing else
here uses it; the skip's add goes to VectorE), each product and sum rounded to x's dtype as the model
rounds them. The backward takes dy
and dxo, the gradient of the written x (the residual path), recomputes x the same way (x_in, x0 are read
for the weights' gradients anyway; reading x would cost a DMA pass more), forms dx = inv (g + x c) + dxo
(the add folded into the VectorE op that applies inv, where norm_projection uses a ScalarE scale; dy^T's
PSUM copies all go to ScalarE to make room), then on GpSimd dx_in = m0 dx, dx0 = m1 dx (and dskip = sw
dx_in) and the products dx x_in', dx x0 (and dx_in skip). Their sums over the tokens (the partition
axis) are TensorE's: per 128-column slice one matmul with the product stationary and a ones column
moving (`is_moving_onezero`, isa docs nc_matmul), [128, 1] into one fp32 PSUM bank that accumulates over
every tile of the call, copied out once as dmix [2, I] and dsw [1, I]. Costs (`python -m
kernels_nki.report`, baseline shapes): forward 1240.4 us per call without a skip, 1488.1 with one,
DMA-bound (x_in, x0, skip in and x out on top of norm_projection's traffic; TensorE 795.8); backward
1741.5 / 2236.0 us, DMA-bound (TensorE 1593.8 / 1594.5, VectorE 1703 / 2171, GpSimd 1311 / 1873), against
norm_projection's 795.8 + 1592.3 us plus ~740 us forward and ~1230 us backward of resid_mix passes per
call (and as much again for a skip add) at the DMA rate. The one-column matmuls add almost no MACs, so
TensorE useful/issued stays 0.941, but each costs at least the 64-cycle matmul initiation interval, which
the cost model floors only in aggregate: 8 (12 with a skip) per tile, at most 94 (140) us per call more,
still under the DMA time.

NeuronCore-v2 (trn1) rules followed (AWS docs, aws-neuron-sdk): matmuls bf16 (or fp32) pairs into fp32
PSUM, stationary free <= 128 (<= the row tile's 64 rows in tiling mode), moving free <= 512 (isa docs
nc_matmul; trn1 arch guide nki/guides/architecture/trainium_inferentia2_arch.rst "Tile Size"); a
VectorE instruction reads at most one PSUM input (isa docs tensor_tensor / scalar_tensor_tensor
"Memory types"); activation's bias is an [N, 1] tile and its scale an fp32 [N, 1] tile (isa docs
activation); rsqrt's input mean(x^2) + eps >= eps is in its valid range (nki/api/nki.api.shared.rst);
operands of more than 64 partitions start at partition 0, of 33-64 at 0 or 64 (a transpose's second
half starts at 64; arch guide, "Accessing SBUF/PSUM tensors using compute engines").
"""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.tiles import EPS, cdiv, identity, norm_grad_rows, transpose_to_psum, transpose_ve

W = 512  # moving columns per matmul: one fp32 PSUM bank (gemm_moving_fmax)
PSUM_BANKS = 8  # 2 MiB PSUM = 16 KiB per partition (trn1 arch guide, "Memory"), in 2 KiB banks of 512 fp32
XT_VE_FWD = (1, 8)  # projection_fwd: 1 of every 8 x^T blocks by VectorE 32 x 32 transposes (module docstring)
BLOCK = 16  # norm_projection_bwd: token tiles whose dw partials accumulate in PSUM before the fp32 SBUF add


def _evacuate(dst, src, on_vector, scale=None, scaled=False):
    """PSUM -> SBUF with the cast to dst's dtype (with `scaled`, times the per-row fp32 [P, 1] `scale`), on
    VectorE or ScalarE (spreading the two engines' load). A Python flag, not a comparison of a tile with
    None, says whether to scale."""
    if on_vector and scaled:
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=scale)
    elif on_vector:
        nisa.tensor_copy(dst=dst, src=src, engine=nisa.engine.vector)
    elif scaled:
        nisa.activation(dst=dst, op=nl.copy, data=src, scale=scale)
    else:
        nisa.activation(dst=dst, op=nl.copy, data=src)


def _transposed(t, rows, cols, dt, ident, first_on_vector=True, on_scalar=False, ve=(0, 1), g=0):
    """[cols/128 tiles of [128, 128]]: t[0:rows, 0:cols] transposed in 128-column slices (TensorE), copied out
    of PSUM alternately by VectorE and ScalarE (with `on_scalar`, all by ScalarE); block i of row tile g is
    transposed by VectorE 32 x 32 blocks instead (`transpose_ve`, no PSUM) when (g cols/128 + i) % ve[1] <
    ve[0]."""
    P = nl.tile_size.pmax
    out = []
    for i in nl.affine_range(cdiv(cols, P)):
        k = min(P, cols - i * P)
        if (g * cdiv(cols, P) + i) % ve[1] < ve[0]:
            tT = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
            transpose_ve(tT, t[0:rows, i * P:i * P + k], rows, k)
            out.append(tT)
            continue
        t_ps = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
        transpose_to_psum(t_ps[0:k, 0:rows], t[0:rows, i * P:i * P + k], rows, ident)
        tT = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
        _evacuate(tT[0:k, 0:rows], t_ps[0:k, 0:rows], (i % 2 == 0) == first_on_vector and not on_scalar)
        out.append(tT)
    return out


def _rows(src_NX, r0, rows, dt):
    """src_NX[r0:r0+rows] as a [128, X] SBUF tile in dt (the DMA casts)."""
    P = nl.tile_size.pmax
    t = nl.ndarray((P, src_NX.shape[1]), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:rows], src=src_NX[r0:r0 + rows])
    return t


def _weight_tiles(w_IO, dt):
    """w_IO as I/128 SBUF tiles [<=128, O] in dt (the contraction rows on partitions)."""
    P = nl.tile_size.pmax
    I, O = w_IO.shape
    tiles = []
    for i in nl.affine_range(cdiv(I, P)):
        k = min(P, I - i * P)
        t = nl.ndarray((k, O), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=w_IO[i * P:i * P + k])
        tiles.append(t)
    return tiles


def _weight_transposed(w_IO, dt, ident):
    """w_IO^T as O/128 SBUF tiles [128, I] (TensorE transposes, once per call)."""
    P = nl.tile_size.pmax
    I, O = w_IO.shape
    wT = [nl.ndarray((P, I), dtype=dt, buffer=nl.sbuf) for _ in range(cdiv(O, P))]
    for i in nl.affine_range(cdiv(I, P)):
        k = min(P, I - i * P)
        w_t = _rows(w_IO, i * P, k, dt)
        for j in nl.affine_range(cdiv(O, P)):
            ko = min(P, O - j * P)
            t_ps = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
            transpose_to_psum(t_ps[0:ko, 0:k], w_t[0:k, j * P:j * P + ko], k, ident)
            _evacuate(wT[j][0:ko, i * P:i * P + k], t_ps[0:ko, 0:k], j % 2 == 1)
    return wT


def _products(lhsT, rhs, K, O, rows):
    """lhsT^T @ rhs over a K-long contraction as O/512 fp32 PSUM tiles [rows, 512]: lhsT as [128, rows]
    tiles, rhs as [128, O] tiles (slice i holds contraction rows i*128 ...)."""
    P = nl.tile_size.pmax
    out = []
    for o in nl.affine_range(cdiv(O, W)):
        w = min(W, O - o * W)
        ps = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum)
        for i in nl.affine_range(cdiv(K, P)):
            k = min(P, K - i * P)
            nisa.nc_matmul(dst=ps[0:rows, 0:w], stationary=lhsT[i][0:k, 0:rows], moving=rhs[i][0:k, o * W:o * W + w])
        out.append(ps)
    return out


def _times(lhsT, rhs, K, dst_NO, r0, rows, dt, scale=None, scaled=False):
    """dst_NO[r0:r0+rows] = lhsT^T @ rhs (`_products`), with `scaled` times the per-row fp32 [P, 1] `scale`
    when leaving PSUM."""
    P = nl.tile_size.pmax
    O = dst_NO.shape[1]
    for o, ps in enumerate(_products(lhsT, rhs, K, O, rows)):
        w = min(W, O - o * W)
        y = nl.ndarray((P, W), dtype=dt, buffer=nl.sbuf)
        _evacuate(y[0:rows, 0:w], ps[0:rows, 0:w], o % 2 == 0, scale[0:rows] if scaled else None, scaled)
        nisa.dma_copy(dst=dst_NO[r0:r0 + rows, o * W:o * W + w], src=y[0:rows, 0:w])


def _inv_rms(x_t, rows, eps_P1):
    """[P, 1] fp32 inv = rsqrt(mean(x^2) + eps) per row of x_t (ScalarE: the squares with their row sum,
    then rsqrt on the column; as kernels_nki/rmsnorm.py)."""
    P = nl.tile_size.pmax
    D = x_t.shape[1]
    sq = nl.ndarray((P, D), dtype=x_t.dtype, buffer=nl.sbuf)  # discarded: only the row sum is kept
    ss = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=sq[0:rows], op=nl.square, data=x_t[0:rows], reduce_op=nl.add, reduce_res=ss[0:rows])
    inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=inv[0:rows], op=nl.rsqrt, data=ss[0:rows], scale=1.0 / D, bias=eps_P1[0:rows])
    return inv


def _norm_bwd(g, x_t, inv, rows, dt, dxo=None):
    """The RMSNorm backward of one row tile, [P, D] in dt: dx = inv (g + x c) (`kernels_nki.tiles.norm_grad_rows`:
    g as fp32 PSUM tiles of 512 columns), the final scale on ScalarE; with `dxo` (the gradient x receives
    along the residual path, a [P, D] tile) dx = inv (g + x c) + dxo, the scale and the add as one VectorE op."""
    P = nl.tile_size.pmax
    work = norm_grad_rows(g, x_t, inv, rows, W)
    dx = nl.ndarray((P, x_t.shape[1]), dtype=dt, buffer=nl.sbuf)
    if dxo != None:  # noqa: E711 (NKI has no `is`: nki/migration/index.rst)
        nisa.scalar_tensor_tensor(dst=dx[0:rows], data=work[0:rows], op0=nl.multiply, operand0=inv[0:rows],
                                  op1=nl.add, operand1=dxo[0:rows])
    else:
        nisa.activation(dst=dx[0:rows], op=nl.copy, data=work[0:rows], scale=inv[0:rows])
    return dx


def _sb(cols, dt):
    """A fresh [128, cols] SBUF tile in dt."""
    return nl.ndarray((nl.tile_size.pmax, cols), dtype=dt, buffer=nl.sbuf)


def _gp(dst, a, b, op, on_vector=False):
    """dst = op(a, b) element-wise on GpSimd (SBUF operands only: isa docs, 'GpSimd Engine cannot access PSUM'),
    or with `on_vector` on VectorE."""
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op, engine=nisa.engine.vector if on_vector else nisa.engine.gpsimd)


def _broadcast(v_KI, k, dt):
    """Row k of v_KI on every partition, a [128, I] tile in dt: one DMA whose HBM access pattern has partition
    stride 0 (nki/get-started/nki-language-guide.rst, "Low-level raw access pattern")."""
    P = nl.tile_size.pmax
    I = v_KI.shape[1]
    t = _sb(I, dt)
    nisa.dma_copy(dst=t, src=v_KI.ap(pattern=[[0, P], [1, I]], offset=k * I))
    return t


def _mix_setup(x0_NI, mix_2I, skip_NI, sw_1I, dt):
    """The mixing's operands for `_mixed`: (x0, skip or None, m0, m1, sw or None), the weights broadcast."""
    sw = _broadcast(sw_1I, 0, dt) if skip_NI != None else None  # noqa: E711
    return x0_NI, skip_NI, _broadcast(mix_2I, 0, dt), _broadcast(mix_2I, 1, dt), sw


def _mixed(x_NI, mix, r0, rows, dt):
    """(x_in', x0, skip or None, x) as [128, I] tiles of rows r0..r0+rows: x = m0 x_in' + m1 x0 with x_in' = x_in
    (+ sw skip), each product and sum rounded to dt as the model rounds them; on GpSimd."""
    x0_NI, skip_NI, m0, m1, sw = mix
    I = x_NI.shape[1]
    xs, x0, sk = _rows(x_NI, r0, rows, dt), _rows(x0_NI, r0, rows, dt), None
    if skip_NI != None:  # noqa: E711
        sk, t, xs2 = _rows(skip_NI, r0, rows, dt), _sb(I, dt), _sb(I, dt)
        _gp(t[0:rows], sk[0:rows], sw[0:rows], nl.multiply)
        _gp(xs2[0:rows], xs[0:rows], t[0:rows], nl.add, True)  # VectorE: GpSimd has the most work with a skip
        xs = xs2
    a, b, x = _sb(I, dt), _sb(I, dt), _sb(I, dt)
    _gp(a[0:rows], xs[0:rows], m0[0:rows], nl.multiply)
    _gp(b[0:rows], x0[0:rows], m1[0:rows], nl.multiply)
    _gp(x[0:rows], a[0:rows], b[0:rows], nl.add)
    return xs, x0, sk, x


def _mix_bwd(dx, xs, x0, sk, mix, r0, rows, outs, red, ones, dt):
    """The mixing's backward of one row tile from dx, x's whole gradient: dx_in = m0 dx, dx0 = m1 dx (and
    dskip = sw dx_in) stored (GpSimd); the products dx x_in', dx x0 (and dx_in skip) summed over the tile's
    tokens into `red` ([128, 2 or 3 x I/128] fp32 PSUM, one column per product and 128-column slice): the tokens
    are the contraction axis, so each slice is one matmul with the product stationary and a ones column
    moving, accumulating in PSUM over every tile of the call."""
    P = nl.tile_size.pmax
    x0_NI, skip_NI, m0, m1, sw = mix
    I = dx.shape[1]
    nb = cdiv(I, P)
    dxi, dx0 = _sb(I, dt), _sb(I, dt)
    _gp(dxi[0:rows], dx[0:rows], m0[0:rows], nl.multiply)
    _gp(dx0[0:rows], dx[0:rows], m1[0:rows], nl.multiply)
    nisa.dma_copy(dst=outs[0][r0:r0 + rows], src=dxi[0:rows])
    nisa.dma_copy(dst=outs[1][r0:r0 + rows], src=dx0[0:rows])
    pairs = [(dx, xs), (dx, x0)]
    if sk != None:  # noqa: E711
        dsk = _sb(I, dt)
        _gp(dsk[0:rows], dxi[0:rows], sw[0:rows], nl.multiply)
        nisa.dma_copy(dst=outs[2][r0:r0 + rows], src=dsk[0:rows])
        pairs.append((dxi, sk))
    for j in range(len(pairs)):
        prod = _sb(I, dt)
        _gp(prod[0:rows], pairs[j][0][0:rows], pairs[j][1][0:rows], nl.multiply)
        for c in nl.affine_range(nb):
            k = min(P, I - c * P)
            nisa.nc_matmul(dst=red[0:k, j * nb + c:j * nb + c + 1], stationary=prod[0:rows, c * P:c * P + k],
                           moving=ones[0:rows, 0:1], is_moving_onezero=True)


def _store_sums(red, j0, dst_KI):
    """dst_KI[j] (fp32) = the token sums in `red`'s columns (j0 + j) x I/128 ...: column c of a product holds
    its entries c*128 .. on partitions, so each goes out as a [k, 1] HBM access pattern."""
    P = nl.tile_size.pmax
    K, I = dst_KI.shape
    nb = cdiv(I, P)
    for j in range(K):
        for c in nl.affine_range(nb):
            k, col = min(P, I - c * P), (j0 + j) * nb + c
            t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=t[0:k], src=red[0:k, col:col + 1], engine=nisa.engine.vector)
            nisa.dma_copy(dst=dst_KI.ap(pattern=[[1, k], [1, 1]], offset=j * I + c * P), src=t[0:k])


def _forward(x_NI, w_IO, y_NO, inv_N1, norm, mixing=None):
    """y = x w per 128-token tile; with `norm`, y = rms_norm(x) w = inv (x w), inv stored in inv_N1. With
    `mixing` = (`_mix_setup`'s operands, xo_NI), x is the mixed stream, stored in xo_NI."""
    N, I = x_NI.shape
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    w = _weight_tiles(w_IO, dt)
    ident = identity(dt)
    eps = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)  # v2: activation's bias is a tile
    nisa.memset(dst=eps, value=EPS)
    for n in nl.affine_range(cdiv(N, P)):
        rows = min(P, N - n * P)
        if mixing != None:  # noqa: E711
            x_t = _mixed(x_NI, mixing[0], n * P, rows, dt)[3]
            nisa.dma_copy(dst=mixing[1][n * P:n * P + rows], src=x_t[0:rows])
        else:
            x_t = _rows(x_NI, n * P, rows, dt)
        inv = None
        if norm:
            inv = _inv_rms(x_t, rows, eps)
            nisa.dma_copy(dst=inv_N1[n * P:n * P + rows], src=inv[0:rows])
        _times(_transposed(x_t, rows, I, dt, ident), w, I, y_NO, n * P, rows, dt, inv, norm)


def _dw_pass(x_NI, dy_NO, dw_IO, o0, o1, dt, ident, dx_NI=None, wT=None):
    """dw_IO[:, o0*512 : o1*512] = x^T dy over every token tile, I/128 x (o1 - o0) PSUM banks, x and that
    column range of dy read once. With dx_NI/wT it also computes dx = dy w^T in the same pass (dy read
    once in all)."""
    N, I = x_NI.shape
    O = dy_NO.shape[1]
    P = nl.tile_size.pmax
    c0, c1 = o0 * W, min(O, o1 * W)
    acc = [[nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum) for _ in range(o1 - o0)]
           for _ in range(cdiv(I, P))]
    for n in nl.affine_range(cdiv(N, P)):
        rows = min(P, N - n * P)
        x_t = _rows(x_NI, n * P, rows, dt)
        dy_t = nl.ndarray((P, c1 - c0), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=dy_t[0:rows], src=dy_NO[n * P:n * P + rows, c0:c1])
        if dx_NI != None:  # noqa: E711
            _times(_transposed(dy_t, rows, O, dt, ident), wT, O, dx_NI, n * P, rows, dt)
        for o in nl.affine_range(o1 - o0):
            w = min(W, c1 - c0 - o * W)
            for i in nl.affine_range(cdiv(I, P)):
                k = min(P, I - i * P)
                nisa.nc_matmul(dst=acc[i][o][0:k, 0:w], stationary=x_t[0:rows, i * P:i * P + k],
                               moving=dy_t[0:rows, o * W:o * W + w])
    for o in nl.affine_range(o1 - o0):
        w = min(W, c1 - c0 - o * W)
        for i in nl.affine_range(cdiv(I, P)):
            k = min(P, I - i * P)
            out = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)
            _evacuate(out[0:k, 0:w], acc[i][o][0:k, 0:w], i % 2 == 0)
            nisa.dma_copy(dst=dw_IO[i * P:i * P + k, c0 + o * W:c0 + o * W + w], src=out[0:k, 0:w])


@nki.jit
def projection_fwd(x_NI, w_IO, r_NO):
    """y_NO = r_NO + x_NI @ w_IO in x's dtype: the residual tile is added as each [rows, 512] product
    leaves PSUM (one VectorE tensor_tensor, its one PSUM input the product), so x w never reaches HBM."""
    N, I = x_NI.shape
    O = w_IO.shape[1]
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    y_NO = nl.ndarray((N, O), dtype=dt, buffer=nl.shared_hbm)
    w = _weight_tiles(w_IO, dt)
    ident = identity(dt)
    for n in nl.affine_range(cdiv(N, P)):
        rows = min(P, N - n * P)
        x_t, r_t = _rows(x_NI, n * P, rows, dt), _rows(r_NO, n * P, rows, dt)
        xT = _transposed(x_t, rows, I, dt, ident, on_scalar=True, ve=XT_VE_FWD, g=n)
        for o, ps in enumerate(_products(xT, w, I, O, rows)):
            c = min(W, O - o * W)
            y = nl.ndarray((P, W), dtype=dt, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=y[0:rows, 0:c], data1=ps[0:rows, 0:c], data2=r_t[0:rows, o * W:o * W + c],
                               op=nl.add)
            nisa.dma_copy(dst=y_NO[n * P:n * P + rows, o * W:o * W + c], src=y[0:rows, 0:c])
    return y_NO


@nki.jit
def norm_projection_fwd(x_NI, w_IO):
    """(y_NO = rms_norm(x) @ w_IO in x's dtype, inv_N1 = rsqrt(mean(x^2) + eps) fp32)."""
    N = x_NI.shape[0]
    y_NO = nl.ndarray((N, w_IO.shape[1]), dtype=x_NI.dtype, buffer=nl.shared_hbm)
    inv_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    _forward(x_NI, w_IO, y_NO, inv_N1, True)
    return y_NO, inv_N1


def _bwd_setup(x_NI, w_IO):
    """A backward's outputs (dx_NI in x's dtype, dw_IO fp32), the transposes' identity and w^T tiles."""
    N, I = x_NI.shape
    dx_NI = nl.ndarray((N, I), dtype=x_NI.dtype, buffer=nl.shared_hbm)
    dw_IO = nl.ndarray((I, w_IO.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    ident = identity(x_NI.dtype)
    return dx_NI, dw_IO, ident, _weight_transposed(w_IO, x_NI.dtype, ident)


@nki.jit
def projection_bwd(x_NI, w_IO, dy_NO):
    """(dx_NI in x's dtype, dw_IO fp32)."""
    N, I = x_NI.shape
    O = w_IO.shape[1]
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    dx_NI, dw_IO, ident, wT = _bwd_setup(x_NI, w_IO)
    slices, banks = cdiv(O, W), cdiv(I, P) * cdiv(O, W)  # dw's PSUM banks with every slice at once
    if banks + 2 <= PSUM_BANKS:  # dx's bank and a transpose's fit beside them: one pass for dx and dw
        _dw_pass(x_NI, dy_NO, dw_IO, 0, slices, dt, ident, dx_NI, wT)
        return dx_NI, dw_IO
    for n in nl.affine_range(cdiv(N, P)):
        rows = min(P, N - n * P)
        dyT = _transposed(_rows(dy_NO, n * P, rows, dt), rows, O, dt, ident)
        _times(dyT, wT, O, dx_NI, n * P, rows, dt)
    if banks <= PSUM_BANKS:  # every dw slice in one pass over x
        _dw_pass(x_NI, dy_NO, dw_IO, 0, slices, dt, ident)
        return dx_NI, dw_IO
    for o in nl.affine_range(slices):  # one pass over x per 512-column slice
        _dw_pass(x_NI, dy_NO, dw_IO, o, o + 1, dt, ident)
    return dx_NI, dw_IO


def _norm_projection_bwd(x_NI, w_IO, inv_N1, dy_NO, dx_NI, dw_IO, ident, wT, mixing=None):
    """norm_projection's backward body (see norm_projection_bwd); with `mixing` = (`_mix_setup`'s operands,
    dxo_NI, (dx_NI, dx0_NI, dskip_NI), red), x is recomputed from the block's inputs, the residual path's
    gradient dxo is added to dx, and the mixing's backward (`_mix_bwd`) runs on the result."""
    N, I = x_NI.shape
    O = w_IO.shape[1]
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    acc = [nl.zeros((P, O), dtype=nl.float32, buffer=nl.sbuf) for _ in range(cdiv(I, P))]
    ones = nl.ones((P, 1), dtype=dt, buffer=nl.sbuf) if mixing != None else None  # noqa: E711 (red's moving column)
    for blk in nl.affine_range(cdiv(N, P * BLOCK)):
        n0 = blk * P * BLOCK
        S = min(BLOCK, cdiv(N - n0, P))
        xn_s, dy_s = [], []
        for s in nl.affine_range(S):
            r0 = n0 + s * P
            rows = min(P, N - r0)
            dy_t, inv = _rows(dy_NO, r0, rows, dt), _rows(inv_N1, r0, rows, nl.float32)
            if mixing != None:  # noqa: E711
                xs, x0, sk, x_t = _mixed(x_NI, mixing[0], r0, rows, dt)
                dxo = _rows(mixing[1], r0, rows, dt)
            else:
                x_t, dxo = _rows(x_NI, r0, rows, dt), None
            g = _products(_transposed(dy_t, rows, O, dt, ident, False, mixing != None), wT, O, I, rows)  # noqa: E711
            dx = _norm_bwd(g, x_t, inv, rows, dt, dxo)
            if mixing != None:  # noqa: E711
                _mix_bwd(dx, xs, x0, sk, mixing[0], r0, rows, mixing[2], mixing[3], ones, dt)
            else:
                nisa.dma_copy(dst=dx_NI[r0:r0 + rows], src=dx[0:rows])
            xn = nl.ndarray((P, I), dtype=dt, buffer=nl.sbuf)  # rms_norm(x), dw's stationary operand
            nisa.activation(dst=xn[0:rows], op=nl.copy, data=x_t[0:rows], scale=inv[0:rows])
            xn_s.append(xn)
            dy_s.append(dy_t)
        for i in nl.affine_range(cdiv(I, P)):
            k = min(P, I - i * P)
            for o in nl.affine_range(cdiv(O, W)):
                w = min(W, O - o * W)
                g_ps = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum)
                for s in nl.affine_range(S):
                    rows = min(P, N - n0 - s * P)
                    nisa.nc_matmul(dst=g_ps[0:k, 0:w], stationary=xn_s[s][0:rows, i * P:i * P + k],
                                   moving=dy_s[s][0:rows, o * W:o * W + w])
                a = acc[i][0:k, o * W:o * W + w]
                nisa.tensor_tensor(dst=a, data1=a, data2=g_ps[0:k, 0:w], op=nl.add)
    for i in nl.affine_range(cdiv(I, P)):
        k = min(P, I - i * P)
        nisa.dma_copy(dst=dw_IO[i * P:i * P + k], src=acc[i][0:k])


@nki.jit
def norm_projection_bwd(x_NI, w_IO, inv_N1, dy_NO):
    """(dx_NI in x's dtype, dw_IO fp32) of y = rms_norm(x) w: g = dy w^T, dx = the norm's backward of g,
    dw = (inv x)^T dy. One pass over the tokens; dw partials of BLOCK token tiles accumulate in one PSUM
    bank per [128, 512] slice, then one VectorE add into fp32 SBUF accumulators."""
    dx_NI, dw_IO, ident, wT = _bwd_setup(x_NI, w_IO)
    _norm_projection_bwd(x_NI, w_IO, inv_N1, dy_NO, dx_NI, dw_IO, ident, wT)
    return dx_NI, dw_IO


@nki.jit
def mix_norm_projection_fwd(x_NI, x0_NI, mix_2I, w_IO, skip_NI=None, sw_1I=None):
    """(x = mix[0] x_in' + mix[1] x0 with x_in' = x_in (+ sw skip) in x_in's dtype, y_NO = rms_norm(x) w_IO,
    inv_N1 fp32): the block's residual mix (and a decoder block's U-Net skip add) before the q/k/v
    projection; mix_2I and sw_1I fp32 (values of x's dtype), skip_NI and sw_1I both None for no skip."""
    N, I = x_NI.shape
    dt = x_NI.dtype
    xo_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm)
    y_NO = nl.ndarray((N, w_IO.shape[1]), dtype=dt, buffer=nl.shared_hbm)
    inv_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    _forward(x_NI, w_IO, y_NO, inv_N1, True, (_mix_setup(x0_NI, mix_2I, skip_NI, sw_1I, dt), xo_NI))
    return xo_NI, y_NO, inv_N1


@nki.jit
def mix_norm_projection_bwd(x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, inv_N1, dxo_NI, dy_NO):
    """(dx_NI, dx0_NI in x's dtype, dmix_2I fp32, dw_IO fp32[, dskip_NI in x's dtype, dsw_1I fp32]) given dy (the
    projection's gradient) and dxo (the written x's): dx = dxo + the norm projection's backward, then the
    mixing's; dmix and dsw are fp32 sums over the tokens (PSUM), the skip's outputs only with a skip."""
    N, I = x_NI.shape
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    dx_NI, dw_IO, ident, wT = _bwd_setup(x_NI, w_IO)
    skip = skip_NI != None  # noqa: E711
    dx0_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm)
    dmix_2I = nl.ndarray((2, I), dtype=nl.float32, buffer=nl.shared_hbm)
    dskip_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm) if skip else None
    dsw_1I = nl.ndarray((1, I), dtype=nl.float32, buffer=nl.shared_hbm) if skip else None
    red = nl.ndarray((P, (3 if skip else 2) * cdiv(I, P)), dtype=nl.float32, buffer=nl.psum)
    mixing = (_mix_setup(x0_NI, mix_2I, skip_NI, sw_1I, dt), dxo_NI, (dx_NI, dx0_NI, dskip_NI), red)
    _norm_projection_bwd(x_NI, w_IO, inv_N1, dy_NO, dx_NI, dw_IO, ident, wT, mixing)
    _store_sums(red, 0, dmix_2I)
    if skip:
        _store_sums(red, 2, dsw_1I)
        return dx_NI, dx0_NI, dmix_2I, dw_IO, dskip_NI, dsw_1I
    return dx_NI, dx0_NI, dmix_2I, dw_IO
