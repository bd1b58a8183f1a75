"""The projection kernels' forward bodies (a kernel-helper file: no @nki.jit; entry points in
`kernels_nki.projection.kernels`): y = r + x w and y = rms_norm(x) w (x optionally the residual mix), per row
tile of packed row groups, as stage tables (`kernels_nki.tiles.pipeline`). Layout and engines:
docs/kernels/projection.md."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import groups, load, rows_per_partition, store, tile
from kernels_nki.projection.matmul import W, chunks, matmul_rows, products, sb, transposed
from kernels_nki.projection.mix import mixed
from kernels_nki.projection.state import FwdGroup, FwdRow
from kernels_nki.projection.weights import weight_tiles
from kernels_nki.tiles import EPS, identity, pipeline, row_tiles


def row_items(gs):
    """[(k, g, j)]: row tile j of group k (g) for every row tile of the groups gs, in order."""
    out = []
    for k, g in enumerate(gs):
        _, _, rows = g
        for j in range(rows):
            out.append((k, g, j))
    return out


def drain(ops):
    """Issue every function still queued in `ops`, oldest first."""
    while len(ops) > 0:
        ops.pop(0)()


def resid_forward(x_NI, w_IO, r_NO, y_NO):
    """y_NO = r_NO + x_NI w_IO (x's dtype). Per row tile t, a stage table over every row tile:

        (0, transposes)  x^T of row tile t (its group's x and r loaded, y allocated at the group's first row tile)
        (1, add_out)     y = r + x w as each [rows, 512] product leaves PSUM (one VectorE add); y stored after
                         the group's last row tile, and the group's tiles let go
    """
    N, I = x_NI.shape
    O = w_IO.shape[1]
    dt = x_NI.dtype
    R = rows_per_partition(I)
    w = weight_tiles(w_IO, dt)
    ident = identity(dt)
    items, grps, rows = row_items(groups(N, R)), [], []
    cols = row_tiles(O, W)

    def transposes(t):
        k, g, j = items[t]
        _, parts, n = g
        if j == 0:
            grps.append(FwdGroup(g=g, x=load(x_NI, g, dt, R), r=load(r_NO, g, dt, R),
                                 y=sb(R * O, dt)))
        xT = transposed(tile(grps[k].x, g, j, I), parts, I, dt, ident, on_scalar=True)
        rows.append(FwdRow(grp=grps[k], j=j, xT=xT))
        if j == n - 1:
            grps[k].x = None  # its last row tile transposed

    def add_out(t):
        k, _, _ = items[t]
        row = rows.pop(0)
        grp, j = row.grp, row.j
        _, parts, n = grp.g
        for o, acc in enumerate(products(row.xT, w, chunks(I), O, parts)):
            _, o0, c = cols[o]
            c0 = j * O + o0
            nisa.tensor_tensor(dst=grp.y[0:parts, c0:c0 + c], data1=acc[0:parts, 0:c],
                               data2=grp.r[0:parts, c0:c0 + c], op=nl.add)
        if j == n - 1:
            store(y_NO, grp.g, grp.y)
            grps[k] = None

    pipeline(len(items), [(0, transposes), (1, add_out)])


def inv_rms(inv, x_t, rows, eps_P1):
    """inv[0:rows] ([rows, 1] fp32) = rsqrt(mean(x^2) + eps) per row of x_t (ScalarE: the squares with their row
    sum, then rsqrt on the column; as kernels_nki/rmsnorm.py)."""
    D = x_t.shape[1]
    sq = sb(D, x_t.dtype)  # discarded: only the row sum is kept
    ss = sb(1, nl.float32)
    nisa.activation_reduce(dst=sq[0:rows], op=nl.square, data=x_t[0:rows], reduce_op=nl.add, reduce_res=ss[0:rows])
    nisa.activation(dst=inv[0:rows], op=nl.rsqrt, data=ss[0:rows], scale=1.0 / D, bias=eps_P1[0:rows])


def norm_forward(x_NI, w_IO, ys, inv_N1, mix=None):
    """y = rms_norm(x) w = inv (x w) into the outputs `ys` (y's columns side by side: one output, or q, k and v),
    inv stored in inv_N1. With `mix` (a Mixing), x is the mixed stream, stored in mix.xo_NI; group k + 1's mix
    is queued when group k starts and issued a row tile at a time between group k's. Per row tile t:

        (0, transposes)  inv and x^T of row tile t (at its group's first: x stored (mix), group k + 1's input in)
        (1, scale_out)   y = inv (x w) as it leaves PSUM; the outputs and inv stored after the group's last row tile
                         (and the group's tiles let go)
        (0, mix_step)    one row tile of group k + 1's mix (the rest after group k's last row tile)
    """
    N, I = x_NI.shape
    dt = x_NI.dtype
    R = rows_per_partition(I)
    mixing = mix != None  # noqa: E711 (NKI has no `is`: nki/migration/index.rst)
    w = weight_tiles(w_IO, dt)
    ident = identity(dt)
    eps = sb(1, nl.float32)  # v2: activation's bias is a tile
    nisa.memset(dst=eps, value=EPS)
    gs = groups(N, R)
    items, inputs, grps, rows, ops = row_items(gs), [], [], [], []

    def group_input(k):  # group k's x: loaded, or with the mix its operands loaded and its GpSimd work queued
        if mixing:
            mg = mixed(x_NI, mix, gs[k], dt)
            ops.extend(mg.ops)
            inputs.append(mg.x)
        else:
            inputs.append(load(x_NI, gs[k], dt, R))

    def transposes(t):
        k, g, j = items[t]
        _, parts, n = g
        if j == 0:
            if mixing:
                store(mix.xo_NI, g, inputs[k])
            if k + 1 < len(gs):
                group_input(k + 1)
            grps.append(FwdGroup(g=g, x=inputs[k], inv=sb(R, nl.float32), ys=[sb(R * y.shape[1], dt) for y in ys]))
            inputs[k] = None
        grp = grps[k]
        x_t = tile(grp.x, g, j, I)
        inv_rms(grp.inv[0:parts, j:j + 1], x_t, parts, eps)
        rows.append(FwdRow(grp=grp, j=j, xT=transposed(x_t, parts, I, dt, ident)))
        if j == n - 1:
            grp.x = None  # its last row tile transposed

    def scale_out(t):
        k, _, _ = items[t]
        row = rows.pop(0)
        grp, j = row.grp, row.j
        g = grp.g
        _, parts, n = g
        dsts = [tile(grp.ys[s], g, j, y.shape[1]) for s, y in enumerate(ys)]
        matmul_rows(row.xT, w, chunks(I), dsts, parts, grp.inv[0:parts, j:j + 1], True)
        if j == n - 1:
            for s, y in enumerate(ys):
                store(y, g, grp.ys[s])
            store(inv_N1, g, grp.inv)
            grps[k] = None

    def mix_step(t):
        _, g, j = items[t]
        _, _, n = g
        if len(ops) > 0:
            ops.pop(0)()
        if j == n - 1:
            drain(ops)

    group_input(0)
    drain(ops)  # group 0's mix: nothing to hide it behind
    pipeline(len(items), [(0, transposes), (1, scale_out), (0, mix_step)])
