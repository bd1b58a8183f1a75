"""Packed row groups: token-major [N, C] HBM arrays moved several rows per partition (a kernel-helper file:
no @nki.jit).

A row group (r0, parts, R) is the rows r0 .. r0 + parts R with partition p holding the R consecutive rows
r0 + p R .. + R: one DMA moves it with R C itemsize contiguous bytes per partition on both sides (HBM and
SBUF). AWS's DMA guides: a DMA buffer is contiguous in the address map on both sides (arch guide
nki/guides/architecture/trainium_inferentia2_arch.rst, "Data movement between HBM and SBUF using DMAs"), and
throughput grows with the buffer to about 4 KiB per partition, 2 KiB the minimum recommended (aws-neuron-sdk
nki/deep-dives/nki-dma-bandwidth-guide.rst, "Bandwidth vs. Payload Size"; nki/get-started/about/
nki-dma-overview.rst, "Performance Considerations"). A 512-wide bf16 row is 1 KiB, so kernels take R rows per
partition (`rows_per_partition`).

Row tile j of a group (j < R) is the [parts, C] slice j C .. (j + 1) C of its SBUF tile: rows r0 + p R + j over
the partitions p. Row-wise work does not care about that order; a contraction over the tokens (the partition
axis) neither, as long as both operands are the same row tile; a matmul whose output rows are tokens writes
them into the same slice of an output group tile, stored with one DMA. Where a consumer needs the group's
tokens in natural order along the free axis (an [X, tokens] tile), row tile j's tokens are the free-axis
columns j, j + R, ... of that tile (`columns`). A group's per-row statistic [N, 1] is [parts, R]: R elements
per partition, one DMA per group.
"""

import nki.isa as nisa
import nki.language as nl

GROUP_ELEMS = 4096  # elements per partition of a packed group: 8 KiB in bf16, past the payload curve's knee


def rows_per_partition(C, elems=GROUP_ELEMS, cap=None):
    """R: rows per partition so that a group holds about `elems` elements per partition (at least 1, at most cap)."""
    r = max(1, elems // C)
    return min(cap, r) if cap != None else r  # noqa: E711 (NKI has no `is`)


def groups(N, R):
    """[(r0, parts, R')]: full groups of 128 x R rows, then the rest as 128 x R' rows (R' < R) and a last group
    of fewer than 128 single rows (sliced, never padded)."""
    P = nl.tile_size.pmax
    full = N // (P * R)
    out = [(g * P * R, P, R) for g in range(full)]
    r0 = full * P * R
    if N - r0 >= P:
        out.append((r0, P, (N - r0) // P))
        r0 += P * ((N - r0) // P)
    if N > r0:
        out.append((r0, N - r0, 1))
    return out


def blocks(N, R, cap):
    """`groups(N, R)` in runs of consecutive groups holding at most `cap` row tiles each (lists of groups)."""
    out, cur, tiles = [], [], 0
    for g in groups(N, R):
        _, _, rows = g
        if cur and tiles + rows > cap:
            out.append(cur)
            cur, tiles = [], 0
        cur.append(g)
        tiles += rows
    return out + ([cur] if cur else [])


def rows_ap(a_NC, g):
    """Group g = (r0, parts, R) of an [N, C] HBM array as [parts, R C]: partition p holds rows r0 + p R .. + R."""
    r0, parts, R = g
    C = a_NC.shape[1]
    return a_NC.ap(pattern=[[R * C, parts], [1, R * C]], offset=r0 * C)


def load(src_NC, g, dt, R):
    """Group g of src as a [128, R C] SBUF tile in dt (the DMA casts), R >= g's rows per partition."""
    P = nl.tile_size.pmax
    C = src_NC.shape[1]
    _, parts, rows = g
    t = nl.ndarray((P, R * C), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:parts, 0:rows * C], src=rows_ap(src_NC, g))
    return t


def store(dst_NC, g, t):
    """dst's group g = t[0:parts, 0:R C] (one DMA)."""
    _, parts, rows = g
    nisa.dma_copy(dst=rows_ap(dst_NC, g), src=t[0:parts, 0:rows * dst_NC.shape[1]])


def tile(t, g, j, C):
    """Row tile j of group g held in t: the [parts, C] view of rows r0 + p R + j."""
    _, parts, _ = g
    return t[0:parts, j * C:(j + 1) * C]


def columns(g, j, c0=0):
    """Row tile j's tokens in a tile whose free axis holds group g's tokens in order from column c0."""
    r0, parts, R = g
    return slice(c0 + j, c0 + j + (parts - 1) * R + 1, R)


def row_tile_ap(a_NC, g, j):
    """Row tile j of group g of an [N, C] HBM array as [parts, C] (rows r0 + p R + j)."""
    r0, parts, R = g
    C = a_NC.shape[1]
    return a_NC.ap(pattern=[[R * C, parts], [1, C]], offset=(r0 + j) * C)
