"""Token-major projections as NKI kernels, trn1: y = r + x w (the attention's output projection with the
block's residual add), y = rms_norm(x) w (the block's pre-attention RMSNorm fused into the q/k/v
projection) and the same with the block's resid_mix (and a decoder block's U-Net skip add) in front
(`mix_norm_projection`). Helpers: `kernels_nki/projection_parts.py` (transposes, weights, matmuls, the norm),
`kernels_nki/mix_parts.py` (the mix front-end), `kernels_nki/packing.py` (the row groups).

Spec: `projection` (frontier_jax.ops.reference.resid_projection_fwd / projection_bwd): y_NO = r_NO + x_NI @ w_IO
(x, r in the compute dtype, the weight cast to it, fp32 accumulation and add, y in x's dtype); backward
dx_NI = dy_NO @ w_IO^T (x's dtype), dw_IO = x_NI^T @ dy_NO (fp32, summed over all N tokens); r's gradient
is dy itself (ops.py passes it through: no operand, no pass). ops.out_projection folds the block's
residual scale s into w's columns (x + s (o w) = x + o (w diag s)) and derives dw and ds from the fp32
dw of the folded weight. `norm_projection` (frontier_jax.ops.reference.norm_projection_fwd / _bwd): y = rms_norm(x) w,
with inv_N1 = rsqrt(mean(x^2) + eps) (fp32, eps = float32 epsilon) as the residual; backward g = dy w^T,
dx = inv (g + x c) with c = -mean(g x) inv^2 (fp32 math), dw = rms_norm(x)^T dy. ops.out_projection
runs `projection`; `norm_projection` is the experimental op (frontier_jax.ops.experimental.norm_qkv_projection).
dw leaves in fp32 and ops casts it to the weight's dtype. `mix_norm_projection`
(frontier_jax.ops.reference.mix_norm_projection_fwd / _bwd; ops.mix_norm_qkv_projection, what the model calls):
x = m0 x_in' + m1 x0 with x_in' = x_in (+ sw skip), m = resid_mix and sw the skip weight (fp32 operands
holding values of x's dtype), then norm_projection of x with q/k/v fused as one [D, (H + 2G) K] weight; x is
written once (the residual stream the block continues with) and y leaves as three outputs q, k, v (`widths`,
a compile-time constant: the model's q/k/v need no slicing pass outside the kernel); the backward takes dq,
dk, dv and dxo (the gradient of the written x) and returns dx_in, dx0, dmix, dw (and dskip, dsw).

Layout. Every token-major operand moves in packed row groups (`kernels_nki.packing`): R = 4096 / I rows per
partition (8 at I = 512), so a group of 128 R tokens is one DMA per operand with R I itemsize contiguous bytes
per partition (8 KiB for x in bf16, 16 KiB for a [N, 1024] y or dy), and the [N, 1] inverse RMS of a group is
one [128, R] DMA. Row tile j of a group (partition p: token r0 + p R + j) is a [128, I] slice of the group
tile; its x^T blocks give y's row tile j, written into the same slice of the output group tile, stored with
one DMA; with several outputs (q, k, v) each output has its own group tile and DMA, and a [rows, 512] PSUM slice
that spans two of them leaves PSUM in two pieces (`projection_parts.pieces`). The backward's dy parts are
transposed part by part and w^T is chunked the same way (`part_chunks`). The contraction over tokens (dw)
pairs row tiles of x and dy with the same tokens, in any order.
The weights are loaded once per call ([128, O] row tiles).

The norm is a per-token scale: rms_norm(x) w = inv (x w), so the forward multiplies the output rows by
inv as they leave PSUM (ScalarE `activation(scale=inv)` or VectorE `tensor_scalar`), and inv comes from the
x tile already in SBUF (one ScalarE square + row-sum pass and an rsqrt on the [P, 1] column, as
kernels_nki/rmsnorm.py). The normalised activation never exists in HBM.

Forward, per row tile: x's 128-column slices are transposed (the contraction axis I must be on partitions)
and copied out of PSUM (ScalarE `activation(op=nl.copy)`: NeuronCore-v2 has no ScalarE tensor_copy, nki/api
isa docs; the norm's forward alternates VectorE and ScalarE); then per 512-column slice of w: y[tokens, 512] =
sum over I slices of x^T (stationary [128, 128]) x w (moving [128, 512], SBUF-resident for the call), one
PSUM bank, scaled/cast out (`projection`: the residual tile added by one VectorE tensor_tensor, its one PSUM
input the product). Program order: row tile t's matmuls come after row tile t + 1's transposes, so TensorE
does not wait on each tile's PSUM copies (each engine issues its stream in order: trn1 arch guide
nki/guides/architecture/trainium_inferentia2_arch.rst, "NeuronCore-v2 Compute Engines"; the compiler may
reorder independent instructions, nki/get-started/nki-language-guide.rst, by rules AWS does not publish, so
the order written overlaps the engines by itself).
Transposes: TensorE transposes a tile as a matmul with the tile stationary and an identity moving
(isa docs nc_transpose; nc_matmul "Transpose mode": is_transpose=True labels it). Each 128-token
transpose is issued as two matmuls of 64 tokens in the two 64-row tiles of the PE array (nc_matmul
"Tiling mode": row tiles of 64 on NeuronCore-v2, matmuls on different row tiles run in parallel), the
identity's matching 64 x 64 block as the moving operand. The result is fp32 in PSUM (exact: a bf16 value
times 1).

Backward (`projection`): dx the same way with dy^T (transposed per row tile) against w^T (transposed once
per call); dw contracts over tokens, which are already on partitions: I/128 PSUM banks per 512-column
slice of w accumulate x (stationary [tokens, 128]) x dy (moving [tokens, 512]) over every row tile.
With as few PSUM banks as the output projection's (I/128 x O/512 = 4, plus dx's and a transpose's) dx
and dw share one pass over the tokens (x and dy read once); with up to 8 dx takes one pass and every dw
slice a second one (dy read twice, x once); beyond, one pass over x per slice.
Backward (`norm_projection`), one pass over the tokens in four stages per group k: A (dy, inv and x in; with the mix,
x recomputed), B (per row tile g = dy w^T in PSUM, token-major, dy^T by transposes; the norm's backward on it: ScalarE
g out of PSUM, the row sum, x c and the inv scale; GpSimd g x, x c + g (and + dxo), two-input element-wise work that
costs VectorE 2N on the SBUF port the two share; dx into the group's dx tile; rms_norm(x) = inv x on ScalarE, kept for
dw; each row tile's norm backward in five stages of one engine each (g x, its row sum, the [P, 1] column, x c + g, dx:
`norm_bwd_stages`), a stage LAG row tiles after the one before it, so that no engine's next instruction waits on the
one just issued on another; row tile j + 1's dy^T transposes issue before row tile j's g matmuls, so TensorE does not
wait on their PSUM copies), the mix's backward (below), and dw = rms_norm(x)^T dy accumulated over BLOCK = 16 row
tiles in one PSUM bank per [128, 512] slice, then one ScalarE copy out of PSUM and a GpSimd add into fp32 SBUF
accumulators ([I/128] x [128, O] fp32), stored once. Program order per group: A(k + 1)'s loads, B(k) with a row tile
of the mix's GpSimd work of k - 1 and of A(k + 1)'s recomputation after each row tile's stages, the token sums of
group k - SUMS_LAG (whose mix work is done by then), dw of the block finished before k: TensorE never waits on the
same group's VectorE and GpSimd results, and GpSimd's in-order stream interleaves its groups' work.

`mix_norm_projection`: the mixing weights are broadcast to every partition once per call by a DMA whose HBM
access pattern has partition stride 0 (nki/get-started/nki-language-guide.rst, "Low-level raw access
pattern"). The mix is 3 (5 with a skip) element-wise ops per row tile on GpSimd (`tensor_tensor(engine=gpsimd)`,
isa docs tensor_tensor; GpSimd reads SBUF only), each product and sum rounded to
x's dtype as the model rounds them; the forward runs group k + 1's a row tile at a time between group k's. The
backward recomputes x the same way (x_in, x0 are read for the weights' gradients anyway; reading x would cost
a DMA pass more), forms dx = inv (g + x c) + dxo (the inv scale on ScalarE, the add on GpSimd; dy^T's
PSUM copies all go to ScalarE), then on GpSimd dx_in = m0 dx, dx0 = m1 dx (and dskip = sw dx_in). The sums
over the tokens (the partition axis) of the products dx x_in', dx x0 (and dx_in skip) are TensorE's, products
included: per row tile and 128-column slice one matmul with dx's slice stationary and x_in''s (x0's, skip's)
moving gives sum_t dx[t, c] x[t, c'] for the slice's c, c' ([128, 128] fp32 in PSUM, accumulated over every
tile of the call), whose diagonal is the slice's sums: no element-wise product on the SBUF port GpSimd and
VectorE share; at the end each block times the fp32 identity, summed along its rows (VectorE), leaves as
dmix [2, I] and dsw [1, I].

NeuronCore-v2 (trn1) rules followed (AWS docs, aws-neuron-sdk): matmuls bf16 (or fp32) pairs into fp32
PSUM, stationary free <= 128 (<= the row tile's 64 rows in tiling mode), moving free <= 512 (isa docs
nc_matmul; trn1 arch guide "Tile Size"); a VectorE instruction reads at most one PSUM input (isa docs
tensor_tensor / scalar_tensor_tensor "Memory types"); activation's bias is an [N, 1] tile and its scale an
fp32 [N, 1] tile (isa docs activation); rsqrt's input mean(x^2) + eps >= eps is in its valid range
(nki/api/nki.api.shared.rst); operands of more than 64 partitions start at partition 0, of 33-64 at 0 or 64
(a transpose's second half starts at 64; arch guide, "Accessing SBUF/PSUM tensors using compute engines"); a
DMA buffer is contiguous on both sides (arch guide, "Data movement between HBM and SBUF using DMAs").
"""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.mix_parts import mix_bwd, mix_setup, mixed, store_sums, token_sums
from kernels_nki.packing import blocks, groups, load, rows_per_partition, store, tile
from kernels_nki.projection_parts import (
    PSUM_BANKS, W, chunks, dw_block, evacuate, inv_rms, matmul_rows, norm_bwd_stages, part_chunks, products, transposed,
    weight_tiles, weight_transposed)
