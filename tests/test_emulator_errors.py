"""The emulator's errors (kernels_nki/emulator/errors.py): a documented limit broken inside a kernel is an
NkiLimitError naming the kernel's file:line."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import load_kernel

from kernels_nki import emulator


LIMIT_CASES = {
    "partition": """
        t = nl.ndarray((129, 4), dtype=nl.float32, buffer=nl.sbuf)  # <-
        return t
    """,
    "stationary_free": """
        s = nl.zeros((128, 129), dtype=nl.bfloat16)
        m = nl.zeros((128, 64), dtype=nl.bfloat16)
        o = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(o, s, m)  # <-
    """,
    "moving_free": """
        s = nl.zeros((128, 128), dtype=nl.bfloat16)
        m = nl.zeros((128, 513), dtype=nl.bfloat16)
        o = nl.ndarray((128, 513), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(o, s, m)  # <-
    """,
    "contraction_not_partition": """
        s = nl.zeros((64, 128), dtype=nl.bfloat16)
        m = nl.zeros((128, 64), dtype=nl.bfloat16)
        o = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(o, s, m)  # <-
    """,
    "matmul_into_sbuf": """
        s = nl.zeros((128, 128), dtype=nl.bfloat16)
        o = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_matmul(o, s, s)  # <-
    """,
    "matmul_into_bf16_psum": """
        s = nl.zeros((128, 128), dtype=nl.bfloat16)
        o = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(o, s, s)  # <-
    """,
    "psum_banks": """
        tiles = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for i in range(8)]
        extra = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)  # <-
    """,
    "sbuf_bytes": """
        big = nl.ndarray((128, 40 * 1024), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
        more = nl.ndarray((128, 9 * 1024), dtype=nl.float32, buffer=nl.sbuf, address=(0, 160 * 1024))  # <-
    """,
    "compute_on_hbm": """
        t = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=a[0:128, 0:4])  # <-
    """,
}


@pytest.mark.parametrize("case", sorted(LIMIT_CASES))
def test_limit_violation_names_kernel_line(tmp_path, monkeypatch, case):
    k, where = load_kernel(tmp_path, monkeypatch, LIMIT_CASES[case])
    with pytest.raises(emulator.NkiLimitError) as info:
        k(np.zeros((256, 8), np.float32))
    assert str(info.value).startswith(where + ":"), str(info.value)
