"""Loading one head's rows and their transposes for the attention kernels (a kernel-helper file: no
@nki.jit; the NKI compiler inlines the functions a kernel calls, whichever file holds them; under the emulator
`kernels_nki.emulator.loader` loads it for the kernel file): `head_rows` (a 128-row block of one head and its
transpose), `kv_head` (all blocks of a kv head and k^T), `v_aug` ([v | 1] tiles), `causal_bias` (identity, causal
bias, ones), `half_matmul` (a contraction on one 64-row half of the PE array), `dims`. Engine and port choices:
docs/kernels/attention.md.
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.attention.layout import block, natural_cols
from kernels_nki.attention.rope_norm import prep_tile, scale_rows
from kernels_nki.attention.state import CausalBias, RowNorm
from kernels_nki.tiles import cdiv, identity, row_tiles, stacked_transpose, transpose


NEG = -1.0e30  # masked raw score: exp(scale * NEG - ...) is exactly 0


def dims(q_BTHK, k_BTGK):
    """(B, T, H, K, G, R query heads per kv head, P partitions, dtype, softmax scale 1/sqrt(K))."""
    B, T, H, K = q_BTHK.shape
    G = k_BTGK.shape[2]
    return B, T, H, K, G, H // G, nl.tile_size.pmax, q_BTHK.dtype, 1.0 / (K ** 0.5)


def causal_bias(dt, key_major=False):
    """The call's `CausalBias` ([128, 128] each in dt, built once per call on GpSimd): mask is 0 where key j <=
    query p, NEG above (the scores get it as identity^T mask accumulated into their PSUM tile); key_major: the
    mask transposed (NEG where key p > query j), for key-major scores."""
    P = nl.tile_size.pmax
    zero = nl.zeros((P, P), dtype=dt, buffer=nl.sbuf)
    one = nl.ones((P, P), dtype=dt, buffer=nl.sbuf)
    bias = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
    d = 1 if key_major else -1
    nisa.affine_select(dst=bias, pattern=[[d, P]], offset=0, channel_multiplier=-d, on_true_tile=zero,
                       on_false_value=NEG, cmp_op=nl.greater_equal)
    return CausalBias(ident=identity(dt), mask=bias, ones=one)


def head_rows(t, rows, dt, ident, saved=()):
    """A 128-row tile of one head, t (a [P, K] `block` view), and its [K, 128] transpose (leaving PSUM on VectorE).
    With `saved` = (y, inv, yT), the forward's outputs as views (yT None where not needed), the tile is replaced by
    y (norm: a `RowNorm` for `prep_grad`, xn = x inv on VectorE) and the transpose is yT, loaded, not transposed.
    -> (tile, transpose, norm or ())."""
    K = t.shape[1]
    P = nl.tile_size.pmax
    if saved:
        y, inv_P1, yT = saved
        xn = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        scale_rows(xn, t, rows, inv_P1)
        xk = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)  # -xn / K, from x on VectorE
        nisa.tensor_scalar(dst=xk[0:rows], data=t[0:rows], op0=nl.multiply, operand0=inv_P1[0:rows], op1=nl.multiply,
                           operand1=-1.0 / K)
        return y, yT, RowNorm(xn=xn, inv=inv_P1, xk=xk)
    tT = nl.ndarray((K, P), dtype=dt, buffer=nl.sbuf)
    transpose(tT[0:K, 0:rows], t[0:rows], rows, K, ident, on_vector=True)
    return t, tT, ()


def kv_head(x_sb, G, g, T, dt, ident, tables=(), saved=(), out=(), perm=False, dup=False):
    """All T rows of kv head g (x_sb: the batch's `seq_tile`): 128-row tile views [keys, K], the transpose
    [K, T] (leaving PSUM on ScalarE) and each tile's norm (`head_rows`): with `tables`
    (cos/sin tiles) the forward's rotated, normed rows (`prep_tile`), written to out = (y seq tile, inv seq
    tile); with `saved` = (kr seq tile, kinv seq tile, krT [K, T] SBUF) the backward's. x_sb, tables and out
    in one layout (`perm`, `seq_dma`); the transpose in natural row order (`natural_cols`); with `dup` (K = 64)
    a [128, T] transpose holding it twice, on both halves of the partitions (`stacked_transpose`), beside both
    halves of a stacked pair of query heads' tiles."""
    P = nl.tile_size.pmax
    nt = cdiv(T, P)
    K = x_sb.shape[1] // (nt * G)
    if saved:
        y_sb, inv_sb, xT = saved
    else:
        xT = nl.ndarray((2 * K if dup else K, T), dtype=dt, buffer=nl.sbuf)
    rows = [r for _, _, r in row_tiles(T)]
    views = [block(x_sb, i, g, G, K) for i in range(nt)]
    if tables:
        y_sb, inv_sb = out
        ys = prep_tile([(views[i], rows[i], tables[i], (block(y_sb, i, g, G, K), block(inv_sb, i, g, G, 1)))
                        for i in range(nt)], (), inv_sb[:, g:(nt - 1) * G + g + 1:G])
        tiles, norms = [y for y, _ in ys], [inv for _, inv in ys]
    elif saved:
        got = [head_rows(views[i], rows[i], dt, None,
                         saved=(block(y_sb, i, g, G, K), block(inv_sb, i, g, G, 1), None)) for i in range(nt)]
        tiles, norms = [t for t, _, _ in got], [n for _, _, n in got]
    else:
        tiles, norms = views, [()] * nt
    if not saved:
        for i in range(nt):
            if dup:
                stacked_transpose(natural_cols(xT, i, T, perm), [tiles[i], tiles[i]], rows[i], ident)
            else:
                transpose(natural_cols(xT, i, T, perm), tiles[i][0:rows[i]], rows[i], K, ident)
    return tiles, xT, norms


