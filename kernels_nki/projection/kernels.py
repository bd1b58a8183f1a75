"""The projection kernels' entry points (NKI, trn1; the registry's module for `projection`, `norm_projection` and
`mix_norm_projection`): y = r + x w (the attention's output projection with the block's residual add),
y = rms_norm(x) w (the pre-attention RMSNorm fused into the q/k/v projection) and the same with the block's
resid_mix (and a decoder block's U-Net skip add) in front. Specs: frontier_jax.ops.reference
(resid_projection_fwd / projection_bwd, norm_projection_fwd / _bwd, mix_norm_projection_fwd / _bwd). Layout,
engine and port choices, and the AWS documents behind them: docs/kernels/projection.md.

Dimensions: N tokens, I input width (the model width D), O output width ((H + 2G) K for q/k/v: Q, K, V columns
of the three outputs, `widths`)."""

import nki
import nki.language as nl

from kernels_nki.packing import rows_per_partition
from kernels_nki.projection.backward import resid_backward
from kernels_nki.projection.forward import norm_forward, resid_forward
from kernels_nki.projection.matmul import part_chunks
from kernels_nki.projection.mix import mix_setup, store_sums
from kernels_nki.projection.norm_backward import norm_backward
from kernels_nki.projection.weights import weight_transposed
from kernels_nki.tiles import identity, row_tiles


@nki.jit
def projection_fwd(x_NI, w_IO, r_NO):
    """y = r + x w, the residual added as each [rows, 512] product leaves PSUM (x w never reaches HBM).

    Args: x_NI [N, I] (the compute dtype), w_IO [I, O] (cast to x's dtype), r_NO [N, O] the residual.
    Returns: y_NO [N, O] in x's dtype (fp32 accumulation and add).
    Notes: `forward.resid_forward`."""
    y_NO = nl.ndarray((x_NI.shape[0], w_IO.shape[1]), dtype=x_NI.dtype, buffer=nl.shared_hbm)
    resid_forward(x_NI, w_IO, r_NO, y_NO)
    return y_NO


