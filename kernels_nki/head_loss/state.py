"""The head_loss kernels' named state (a kernel-helper file: no @nki.jit): what a row group's operands and a row
tile's stages hand each other, as `nl.NKIObject` dataclasses whose attributes the stages fill in order (the form
of AWS nki-library's attention_cte.py `AttnInternalBuffers`; NKI classes: aws-neuron-sdk
nki/get-started/nki-language-guide.rst, "Class Support")."""

from dataclasses import dataclass

import nki.language as nl


@dataclass
class FwdGroup(nl.NKIObject):
    """A forward row group's SBUF tiles (one DMA each)."""

    x = None  # [P, R D] x rows, row tile j at columns j D .. (j + 1) D
    cols = None  # [P, R, 1 + S] fp32 target and bias ids per row tile (`chunks.token_columns`)
    idx = None  # [P, R, 1 + S] uint32, the same as gather indices
    loss = None  # [P, R] fp32 loss, column j = row tile j, stored after the group's last row tile
    lse = None  # [P, R] fp32 log-sum-exp, the same


@dataclass
class FwdTile(nl.NKIObject):
    """One forward row tile, filled stage by stage: x^T, then t, then the loss."""

    g = None  # its row group (r0, parts, rows)
    j = None  # its row tile in the group
    group = None  # the group's FwdGroup
    xT = None  # D/128 SBUF tiles [d, rows] (`chunks.x_T`)
    t_PV = None  # [P, V] fp32 tanh(z / softcap); exp(softcap t - m) once the loss stage has run


@dataclass
class BwdGroup(nl.NKIObject):
    """A backward row group's SBUF tiles (one DMA each in, one out)."""

    x = None  # [P, R D] x rows
    cols = None  # [P, R, 1 + S] fp32 target and bias ids
    idx = None  # [P, R, 1 + S] uint32 gather indices
    neg_lse = None  # [P, R] fp32 -lse (exp's bias)
    dloss = None  # [P, R] fp32 g, the loss gradient
    neg_dloss = None  # [P, R] fp32 -g (dz's scale)
    dx = None  # [P, R D] dx rows in x's dtype, stored after the group's last row tile


@dataclass
class BwdTile(nl.NKIObject):
    """One backward row tile, filled stage by stage: z, t, r, dz and dz^T, dx. A stage sets the buffers it has
    consumed back to None: a buffer is live while referenced (under the emulator: kernels_nki/emulator/machine.py),
    and the tile stays referenced until its demb block is done."""

    g = None  # its row group (r0, parts, rows)
    j = None  # its row tile in the group
    rows = None  # its tokens (the group's partitions)
    last = None  # the group's last row tile: stores the group's dx
    ends_block = None  # the demb block's last row tile: accumulates the block
    group = None  # the group's BwdGroup
    x_PD = None  # [rows, D] view of x (demb's moving operand)
    z_ps = None  # per vocabulary chunk the fp32 PSUM bank of z = x emb^T (at most Z_BANKS of them)
    t_PV = None  # [P, V] fp32 tanh(z / softcap)
    corr = None  # [P, S] fp32 the bias sources' corrections to r at their ids (`bias.bias_grad`)
    r_PV = None  # [P, V] fp32 r = (t^2 - 1) dl
    dz_PV = None  # [P, V] dz = -g r in x's dtype (demb's stationary operand)
    dzT = None  # per vocabulary chunk the [128, 512] SBUF dz^T (dx's stationary operand; at most Z_BANKS chunks)
    dx_ps = None  # D/512 fp32 PSUM banks of dx = dz emb