from kernels_nki.tiles import EPS, cdiv, identity

LAG = 2  # norm_projection_bwd: a row tile's norm-backward stage s runs LAG row tiles after its stage s - 1
SUMS_LAG = 2  # mix_norm_projection_bwd: group k's token sums issue after B(k + SUMS_LAG), its mix's GpSimd work done
BLOCK = 16  # norm_projection_bwd: row tiles whose dw partials accumulate in PSUM before the fp32 SBUF add


def _norm_out(prev, w, I, ys, inv_N1):
    """The forward's row tile `prev` = (x^T blocks, group, j, inv, the outputs' group tiles): y = inv (x w) as it
    leaves PSUM, each output's columns into its own group tile; the outputs and inv out after the group's last
    row tile."""
    xT, g, j, inv, y_gs = prev
    p = g[1]
    matmul_rows(xT, w, chunks(I), [tile(y_gs[s], g, j, ys[s].shape[1]) for s in range(len(ys))], p,
                inv[0:p, j:j + 1], True)
    if j == g[2] - 1:
        for s in range(len(ys)):
            store(ys[s], g, y_gs[s])
        store(inv_N1, g, inv)


def _fwd_input(x_NI, g, dt, R, mixing):
    """(x's group tile of group g, functions still to run per row tile to compute it): loaded, or with `mixing`
    the mixed stream (`mixed`)."""
    if mixing != None:  # noqa: E711
        mx = mixed(x_NI, mixing[0], g, dt)
        return mx[3], mx[4]
    return load(x_NI, g, dt, R), []


