"""Our own equivalents of the matmul kernels AWS profiles in nki/guides/tutorials/kernel-optimization.rst.

One kernel, three schedules of result[M, N] = lhsT[K, M].T @ rhs[K, N] on [128 x 128] stationary and
[128 x 512] moving tiles accumulated in PSUM (fp32 inputs, as the tutorial's test driver):
- "tiled": both operand tiles loaded from HBM right before each matmul;
- "hoisted": a 128-column strip of lhsT loaded once per output row block, the rhs strip once per
  output tile;
- "blocked": output blocks of block_m x block_n tiles, the lhsT and rhs strips of a block loaded
  once and reused by every tile of the block.
Costed by bench/cost_calibration.py against the engine activity AWS publishes for its versions.
"""

import nki
import nki.isa as nisa
import nki.language as nl


def _strip(src, rows, c0, width, dt):
    """src[0:rows, c0:c0+width] as rows/128 SBUF tiles [128, width]."""
    P = nl.tile_size.pmax
    tiles = []
    for k in nl.affine_range(rows // P):
        t = nl.ndarray((P, width), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src[k * P:(k + 1) * P, c0:c0 + width])
        tiles.append(t)
    return tiles


def _out_tile(result, acc, r0, c0):
    P, W = acc.shape
    out = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=acc)
    nisa.dma_copy(dst=result[r0:r0 + P, c0:c0 + W], src=out)


@nki.jit
def matmul_schedule(lhsT, rhs, schedule="tiled", block_m=1, block_n=1):
    K, M = lhsT.shape
    N = rhs.shape[1]
    P, W = nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // (P * block_m)):
        lhs_strips = []
        if schedule != "tiled":
            lhs_strips = [_strip(lhsT, K, (m * block_m + i) * P, P, lhsT.dtype) for i in range(block_m)]
        for n in nl.affine_range(N // (W * block_n)):
            rhs_strips = []
            if schedule != "tiled":
                rhs_strips = [_strip(rhs, K, (n * block_n + j) * W, W, rhs.dtype) for j in range(block_n)]
            for i in nl.affine_range(block_m):
                for j in nl.affine_range(block_n):
                    r0, c0 = (m * block_m + i) * P, (n * block_n + j) * W
                    acc = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // P):
                        if schedule == "tiled":
                            a = _strip(lhsT[k * P:(k + 1) * P], P, r0, P, lhsT.dtype)[0]
                            b = _strip(rhs[k * P:(k + 1) * P], P, c0, W, rhs.dtype)[0]
                        else:
                            a, b = lhs_strips[i][k], rhs_strips[j][k]
                        nisa.nc_matmul(dst=acc, stationary=a, moving=b)
                    _out_tile(result, acc, r0, c0)
    return result


@nki.jit
def matmul_blocked_k(lhsT, rhs, block_m=16, block_n=2, block_k=8):
    """All three dimensions blocked: per column block of block_n x 512, fp32 SBUF accumulators for every
    output tile of the column; per block_k x 128 slice of the contraction, the rhs slice is loaded once,
    then per row block the lhsT slice, the PSUM partial sums added into the accumulators (VectorE)."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    P, W = nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    BM, BN, BK = P * block_m, W * block_n, P * block_k
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for n in nl.affine_range(N // BN):
        acc = []
        for i in range(M // P):
            row = []
            for j in range(block_n):
                t = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)
                nisa.memset(dst=t, value=0.0)
                row.append(t)
            acc.append(row)
        for kb in nl.sequential_range(K // BK):
            rhs_tiles = _strip(rhs[kb * BK:(kb + 1) * BK], BK, n * BN, BN, rhs.dtype)
            for mb in nl.affine_range(M // BM):
                lhs_tiles = _strip(lhsT[kb * BK:(kb + 1) * BK], BK, mb * BM, BM, lhsT.dtype)
                for j in nl.affine_range(block_n):
                    for i in nl.affine_range(block_m):
                        ps = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum)
                        for k in nl.affine_range(block_k):
                            nisa.nc_matmul(dst=ps, stationary=lhs_tiles[k][0:P, i * P:(i + 1) * P],
                                           moving=rhs_tiles[k][0:P, j * W:(j + 1) * W])
                        a = acc[mb * block_m + i][j]
                        nisa.tensor_tensor(dst=a, data1=a, data2=ps, op=nl.add)
                lhs_tiles = ()  # the slice's SBUF is free before the next one is loaded
            rhs_tiles = ()
        for i in nl.affine_range(M // P):
            row = nl.ndarray((P, BN), dtype=nl.float32, buffer=nl.sbuf)
            for j in nl.affine_range(block_n):
                nisa.tensor_copy(dst=row[0:P, j * W:(j + 1) * W], src=acc[i][j])
            nisa.dma_copy(dst=result[i * P:(i + 1) * P, n * BN:(n + 1) * BN], src=row)
    return result
