"""The backward body of `norm_projection` and `mix_norm_projection` (a kernel-helper file: no @nki.jit; entry
points in `kernels_nki.projection.kernels`): one pass over the tokens, as two stage tables
(`kernels_nki.tiles.pipeline`), one over the row groups and, inside its stage B, one over a group's row tiles.
Engine and port choices: docs/kernels/projection.md, "The norm's backward"."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import blocks, load, rows_per_partition, store, tile
from kernels_nki.projection.forward import drain
from kernels_nki.projection.matmul import W, part_chunks, pieces, products, sb, transposed
from kernels_nki.projection.mix import mix_bwd, mixed, token_sums
from kernels_nki.projection.state import BwdGroup, BwdRow, DwBlock
from kernels_nki.tiles import (
    accumulate_weight_grad, norm_grad_columns, norm_grad_combine, norm_grad_products, norm_grad_sum, pipeline,
    row_tiles)

LAG = 2  # a row tile's norm-backward stage s runs LAG row tiles after its stage s - 1
BLOCK = 16  # row tiles whose dw partials accumulate in PSUM before the fp32 SBUF add


def dw_block(acc, blk, I, O):
    """acc[i] += xn^T dy over a DwBlock's row tiles (dy's row tiles per part, side by side: `pieces`;
    `accumulate_weight_grad`). A slice of several parts holds one accumulation group per part in its bank, so the
    flag is explicit: the block's first row tile overwrites, the rest accumulate."""
    def matmuls(g_ps, k0, k, o0, w):
        for s, (parts, xn) in enumerate(blk.xn):
            dy_t = blk.dy[s]
            for t, a, b, off in pieces(dy_t, o0, o0 + w):
                nisa.nc_matmul(dst=g_ps[0:k, off:off + b - a], stationary=xn[0:parts, k0:k0 + k],
                               moving=dy_t[t][0:parts, a:b], accumulate=s > 0)

    accumulate_weight_grad(acc, I, O, W, matmuls)


def group_rows(grp, blk, wT, I, widths, dt, ident, mixing, fills):
    """Stage B of a row group (a BwdGroup, its dy, inv and x in): per row tile, g = dy w^T (token-major PSUM; dy^T
    by TensorE transposes of each part, w^T chunked to match: `part_chunks`), the RMSNorm backward of g into
    dx = inv (g + x c) (+ dxo), c = -mean(g x) inv^2 (kernels_nki.tiles.norm_grad_*), and rms_norm(x) = inv x
    (ScalarE) kept for dw in `blk`. Each norm stage is one engine's step, LAG row tiles after the one before it,
    so that no engine's next instruction waits on the one just issued on another; after each row tile, one
    function of each list in `fills` (other groups' GpSimd work). Per row tile j:

        (0, transposes)        dy^T of row tile j, a row tile ahead of its g matmuls
        (1, g_rows)            g = dy w^T in PSUM; g out of PSUM (ScalarE) and g x (GpSimd)
        (1 + LAG, row_sum)     sum(g x) per row (ScalarE)
        (1 + 2 LAG, column)    the [P, 1] column c (VectorE)
        (1 + 3 LAG, combine)   g + x c (ScalarE scale, GpSimd add)
        (1 + 4 LAG, scale)     dx = inv (g + x c) (+ dxo: GpSimd); rms_norm(x) = inv x; the row tile let go
        (1, fill)              one function of each of `fills`
    """
    g = grp.g
    _, parts, n = g
    R = rows_per_partition(I)
    grp.dx = sb(R * I, dt)
    grp.xn = sb(R * I, dt)  # rms_norm(x), dw's stationary operand
    ks = part_chunks(widths)
    dyT, nrows = [], []

    def transposes(j):
        dy_t = [tile(dy, g, j, widths[s]) for s, dy in enumerate(grp.dy)]
        t = []
        for s, dy in enumerate(dy_t):
            t += transposed(dy, parts, widths[s], dt, ident, False, mixing)
        blk.dy.append(dy_t)
        dyT.append(t)

    def g_rows(j):
        row = BwdRow(j=j, x=tile(grp.x, g, j, I), inv=grp.inv[0:parts, j:j + 1], dx=tile(grp.dx, g, j, I))
        if mixing:
            row.dxo = tile(grp.dxo, g, j, I)
        row.st = norm_grad_products(products(dyT.pop(0), wT, ks, I, parts), row.x, parts, W)
        nrows.append(row)

    def row_sum(j):
        nrows[j].st = norm_grad_sum(nrows[j].st, parts)

    def column(j):
        row = nrows[j]
        row.st = norm_grad_columns(row.st, row.x, row.inv, parts)

    def combine(j):
        row = nrows[j]
        row.st = norm_grad_combine(row.st, row.x, parts)

    def scale(j):
        row = nrows[j]
        work = row.st
        if mixing:
            nisa.activation(dst=work[0:parts], op=nl.copy, data=work[0:parts], scale=row.inv)
            nisa.tensor_tensor(dst=row.dx, data1=work[0:parts], data2=row.dxo, op=nl.add, engine=nisa.engine.gpsimd)
        else:
            nisa.activation(dst=row.dx, op=nl.copy, data=work[0:parts], scale=row.inv)
        xn = tile(grp.xn, g, j, I)
        nisa.activation(dst=xn, op=nl.copy, data=row.x, scale=row.inv)
        blk.xn.append((parts, xn))
        nrows[j] = None

    def fill(j):
        for f in fills:
            if len(f) > 0:
                f.pop(0)()

    pipeline(n, [(0, transposes), (1, g_rows), (1 + LAG, row_sum), (1 + 2 * LAG, column), (1 + 3 * LAG, combine),
                 (1 + 4 * LAG, scale), (1, fill)])