def _forward(x_NI, w_IO, ys, inv_N1, mixing=None):
    """y = rms_norm(x) w = inv (x w) per packed row group into the outputs `ys` (y's columns side by side: one
    output, or q, k and v), inv stored in inv_N1 (one DMA per output and group). With
    `mixing` = (`mix_setup`'s operands, xo_NI), x is the mixed stream, stored in xo_NI. Row tile t's matmuls
    follow row tile t + 1's transposes in program order; group k + 1's mixing runs a row tile at a time
    between group k's."""
    N, I = x_NI.shape
    O = w_IO.shape[1]
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    R = rows_per_partition(I)
    w = weight_tiles(w_IO, dt)
    ident = identity(dt)
    eps = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)  # v2: activation's bias is a tile
    nisa.memset(dst=eps, value=EPS)
    prev = None
    gl = list(groups(N, R))
    nxt = _fwd_input(x_NI, gl[0], dt, R, mixing)
    for op in nxt[1]:
        op()
    for k in range(len(gl)):
        g, (x_g, _) = gl[k], nxt
        p = g[1]
        if mixing != None:  # noqa: E711 (NKI has no `is`: nki/migration/index.rst)
            store(mixing[1], g, x_g)
        nxt = _fwd_input(x_NI, gl[k + 1], dt, R, mixing) if k + 1 < len(gl) else (None, [])
        inv = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
        y_gs = [nl.ndarray((P, R * y.shape[1]), dtype=dt, buffer=nl.sbuf) for y in ys]
        for j in range(g[2]):
            x_t = tile(x_g, g, j, I)
            inv_rms(inv[0:p, j:j + 1], x_t, p, eps)
            xT = transposed(x_t, p, I, dt, ident)
            if prev != None:  # noqa: E711
                _norm_out(prev, w, I, ys, inv_N1)
            prev = (xT, g, j, inv, y_gs)
            if j < len(nxt[1]):
                nxt[1][j]()
        for op in nxt[1][g[2]:]:
            op()
    _norm_out(prev, w, I, ys, inv_N1)


