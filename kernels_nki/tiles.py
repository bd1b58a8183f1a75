"""Kernel helpers shared by the kernel files (a kernel-helper file: no @nki.jit; the NKI compiler inlines
functions a kernel calls, whichever file holds them; under the emulator `kernels_nki.emulator.loader`
loads this file against the emulated nki for the kernel files that import from it).

- `cdiv`, `EPS` (the RMSNorm epsilon, float32 machine epsilon == frontier_jax.ops.reference.RMS_EPS).
- `row_tiles(n, size)`: the tiles of an axis of n elements as (index, start, size) (the last one ragged).
- `pipeline(n, table)`: a software pipeline over n items written as a stage table.
- `identity(dt)`: the [128, 128] identity, the moving operand of every TensorE transpose.
- `transpose_to_psum` / `transpose`: a TensorE transpose as two <= 64-row halves, each on its own 64-row
  tile of the PE array so that the two run in parallel and a [128, 128] transpose streams 64 identity
  columns per tile instead of 128 (and a <= 64-column source uses a 64-column tile too) (aws-neuron-sdk nki/api/nki/isa/__init__.py nc_matmul, "Tiling mode":
  2 x 64-row tiles on NeuronCore-v2; "Transpose mode" / nc_transpose: TensorE transposes by a matmul
  against the identity, is_transpose labels it; the result is fp32 PSUM, as nc_matmul requires on
  NeuronCore-v2).
- `accumulate_weight_grad`: a weight gradient contracted over tokens in PSUM, slice by slice, added to fp32 SBUF.
- `norm_grad_rows` and its four steps: the RMSNorm backward of one row tile before its final scale.
"""

import nki.isa as nisa
import nki.language as nl

EPS = 1.1920928955078125e-07  # float32 machine epsilon == frontier_jax.ops.reference.RMS_EPS
HALF = 64  # a row tile of the PE array in row tiling mode on NeuronCore-v2


def cdiv(a, b):
    return (a + b - 1) // b


def row_tiles(n, size=None):
    """[(i, start, rows)]: tile i of an axis of n elements covers start .. start + rows (rows = size, default the
    partition count nl.tile_size.pmax, read at the call; the last tile's rows the remainder). A list, not a generator: lists of tuples are NKI values (aws-neuron-sdk
    nki/get-started/nki-language-guide.rst, "NKI Values"), generators are not listed there."""
    size = size or nl.tile_size.pmax
    return [(i, i * size, min(size, n - i * size)) for i in range(cdiv(n, size))]


def pipeline(n, table):
    """A software pipeline over items 0 .. n - 1 written as a stage table: table = [(offset, stage), ...], one row
    per stage in program order within a step; step s runs stage(s - offset) for each row with 0 <= s - offset < n,
    so the prologue and the epilogue follow from the offsets and a re-ordering is a change to the table. Stages
    hand results to later stages through lists they append to and pop from (oldest first). The explicit form of
    the same order is AWS nki-library's attention_cte.py steady state (src/nkilib_src/nkilib/core/attention/
    attention_cte.py, `_attention_cte_impl`: one call per stage at grp_i, grp_i + 1, grp_i + 2)."""
    last = 0
    for offset, _ in table:
        last = max(last, offset)
    for s in range(n + last):
        for offset, stage in table:
            if 0 <= s - offset < n:
                stage(s - offset)


def identity(dt):
    """[128, 128] identity in dt, built once per call on GpSimd (affine_select)."""
    P = nl.tile_size.pmax
    one = nl.ones((P, P), dtype=dt, buffer=nl.sbuf)
    ident = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, pattern=[[-1, P]], offset=0, channel_multiplier=1, on_true_tile=one,
                       on_false_value=0.0, cmp_op=nl.equal)
    return ident


