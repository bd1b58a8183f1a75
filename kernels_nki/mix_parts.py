"""The residual-mix front-end of `mix_norm_projection` (`kernels_nki/projection.py`; a kernel-helper file, no
@nki.jit): x = m0 x_in' + m1 x0 with x_in' = x_in (+ sw skip) on packed row groups (`kernels_nki.packing`: one DMA per
operand and group, the element-wise ops over the whole [parts, R I] group tile), and its backward with the token sums
of dmix and dsw on TensorE (the products too: the diagonal of a matmul over the tokens). The spec and the engine
choices are in projection.py's docstring.
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import load, store
from kernels_nki.tiles import cdiv


def sb(cols, dt):
    """A fresh [128, cols] SBUF tile in dt."""
    return nl.ndarray((nl.tile_size.pmax, cols), dtype=dt, buffer=nl.sbuf)


def gp(dst, a, b, op):
    """dst = op(a, b) element-wise on GpSimd (SBUF operands only: isa docs, 'GpSimd Engine cannot access PSUM')."""
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op, engine=nisa.engine.gpsimd)


def broadcast(v_KI, k, dt):
    """Row k of v_KI on every partition, a [128, I] tile in dt: one DMA whose HBM access pattern has partition
    stride 0 (nki/get-started/nki-language-guide.rst, "Low-level raw access pattern")."""
    P = nl.tile_size.pmax
    I = v_KI.shape[1]
    t = sb(I, dt)
    nisa.dma_copy(dst=t, src=v_KI.ap(pattern=[[0, P], [1, I]], offset=k * I))
    return t


def mix_setup(x0_NI, mix_2I, skip_NI, sw_1I, R, dt):
    """The mixing's operands for `mixed`: (x0, skip or None, m0, m1, sw or None, R), the weights broadcast (R:
    rows per partition of the kernel's groups)."""
    sw = broadcast(sw_1I, 0, dt) if skip_NI != None else None  # noqa: E711 (NKI has no `is`)
    return x0_NI, skip_NI, broadcast(mix_2I, 0, dt), broadcast(mix_2I, 1, dt), sw, R


def _each(dst, a, b, g, I, op, j):
    """dst = op(a, b) on row tile j of group g ([128, R I] tiles; b may be a [128, I] broadcast weight)."""
    c, cb = slice(j * I, (j + 1) * I), slice(0, I) if b.shape[1] == I else slice(j * I, (j + 1) * I)
    gp(dst[0:g[1], c], a[0:g[1], c], b[0:g[1], cb], op)


def mixed(x_NI, mix, g, dt):
    """(x_in', x0, skip or None, x, ops) as [128, R I] group tiles of group g: x = m0 x_in' + m1 x0 with x_in' =
    x_in (+ sw skip), each product and sum rounded to dt as the model rounds them; on GpSimd. The tiles are
    loaded here; `ops` holds one function per row tile computing its slice (the caller runs them all, spread
    over other work)."""
    x0_NI, skip_NI, m0, m1, sw, R = mix
    I = x_NI.shape[1]
    xs, x0, sk = load(x_NI, g, dt, R), load(x0_NI, g, dt, R), None
    t, xs2 = None, None
    if skip_NI != None:  # noqa: E711
        sk, t, xs2 = load(skip_NI, g, dt, R), sb(R * I, dt), sb(R * I, dt)
    a, b, x = sb(R * I, dt), sb(R * I, dt), sb(R * I, dt)
    xi = xs2 if skip_NI != None else xs  # noqa: E711

    def op(j):
        if skip_NI != None:  # noqa: E711
            _each(t, sk, sw, g, I, nl.multiply, j)
            _each(xs2, xs, t, g, I, nl.add, j)
        _each(a, xi, m0, g, I, nl.multiply, j)
        _each(b, x0, m1, g, I, nl.multiply, j)
        _each(x, a, b, g, I, nl.add, j)

    return xi, x0, sk, x, [lambda j=j: op(j) for j in range(g[2])]


def mix_bwd(dx, xs, x0, sk, mix, g, outs, dt):
    """The mixing's backward of group g from dx, x's whole gradient ([128, R I] group tiles): dx_in = m0 dx,
    dx0 = m1 dx (and dskip = sw dx_in) on GpSimd, stored. Returns (the pairs (dx, x_in'), (dx, x0) (and (dx_in,
    skip)) whose products' token sums are dmix (and dsw), for `token_sums`; one function per row tile computing
    its slices, the last also storing the outputs)."""
    x0_NI, skip_NI, m0, m1, sw, R = mix
    I = outs[0].shape[1]
    dxi, dx0 = sb(R * I, dt), sb(R * I, dt)
    dsk = sb(R * I, dt) if sk != None else None  # noqa: E711
    pairs = [(dx, xs), (dx, x0)] + ([(dxi, sk)] if sk != None else [])  # noqa: E711

    def op(j):
        _each(dxi, dx, m0, g, I, nl.multiply, j)
        _each(dx0, dx, m1, g, I, nl.multiply, j)
        if sk != None:  # noqa: E711
            _each(dsk, dxi, sw, g, I, nl.multiply, j)
        if j == g[2] - 1:
            store(outs[0], g, dxi)
            store(outs[1], g, dx0)
            if sk != None:  # noqa: E711
                store(outs[2], g, dsk)

    return pairs, [lambda j=j: op(j) for j in range(g[2])]


def token_sums(pairs, g, I, red):
    """The token sums of the pairs' products over group g into `red` ([128, n I/128 x 128] fp32 PSUM, a [128,
    128] block per pair and 128-column slice): sum_t a[t, c] b[t, c'] for every c, c' of a slice is one matmul
    over a row tile (the tokens are the contraction axis: stationary a's slice, moving b's), accumulating in
    PSUM over every tile of the call; the sums wanted are its diagonal (`store_sums`). TensorE forms the
    products exactly (fp32 accumulation), instead of an element-wise pass per product on the SBUF port. A bank
    holds several blocks, each its own accumulation group, so the flag is explicit: the call's first row tile
    (tile 0 of the group at row 0) overwrites, every later one accumulates."""
    P = nl.tile_size.pmax
    nb = cdiv(I, P)
    for j, (a, b) in enumerate(pairs):
        for r in range(g[2]):
            for c in range(nb):
                k, c0, col = min(P, I - c * P), r * I + c * P, (j * nb + c) * P
                nisa.nc_matmul(dst=red[0:k, col:col + k], stationary=a[0:g[1], c0:c0 + k],
                               moving=b[0:g[1], c0:c0 + k], accumulate=g[0] + r > 0)


def store_sums(red, j0, dst_KI, ident32):
    """dst_KI[j] (fp32) = the token sums on the diagonals of `red`'s blocks (j0 + j) x I/128 ... (`token_sums`):
    each block times the fp32 identity (VectorE, from PSUM) and summed along its row (VectorE) is a [k, 1]
    column holding its entries c*128 .. on partitions, which goes out as a [k, 1] HBM access pattern."""
    P = nl.tile_size.pmax
    K, I = dst_KI.shape
    nb = cdiv(I, P)
    for j in range(K):
        for c in range(nb):
            k, col = min(P, I - c * P), ((j0 + j) * nb + c) * P
            d = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=d[0:k, 0:k], data1=red[0:k, col:col + k], data2=ident32[0:k, 0:k], op=nl.multiply)
            t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=t[0:k], op=nl.add, data=d[0:k, 0:k], axis=1, keepdims=True)
            nisa.dma_copy(dst=dst_KI.ap(pattern=[[1, k], [1, 1]], offset=j * I + c * P), src=t[0:k])
