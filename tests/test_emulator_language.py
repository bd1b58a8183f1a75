"""The emulated nki.language (kernels_nki/emulator/language.py): the nl.* convenience calls, NKIObject
configuration classes, nl.rsqrt on GpSimd, runtime loops refused by name."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from helpers import load_kernel, run_kernel

from kernels_nki import emulator

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_nki_typing_annotations_and_copy_helpers(tmp_path, monkeypatch):
    out = run_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        c = nl.copy(t)
        e = nl.equal(c, t)
        nl.store(out, nl.multiply(e, nl.negative(c)))
        return out
    """, A, header="import nki.typing as nt", sig="a: nt.tensor[128, 64]")
    np.testing.assert_array_equal(out, -A)


def test_nkiobject_dataclasses_construct_as_nki_does(tmp_path, monkeypatch):
    """Keyword arguments populate the object dictionary: a frozen dataclass and one whose attributes carry no
    annotations (NKI 0.4.0 fixed frozen NKIObject dataclasses)."""
    out = run_kernel(tmp_path, monkeypatch, """
        s = Plain(factor=3.0)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        r = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=nl.load(a), op0=nl.multiply, operand0=Frozen(2.0).scale * s.factor)
        nl.store(out, r)
        return out
    """, A, header=textwrap.dedent("""
        from dataclasses import dataclass
        @dataclass(frozen=True)
        class Frozen(nl.NKIObject):
            scale: float = 1.0
        @dataclass
        class Plain(nl.NKIObject):
            factor = None
    """))
    np.testing.assert_allclose(out, 6 * A, rtol=1e-6)


def test_nl_rsqrt_runs_on_gpsimd_and_refuses_psum(tmp_path, monkeypatch):
    """NKI 0.5.0: nl.rsqrt on GpSimd, PSUM inputs no longer supported."""
    x = np.abs(A) + 0.5
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.rsqrt(nl.load(a)))
        return out
    """)
    out, c = emulator.run(k, x)
    np.testing.assert_allclose(out, 1 / np.sqrt(x), rtol=1e-6)
    assert c.gpsimd_instructions == 1 and c.scalar_instructions == 0
    k, where = load_kernel(tmp_path, monkeypatch, """
        p = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=nl.load(a))
        r = nl.rsqrt(p)  # <-
        return a
    """)
    with pytest.raises(emulator.NkiRuleError, match="gpsimd.psum") as info:
        emulator.run(k, x)
    assert str(info.value).startswith(where)


def test_runtime_loops_are_refused_naming_them(tmp_path, monkeypatch):
    k, _ = load_kernel(tmp_path, monkeypatch, """
        nl.fori_loop(0, 4, lambda i: None)
        return a
    """)
    with pytest.raises(emulator.NkiEmulatorError, match="fori_loop: a runtime"):
        emulator.run(k, A)
