"""tensor_scalar_reduce (kernels_nki/emulator/vector_reduce.py)."""

from __future__ import annotations

import numpy as np
from helpers import run_kernel

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_tensor_scalar_reduce_accumulates_across_calls(tmp_path, monkeypatch):
    out = run_kernel(tmp_path, monkeypatch, """
        t = nl.load(a)
        r = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=r, data=t[:, 0:32], op0=nl.multiply, operand0=2.0, reduce_op=nl.add)
        nisa.tensor_scalar_reduce(dst=r, data=t[:, 32:64], op0=nl.multiply, operand0=2.0, reduce_op=nl.add,
                                  reduce_res=s, reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, s)
        return out
    """, A)
    np.testing.assert_allclose(out[:, 0], 2 * A.sum(1), rtol=1e-5, atol=1e-5)
