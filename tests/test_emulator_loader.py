"""The emulator's loader (kernels_nki/emulator/loader.py): kernel modules run against the emulated nki and never
installed, helper modules, outputs (shared HBM, or inputs written in place), tensors passed by keyword,
count-only mode, targets and readings."""

from __future__ import annotations

import sys
import textwrap
import types

import ml_dtypes
import numpy as np
import pytest
from helpers import load_kernel, write_kernel

from kernels_nki import emulator

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_outputs_must_be_shared_hbm(tmp_path, monkeypatch):
    k, _ = load_kernel(tmp_path, monkeypatch, """
        return nl.load(a)
    """)
    with pytest.raises(emulator.NkiEmulatorError, match="shared_hbm"):
        k(np.zeros((4, 4), np.float32))


def test_never_installed_and_refuses_a_real_nki(monkeypatch):
    emulator.load_kernel_module("kernels_nki.rmsnorm")
    assert "nki" not in sys.modules and "nki.language" not in sys.modules
    monkeypatch.setitem(sys.modules, "nki", types.ModuleType("nki"))  # a "real" nki is imported
    with pytest.raises(emulator.EmulatorConflictError):
        emulator.load_kernel_module("kernels_nki.rmsnorm")


def test_count_only_mode_matches_a_full_run():
    m = emulator.load_kernel_module("kernels_nki.rmsnorm")
    x = np.random.default_rng(2).standard_normal((300, 96)).astype(ml_dtypes.bfloat16)
    (y, inv), full = emulator.run(m.rmsnorm_fwd, x, target="trn1")
    assert emulator.count(m.rmsnorm_fwd, ((300, 96), "bfloat16"), target="trn1") == full
    _, full_b = emulator.run(m.rmsnorm_bwd, x, inv, y, target="trn1")
    counted = emulator.count(m.rmsnorm_bwd, (x.shape, x.dtype), (inv.shape, inv.dtype), (y.shape, y.dtype),
                             target="trn1")
    assert counted == full_b
    # per-call work is affine in the number of 128-row tiles (a per-call constant: the eps bias tile)
    c1, c2, c4 = (emulator.count(m.rmsnorm_fwd, ((128 * t, 96), "bfloat16"), target="trn1") for t in (1, 2, 4))
    for field in ("dma_bytes", "vector_elems_issued", "scalar_elems_issued"):
        a, b, d = (getattr(c, field) for c in (c1, c2, c4))
        assert d - b == 2 * (b - a) and b > a, field


def test_kernel_helper_modules_load_against_the_emulator_and_leave_no_trace():
    """A kernel file may import functions from a kernel-helper file (`from kernels_nki.tiles import ...`):
    the loader runs that file against the emulated nki too, binds it only while the kernel file's body
    runs, and the AST pass checks every function of a helper file as kernel code."""
    from kernels_nki.emulator import ast_pass, isa, loader

    before = sys.modules.get("kernels_nki.tiles")
    attention = emulator.load_kernel_module("kernels_nki.attention.forward")
    assert sys.modules.get("kernels_nki.tiles") is before and "nki" not in sys.modules
    helper = loader._modules["kernels_nki.tiles", "any"]
    assert attention.transpose is helper.transpose and helper.transpose.__globals__["nisa"] is isa
    source = textwrap.dedent("""
        import nki.language as nl
        def half(x):
            if x is True:
                return x
            return nl.zeros((1, 1), dtype=nl.float32)
    """)
    with pytest.raises(emulator.NkiRuleError, match="ast.is_operator"):
        ast_pass.check_source(source, "helper.py")
    tree = ast_pass.check_source("from kernels_nki.tiles import cdiv\nimport nki\n", "kernel.py")
    assert ast_pass.helper_modules(tree) == ["kernels_nki.tiles"]


