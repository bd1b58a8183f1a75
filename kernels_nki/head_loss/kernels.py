"""The head_loss op's two kernels, the module `kernels_nki.registry` names (forward.py and backward.py hold them)."""

from kernels_nki.head_loss.backward import head_loss_bwd
from kernels_nki.head_loss.forward import head_loss_fwd

__all__ = ["head_loss_bwd", "head_loss_fwd"]
