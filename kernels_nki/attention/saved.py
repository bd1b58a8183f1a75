"""The fused forward's residuals for the backward (a kernel-helper file): `saved_outputs` (the HBM tensors),
`saved_tiles` (one sequence's SBUF tiles of them), `store_seq` (one sequence's outputs to HBM).
"""

import nki.language as nl

from kernels_nki.attention.layout import lse_store, seq_dma, seq_tile
from kernels_nki.attention.state import Saved


def saved_outputs(B, T, H, G, K, dt):
    """The fused forward's extra outputs, the backward's inputs, as a `Saved` of HBM tensors: rope(qk_norm(q)) *
    gain and rope(qk_norm(k)) in dt, each row's inverse RMS (fp32), and the same rows transposed (the forward
    builds q^T / k^T anyway; the backward loads them instead of transposing again)."""
    return Saved(qg=nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm),
                 qinv=nl.ndarray((B, T, H, 1), dtype=nl.float32, buffer=nl.shared_hbm),
                 kr=nl.ndarray((B, T, G, K), dtype=dt, buffer=nl.shared_hbm),
                 kinv=nl.ndarray((B, T, G, 1), dtype=nl.float32, buffer=nl.shared_hbm),
                 qgT=nl.ndarray((B, H, K, T), dtype=dt, buffer=nl.shared_hbm),
                 krT=nl.ndarray((B, G, K, T), dtype=dt, buffer=nl.shared_hbm))


def residuals(saved):
    """The kernel's outputs after o and lse: (qg, qinv, kr, kinv, qgT, krT) of a `Saved`, () without one."""
    if not saved:
        return ()
    return saved.qg, saved.qinv, saved.kr, saved.kinv, saved.qgT, saved.krT


def saved_tiles(saved, dt):
    """One sequence's SBUF `seq_tile`s of the fused forward's row outputs (a `Saved` without qgT / krT), ()
    without."""
    if not saved:
        return ()
    return Saved(qg=seq_tile(saved.qg, dt), qinv=seq_tile(saved.qinv, nl.float32), kr=seq_tile(saved.kr, dt),
                 kinv=seq_tile(saved.kinv, nl.float32))


def store_seq(o_BTHK, lse_BHT1, saved, o_sb, lse_sb, outs, b, ident32, o_perm=False):
    """One sequence's forward outputs to HBM: o (in the `perm` layout with o_perm), lse and (outs: `saved_tiles`)
    the saved rows, one DMA each (`seq_dma`, `lse_store`)."""
    seq_dma(o_sb, o_BTHK, b, False, o_perm)
    lse_store(lse_BHT1, b, lse_sb, ident32)
    if outs:
        for sb, dst in ((outs.qg, saved.qg), (outs.qinv, saved.qinv), (outs.kr, saved.kr), (outs.kinv, saved.kinv)):
            seq_dma(sb, dst, b, False, perm=True)