def test_targets_and_zero_size_inputs(tmp_path, monkeypatch):
    assert emulator.TARGETS == ("trn1", "trn2")
    k, _ = load_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        v = nl.full((1, 1), 2.0 if nisa.get_nc_version() == nisa.nc_version.gen3 else 1.0, dtype=nl.float32)
        nl.store(out, v)
        return out
    """)
    assert emulator.run(k, A)[0][0, 0] == 1.0 and emulator.run(k, A, target="trn2")[0][0, 0] == 2.0
    with pytest.raises(ValueError, match="unknown target"):
        emulator.run(k, A, target="trn3")
    with pytest.raises(emulator.NkiRuleError, match=r"\[tensor.zero_size\] kernel input of shape \(128, 0\)"):
        emulator.run(k, np.zeros((128, 0), np.float32))


def test_shared_constants_alias_outputs_tensor_keywords_and_views(tmp_path, monkeypatch):
    """nl.shared_constant / shared_identity_matrix; an input written in place and returned; a tensor passed by
    keyword; `.ap(dtype=)` reinterpreting a tile's bytes; a TensorE transpose of bf16 into fp32 PSUM."""
    k, _ = load_kernel(tmp_path, monkeypatch, """
        c = nl.load(nl.shared_constant(CONST))
        eye = nl.shared_identity_matrix(64, dtype=nl.bfloat16)
        t = nl.load(a[0:64], dtype=nl.bfloat16)
        p = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=p, data=t)
        r = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=p)
        nl.store(inplace, r)
        raw = nl.ndarray((1, 4), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_copy(dst=raw, src=c.ap(pattern=[[256, 1], [1, 4]], dtype=nl.uint8))
        bytes_out = nl.ndarray((1, 4), dtype=nl.uint8, buffer=nl.shared_hbm)
        nl.store(bytes_out, raw)
        e = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(e, eye)
        return inplace, bytes_out, e
    """, sig="a, inplace", header="import numpy as np\nCONST = np.full((1, 64), 1.5, np.float32)")
    inplace = np.zeros((64, 64), np.float32)
    got, raw, eye = emulator.run(k, A, inplace=inplace)[0]
    np.testing.assert_array_equal(got, A[:64].astype(ml_dtypes.bfloat16).astype(np.float32).T)
    assert raw.tobytes() == np.float32(1.5).tobytes() and (eye == np.eye(64)).all() and (inplace == 0).all()


def test_readings_follow_the_module_unless_a_call_names_one(tmp_path, monkeypatch):
    """A kernel runs under its module's reading ("any" unless loaded strict), run / count / record under another
    when they name it; a module is loaded once per reading; the project's kernels are loaded strict."""
    from kernels_nki import registry
    from kernels_nki.emulator import loader

    name, where = write_kernel(tmp_path, monkeypatch, """
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(1):  # <-
            nl.store(out, nl.load(a))
        return out
    """)
    lenient, strict = emulator.load_kernel_module(name).k, emulator.load_kernel_module(name, reading="strict").k
    assert (lenient.reading, strict.reading, strict[1].reading) == ("any", "strict", "strict")
    assert emulator.load_kernel_module(name, reading="strict").k is strict and lenient is not strict
    np.testing.assert_array_equal(lenient(A), A)
    np.testing.assert_array_equal(emulator.run(strict, A, reading="any")[0], A)
    for call in (lambda: strict(A), lambda: emulator.count(strict, (A.shape, "float32")),
                 lambda: loader.record(strict, (A.shape, "float32")), lambda: emulator.run(lenient, A, reading="strict")):
        with pytest.raises(emulator.NkiRuleError, match=r"\[strict.loop_alias\] nl.affine_range\(1\)") as info:
            call()
        assert str(info.value).startswith(where)
    with pytest.raises(ValueError, match="unknown reading"):
        emulator.run(lenient, A, reading="lenient")
    with pytest.raises(ValueError, match="unknown reading"):
        emulator.load_kernel_module(name, reading="lenient")
    assert registry.load_emulated("rms_norm").rmsnorm_fwd.reading == "strict"