def half_matmul(dst, stationary, moving, half, name=None):
    """nc_matmul; with `half` (0 / 1) a contraction of <= 64 rows whose operands both sit on that half of the
    partitions (64 half .. 64 half + 63) runs on the 64-row tile of the PE array there (row tiling mode,
    NeuronCore-v2 or newer: nki/api/nki/isa/__init__.py nc_matmul, "Tiling mode"), so that two such matmuls
    on different halves run in parallel; `half` None: the whole array (a row tile multiplies its own
    partitions: rule strict.row_tile_partitions of kernels_nki.emulator.rules). `name`: the instruction's name
    (a "recompute..." name marks a product computed a second time: kernels_nki.emulator counts it not
    useful)."""
    if half != None and stationary.shape[0] <= 64:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, tile_position=(half * 64, 0),
                       tile_size=(64, 128), name=name)
    else:
        nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, name=name)


def kv_head_saved(k_sb, G, g, T, dt, ident, tables, outs, krT_BGKT, b, perm=False):
    """The fused forward's k side (`kv_head` with the rope tables): its normed, rotated rows and their inverse
    RMS written to outs = (kr seq tile, kinv seq tile), the transpose stored to krT_BGKT[b, g] (one DMA)
    -> (tiles, transpose)."""
    k_tiles, kT, _ = kv_head(k_sb, G, g, T, dt, ident, tables, out=outs, perm=perm)
    nisa.dma_copy(dst=krT_BGKT[b, g], src=kT)
    return k_tiles, kT


def v_aug(v_sb, G, g, T, dt):
    """All T rows of value head g (v_sb: the batch's `seq_tile`) as 128-row tiles [keys, K + 1]: v and a ones
    column, so that p [v | 1] carries the softmax's row sums in its last column; one [P, n, K + 1] tile (GpSimd
    memset and copy, one more copy for a ragged last tile) -> the n [P, K + 1] views."""
    P = nl.tile_size.pmax
    n, tail = T // P, T % P
    nt = cdiv(T, P)
    K = v_sb.shape[1] // (nt * G)
    aug = nl.ndarray((P, nt, K + 1), dtype=dt, buffer=nl.sbuf)
    nisa.memset(dst=aug[:, :, K:K + 1], value=1.0, engine=nisa.engine.gpsimd)
    src = v_sb.reshape((P, nt, G * K))
    if n:
        nisa.tensor_copy(dst=aug[:, 0:n, 0:K], src=src[:, 0:n, g * K:(g + 1) * K], engine=nisa.engine.gpsimd)
    if tail:
        nisa.tensor_copy(dst=aug[0:tail, n, 0:K], src=src[0:tail, n, g * K:(g + 1) * K], engine=nisa.engine.gpsimd)
    return [aug[:, j, :] for j in range(nt)]

