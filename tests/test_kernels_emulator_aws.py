"""What AWS's nki-library kernels need from the emulator (NKI 0.4-0.6), each feature by a kernel of our own checked
against NumPy: the fp8 dtype names, annotation and typing forms, NKIObject configuration classes, helpers
imported package-relatively from a checkout, tile_size capacities, the top-8 search instructions,
tensor_scalar_reduce, dma_transpose, nc_stream_shuffle, shared constants, outputs aliasing inputs, tensors passed
by keyword, reinterpreting `.ap(dtype=)` views, TensorE transposes into fp32 PSUM."""

from __future__ import annotations

import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
from test_kernels_emulator import _kernel_module
from test_kernels_emulator import run_kernel as run

from kernels_nki import emulator

rng = np.random.default_rng(7)
A = rng.standard_normal((128, 64)).astype(np.float32)


def test_fp8_dtype_names_are_distinct_types(tmp_path, monkeypatch):
    """float8_e4m3 (legacy, max 240) and float8_e4m3fn (OCP, max 448) are distinct since NKI 0.4; e8m0fnu (0.5)
    and the packed x4 names exist; a kernel casts through them by DMA."""
    out = run(tmp_path, monkeypatch, """
        assert nl.float8_e4m3 != nl.float8_e4m3fn and nl.float8_e4m3fn_x4 != nl.float8_e5m2_x4
        assert nl.float8_e8m0fnu.itemsize == 1 and nl.float4_e2m1fn_x4.itemsize == 2
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a, dtype=nl.float8_e4m3)
        nl.store(out, t)
        return out
    """, 300 * A)
    np.testing.assert_array_equal(out, (300 * A).astype(ml_dtypes.float8_e4m3).astype(np.float32))
    assert ml_dtypes.finfo(ml_dtypes.float8_e4m3).max == 240 and ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max == 448


def test_annotations_typing_forms_and_is_none(tmp_path, monkeypatch):
    """typing / nki.typing annotations are not calls; `x is None` is allowed (AWS's library writes it); math."""
    out = run(tmp_path, monkeypatch, """
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


def test_nkiobject_dataclasses_construct_as_nki_does(tmp_path, monkeypatch):
    """Keyword arguments populate the object dictionary: a frozen dataclass and one whose attributes carry no
    annotations (NKI 0.4.0 fixed frozen NKIObject dataclasses)."""
    out = run(tmp_path, monkeypatch, """
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


@pytest.mark.parametrize("target,kib", [("trn1", 192), ("trn2", 224)])
def test_tile_size_capacities_follow_the_target(tmp_path, monkeypatch, target, kib):
    out = run(tmp_path, monkeypatch, """
        ts = nl.tile_size
        assert ts.psum_num_banks == 8 and ts.psum_bank_fmax == 512 and ts.psum_bank_fmax_bytes == 2048
        assert ts.sbuf_size_bytes == 128 * ts.sbuf_fmax_bytes == 128 * ts.total_available_sbuf_size
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.full((1, 1), ts.sbuf_fmax * 4, dtype=nl.float32))
        return out
    """, A, target=target)
    assert out[0, 0] == kib * 1024


def test_top8_search_instructions(tmp_path, monkeypatch):
    x = rng.permutation(128 * 64).reshape(128, 64).astype(np.float32)  # distinct values
    out = run(tmp_path, monkeypatch, """
        t = nl.load(a)
        top = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=top, src=t)
        idx = nl.ndarray((128, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx, data=t, vals=top)
        rep = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=rep, data=t, vals=top, imm=-1.0)
        out = nl.ndarray((128, 80), dtype=nl.float32, buffer=nl.shared_hbm)
        f = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=f, src=idx)
        nl.store(out[:, 0:8], top)
        nl.store(out[:, 8:16], f)
        nl.store(out[:, 16:80], rep)
        return out
    """, x)
    order = np.argsort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(out[:, :8], np.take_along_axis(x, order, 1))
    np.testing.assert_array_equal(out[:, 8:16], order)
    rep = x.copy()
    np.put_along_axis(rep, order, -1.0, 1)
    np.testing.assert_array_equal(out[:, 16:], rep)


def test_tensor_scalar_reduce_accumulates_across_calls(tmp_path, monkeypatch):
    out = run(tmp_path, monkeypatch, """
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


def test_dma_transpose_2d_and_4d(tmp_path, monkeypatch):
    x = rng.standard_normal((2, 3, 4, 16)).astype(ml_dtypes.bfloat16)
    out = run(tmp_path, monkeypatch, """
        t = nl.ndarray((16, 3, 4, 2), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a)
        out = nl.ndarray((16, 3, 4, 2), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out
    """, x)
    np.testing.assert_array_equal(out, np.transpose(x, (3, 1, 2, 0)))
    y = rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    out = run(tmp_path, monkeypatch, """
        t = nl.load(a)
        u = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=u, src=t, axes=(1, 0))
        out = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, u)
        return out
    """, y)
    np.testing.assert_array_equal(out, y.T)


def test_stream_shuffle_broadcasts_a_partition(tmp_path, monkeypatch):
    out = run(tmp_path, monkeypatch, """
        t = nl.load(a)
        b = nl.ndarray((64, 64), dtype=a.dtype, buffer=nl.sbuf)
        for q in range(2):
            nisa.nc_stream_shuffle(src=t[0:1, :], dst=b[q * 32:(q + 1) * 32, :], shuffle_mask=[0] * 32)
        out = nl.ndarray((64, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, b)
        return out
    """, A)
    np.testing.assert_array_equal(out, np.broadcast_to(A[0], (64, 64)))


def test_shared_constants_alias_outputs_tensor_keywords_and_views(tmp_path, monkeypatch):
    """nl.shared_constant / shared_identity_matrix; an input written in place and returned; a tensor passed by
    keyword; `.ap(dtype=)` reinterpreting a tile's bytes; a TensorE transpose of bf16 into fp32 PSUM."""
    k, _ = _kernel_module(tmp_path, monkeypatch, """
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


def test_multi_core_instructions_name_their_requirement(tmp_path, monkeypatch):
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        nisa.core_barrier(a, (0, 1))
        return a
    """)
    with pytest.raises(emulator.NkiEmulatorError, match="LNC > 1"):
        emulator.run(k, A)


def test_nl_rsqrt_runs_on_gpsimd_and_refuses_psum(tmp_path, monkeypatch):
    """NKI 0.5.0: nl.rsqrt on GpSimd, PSUM inputs no longer supported."""
    x = np.abs(A) + 0.5
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.rsqrt(nl.load(a)))
        return out
    """)
    out, c = emulator.run(k, x)
    np.testing.assert_allclose(out, 1 / np.sqrt(x), rtol=1e-6)
    assert c.gpsimd_instructions == 1 and c.scalar_instructions == 0
    k, where = _kernel_module(tmp_path, monkeypatch, """
        p = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=nl.load(a))
        r = nl.rsqrt(p)  # <-
        return a
    """)
    with pytest.raises(emulator.NkiRuleError, match="gpsimd.psum") as info:
        emulator.run(k, x)
    assert str(info.value).startswith(where)


def test_runtime_loops_are_refused_naming_them(tmp_path, monkeypatch):
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        nl.fori_loop(0, 4, lambda i: None)
        return a
    """)
    with pytest.raises(emulator.NkiEmulatorError, match="fori_loop: a runtime"):
        emulator.run(k, A)
