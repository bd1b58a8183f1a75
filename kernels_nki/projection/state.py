"""Named state of the projection kernels (a kernel-helper file: no @nki.jit): NKIObject classes whose attributes
are the SBUF tiles and HBM tensors a stage hands to the next (AWS nki-library's style:
src/nkilib_src/nkilib/core/attention/attention_cte.py `AttnInternalBuffers(nl.NKIObject)`; NKI classes are their
object dictionary: aws-neuron-sdk nki/get-started/nki-language-guide.rst, "Class Support"). Built with keywords."""

from dataclasses import dataclass

import nki.language as nl


@dataclass
class Mixing(nl.NKIObject):
    """The residual mix x = m0 x_in' + m1 x0, x_in' = x_in (+ sw skip): its operands and HBM outputs."""

    x0_NI = None  # the block's x0 (HBM)
    skip_NI = None  # the U-Net skip (HBM); unused without a skip
    skip = False  # a decoder block's skip add (a Python flag)
    m0 = None  # mix[0] on every partition, [128, I] in x's dtype
    m1 = None  # mix[1], the same
    sw = None  # the skip weight on every partition, [128, I]; with a skip only
    R = None  # rows per partition of the kernel's row groups
    xo_NI = None  # forward: the mixed x, written once (HBM)
    dxo_NI = None  # backward: the gradient of the written x (HBM)
    dx_NI = None  # backward outputs (HBM): dx_in, dx0, dskip (with a skip)
    dx0_NI = None
    dskip_NI = None
    red = None  # backward: the token sums' fp32 PSUM blocks (`mix.token_sums`)


@dataclass
class MixedGroup(nl.NKIObject):
    """One row group's mix (`mix.mixed`): [128, R I] group tiles and the GpSimd work still to issue."""

    xs = None  # x_in' (x_in, or x_in + sw skip)
    x0 = None
    sk = None  # the skip; with a skip only
    x = None  # the mixed x, complete once every function of `ops` has run
    ops = None  # one function per row tile computing its slice of x


@dataclass
class FwdGroup(nl.NKIObject):
    """A forward row group: its inputs and outputs as [128, R C] SBUF group tiles."""

    g = None  # the row group (r0, parts, R)
    x = None  # x (loaded or mixed)
    r = None  # `projection`: the residual
    y = None  # `projection`: y; stored after the group's last row tile
    inv = None  # `norm_projection`: inv, [128, R] fp32
    ys = None  # `norm_projection`: one group tile per output (y, or q, k, v)


@dataclass
class FwdRow(nl.NKIObject):
    """A forward row tile between its transposes and its matmuls."""

    grp = None  # its FwdGroup
    j = None  # its row tile in the group
    xT = None  # x^T, [128, 128] tiles per 128 input columns


@dataclass
class BwdGroup(nl.NKIObject):
    """A norm backward's row group after stage A (inputs in): [128, R C] group tiles."""

    g = None  # the row group (r0, parts, R)
    dy = None  # dy's group tiles, one per part (dy, or dq, dk, dv)
    inv = None  # inv, [128, R] fp32
    x = None  # x (loaded, or recomputed from the mix)
    dxo = None  # the written x's gradient; with the mix only
    mixed = None  # the MixedGroup; with the mix only
    dx = None  # dx (B's output), [128, R I]
    xn = None  # rms_norm(x) = inv x, dw's stationary operand


@dataclass
class BwdRow(nl.NKIObject):
    """A norm backward's row tile through the norm's backward stages."""

    j = None  # its row tile in the group
    x = None  # its x, [parts, I]
    inv = None  # its inv, [parts, 1] fp32
    dx = None  # its slice of the group's dx
    dxo = None  # its slice of dxo; with the mix only
    st = None  # the norm's backward in flight (kernels_nki.tiles.norm_grad_*; g's PSUM tiles are not held)


@dataclass
class DwBlock(nl.NKIObject):
    """The row tiles of one block of groups whose dw partials accumulate in PSUM together."""

    xn = None  # [(parts, rms_norm(x) row tile)]
    dy = None  # [dy's row tiles, one per part]
