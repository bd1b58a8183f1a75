"""NumPy emulator of `nki.typing` (NKI 0.3+, release-notes/components/nki.rst: "the nki.typing module for
declaring expected tensor shapes"): annotations only, never checked at run time (as the notes describe them)."""

from __future__ import annotations


class tensor:  # noqa: N801 (mirrors the nki.typing name)
    """`nki.typing.tensor`, `tensor[shape]`, `tensor[shape, dtype]`: an annotation of a tensor parameter."""

    def __class_getitem__(cls, item):
        return cls


def legacy_modules() -> dict:
    """`neuronxcc.nki.typing` (and its parent packages) for a file that imports it for annotations only, as AWS's
    nki-library router_topk does (`nt.mutable_tensor`): every attribute is the annotation `tensor`. Kernel code
    that uses a neuronxcc name is rejected by the AST pass (rule ast.neuronxcc_namespace) before the file runs."""
    import types

    typing_mod = types.ModuleType("neuronxcc.nki.typing", "annotation names only (kernels_nki.emulator)")
    typing_mod.__getattr__ = lambda name: tensor
    nki_mod = types.ModuleType("neuronxcc.nki")
    nki_mod.__path__, nki_mod.typing = [], typing_mod
    top = types.ModuleType("neuronxcc")
    top.__path__, top.nki = [], nki_mod
    return {"neuronxcc": top, "neuronxcc.nki": nki_mod, "neuronxcc.nki.typing": typing_mod}
