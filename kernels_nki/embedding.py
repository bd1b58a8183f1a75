"""Token embedding forward (row gather) and backward (scatter-add into [V, D]) as NKI kernels, trn1.

Spec: frontier_jax.reference.embed (jnp.take(emb_VD, ids_N, axis=0)) and its gradient: demb[v] is
the sum of dy[n] over every n with ids[n] == v, duplicates included.

Both kernels move rows HBM -> HBM with indirect DMA (`tensor.ap(..., vector_offset=ids)`): only the
ids pass through SBUF (128 per tile, the last tile ragged and sliced, never padded), so no DMA,
engine or TensorE work is spent on padding rows or on one-hot matrices; at the baseline shapes the
DMA bytes are within 1% of the minimum (rows in + rows out, see `python -m kernels_nki.report`).
- forward: out[n] = emb[ids[n]], a gather as the DMA source.
- backward: demb is zeroed (one SBUF zero tile DMA'd over its 128-row blocks), then every dy row is
  added at its id with a read-modify-write DMA (`dst_rmw_op=nl.add`). Duplicate ids inside one DMA
  are correct only with `unique_indices=False` (the hardware then serialises the colliding
  read-modify-writes; with the default True colliding rows are lost, which the emulator reproduces).
  The accumulator is float32 (the DMA adds in fp32 and rounds to the destination on every add, so a
  bf16 destination would round once per duplicate); `frontier_jax.ops` casts it to emb's dtype.
"""

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def embed_fwd(ids_N, emb_VD):
    """out_ND (emb's dtype) = emb_VD[ids_N]; ids int32 in [0, V)."""
    N = ids_N.shape[0]
    V, D = emb_VD.shape
    P = nl.tile_size.pmax
    out_ND = nl.ndarray((N, D), dtype=emb_VD.dtype, buffer=nl.shared_hbm)
    ids_N1 = ids_N.reshape((N, 1))
    for t in nl.affine_range((N + P - 1) // P):
        r0 = t * P
        rows = min(P, N - r0)
        ids_P1 = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ids_P1[0:rows], src=ids_N1[r0:r0 + rows])
        nisa.dma_copy(dst=out_ND[r0:r0 + rows],
                      src=emb_VD.ap(pattern=[[D, rows], [1, D]], offset=0, vector_offset=ids_P1[0:rows],
                                    indirect_dim=0))
    return out_ND


@nki.jit
def embed_bwd(ids_N, emb_VD, dy_ND):
    """demb_VD (float32) = scatter-add of dy rows at ids (emb_VD is read for its shape only)."""
    N = ids_N.shape[0]
    V, D = emb_VD.shape
    P = nl.tile_size.pmax
    demb_VD = nl.ndarray((V, D), dtype=nl.float32, buffer=nl.shared_hbm)
    zero_PD = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zero_PD, value=0.0)
    for v in nl.affine_range((V + P - 1) // P):
        v0 = v * P
        vr = min(P, V - v0)
        nisa.dma_copy(dst=demb_VD[v0:v0 + vr], src=zero_PD[0:vr])
    ids_N1 = ids_N.reshape((N, 1))
    for t in nl.sequential_range((N + P - 1) // P):  # read-modify-writes of one array: keep them ordered
        r0 = t * P
        rows = min(P, N - r0)
        ids_P1 = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ids_P1[0:rows], src=ids_N1[r0:r0 + rows])
        nisa.dma_copy(dst=demb_VD.ap(pattern=[[D, rows], [1, D]], offset=0, vector_offset=ids_P1[0:rows],
                                     indirect_dim=0),
                      src=dy_ND[r0:r0 + rows], dst_rmw_op=nl.add, unique_indices=False)
    return demb_VD
