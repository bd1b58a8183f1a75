"""Token-major projections y = x w (the attention's fused q/k/v and output projections) as NKI kernels, trn1.

Spec: y_NO = x_NI @ w_IO (x in the compute dtype, the weight cast to it, fp32 accumulation, y in x's
dtype); backward dx_NI = dy_NO @ w_IO^T (x's dtype) and dw_IO = x_NI^T @ dy_NO (fp32, summed over all
N tokens). The `projection` op (frontier_jax.ops.qkv_projection: q/k/v fused as one [D, (H + 2G) K]
weight; ops.out_projection: [H K, D]); dw leaves in fp32 and ops casts it to the weight's dtype.

Forward, per 128-token tile: x arrives token-major, so its 128-column slices are transposed on
TensorE (the contraction axis I must be on partitions) and copied out of PSUM, alternately by
ScalarE (`activation(op=nl.copy)`: NeuronCore-v2 has no ScalarE tensor_copy, nki/api isa docs) and
VectorE; then per 512-column slice of w: y[tokens, 512] = sum over I slices of x^T (stationary
[128, 128]) x w (moving [128, 512], SBUF-resident for the call), one PSUM bank, cast out and stored.
Backward: dx the same way with dy^T (transposed per tile) against w^T (transposed once per call);
dw contracts over tokens, which are already on partitions: I/128 PSUM banks per 512-column slice of w
accumulate x (stationary [tokens, 128]) x dy (moving [tokens, 512]) over every token tile. With as
few PSUM banks as the output projection's (I/128 x O/512 = 4, plus dx's and a transpose's) dx and dw
share one pass over the tokens (x and dy read once); with up to 8 (q/k/v: 4 x 2) dx takes one pass
and every dw slice a second one (dy read twice, x once); beyond, one pass over x per slice.

TensorE useful/issued is bounded by the transposes: the forward issues I/128 transposes of 128 columns
per tile against I/128 x O columns of matmul, 1 - 128/(O + 128): 0.889 at O = 1024 (q/k/v), 0.8 at
O = 512 (output). Reaching 0.9 needs x^T from the producer (a norm kernel writing feature-major
tiles, or the pre-attention RMSNorm fused here), not a choice inside this kernel.
"""

import nki
import nki.isa as nisa
import nki.language as nl

W = 512  # moving columns per matmul: one fp32 PSUM bank (gemm_moving_fmax)
PSUM_BANKS = 8  # 2 MiB PSUM = 16 KiB per partition (trn1 arch guide, "Memory"), in 2 KiB banks of 512 fp32


def _cdiv(a, b):
    return (a + b - 1) // b


def _evacuate(dst, src, on_vector):
    """PSUM -> SBUF with the cast to dst's dtype, on VectorE or ScalarE (spreading the two engines' load)."""
    if on_vector:
        nisa.tensor_copy(dst=dst, src=src, engine=nisa.engine.vector)
    else:
        nisa.activation(dst=dst, op=nl.copy, data=src)


def _transposed(t, rows, cols, dt):
    """[cols/128 tiles of [128, 128]]: t[0:rows, 0:cols] transposed in 128-column slices (TensorE)."""
    P = nl.tile_size.pmax
    out = []
    for i in nl.affine_range(_cdiv(cols, P)):
        k = min(P, cols - i * P)
        t_ps = nl.ndarray((P, P), dtype=dt, buffer=nl.psum)
        nisa.nc_transpose(dst=t_ps[0:k, 0:rows], data=t[0:rows, i * P:i * P + k])
        tT = nl.ndarray((P, P), dtype=dt, buffer=nl.sbuf)
        _evacuate(tT[0:k, 0:rows], t_ps[0:k, 0:rows], i % 2 == 1)
        out.append(tT)
    return out


def _rows(src_NX, r0, rows, dt):
    """src_NX[r0:r0+rows] as a [128, X] SBUF tile in dt (the DMA casts)."""
    P = nl.tile_size.pmax
    t = nl.ndarray((P, src_NX.shape[1]), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:rows], src=src_NX[r0:r0 + rows])
    return t


def _times(lhsT, rhs, K, dst_NO, r0, rows, dt):
    """dst_NO[r0:r0+rows] = lhsT^T @ rhs over a K-long contraction: lhsT as [128, rows] tiles, rhs as
    [128, O] tiles (slice i holds contraction rows i*128 ...)."""
    P = nl.tile_size.pmax
    O = dst_NO.shape[1]
    for o in nl.affine_range(_cdiv(O, W)):
        w = min(W, O - o * W)
        ps = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum)
        for i in nl.affine_range(_cdiv(K, P)):
            k = min(P, K - i * P)
            nisa.nc_matmul(dst=ps[0:rows, 0:w], stationary=lhsT[i][0:k, 0:rows], moving=rhs[i][0:k, o * W:o * W + w])
        y = nl.ndarray((P, W), dtype=dt, buffer=nl.sbuf)
        _evacuate(y[0:rows, 0:w], ps[0:rows, 0:w], o % 2 == 0)
        nisa.dma_copy(dst=dst_NO[r0:r0 + rows, o * W:o * W + w], src=y[0:rows, 0:w])