def transpose_to_psum(dst_ps, src, rows, ident, col0=0, p0=0):
    """dst_ps[0:cols, 0:rows] (fp32 PSUM) = src[0:rows, 0:cols]^T: rows r0:r0+64 are the stationary operand
    of a matmul against the identity in the 64-row tile at r0 of the PE array; src of <= 64 columns also
    fits a 64-column tile (column tiling, the same "Tiling mode"; the tile at column col0, 0 or 64, since PE
    column c writes PSUM partition c: dst_ps starts at partition col0), so each half costs 64 x 64 PEs instead
    of 64 x 128. p0 (0 or 64): the partition src starts at, for <= 64 rows: the row tile and the identity's
    block there, so both operands sit on the tile's partitions. Each half overwrites its PSUM locations
    (accumulate=False): other transposes may share dst_ps's bank, where inferring the flag would accumulate
    if inference is per bank (rule strict.accumulate_inference of kernels_nki.emulator.rules)."""
    cols = src.shape[1]
    ctile = HALF if cols <= HALF else nl.tile_size.pmax
    for h in range(cdiv(rows, HALF)):
        r0 = h * HALF
        rh = min(HALF, rows - r0)
        i0 = p0 + r0
        nisa.nc_matmul(dst=dst_ps[:, r0:r0 + rh], stationary=src[r0:r0 + rh], moving=ident[i0:i0 + rh, i0:i0 + rh],
                       is_transpose=True, accumulate=False, tile_position=(i0, col0), tile_size=(HALF, ctile))


def stacked_transpose(dst, srcs, rows, ident):
    """dst (SBUF [128, >= rows]) = two [rows, 64] tiles srcs transposed one above the other (srcs[s]^T on
    partitions 64 s .. 64 s + 64: `transpose_to_psum` on the column tiles at 0 and 64 of one PSUM tile),
    leaving PSUM by one ScalarE copy where one 64-column tile's transpose would fill half the partitions."""
    P = nl.tile_size.pmax
    t_ps = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
    for s, src in enumerate(srcs):
        transpose_to_psum(t_ps[s * HALF:(s + 1) * HALF, 0:rows], src[0:rows, 0:HALF], rows, ident, s * HALF)
    nisa.activation(dst=dst[0:P], op=nl.copy, data=t_ps[0:P, 0:rows])


def transpose(dst, src, rows, cols, ident, on_vector=False):
    """dst[0:cols, 0:rows] (SBUF) = src[0:rows, 0:cols]^T (`transpose_to_psum`), leaving PSUM on ScalarE
    (`activation(op=nl.copy)`: NeuronCore-v2 has no ScalarE tensor_copy, isa docs tensor_copy) or, with
    on_vector, on VectorE (GpSimd cannot read PSUM: same docs)."""
    P = nl.tile_size.pmax
    t_ps = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
    transpose_to_psum(t_ps[0:cols, 0:rows], src[0:rows, 0:cols], rows, ident)
    if on_vector:
        nisa.tensor_copy(dst=dst, src=t_ps[0:cols, 0:rows], engine=nisa.engine.vector)
    else:
        nisa.activation(dst=dst, op=nl.copy, data=t_ps[0:cols, 0:rows])


def accumulate_weight_grad(acc, K, C, width, matmuls, on_vector=False):
    """acc[i] ([128, C] fp32 SBUF, one per row tile i of K) += a weight gradient, one PSUM bank per [128, width]
    slice: for each row tile (k0, ki) of K and column slice (c0, cw) of C, `matmuls(g_ps, k0, ki, c0, cw)` issues the
    matmuls contracting the tokens into g_ps[0:ki, 0:cw] (fp32 PSUM), then the slice leaves PSUM into the
    accumulator: by one ScalarE copy and a GpSimd add from SBUF (default: one input on the VectorE/ScalarE PSUM port,
    where a VectorE add reading PSUM holds it about twice as long: trn1 arch guide nki/guides/architecture/
    trainium_inferentia2_arch.rst, "Data Movement" and "Vector Engine / Performance Consideration"), or, with
    on_vector, by one VectorE add reading PSUM (where ScalarE is the busier engine)."""
    P = nl.tile_size.pmax
    for i, k0, ki in row_tiles(K):
        for _, c0, cw in row_tiles(C, width):
            g_ps = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.psum)
            matmuls(g_ps, k0, ki, c0, cw)
            a = acc[i][0:ki, c0:c0 + cw]
            if on_vector:
                nisa.tensor_tensor(dst=a, data1=a, data2=g_ps[0:ki, 0:cw], op=nl.add)
            else:
                g_s = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=g_s[0:ki, 0:cw], op=nl.copy, data=g_ps[0:ki, 0:cw])
                nisa.tensor_tensor(dst=a, data1=a, data2=g_s[0:ki, 0:cw], op=nl.add, engine=nisa.engine.gpsimd)