def _dy_group(dy_NO, g, c0, c1, dt, R):
    """Columns c0:c1 of dy's group g as a [128, R (c1 - c0)] tile (row tile j at columns j (c1 - c0) ..)."""
    O = dy_NO.shape[1]
    if c0 == 0 and c1 == O:
        return load(dy_NO, g, dt, R)
    r0, p, rr = g
    t = nl.ndarray((nl.tile_size.pmax, R * (c1 - c0)), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:p, 0:rr * (c1 - c0)],
                  src=dy_NO.ap(pattern=[[rr * O, p], [O, rr], [1, c1 - c0]], offset=r0 * O + c0))
    return t


def _dw_pass(x_NI, dy_NO, dw_IO, o0, o1, dt, ident, dx_NI=None, wT=None):
    """dw_IO[:, o0*512 : o1*512] = x^T dy over every row tile, I/128 x (o1 - o0) PSUM banks, x and that
    column range of dy read once. With dx_NI/wT it also computes dx = dy w^T in the same pass (dy read
    once in all)."""
    N, I = x_NI.shape
    O = dy_NO.shape[1]
    P = nl.tile_size.pmax
    R = rows_per_partition(I)
    c0, c1 = o0 * W, min(O, o1 * W)
    acc = [[nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum) for _ in range(o1 - o0)]
           for _ in range(cdiv(I, P))]
    for g in groups(N, R):
        p = g[1]
        x_g, dy_g = load(x_NI, g, dt, R), _dy_group(dy_NO, g, c0, c1, dt, R)
        dx_g = nl.ndarray((P, R * I), dtype=dt, buffer=nl.sbuf) if dx_NI != None else None  # noqa: E711
        for j in range(g[2]):
            x_t, dy_t = tile(x_g, g, j, I), tile(dy_g, g, j, c1 - c0)
            if dx_NI != None:  # noqa: E711
                matmul_rows(transposed(dy_t, p, O, dt, ident), wT, chunks(O), [tile(dx_g, g, j, I)], p)
            for o in range(o1 - o0):
                w = min(W, c1 - c0 - o * W)
                for i in range(cdiv(I, P)):
                    k = min(P, I - i * P)
                    nisa.nc_matmul(dst=acc[i][o][0:k, 0:w], stationary=x_t[0:p, i * P:i * P + k],
                                   moving=dy_t[0:p, o * W:o * W + w])
        if dx_NI != None:  # noqa: E711
            store(dx_NI, g, dx_g)
    for o in range(o1 - o0):
        w = min(W, c1 - c0 - o * W)
        for i in range(cdiv(I, P)):
            k = min(P, I - i * P)
            out = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)
            evacuate(out[0:k, 0:w], acc[i][o][0:k, 0:w], i % 2 == 0)
            nisa.dma_copy(dst=dw_IO[i * P:i * P + k, c0 + o * W:c0 + o * W + w], src=out[0:k, 0:w])


