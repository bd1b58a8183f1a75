"""The fused forward's residuals for the backward (a kernel-helper file): `saved_outputs` (the HBM tensors),
`saved_tiles` (one sequence's SBUF tiles of them), `store_seq` (one sequence's outputs to HBM).
"""

import nki.language as nl

from kernels_nki.attention.layout import lse_store, seq_dma, seq_tile


def saved_outputs(B, T, H, G, K, dt):
    """(qg_BTHK, qinv_BTH1, kr_BTGK, kinv_BTG1, qgT_BHKT, krT_BGKT): the fused forward's extra outputs, the
    backward's inputs: rope(qk_norm(q)) * gain and rope(qk_norm(k)) in dt, each row's inverse RMS (fp32), and
    the same rows transposed (the forward builds q^T / k^T anyway; the backward loads them instead of
    transposing again)."""
    return (nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm),
            nl.ndarray((B, T, H, 1), dtype=nl.float32, buffer=nl.shared_hbm),
            nl.ndarray((B, T, G, K), dtype=dt, buffer=nl.shared_hbm),
            nl.ndarray((B, T, G, 1), dtype=nl.float32, buffer=nl.shared_hbm),
            nl.ndarray((B, H, K, T), dtype=dt, buffer=nl.shared_hbm),
            nl.ndarray((B, G, K, T), dtype=dt, buffer=nl.shared_hbm))

def saved_tiles(saved, dt):
    """The SBUF `seq_tile`s of one batch of the fused forward's row outputs (qg, qinv, kr, kinv), () without."""
    if not saved:
        return ()
    return (seq_tile(saved[0], dt), seq_tile(saved[1], nl.float32), seq_tile(saved[2], dt),
            seq_tile(saved[3], nl.float32))


def store_seq(o_BTHK, lse_BHT1, saved, o_sb, lse_sb, outs, b, ident32, o_perm=False):
    """One batch's forward outputs to HBM: o (in the `perm` layout with o_perm), lse and the saved rows, one DMA
    each (`seq_dma`, `lse_store`)."""
    seq_dma(o_sb, o_BTHK, b, False, o_perm)
    lse_store(lse_BHT1, b, lse_sb, ident32)
    for sb, dst in zip(outs, saved[0:4]):
        seq_dma(sb, dst, b, False, perm=True)
