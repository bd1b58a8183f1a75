"""The NKI Python subset checked on a kernel's source (kernels_nki/emulator/ast_pass.py): annotations (typing,
nki.typing) are not calls, `is None` is allowed, math is."""

from __future__ import annotations

import numpy as np
from helpers import run_kernel

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_annotations_typing_forms_and_is_none(tmp_path, monkeypatch):
    """typing / nki.typing annotations are not calls; `x is None` is allowed (AWS's library writes it); math."""
    out = run_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray(a.shape, dtype=dtype, buffer=nl.shared_hbm)
        n: int = math.ceil(a.shape[0] / 128)
        if scale is None or b is not None:
            nl.store(out, same(nl.load(a)))
        return out
    """, A, header="import math\nimport typing\nimport nki.typing as nt\nfrom typing import Optional, Tuple\n\n"
                   "def same(t: nl.ndarray) -> Tuple[nl.ndarray, typing.Any]:\n    return t\n",
        sig="a: nt.tensor[128, 64], b: Optional[nl.ndarray] = None, scale: typing.Optional[float] = None,"
            " dtype: nki.dtype = nl.float32")
    np.testing.assert_array_equal(out, A)
