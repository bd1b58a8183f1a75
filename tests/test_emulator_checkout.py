"""Kernel files of a source checkout (kernels_nki/emulator/checkout.py), as AWS's nki-library ships them."""

from __future__ import annotations

import sys
import textwrap

import numpy as np

from kernels_nki import emulator

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_checkout_file_loads_with_relative_helpers_and_leaves_nothing(tmp_path):
    pkg = tmp_path / "lib" / "mypkg"
    (pkg / "utils").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "utils" / "__init__.py"):
        init.write_text("raise RuntimeError('install glue')\n")
    (pkg / "utils" / "helpers.py").write_text("import nki.language as nl\n\ndef twice(t):\n    return nl.add(t, t)\n")
    (pkg / "k.py").write_text(textwrap.dedent("""
        import nki
        import nki.language as nl
        from .utils.helpers import twice

        @nki.jit
        def k(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, twice(nl.load(a)))
            return out
    """))
    m = emulator.load_kernel_file(str(pkg / "k.py"))
    assert m.__name__ == "mypkg.k" and "mypkg" not in sys.modules and "nki" not in sys.modules
    np.testing.assert_array_equal(emulator.run(m.k, A)[0], 2 * A)
    assert emulator.load_kernel_file(str(pkg / "k.py")) is m