def norm_backward(x_NI, w_IO, inv_N1, dys, dx_NI, dw_IO, ident, wT, mix=None):
    """dx_NI and dw_IO (fp32) of y = rms_norm(x) w, dy given as its parts `dys` (y's columns side by side: all of
    dy, or dq, dk and dv); with `mix` (a Mixing), x is recomputed from the block's inputs, the residual path's
    gradient dxo is added to dx, and the mix's backward (`mix_bwd`, `token_sums`) runs on the result. dw partials
    of BLOCK row tiles accumulate in PSUM, then go into fp32 SBUF accumulators, stored once. Per group k:

        (0, inputs)              A: dy, inv and x in (with the mix: x_in, x0 (skip), dxo in, x's recompute queued)
        (1, rows)                B: `group_rows`, filled with the mix's backward of k - 1 and x's recompute of k + 1
        (2, finish_mix)          what B(k + 1) left of k's mix backward
        (0, finish_recompute)    what B(k - 1) left of k's recompute (all of group 0's)
        (2, sums)                the token sums of dmix (dsw) over k, its mix backward done
        (2, weight_grads)        dw of the block ending at group k (`dw_block`), the block let go
        (1, mix_backward)        the mix's backward of k queued (`mix_bwd`), or dx stored; the group let go
    """
    N, I = x_NI.shape
    O = w_IO.shape[1]
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    R = rows_per_partition(I)
    mixing = mix != None  # noqa: E711 (NKI has no `is`: nki/migration/index.rst)
    widths = [dy.shape[1] for dy in dys]
    acc = [nl.zeros((P, O), dtype=nl.float32, buffer=nl.sbuf) for _ in row_tiles(I)]
    gs, block_of, ends, dwb = [], [], [], []
    for b, blk in enumerate(blocks(N, R, BLOCK)):
        dwb.append(DwBlock(xn=[], dy=[]))
        for i, g in enumerate(blk):
            gs.append(g)
            block_of.append(b)
            ends.append(i == len(blk) - 1)
    grps, pairs, recompute, mix_ops = [], [], [], []

    def inputs(k):
        g = gs[k]
        grp = BwdGroup(g=g, dy=[load(dy, g, dt, R) for dy in dys], inv=load(inv_N1, g, nl.float32, R))
        if mixing:
            grp.mixed = mixed(x_NI, mix, g, dt)
            grp.x, grp.dxo = grp.mixed.x, load(mix.dxo_NI, g, dt, R)
            recompute.extend(grp.mixed.ops)
        else:
            grp.x = load(x_NI, g, dt, R)
        grps.append(grp)

    def rows(k):
        group_rows(grps[k], dwb[block_of[k]], wT, I, widths, dt, ident, mixing, [mix_ops, recompute])

    def finish_mix(k):
        drain(mix_ops)

    def finish_recompute(k):
        drain(recompute)

    def sums(k):
        if mixing:
            token_sums(pairs[k], gs[k], I, mix.red)
            pairs[k] = None

    def weight_grads(k):
        if ends[k]:
            dw_block(acc, dwb[block_of[k]], I, O)
            dwb[block_of[k]] = None

    def mix_backward(k):
        grp = grps[k]
        grps[k] = None
        if mixing:
            grp_pairs, ops = mix_bwd(grp.dx, grp.mixed, mix, grp.g, dt)
            pairs.append(grp_pairs)
            mix_ops.extend(ops)
        else:
            store(dx_NI, grp.g, grp.dx)

    pipeline(len(gs), [(0, inputs), (1, rows), (2, finish_mix), (0, finish_recompute), (2, sums),
                       (2, weight_grads), (1, mix_backward)])
    for i, i0, k in row_tiles(I):
        nisa.dma_copy(dst=dw_IO[i0:i0 + k], src=acc[i][0:k])
