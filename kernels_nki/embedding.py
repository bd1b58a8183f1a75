"""Token embedding forward (row gather) and backward (scatter-add into [V, D]) as NKI kernels, trn1.

Spec: frontier_jax.ops.reference.embed (jnp.take(emb_VD, ids_N, axis=0)) and its gradient: demb[v] is
the sum of dy[n] over every n with ids[n] == v, duplicates included.

Design: both directions are one-hot matmuls on TensorE. NeuronCore-v2 (trn1) has no indirect DMA:
`.ap(vector_offset=...)` gathers/scatters need software DGE, which supports indirect access only on
NeuronCore-v3+ (aws-neuron-sdk nki/deep-dives/nki-dge.rst, "Mode Selection Summary"), and the
read-modify-write scatter (`dma_copy(dst_rmw_op=...)`) was removed in NKI 0.3; its replacement
`dma_compute` requires unique indices (release-notes/components/nki.rst, NKI 0.3.0 breaking changes;
nki/api/nki/isa/__init__.py, dma_compute). With V = 1024 a one-hot matmul costs V x D MACs per
token on TensorE; duplicates are summed
exactly by PSUM accumulation, and no work is spent on padding (ragged tiles are sliced).

- forward, per group of 512 tokens (the next group's one-hots issued before this group's matmuls): the
  group's ids are DMA'd once into all partitions (an HBM access pattern with partition stride 0: HBM tensors
  accept any `.ap()` pattern,
  nki/get-started/nki-language-guide.rst "Low-level raw access pattern"); per 128-row vocabulary
  chunk one VectorE `tensor_scalar(equal)` against a per-partition iota column gives onehot^T
  [v, tokens] in emb's dtype; out[tokens, D] = sum over chunks of onehot^T-stationary x emb-rows
  moving (nc_matmul accumulating in one fp32 PSUM bank, nki/api/nki/isa/__init__.py nc_matmul),
  copied to SBUF in emb's dtype (exact: one 1.0 x row term per token). Output rows leave as packed row
  groups (`kernels_nki.packing`: the block's 512 tokens as 4 rows per partition, one DMA): row tile j takes
  onehot^T's columns j, j + 4, ... as its stationary operand.
- backward: the tokens are the contraction axis, so the one-hot needs no transpose: dy and the ids move
  in packed row groups (one DMA each per group of 128 R tokens, R = 4096 / D); per row tile, onehot[tokens, V] =
  (iota row == id column) (one VectorE op; ids cast to fp32 on VectorE,
  exact below 2^24, because `tensor_scalar` operands must be float32, isa docs tensor_scalar), and
  demb[v-chunk, D] += onehot[:, v-chunk]-stationary x dy-tile moving, accumulated in PSUM over every
  token of the call (first write overwrites, later ones accumulate: isa docs nc_matmul
  "Accumulation mode"). The [V, D] fp32 result is held in PSUM banks [128, 512] (8 banks = V 1024 x
  D 512); larger V x D are processed in groups of 8 banks, re-reading dy once per group. The output
  is float32; `frontier_jax.ops` casts it to emb's dtype.

Engine rules relied on: every SBUF/PSUM operand starts at partition 0 (trn1 arch guide
nki/guides/architecture/trainium_inferentia2_arch.rst, "Accessing SBUF/PSUM tensors": start_partition
rules); iota writes SBUF on GpSimd (isa docs iota); TensorE reads SBUF and writes fp32 PSUM, both
matmul inputs in the same precision class (bf16/bf16 or fp32/fp32; isa docs nc_matmul "Data types");
PSUM is evacuated by VectorE `tensor_copy`, named explicitly: GpSimd cannot read PSUM (arch guide
"Data Movement") and ScalarE `tensor_copy` is unsupported on v2 (isa docs tensor_copy).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.packing import columns, groups, load, rows_ap, rows_per_partition, store, tile
from kernels_nki.tiles import cdiv, pipeline, row_tiles

NB = 512  # tokens per forward block (gemm_moving_fmax of the id broadcast / one-hot tiles)
DC = 512  # fp32 columns of one PSUM bank (nl.tile_size.psum_fmax)
PSUM_BANKS = 8  # PSUM banks per partition on NeuronCore-v2 (trn1 arch guide, "Near-memory accumulation")


def _onehot_T(ids_N, g, vcol_PK, V, PV, dt):
    """Group g's onehot^T [v, tokens] per 128-row vocabulary chunk: its ids broadcast to every partition (one
    stride-0 DMA) against the per-partition vocabulary column (VectorE)."""
    P = nl.tile_size.pmax
    r0, parts, R = g
    nb = parts * R
    ids_PB = nl.ndarray((P, NB), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ids_PB[0:PV, 0:nb], src=ids_N.ap(pattern=[[0, PV], [1, nb]], offset=r0))
    ohT = []
    for k, _, vr in row_tiles(V):
        oh_t = nl.ndarray((P, NB), dtype=dt, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=oh_t[0:vr, 0:nb], data=ids_PB[0:vr, 0:nb], op0=nl.equal, operand0=vcol_PK[0:vr, k:k + 1])
        ohT.append(oh_t)
    return ohT


def _gather_rows(ohT, g, emb_t, out_ND, V, dt):
    """Group g's output rows: row tile j = onehot^T's columns of its tokens (stationary) x emb rows (moving),
    one fp32 PSUM bank per 512 columns, into the group tile, stored with one DMA."""
    P = nl.tile_size.pmax
    D = out_ND.shape[1]
    _, p, R = g
    y_g = nl.ndarray((P, NB // P * D), dtype=dt, buffer=nl.sbuf)
    for j in range(R):
        for _, d0, dc in row_tiles(D, DC):
            y_ps = nl.ndarray((P, DC), dtype=nl.float32, buffer=nl.psum)
            for k, _, vr in row_tiles(V):
                nisa.nc_matmul(dst=y_ps[0:p, 0:dc], stationary=ohT[k][0:vr, columns(g, j)],
                               moving=emb_t[k][0:vr, d0:d0 + dc])
            o0 = j * D + d0
            nisa.tensor_copy(dst=y_g[0:p, o0:o0 + dc], src=y_ps[0:p, 0:dc], engine=nisa.engine.vector)
    store(out_ND, g, y_g)


@nki.jit
def embed_fwd(ids_N, emb_VD):
    """out_ND (emb's dtype) = emb_VD[ids_N]; ids int32 in [0, V)."""
    N = ids_N.shape[0]
    V, D = emb_VD.shape
    P = nl.tile_size.pmax
    dt = emb_VD.dtype
    KV = cdiv(V, P)
    out_ND = nl.ndarray((N, D), dtype=dt, buffer=nl.shared_hbm)
    # emb as V/128 row tiles (the moving operands) and vcol[p, k] = 128 k + p (the one-hot compare values)
    emb_t = []
    for _, v0, vr in row_tiles(V):
        e_t = nl.ndarray((P, D), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=e_t[0:vr], src=emb_VD[v0:v0 + vr])
        emb_t.append(e_t)
    vcol_PK = nl.ndarray((P, KV), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=vcol_PK, pattern=[[P, KV]], offset=0, channel_multiplier=1)
    PV = min(P, V)
    gs = groups(N, NB // P)  # 512 tokens per group; row tile j holds tokens n0 + p R + j
    held = []  # the one-hots made and not yet used, oldest first

    def onehots(i):
        held.append(_onehot_T(ids_N, gs[i], vcol_PK, V, PV, dt))

    def gather(i):
        _gather_rows(held.pop(0), gs[i], emb_t, out_ND, V, dt)

    # group i + 1's one-hots (VectorE) come before group i's matmuls in program order
    pipeline(len(gs), [(0, onehots), (1, gather)])
    return out_ND


@nki.jit
def embed_bwd(ids_N, emb_VD, dy_ND):
    """demb_VD (float32) = scatter-add of dy rows at ids (emb_VD is read for its shape only)."""
    N = ids_N.shape[0]
    V, D = emb_VD.shape
    P = nl.tile_size.pmax
    dt = dy_ND.dtype
    demb_VD = nl.ndarray((V, D), dtype=nl.float32, buffer=nl.shared_hbm)
    iota_PV = nl.ndarray((P, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=iota_PV, pattern=[[1, V]], offset=0, channel_multiplier=0)
    blocks = [(v0, vr, d0, dc) for _, v0, vr in row_tiles(V) for _, d0, dc in row_tiles(D, DC)]
    ids_N1 = ids_N.reshape((N, 1))
    R = rows_per_partition(D, cap=16)
    for g0 in range(0, len(blocks), PSUM_BANKS):
        group = blocks[g0:g0 + PSUM_BANKS]
        vlo, vhi = V, 0  # the vocabulary rows the group's blocks cover
        for v0, vr, _, _ in group:
            vlo, vhi = min(vlo, v0), max(vhi, v0 + vr)
        acc = [nl.ndarray((P, DC), dtype=nl.float32, buffer=nl.psum) for _ in group]
        for g in groups(N, R):  # row tile j of group g: tokens r0 + p R + j
            _, p, nr = g
            id_i = nl.ndarray((P, R), dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=id_i[0:p, 0:nr], src=rows_ap(ids_N1, g))
            id_f = nl.ndarray((P, R), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=id_f[0:p, 0:nr], src=id_i[0:p, 0:nr])
            dy_g = load(dy_ND, g, dt, R)
            for j in range(nr):
                dy_t = tile(dy_g, g, j, D)
                oh_t = nl.ndarray((P, V), dtype=dt, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=oh_t[0:p, vlo:vhi], data=iota_PV[0:p, vlo:vhi], op0=nl.equal,
                                   operand0=id_f[0:p, j:j + 1])
                for b, (v0, vr, d0, dc) in enumerate(group):
                    nisa.nc_matmul(dst=acc[b][0:vr, 0:dc], stationary=oh_t[0:p, v0:v0 + vr],
                                   moving=dy_t[0:p, d0:d0 + dc])
        for b, (v0, vr, d0, dc) in enumerate(group):
            o_t = nl.ndarray((P, DC), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o_t[0:vr, 0:dc], src=acc[b][0:vr, 0:dc], engine=nisa.engine.vector)
            nisa.dma_copy(dst=demb_VD[v0:v0 + vr, d0:d0 + dc], src=o_t[0:vr, 0:dc])
    return demb_VD