def _resid_out(prev, w, I, y_NO):
    """projection_fwd's row tile `prev` = (x^T blocks, group, j, r, y group tile): y = r + x w as each [rows, 512]
    product leaves PSUM (one VectorE tensor_tensor, its one PSUM input the product); y out after its group's last
    row tile."""
    xT, g, j, r_g, y_g = prev
    O = y_NO.shape[1]
    p = g[1]
    for o, ps in enumerate(products(xT, w, chunks(I), O, p)):
        c, c0 = min(W, O - o * W), j * O + o * W
        nisa.tensor_tensor(dst=y_g[0:p, c0:c0 + c], data1=ps[0:p, 0:c], data2=r_g[0:p, c0:c0 + c], op=nl.add)
    if j == g[2] - 1:
        store(y_NO, g, y_g)


@nki.jit
def projection_fwd(x_NI, w_IO, r_NO):
    """y_NO = r_NO + x_NI @ w_IO in x's dtype: the residual tile is added as each [rows, 512] product
    leaves PSUM, so x w never reaches HBM. Row tile t's matmuls follow row tile t + 1's transposes in program
    order (TensorE does not wait on each tile's PSUM copies)."""
    N, I = x_NI.shape
    O = w_IO.shape[1]
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    R = rows_per_partition(I)
    y_NO = nl.ndarray((N, O), dtype=dt, buffer=nl.shared_hbm)
    w = weight_tiles(w_IO, dt)
    ident = identity(dt)
    prev = None
    for g in groups(N, R):
        x_g, r_g = load(x_NI, g, dt, R), load(r_NO, g, dt, R)
        y_g = nl.ndarray((P, R * O), dtype=dt, buffer=nl.sbuf)
        for j in range(g[2]):
            xT = transposed(tile(x_g, g, j, I), g[1], I, dt, ident, on_scalar=True)
            if prev != None:  # noqa: E711 (NKI has no `is`)
                _resid_out(prev, w, I, y_NO)
            prev = (xT, g, j, r_g, y_g)
    _resid_out(prev, w, I, y_NO)
    return y_NO


@nki.jit
def norm_projection_fwd(x_NI, w_IO):
    """(y_NO = rms_norm(x) @ w_IO in x's dtype, inv_N1 = rsqrt(mean(x^2) + eps) fp32)."""
    N = x_NI.shape[0]
    y_NO = nl.ndarray((N, w_IO.shape[1]), dtype=x_NI.dtype, buffer=nl.shared_hbm)
    inv_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    _forward(x_NI, w_IO, (y_NO,), inv_N1)
    return y_NO, inv_N1