def _bwd_setup(x_NI, w_IO, widths):
    """A backward's outputs (dx_NI in x's dtype, dw_IO fp32), the transposes' identity and w^T's tiles, chunked as
    dy's parts of `widths` columns (`part_chunks`)."""
    N, I = x_NI.shape
    dx_NI = nl.ndarray((N, I), dtype=x_NI.dtype, buffer=nl.shared_hbm)
    dw_IO = nl.ndarray((I, w_IO.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    ident = identity(x_NI.dtype)
    return dx_NI, dw_IO, ident, weight_transposed(w_IO, x_NI.dtype, ident, part_chunks(widths))


@nki.jit
def projection_bwd(x_NI, w_IO, dy_NO):
    """The backward of y = r + x w (r's gradient is dy itself: ops passes it through).

    Args: x_NI [N, I], w_IO [I, O], dy_NO [N, O].
    Returns: (dx_NI = dy w^T in x's dtype, dw_IO = x^T dy fp32, summed over all N tokens).
    Notes: `backward.resid_backward` (one pass or several as the PSUM banks allow)."""
    dx_NI, dw_IO, ident, wT = _bwd_setup(x_NI, w_IO, (w_IO.shape[1],))
    resid_backward(x_NI, dy_NO, dx_NI, dw_IO, ident, wT)
    return dx_NI, dw_IO


@nki.jit
def norm_projection_fwd(x_NI, w_IO):
    """y = rms_norm(x) w = inv (x w), inv = rsqrt(mean(x^2) + eps) (eps = float32 epsilon).

    Args: x_NI [N, I], w_IO [I, O].
    Returns: (y_NO [N, O] in x's dtype, inv_N1 [N, 1] fp32).
    Notes: `forward.norm_forward`."""
    N = x_NI.shape[0]
    y_NO = nl.ndarray((N, w_IO.shape[1]), dtype=x_NI.dtype, buffer=nl.shared_hbm)
    inv_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    norm_forward(x_NI, w_IO, (y_NO,), inv_N1)
    return y_NO, inv_N1


@nki.jit
def norm_projection_bwd(x_NI, w_IO, inv_N1, dy_NO):
    """The backward of y = rms_norm(x) w: g = dy w^T, dx = inv (g + x c) with c = -mean(g x) inv^2 (fp32 math),
    dw = (inv x)^T dy.

    Args: x_NI [N, I], w_IO [I, O], inv_N1 [N, 1] fp32 (the forward's), dy_NO [N, O].
    Returns: (dx_NI in x's dtype, dw_IO fp32).
    Notes: `norm_backward.norm_backward` (one pass over the tokens)."""
    dx_NI, dw_IO, ident, wT = _bwd_setup(x_NI, w_IO, (w_IO.shape[1],))
    norm_backward(x_NI, w_IO, inv_N1, (dy_NO,), dx_NI, dw_IO, ident, wT)
    return dx_NI, dw_IO


@nki.jit
def mix_norm_projection_fwd(x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, widths):
    """x = m0 x_in' + m1 x0 with x_in' = x_in (+ sw skip), then [q | k | v] = rms_norm(x) w: the block's residual
    mix (and a decoder block's U-Net skip add) before the q/k/v projection; x written once.

    Args: x_NI [N, I] (x_in), x0_NI [N, I], mix_2I [2, I] fp32 (values of x's dtype), w_IO [I, Q + K + V],
    skip_NI [N, I] and sw_1I [1, I] fp32, both None without a skip; widths = (Q, K, V), a compile-time constant.
    Returns: (xo_NI [N, I], q_NQ, k_NK, v_NV in x's dtype (the packed row groups the attention kernel reads),
    inv_N1 [N, 1] fp32).
    Notes: `forward.norm_forward` with the mix (`mix.mixed`)."""
    N, I = x_NI.shape
    dt = x_NI.dtype
    xo_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm)
    ys = tuple(nl.ndarray((N, c), dtype=dt, buffer=nl.shared_hbm) for c in widths)
    inv_N1 = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    mix = mix_setup(x0_NI, mix_2I, skip_NI, sw_1I, rows_per_partition(I), dt, xo_NI=xo_NI)
    norm_forward(x_NI, w_IO, ys, inv_N1, mix)
    return (xo_NI,) + ys + (inv_N1,)


@nki.jit
def mix_norm_projection_bwd(x_NI, x0_NI, mix_2I, w_IO, skip_NI, sw_1I, inv_N1, dxo_NI, dq_NQ, dk_NK, dv_NV):
    """The backward of `mix_norm_projection_fwd`: dx = dxo + the norm projection's backward, then the mix's.

    Args: the forward's operands, inv_N1 (the forward's), dxo_NI [N, I] (the written x's gradient), dq_NQ,
    dk_NK, dv_NV (y's three parts).
    Returns: (dx_NI, dx0_NI in x's dtype, dmix_2I fp32, dw_IO fp32[, dskip_NI in x's dtype, dsw_1I fp32]), the
    skip's only with a skip; dmix and dsw are fp32 sums over the tokens (PSUM).
    Notes: `norm_backward.norm_backward` with the mix (`mix.mix_bwd`, `mix.token_sums`)."""
    N, I = x_NI.shape
    P = nl.tile_size.pmax
    dt = x_NI.dtype
    dys = (dq_NQ, dk_NK, dv_NV)
    dx_NI, dw_IO, ident, wT = _bwd_setup(x_NI, w_IO, [dy.shape[1] for dy in dys])
    skip = skip_NI != None  # noqa: E711 (NKI has no `is`: nki/migration/index.rst)
    dx0_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm)
    dmix_2I = nl.ndarray((2, I), dtype=nl.float32, buffer=nl.shared_hbm)
    dskip_NI = nl.ndarray((N, I), dtype=dt, buffer=nl.shared_hbm) if skip else None
    dsw_1I = nl.ndarray((1, I), dtype=nl.float32, buffer=nl.shared_hbm) if skip else None
    red = nl.ndarray((P, (3 if skip else 2) * len(row_tiles(I)) * P), dtype=nl.float32, buffer=nl.psum)
    mix = mix_setup(x0_NI, mix_2I, skip_NI, sw_1I, rows_per_partition(I), dt, dxo_NI=dxo_NI, dx_NI=dx_NI,
                    dx0_NI=dx0_NI, dskip_NI=dskip_NI, red=red)
    norm_backward(x_NI, w_IO, inv_N1, dys, dx_NI, dw_IO, ident, wT, mix)
    ident32 = identity(nl.float32)
    store_sums(red, 0, dmix_2I, ident32)
    if skip:
        store_sums(red, 2, dsw_1I, ident32)
        return dx_NI, dx0_NI, dmix_2I, dw_IO, dskip_NI, dsw_1I
    return dx_NI, dx0_NI, dmix_2I, dw_IO
