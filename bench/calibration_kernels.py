"""Our own equivalents of kernels whose performance AWS publishes: the matmuls AWS profiles in
nki/guides/tutorials/kernel-optimization.rst, and the three fused-Mamba kernels of
nki/guides/tutorials/fused_mamba.rst (below).

One kernel, three schedules of result[M, N] = lhsT[K, M].T @ rhs[K, N] on [128 x 128] stationary and
[128 x 512] moving tiles accumulated in PSUM (fp32 inputs, as the tutorial's test driver):
- "tiled": both operand tiles loaded from HBM right before each matmul;
- "hoisted": a 128-column strip of lhsT loaded once per output row block, the rhs strip once per
  output tile;
- "blocked": output blocks of block_m x block_n tiles, the lhsT and rhs strips of a block loaded
  once and reused by every tile of the block.
Costed by bench/cost_calibration.py against the engine activity AWS publishes for its versions, and (bf16, the
result in the inputs' dtype: `input_dtype_result`) against the trn1 latencies the earlier matrix multiplication
tutorial published for the same four steps.
"""

import nki
import nki.isa as nisa
import nki.language as nl


def _strip(src, rows, c0, width, dt):
    """src[0:rows, c0:c0+width] as rows/128 SBUF tiles [128, width]."""
    P = nl.tile_size.pmax
    tiles = []
    for k in range(rows // P):
        t = nl.ndarray((P, width), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src[k * P:(k + 1) * P, c0:c0 + width])
        tiles.append(t)
    return tiles


def _out_tile(result, acc, r0, c0):
    P, W = acc.shape
    out = nl.ndarray((P, W), dtype=result.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=acc)
    nisa.dma_copy(dst=result[r0:r0 + P, c0:c0 + W], src=out)


@nki.jit
def matmul_schedule(lhsT, rhs, schedule="tiled", block_m=1, block_n=1, input_dtype_result=False):
    K, M = lhsT.shape
    N = rhs.shape[1]
    P, W = nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype if input_dtype_result else nl.float32, buffer=nl.shared_hbm)
    for m in range(M // (P * block_m)):
        lhs_strips = []
        if schedule != "tiled":
            lhs_strips = [_strip(lhsT, K, (m * block_m + i) * P, P, lhsT.dtype) for i in range(block_m)]
        for n in range(N // (W * block_n)):
            rhs_strips = []
            if schedule != "tiled":
                rhs_strips = [_strip(rhs, K, (n * block_n + j) * W, W, rhs.dtype) for j in range(block_n)]
            for i in range(block_m):
                for j in range(block_n):
                    r0, c0 = (m * block_m + i) * P, (n * block_n + j) * W
                    acc = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum)
                    for k in range(K // P):
                        if schedule == "tiled":
                            a = _strip(lhsT[k * P:(k + 1) * P], P, r0, P, lhsT.dtype)[0]
                            b = _strip(rhs[k * P:(k + 1) * P], P, c0, W, rhs.dtype)[0]
                        else:
                            a, b = lhs_strips[i][k], rhs_strips[j][k]
                        nisa.nc_matmul(dst=acc, stationary=a, moving=b)
                    _out_tile(result, acc, r0, c0)
    return result


@nki.jit
def matmul_blocked_k(lhsT, rhs, block_m=16, block_n=2, block_k=8, input_dtype_result=False):
    """All three dimensions blocked: per column block of block_n x 512, fp32 SBUF accumulators for every
    output tile of the column; per block_k x 128 slice of the contraction, the rhs slice is loaded once,
    then per row block the lhsT slice, the PSUM partial sums added into the accumulators (VectorE)."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    P, W = nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    BM, BN, BK = P * block_m, W * block_n, P * block_k
    result = nl.ndarray((M, N), dtype=lhsT.dtype if input_dtype_result else nl.float32, buffer=nl.shared_hbm)
    for n in range(N // BN):
        acc = []
        for i in range(M // P):
            row = []
            for j in range(block_n):
                t = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)
                nisa.memset(dst=t, value=0.0)
                row.append(t)
            acc.append(row)
        for kb in range(K // BK):
            rhs_tiles = _strip(rhs[kb * BK:(kb + 1) * BK], BK, n * BN, BN, rhs.dtype)
            for mb in range(M // BM):
                lhs_tiles = _strip(lhsT[kb * BK:(kb + 1) * BK], BK, mb * BM, BM, lhsT.dtype)
                for j in range(block_n):
                    for i in range(block_m):
                        ps = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum)
                        for k in range(block_k):
                            nisa.nc_matmul(dst=ps, stationary=lhs_tiles[k][0:P, i * P:(i + 1) * P],
                                           moving=rhs_tiles[k][0:P, j * W:(j + 1) * W])
                        a = acc[mb * block_m + i][j]
                        nisa.tensor_tensor(dst=a, data1=a, data2=ps, op=nl.add)
                lhs_tiles = ()  # the slice's SBUF is free before the next one is loaded
            rhs_tiles = ()
        for i in range(M // P):
            row = nl.ndarray((P, BN), dtype=result.dtype, buffer=nl.sbuf)
            for j in range(block_n):
                nisa.tensor_copy(dst=row[0:P, j * W:(j + 1) * W], src=acc[i][j])
            nisa.dma_copy(dst=result[i * P:(i + 1) * P, n * BN:(n + 1) * BN], src=row)
    return result


# ----------------------------------------------------------------------------- the fused-Mamba tutorial
# aws-neuron-sdk nki/guides/tutorials/fused_mamba.rst, "Mapping Mamba Layer to NeuronCore" (steps 1-6) and its
# three versions, written here from that text: per batch, channel tile (128 channels on the partitions) and
# state: deltaA = exp(delta * A) on ScalarE (nisa.activation with A as the scale), deltaBu = delta * u * B
# (two tensor_tensor, B broadcast over the partitions), the scan (tensor_tensor_scan), times C (broadcast),
# accumulated over the states (tensor_tensor). fp32 throughout, as the tutorial's driver.


def _mamba_state(delta_i, u_i, acc, A, B, C, b, c0, s, l0, L, scan_init=None, delta_u=None):
    """One state's steps 1-6 over the sequence columns [l0, l0 + L) of a channel tile; the scan's last
    column carried through `scan_init` when the sequence is tiled (v3); `delta_u`: delta * u of the whole
    channel tile, computed once (else per state)."""
    P = delta_i.shape[0]
    dt = delta_i.dtype
    a_i = nl.ndarray((P, 1), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_i, src=A[c0:c0 + P, s:s + 1])
    delta_a = nl.ndarray((P, L), dtype=dt, buffer=nl.sbuf)
    nisa.activation(dst=delta_a, op=nl.exp, data=delta_i[0:P, l0:l0 + L], scale=a_i)
    b_i = nl.ndarray((1, L), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=b_i, src=B[b, s:s + 1, l0:l0 + L])
    if delta_u == None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        du = nl.ndarray((P, L), dtype=dt, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=du, data1=delta_i[0:P, l0:l0 + L], data2=u_i[0:P, l0:l0 + L], op=nl.multiply)
    else:
        du = delta_u[0:P, l0:l0 + L]
    delta_bu = nl.ndarray((P, L), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=delta_bu, data1=du, data2=nl.broadcast_to(b_i, (P, L)), op=nl.multiply)
    scan = nl.ndarray((P, L), dtype=dt, buffer=nl.sbuf)
    initial = 0.0 if scan_init == None else scan_init  # noqa: E711
    nisa.tensor_tensor_scan(dst=scan, data0=delta_a, data1=delta_bu, initial=initial, op0=nl.multiply, op1=nl.add)
    if scan_init != None:  # noqa: E711
        nisa.tensor_copy(dst=scan_init, src=scan[0:P, L - 1:L])
    c_i = nl.ndarray((1, L), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=c_i, src=C[b, s:s + 1, l0:l0 + L])
    scan_c = nl.ndarray((P, L), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=scan_c, data1=scan, data2=nl.broadcast_to(c_i, (P, L)), op=nl.multiply)
    nisa.tensor_tensor(dst=acc, data1=acc, data2=scan_c, op=nl.add)


def _load(src, dt):
    t = nl.ndarray(src.shape, dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


@nki.jit
def mamba_v1(delta, u, A, B, C):
    """The tutorial's initial kernel: loops [batch, state, channel tile], delta and u loaded for every state
    and channel tile, one accumulator per channel tile (all of them live), stored at the end."""
    batch, channels, L = delta.shape
    states = A.shape[1]
    P = nl.tile_size.pmax
    out = nl.ndarray((batch, channels, L), dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in range(batch):
        accs = []
        for t in range(channels // P):
            acc = nl.ndarray((P, L), dtype=delta.dtype, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)
            accs.append(acc)
        for s in range(states):
            for t in range(channels // P):
                c0 = t * P
                delta_i = _load(delta[b, c0:c0 + P, 0:L], delta.dtype)
                u_i = _load(u[b, c0:c0 + P, 0:L], u.dtype)
                _mamba_state(delta_i, u_i, accs[t], A, B, C, b, c0, s, 0, L)
        for t in range(channels // P):
            nisa.dma_copy(dst=out[b, t * P:(t + 1) * P, 0:L], src=accs[t])
    return out


@nki.jit
def mamba_v2(delta, u, A, B, C, seq_tile=0, hoist_delta_u=False):
    """Loops reordered to [batch, channel tile, state]: delta and u loaded once per channel tile, one
    accumulator per channel tile, stored after its states. seq_tile > 0 tiles the sequence inside the state
    loop, the scan carried from tile to tile (the tutorial's mamba_v3, its tile 512). hoist_delta_u: delta * u
    (the same for every state once delta and u are loaded per channel tile) computed once per channel tile,
    which the tutorial's code does not write (bench/cost_calibration.py: the cause of its misses)."""
    batch, channels, L = delta.shape
    states = A.shape[1]
    P = nl.tile_size.pmax
    out = nl.ndarray((batch, channels, L), dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in range(batch):
        for t in range(channels // P):
            c0 = t * P
            acc = nl.ndarray((P, L), dtype=delta.dtype, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)
            delta_i = _load(delta[b, c0:c0 + P, 0:L], delta.dtype)
            u_i = _load(u[b, c0:c0 + P, 0:L], u.dtype)
            delta_u = None
            if hoist_delta_u:
                delta_u = nl.ndarray((P, L), dtype=delta.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=delta_u, data1=delta_i, data2=u_i, op=nl.multiply)
            for s in range(states):
                if seq_tile:
                    scan_init = nl.ndarray((P, 1), dtype=delta.dtype, buffer=nl.sbuf)
                    nisa.memset(dst=scan_init, value=0.0)
                    for l0 in range(0, L, seq_tile):
                        _mamba_state(delta_i, u_i, acc[0:P, l0:l0 + seq_tile], A, B, C, b, c0, s, l0, seq_tile,
                                     scan_init, delta_u)
                else:
                    _mamba_state(delta_i, u_i, acc, A, B, C, b, c0, s, 0, L, delta_u=delta_u)
            nisa.dma_copy(dst=out[b, c0:c0 + P, 0:L], src=acc)
    return out