def _bwd_setup(x_NI, w_IO, widths=None):
    """A backward's outputs (dx_NI in x's dtype, dw_IO fp32), the transposes' identity and w^T tiles (chunked
    as dy's parts of `widths` columns: `part_chunks`; one part of all of w's columns by default)."""
    N, I = x_NI.shape
    dx_NI = nl.ndarray((N, I), dtype=x_NI.dtype, buffer=nl.shared_hbm)
    dw_IO = nl.ndarray((I, w_IO.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    ident = identity(x_NI.dtype)
    ks = part_chunks(widths if widths != None else (w_IO.shape[1],))  # noqa: E711
    return dx_NI, dw_IO, ident, weight_transposed(w_IO, x_NI.dtype, ident, ks)


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
    R = rows_per_partition(I)
    for g in groups(N, R):
        dy_g = load(dy_NO, g, dt, R)
        dx_g = nl.ndarray((P, R * I), dtype=dt, buffer=nl.sbuf)
        for j in range(g[2]):
            matmul_rows(transposed(tile(dy_g, g, j, O), g[1], O, dt, ident), wT, chunks(O), [tile(dx_g, g, j, I)],
                        g[1])
        store(dx_NI, g, dx_g)
    if banks <= PSUM_BANKS:  # every dw slice in one pass over x
        _dw_pass(x_NI, dy_NO, dw_IO, 0, slices, dt, ident)
        return dx_NI, dw_IO
    for o in range(slices):  # one pass over x per 512-column slice
        _dw_pass(x_NI, dy_NO, dw_IO, o, o + 1, dt, ident)
    return dx_NI, dw_IO


def _bwd_inputs(x_NI, inv_N1, dys, g, R, dt, mixing):
    """Backward stage A of group g: dy (its parts `dys`, one group tile each), inv and x in (with `mixing`, x
    recomputed from the block's inputs on GpSimd, and dxo in). Returns (g, dy group tiles, inv, x, dxo or None,
    (x_in', x0, skip) or None, the recomputation's per-row-tile functions, still to run)."""
    dy_g, inv = [load(dy, g, dt, R) for dy in dys], load(inv_N1, g, nl.float32, R)
    if mixing != None:  # noqa: E711
        xs, x0, sk, x_g, ops = mixed(x_NI, mixing[0], g, dt)
        return g, dy_g, inv, x_g, load(mixing[1], g, dt, R), (xs, x0, sk), ops
    return g, dy_g, inv, load(x_NI, g, dt, R), None, None, []


def _bwd_rows(st, wT, I, widths, dt, ident, scalar_copies, fills):
    """Backward stage B: per row tile g = dy w^T (token-major PSUM, dy^T by transposes of each part of dy, w^T
    chunked to match: `part_chunks`), the norm's backward into dx (+ dxo), rms_norm(x) = inv x (ScalarE) for dw.
    After each row tile's stages, the next function of each list in `fills` (other groups' GpSimd work).
    Returns (dx group tile, [(parts, xn row tile)], [dy's row tiles, one per part])."""
    P = nl.tile_size.pmax
    g, dy_g, inv, x_g, dxo = st[:5]
    p, R = g[1], dy_g[0].shape[1] // widths[0]
    dx_g = nl.ndarray((P, R * I), dtype=dt, buffer=nl.sbuf)
    xn_g = nl.ndarray((P, R * I), dtype=dt, buffer=nl.sbuf)  # rms_norm(x), dw's stationary operand
    xn_s, dy_s, live = [], [], []

    def transposes(j):  # row tile j's dy and dy^T, issued a row tile ahead of its products
        dy_t = [tile(dy_g[s], g, j, widths[s]) for s in range(len(widths))]
        dyT = []
        for s in range(len(widths)):
            dyT += transposed(dy_t[s], p, widths[s], dt, ident, False, scalar_copies)
        return dy_t, dyT

    ahead = transposes(0) if g[2] else None
    j = 0
    while j < g[2] or any(e[2] < len(e[0]) for e in live):  # until every row tile's last stage has run
        if j < g[2]:
            dy_t, dyT = ahead
            ahead = transposes(j + 1) if j + 1 < g[2] else None
            x_t, inv_j = tile(x_g, g, j, I), inv[0:p, j:j + 1]
            fs = norm_bwd_stages(tile(dx_g, g, j, I), products(dyT, wT, part_chunks(widths), I, p), x_t, inv_j, p,
                                 tile(dxo, g, j, I) if dxo != None else None)  # noqa: E711
            live.append([fs, fs[0](None), 1, x_t, inv_j, j])
            dy_s.append(dy_t)
        for e in live[::-1]:  # the older row tiles' next stages, stage s LAG s row tiles after the first
            if e[2] < len(e[0]) and j - e[5] >= e[2] * LAG:
                e[1], e[2] = e[0][e[2]](e[1]), e[2] + 1
                if e[2] == len(e[0]):
                    xn = tile(xn_g, g, len(xn_s), I)
                    nisa.activation(dst=xn, op=nl.copy, data=e[3], scale=e[4])
                    xn_s.append((p, xn))
        for f in fills:
            if j < len(f):
                f[j]()
        j += 1
    for f in fills:
        for op in f[j:]:
            op()
    return dx_g, xn_s, dy_s


def _norm_projection_bwd(x_NI, w_IO, inv_N1, dys, dx_NI, dw_IO, ident, wT, mixing=None):
    """norm_projection's backward body (see norm_projection_bwd), dy given as its parts `dys` (y's columns side
    by side: all of dy, or dq, dk and dv); with `mixing` = (`mix_setup`'s operands,
    dxo_NI, (dx_NI, dx0_NI, dskip_NI), red), x is recomputed from the block's inputs, the residual path's
    gradient dxo is added to dx, and the mixing's backward (`mix_bwd`, `token_sums`) runs on the result. Per
    group k the stages run in the program order A(k + 1), B(k), the token sums of k - SUMS_LAG, dw of the block
    before k's, the mixing's backward of k (module docstring)."""
    N, I = x_NI.shape
    O = w_IO.shape[1]
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    R = rows_per_partition(I)
    mix = mixing != None  # noqa: E711
    acc = [nl.zeros((P, O), dtype=nl.float32, buffer=nl.sbuf) for _ in range(cdiv(I, P))]
    blks = blocks(N, R, BLOCK)
    gs = [g for blk in blks for g in blk]
    last = [blk[-1] for blk in blks]
    widths = [dy.shape[1] for dy in dys]
    st = _bwd_inputs(x_NI, inv_N1, dys, gs[0], R, dt, mixing)
    for op in st[6]:
        op()
    sums, pend_dw, pend_mix, xn_b, dy_b = [], None, [], [], []
    for k in range(len(gs)):
        nxt = _bwd_inputs(x_NI, inv_N1, dys, gs[k + 1], R, dt, mixing) if k + 1 < len(gs) else None
        fills = [pend_mix, nxt[6] if nxt != None else []]  # noqa: E711
        dx_g, xn_s, dy_s = _bwd_rows(st, wT, I, widths, dt, ident, mix, fills)
        xn_b, dy_b = xn_b + xn_s, dy_b + dy_s
        if len(sums) == SUMS_LAG:
            token_sums(*sums.pop(0), I, mixing[3])
        if pend_dw != None:  # noqa: E711
            dw_block(acc, pend_dw[0], pend_dw[1], I, O)
        pend_dw = None
        if gs[k] in last:
            pend_dw, xn_b, dy_b = (xn_b, dy_b), [], []
        if mix:
            xs, x0, sk = st[5]
            pairs, pend_mix = mix_bwd(dx_g, xs, x0, sk, mixing[0], gs[k], mixing[2], dt)
            sums.append((pairs, gs[k]))
        else:
            store(dx_NI, gs[k], dx_g)
        st, dx_g, xn_s, dy_s = nxt, None, None, None
    for op in pend_mix:
        op()
    for pairs, g in sums:
        token_sums(pairs, g, I, mixing[3])
    if pend_dw != None:  # noqa: E711
        dw_block(acc, pend_dw[0], pend_dw[1], I, O)
    for i in range(cdiv(I, P)):
        k = min(P, I - i * P)
        nisa.dma_copy(dst=dw_IO[i * P:i * P + k], src=acc[i][0:k])


@nki.jit
def norm_projection_bwd(x_NI, w_IO, inv_N1, dy_NO):
    """(dx_NI in x's dtype, dw_IO fp32) of y = rms_norm(x) w: g = dy w^T, dx = the norm's backward of g,
    dw = (inv x)^T dy. One pass over the tokens; dw partials of BLOCK row tiles accumulate in one PSUM
    bank per [128, 512] slice, then one ScalarE copy and a GpSimd add into fp32 SBUF accumulators."""
    dx_NI, dw_IO, ident, wT = _bwd_setup(x_NI, w_IO)
    _norm_projection_bwd(x_NI, w_IO, inv_N1, (dy_NO,), dx_NI, dw_IO, ident, wT)
    return dx_NI, dw_IO


@nki.jit
def mix_norm_projection_fwd(x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, widths):
    """(x = mix[0] x_in' + mix[1] x0 with x_in' = x_in (+ sw skip) in x_in's dtype, q_NQ, k_NK, v_NV, inv_N1
    fp32) with [q | k | v] = rms_norm(x) w_IO, `widths` = (Q, K, V) the three outputs' columns (a compile-time
    constant; each written in the packed row groups the attention kernel reads): the block's residual mix (and
    a decoder block's U-Net skip add) before the q/k/v projection; mix_2I and sw_1I fp32 (values of x's
    dtype), skip_NI and sw_1I both None for no skip."""
    N, I = x_NI.shape
    dt = x_NI.dtype
    xo_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm)
    ys = tuple(nl.ndarray((N, c), dtype=dt, buffer=nl.shared_hbm) for c in widths)
    inv_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    mix = mix_setup(x0_NI, mix_2I, skip_NI, sw_1I, rows_per_partition(I), dt)
    _forward(x_NI, w_IO, ys, inv_N1, (mix, xo_NI))
    return (xo_NI,) + ys + (inv_N1,)


@nki.jit
def mix_norm_projection_bwd(x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, inv_N1, dxo_NI, dq_NQ, dk_NK, dv_NV):
    """(dx_NI, dx0_NI in x's dtype, dmix_2I fp32, dw_IO fp32[, dskip_NI in x's dtype, dsw_1I fp32]) given dq, dk,
    dv (the projection's gradient, y's three parts) and dxo (the written x's): dx = dxo + the norm projection's
    backward, then the mixing's; dmix and dsw are fp32 sums over the tokens (PSUM), the skip's outputs only with
    a skip."""
    N, I = x_NI.shape
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    dys = (dq_NQ, dk_NK, dv_NV)
    dx_NI, dw_IO, ident, wT = _bwd_setup(x_NI, w_IO, [dy.shape[1] for dy in dys])
    skip = skip_NI != None  # noqa: E711
    dx0_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm)
    dmix_2I = nl.ndarray((2, I), dtype=nl.float32, buffer=nl.shared_hbm)
    dskip_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm) if skip else None
    dsw_1I = nl.ndarray((1, I), dtype=nl.float32, buffer=nl.shared_hbm) if skip else None
    red = nl.ndarray((P, (3 if skip else 2) * cdiv(I, P) * P), dtype=nl.float32, buffer=nl.psum)
    mix = mix_setup(x0_NI, mix_2I, skip_NI, sw_1I, rows_per_partition(I), dt)
    mixing = (mix, dxo_NI, (dx_NI, dx0_NI, dskip_NI), red)
    _norm_projection_bwd(x_NI, w_IO, inv_N1, dys, dx_NI, dw_IO, ident, wT, mixing)
    ident32 = identity(nl.float32)
    store_sums(red, 0, dmix_2I, ident32)
    if skip:
        store_sums(red, 2, dsw_1I, ident32)
        return dx_NI, dx0_NI, dmix_2I, dw_IO, dskip_NI, dsw_1I
    return dx_NI, dx0_NI, dmix_2I, dw_IO
