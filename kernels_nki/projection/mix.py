"""The residual mix of `mix_norm_projection` (a kernel-helper file: no @nki.jit): x = m0 x_in' + m1 x0 with
x_in' = x_in (+ sw skip) on packed row groups (`kernels_nki.packing`: one DMA per operand and group), on GpSimd a
row tile at a time, and its backward with the token sums of dmix and dsw on TensorE (the products too: the diagonal
of a matmul over the tokens). Engine choices: docs/kernels/projection.md, "The mix on GpSimd"."""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import load, store
from kernels_nki.projection.matmul import sb
from kernels_nki.projection.state import MixedGroup, Mixing
from kernels_nki.tiles import row_tiles


def broadcast(v_KI, k, dt):
    """Row k of v_KI on every partition, a [128, I] tile in dt: one DMA whose HBM access pattern has partition
    stride 0 (nki/get-started/nki-language-guide.rst, "Low-level raw access pattern")."""
    P = nl.tile_size.pmax
    I = v_KI.shape[1]
    t = sb(I, dt)
    nisa.dma_copy(dst=t, src=v_KI.ap(pattern=[[0, P], [1, I]], offset=k * I))
    return t


def mix_setup(x0_NI, mix_2I, skip_NI, sw_1I, R, dt, **outputs):
    """The Mixing of a call: the weights broadcast, R the rows per partition of the kernel's groups; `outputs`
    the HBM tensors the kernel writes (Mixing's fields)."""
    skip = skip_NI != None  # noqa: E711 (NKI has no `is`: nki/migration/index.rst)
    sw = broadcast(sw_1I, 0, dt) if skip else None
    return Mixing(x0_NI=x0_NI, skip_NI=skip_NI, skip=skip, m0=broadcast(mix_2I, 0, dt), m1=broadcast(mix_2I, 1, dt),
                  sw=sw, R=R, **outputs)


def _each(dst, a, b, g, I, op, j):
    """dst = op(a, b) on GpSimd (SBUF operands only: isa docs, 'GpSimd Engine cannot access PSUM') on row tile j
    of group g ([128, R I] tiles; b may be a [128, I] broadcast weight)."""
    _, parts, _ = g
    c, cb = slice(j * I, (j + 1) * I), slice(0, I) if b.shape[1] == I else slice(j * I, (j + 1) * I)
    nisa.tensor_tensor(dst=dst[0:parts, c], data1=a[0:parts, c], data2=b[0:parts, cb], op=op,
                       engine=nisa.engine.gpsimd)


def mixed(x_NI, mix, g, dt):
    """Group g's MixedGroup: x_in, x0 (and the skip) loaded; x = m0 x_in' + m1 x0 with x_in' = x_in (+ sw skip),
    each product and sum rounded to dt as the model rounds them, as one function per row tile (`ops`, for the
    caller to spread over other work)."""
    R, I = mix.R, x_NI.shape[1]
    _, _, rows = g
    xs, x0 = load(x_NI, g, dt, R), load(mix.x0_NI, g, dt, R)
    xi, sk, t = xs, None, None  # xi: x_in'
    if mix.skip:
        sk, t, xi = load(mix.skip_NI, g, dt, R), sb(R * I, dt), sb(R * I, dt)
    a, b, x = sb(R * I, dt), sb(R * I, dt), sb(R * I, dt)

    def op(j):
        if mix.skip:
            _each(t, sk, mix.sw, g, I, nl.multiply, j)
            _each(xi, xs, t, g, I, nl.add, j)
        _each(a, xi, mix.m0, g, I, nl.multiply, j)
        _each(b, x0, mix.m1, g, I, nl.multiply, j)
        _each(x, a, b, g, I, nl.add, j)

    return MixedGroup(xs=xi, x0=x0, sk=sk, x=x, ops=[lambda j=j: op(j) for j in range(rows)])


def mix_bwd(dx, mg, mix, g, dt):
    """The mix's backward of group g from dx, x's whole gradient ([128, R I] group tile; mg its MixedGroup): dx_in
    = m0 dx, dx0 = m1 dx (and dskip = sw dx_in) on GpSimd, stored. Returns (the pairs (dx, x_in'), (dx, x0) (and
    (dx_in, skip)) whose products' token sums are dmix (and dsw), for `token_sums`; one function per row tile
    computing its slices, the last also storing the outputs)."""
    R, I = mix.R, mix.dx_NI.shape[1]
    _, _, rows = g
    dxi, dx0, dsk = sb(R * I, dt), sb(R * I, dt), None
    pairs = [(dx, mg.xs), (dx, mg.x0)]
    if mix.skip:
        dsk = sb(R * I, dt)
        pairs.append((dxi, mg.sk))

    def op(j):
        _each(dxi, dx, mix.m0, g, I, nl.multiply, j)
        _each(dx0, dx, mix.m1, g, I, nl.multiply, j)
        if mix.skip:
            _each(dsk, dxi, mix.sw, g, I, nl.multiply, j)
        if j == rows - 1:
            store(mix.dx_NI, g, dxi)
            store(mix.dx0_NI, g, dx0)
            if mix.skip:
                store(mix.dskip_NI, g, dsk)

    return pairs, [lambda j=j: op(j) for j in range(rows)]


def token_sums(pairs, g, I, red):
    """The token sums of the pairs' products over group g into `red` ([128, n I/128 x 128] fp32 PSUM, a [128,
    128] block per pair and 128-column slice): sum_t a[t, c] b[t, c'] for every c, c' of a slice is one matmul
    over a row tile (the tokens are the contraction axis: stationary a's slice, moving b's), accumulating in
    PSUM over every tile of the call; the sums wanted are its diagonal (`store_sums`). A bank holds several
    blocks, each its own accumulation group, so the flag is explicit: the call's first row tile (tile 0 of the
    group at row 0) overwrites, every later one accumulates."""
    P = nl.tile_size.pmax
    r0, parts, rows = g
    nb = len(row_tiles(I))
    for j, (a, b) in enumerate(pairs):
        for r in range(rows):
            for c, c1, k in row_tiles(I):
                c0, col = r * I + c1, (j * nb + c) * P
                nisa.nc_matmul(dst=red[0:k, col:col + k], stationary=a[0:parts, c0:c0 + k],
                               moving=b[0:parts, c0:c0 + k], accumulate=r0 + r > 0)


def store_sums(red, j0, dst_KI, ident32):
    """dst_KI[j] (fp32) = the token sums on the diagonals of `red`'s blocks (j0 + j) x I/128 ... (`token_sums`):
    each block times the fp32 identity (VectorE, from PSUM) and summed along its row (VectorE) is a [k, 1]
    column holding its entries c*128 .. on partitions, which goes out as a [k, 1] HBM access pattern."""
    P = nl.tile_size.pmax
    K, I = dst_KI.shape
    nb = len(row_tiles(I))
    for j in range(K):
        for c, c0, k in row_tiles(I):
            col = ((j0 + j) * nb + c) * P
            d = sb(P, nl.float32)
            nisa.tensor_tensor(dst=d[0:k, 0:k], data1=red[0:k, col:col + k], data2=ident32[0:k, 0:k], op=nl.multiply)
            t = sb(1, nl.float32)
            nisa.tensor_reduce(dst=t[0:k], op=nl.add, data=d[0:k, 0:k], axis=1, keepdims=True)
            nisa.dma_copy(dst=dst_KI.ap(pattern=[[1, k], [1, 1]], offset=j * I + c0), src=t[0:k])