def norm_grad_rows(g, x_t, inv, rows, width):
    """work [P, D] fp32 = g + x c, c = -mean(g x) inv^2: the RMSNorm backward of one row tile before its final
    scale (dx = inv work), with g (the gradient w.r.t. the normalised rows) as fp32 PSUM tiles of `width`
    columns and inv the forward's [P, 1] inverse RMS. The work leaves the VectorE/GpSimd SBUF port and the
    VectorE/ScalarE PSUM port where it can (trn1 arch guide nki/guides/architecture/trainium_inferentia2_arch.rst,
    "Data Movement": VectorE and GpSimd cannot access SBUF in parallel, VectorE and ScalarE cannot access PSUM in
    parallel): g leaves PSUM by one-input ScalarE copies (N cycles, where a two-input VectorE instruction costs
    ~2N at a lower clock: same guide, "Vector Engine / Performance Consideration" and the "Compute Engine"
    table), the row sum and x c (its per-partition scale: isa docs activation, scale an [N, 1] tile) run on
    ScalarE, the [P, 1] column c on VectorE, g x and g + x c on GpSimd (SBUF only). Four steps, each taking the
    previous one's result (`kernels_nki.projection.norm_backward.group_rows` interleaves them over row tiles)."""
    st = norm_grad_sum(norm_grad_products(g, x_t, rows, width), rows)
    return norm_grad_combine(norm_grad_columns(st, x_t, inv, rows), x_t, rows)


def norm_grad_products(g, x_t, rows, width):
    """`norm_grad_rows`' first step: (g_s = g in SBUF (ScalarE), work = g x (GpSimd))."""
    P = nl.tile_size.pmax
    D = x_t.shape[1]
    g_s = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
    work = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
    for c, c0, cw in row_tiles(D, width):
        cols = slice(c0, c0 + cw)
        nisa.activation(dst=g_s[0:rows, cols], op=nl.copy, data=g[c][0:rows, 0:cw])
        nisa.tensor_tensor(dst=work[0:rows, cols], data1=g_s[0:rows, cols], data2=x_t[0:rows, cols],
                           op=nl.multiply, engine=nisa.engine.gpsimd)
    return g_s, work


def norm_grad_sum(st, rows):
    """The second step: (g_s, work, dot = sum(g x) per row [P, 1] fp32, ScalarE)."""
    g_s, work = st
    dot = nl.ndarray((nl.tile_size.pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=work[0:rows], op=nl.copy, data=work[0:rows], reduce_op=nl.add, reduce_res=dot[0:rows])
    return g_s, work, dot


def norm_grad_columns(st, x_t, inv, rows):
    """The third step: (g_s, work, c = -mean(g x) inv^2, VectorE)."""
    g_s, work, dot = st
    D = x_t.shape[1]
    cc = nl.ndarray((nl.tile_size.pmax, 1), dtype=nl.float32, buffer=nl.sbuf)  # c = (dot * -1/D * inv) * inv
    nisa.tensor_scalar(dst=cc[0:rows], data=dot[0:rows], op0=nl.multiply, operand0=-1.0 / D, op1=nl.multiply,
                       operand1=inv[0:rows])
    nisa.tensor_scalar(dst=cc[0:rows], data=cc[0:rows], op0=nl.multiply, operand0=inv[0:rows])
    return g_s, work, cc


def norm_grad_combine(st, x_t, rows):
    """The last step: work = g + x c (x c ScalarE's per-partition scale, the add on GpSimd)."""
    g_s, work, cc = st
    nisa.activation(dst=work[0:rows], op=nl.copy, data=x_t[0:rows], scale=cc[0:rows])  # x c
    nisa.tensor_tensor(dst=work[0:rows], data1=work[0:rows], data2=g_s[0:rows], op=nl.add,
                       engine=nisa.engine.gpsimd)
    return work
