"""Named state of the attention kernels (a kernel-helper file): `nl.NKIObject` dataclasses, as AWS nki-library's
core/attention/attention_cte.py `AttnInternalBuffers` (aws-neuron-sdk nki/get-started/nki-language-guide.rst,
"Class Support": an instance is its object dictionary). A field left None is absent."""

from dataclasses import dataclass

import nki.language as nl


@dataclass
class CausalBias(nl.NKIObject):
    """The [128, 128] constants of one call (`rows.causal_bias`), in the input dtype."""

    ident = None  # the identity: the moving side of every transpose, the stationary of the mask matmul
    mask = None  # 0 where key <= query, NEG above (key-major: NEG where key > query)
    ones = None  # all ones: ones[0:1] is the exact forward's K = 1 shift stationary


@dataclass
class Gain(nl.NKIObject):
    """One query head's gain (`rope_norm.gain_column`)."""

    col = None  # fp32 [P, 1]: the gain times sqrt(K) on every partition


@dataclass
class RowNorm(nl.NKIObject):
    """What the backward keeps of one row tile's QK-norm (`rows.head_rows`), for `rope_norm.prep_grad`."""

    xn = None  # fp32 [P, K]: x times its inverse RMS (the normed rows before the rotation and gain)
    inv = None  # fp32 [P, 1]: the inverse RMS (times gain / sqrt(K) once `prescaled`)
    xk = None  # fp32 [P, K]: -xn / K


@dataclass
class Saved(nl.NKIObject):
    """The fused forward's residuals (`saved.saved_outputs`: HBM tensors; `saved.saved_tiles`: one sequence's SBUF
    tiles of the row ones, qgT / krT None)."""

    qg = None  # rope(qk_norm(q)) * gain, [B, T, H, K] in dt
    qinv = None  # each q row's inverse RMS, [B, T, H, 1] fp32
    kr = None  # rope(qk_norm(k)), [B, T, G, K] in dt
    kinv = None  # each k row's inverse RMS, [B, T, G, 1] fp32
    qgT = None  # qg transposed, [B, H, K, T]
    krT = None  # kr transposed, [B, G, K, T]


@dataclass
class Rope(nl.NKIObject):
    """The fused kernels' extra inputs: the rotation tables, the query gain and (the backward) the residuals."""

    cos = None  # [T, K / 2] fp32
    sin = None  # [T, K / 2] fp32
    gain = None  # g_PH: the query gain broadcast over 128 rows, fp32
    saved = None  # the backward: the forward's residuals (`Saved`, HBM)


@dataclass
class RopeTile(nl.NKIObject):
    """The rotation tables of one 128-row block (`rope_norm.rope_tiles`), fp32 SBUF."""

    cos2 = None  # [P, K]: [cos, cos]
    sin = None  # [P, K / 2]
    neg_sin = None  # [P, K / 2]: -sin


@dataclass
class QueryTile(nl.NKIObject):
    """One 128-query tile of a head in the backward (`steps.bwd_tile`)."""

    q = None  # [P, K] rows (with rope: the forward's normed, rotated rows)
    qT = None  # [K, rows]
    norm = None  # a `RowNorm` with rope (its inv times gain / sqrt(K)), else ()
    do = None  # [P, K] dO rows (with XSA: da)
    doT = None  # [K, rows] dO^T
    negl = None  # fp32 [P, 1]: -lse
    negdi = None  # fp32 [P, 1]: -Di = -rowsum(dO o)
    t0 = None  # the tile's first query
    rows = None  # its rows (the last tile ragged)
    dq = None  # [P, K] view of dq's natural rows
    tables = None  # the block's `RopeTile` with rope, else ()


@dataclass
class KvAcc(nl.NKIObject):
    """A kv head's dk and dv accumulators in the backward: fp32 PSUM banks [P, KC], KC / K key tiles each."""

    dk = None
    dv = None