def _weight_tiles(w_IO, dt):
    """w_IO as I/128 SBUF tiles [<=128, O] in dt (the contraction rows on partitions)."""
    P = nl.tile_size.pmax
    I, O = w_IO.shape
    tiles = []
    for i in nl.affine_range(_cdiv(I, P)):
        k = min(P, I - i * P)
        t = nl.ndarray((k, O), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=w_IO[i * P:i * P + k])
        tiles.append(t)
    return tiles


def _weight_transposed(w_IO, dt):
    """w_IO^T as O/128 SBUF tiles [128, I] (TensorE transposes, once per call)."""
    P = nl.tile_size.pmax
    I, O = w_IO.shape
    wT = [nl.ndarray((P, I), dtype=dt, buffer=nl.sbuf) for _ in range(_cdiv(O, P))]
    for i in nl.affine_range(_cdiv(I, P)):
        k = min(P, I - i * P)
        w_t = _rows(w_IO, i * P, k, dt)
        for j in nl.affine_range(_cdiv(O, P)):
            ko = min(P, O - j * P)
            t_ps = nl.ndarray((P, P), dtype=dt, buffer=nl.psum)
            nisa.nc_transpose(dst=t_ps[0:ko, 0:k], data=w_t[0:k, j * P:j * P + ko])
            _evacuate(wT[j][0:ko, i * P:i * P + k], t_ps[0:ko, 0:k], j % 2 == 1)
    return wT


def _dw_pass(x_NI, dy_NO, dw_IO, o0, o1, dt, dx_NI=None, wT=None):
    """dw_IO[:, o0*512 : o1*512] = x^T dy over every token tile, I/128 x (o1 - o0) PSUM banks, x and that
    column range of dy read once. With dx_NI/wT it also computes dx = dy w^T in the same pass (dy read
    once in all)."""
    N, I = x_NI.shape
    O = dy_NO.shape[1]
    P = nl.tile_size.pmax
    c0, c1 = o0 * W, min(O, o1 * W)
    acc = [[nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum) for _ in range(o1 - o0)]
           for _ in range(_cdiv(I, P))]
    for n in nl.affine_range(_cdiv(N, P)):
        rows = min(P, N - n * P)
        x_t = _rows(x_NI, n * P, rows, dt)
        dy_t = nl.ndarray((P, c1 - c0), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=dy_t[0:rows], src=dy_NO[n * P:n * P + rows, c0:c1])
        if dx_NI != None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
            _times(_transposed(dy_t, rows, O, dt), wT, O, dx_NI, n * P, rows, dt)
        for o in nl.affine_range(o1 - o0):
            w = min(W, c1 - c0 - o * W)
            for i in nl.affine_range(_cdiv(I, P)):
                k = min(P, I - i * P)
                nisa.nc_matmul(dst=acc[i][o][0:k, 0:w], stationary=x_t[0:rows, i * P:i * P + k],
                               moving=dy_t[0:rows, o * W:o * W + w])
    for o in nl.affine_range(o1 - o0):
        w = min(W, c1 - c0 - o * W)
        for i in nl.affine_range(_cdiv(I, P)):
            k = min(P, I - i * P)
            out = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)
            _evacuate(out[0:k, 0:w], acc[i][o][0:k, 0:w], i % 2 == 0)
            nisa.dma_copy(dst=dw_IO[i * P:i * P + k, c0 + o * W:c0 + o * W + w], src=out[0:k, 0:w])


@nki.jit
def projection_fwd(x_NI, w_IO):
    """y_NO = x_NI @ w_IO in x's dtype."""
    N, I = x_NI.shape
    O = w_IO.shape[1]
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    y_NO = nl.ndarray((N, O), dtype=dt, buffer=nl.shared_hbm)
    w = _weight_tiles(w_IO, dt)
    for n in nl.affine_range(_cdiv(N, P)):
        rows = min(P, N - n * P)
        xT = _transposed(_rows(x_NI, n * P, rows, dt), rows, I, dt)
        _times(xT, w, I, y_NO, n * P, rows, dt)
    return y_NO


@nki.jit
def projection_bwd(x_NI, w_IO, dy_NO):
    """(dx_NI in x's dtype, dw_IO fp32)."""
    N, I = x_NI.shape
    O = w_IO.shape[1]
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    dx_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm)
    dw_IO = nl.ndarray((I, O), dtype=nl.float32, buffer=nl.shared_hbm)
    wT = _weight_transposed(w_IO, dt)
    slices, banks = _cdiv(O, W), _cdiv(I, P) * _cdiv(O, W)  # dw's PSUM banks with every slice at once
    if banks + 2 <= PSUM_BANKS:  # dx's bank and a transpose's fit beside them: one pass for dx and dw
        _dw_pass(x_NI, dy_NO, dw_IO, 0, slices, dt, dx_NI, wT)
        return dx_NI, dw_IO
    for n in nl.affine_range(_cdiv(N, P)):
        rows = min(P, N - n * P)
        dyT = _transposed(_rows(dy_NO, n * P, rows, dt), rows, O, dt)
        _times(dyT, wT, O, dx_NI, n * P, rows, dt)
    if banks <= PSUM_BANKS:  # every dw slice in one pass over x
        _dw_pass(x_NI, dy_NO, dw_IO, 0, slices, dt)
        return dx_NI, dw_IO
    for o in nl.affine_range(slices):  # one pass over x per 512-column slice
        _dw_pass(x_NI, dy_NO, dw_IO, o, o + 1, dt)
    return dx_NI, dw_IO
