"""The NKI emulator: trn1 limits caught at the kernel's line, NaN-filled fresh memory, exact work counters."""

from __future__ import annotations

import sys
import textwrap
import types

import ml_dtypes
import numpy as np
import pytest

from kernels_nki import emulator
from kernels_nki.emulator import cost

_counter = [0]


def write_kernel(tmp_path, monkeypatch, body: str, header: str = "", sig: str = "a", mark_jit: bool = False):
    """Write a kernel module (`header` lines, then `@nki.jit def k(<sig>):` with `body`) importable by name.

    Returns (module name, "path:line" of the line marked `# <-`, or of the @nki.jit line when mark_jit)."""
    _counter[0] += 1
    name = f"emu_case_{_counter[0]}"
    src = f"import nki\nimport nki.language as nl\nimport nki.isa as nisa\n{header}\n\n"
    src += f"@nki.jit{'  # <-' if mark_jit else ''}\ndef k({sig}):\n"
    src += textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    line = next((i + 1 for i, text in enumerate(src.splitlines()) if "# <-" in text), None)
    return name, f"{path}:{line}"


def _kernel_module(tmp_path, monkeypatch, body: str, **kw):
    """Write and load (AST pass, then execution against the emulated nki) a kernel module -> (k, marked line)."""
    name, where = write_kernel(tmp_path, monkeypatch, body, **kw)
    return emulator.load_kernel_module(name).k, where


def run_kernel(tmp_path, monkeypatch, body, *args, target="trn1", **kw):
    """Write, load and run a kernel module on `args`: its first output."""
    k, _ = _kernel_module(tmp_path, monkeypatch, body, **kw)
    return emulator.run(k, *args, target=target)[0]


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
    k, where = _kernel_module(tmp_path, monkeypatch, LIMIT_CASES[case])
    with pytest.raises(emulator.NkiLimitError) as info:
        k(np.zeros((256, 8), np.float32))
    assert str(info.value).startswith(where + ":"), str(info.value)


def test_out_of_bounds_slice_raises(tmp_path, monkeypatch):
    k, where = _kernel_module(tmp_path, monkeypatch, """
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[200:328, :])  # <-
    """)
    with pytest.raises(emulator.NkiEmulatorError, match="out of bounds") as info:
        k(np.zeros((256, 8), np.float32))
    assert str(info.value).startswith(where)


def test_uninitialised_reads_are_nan(tmp_path, monkeypatch):
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:5], src=a[0:5])
        u = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u, data=t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=out, src=u)
        return out
    """)
    out = k(np.ones((8, 4), np.float32))
    np.testing.assert_array_equal(out[:5], 2.0)
    assert np.isnan(out[5:]).all()


def test_matmul_values_counters_and_estimate(tmp_path, monkeypatch):
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a[0:128, 0:128])
        m = nl.load(a[0:128, 0:512])
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, s, m)
        res = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    a = np.random.default_rng(0).standard_normal((128, 512)).astype(ml_dtypes.bfloat16)
    out, c = emulator.run(k, a)
    a32 = a.astype(np.float32)
    np.testing.assert_allclose(out, a32[:, :128].T @ a32, rtol=1e-5, atol=1e-4)
    assert (c.pe_instructions, c.pe_macs_issued, c.pe_macs_useful) == (1, 128 * 128 * 512, 128 * 128 * 512)
    assert c.pe_macs_issued_fp32 == 0
    assert c.dma_bytes == 2 * (128 * 128 + 128 * 512) + 128 * 512 * 4 and c.dma_transfers == 3
    assert (c.vector_instructions, c.vector_elems_issued, c.vector_elems_useful) == (1, 128 * 512, 128 * 512)
    assert c.psum_peak_banks == 1
    est = emulator.estimate(c)
    assert est.engine_s["tensor"] == pytest.approx(128 * 128 * 512 / cost.TENSOR_MACS_PER_S)
    assert est.engine_s["dma"] == pytest.approx(c.dma_bytes / cost.DMA_BYTES_PER_S)
    assert est.bound == max(est.engine_s, key=est.engine_s.get) and est.total_s == max(est.engine_s.values())


def test_dma_buffers_follow_the_contiguous_runs_of_both_sides(tmp_path, monkeypatch):
    """One head's rows of a [T, H, K] tensor are 128 B apart-strided runs (one buffer per row, under 256 B);
    whole [128, 512] fp32 rows are 2 KiB buffers; an SBUF tile's column slice caps the run at its width;
    count-only mode sees the same layouts as a full run."""
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[0:128, 3, 0:64])
        w = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=w, src=b[0:128, 0:512])
        nisa.dma_copy(dst=out[0:128, 0:512], src=w)
        nisa.dma_copy(dst=out[0:128, 0:100], src=w[0:128, 0:100])
        return out
    """, sig="a, b")
    a = np.zeros((128, 8, 64), ml_dtypes.bfloat16)
    b = np.zeros((128, 512), np.float32)
    _, c = emulator.run(k, a, b)
    assert c.dma_transfers == 4
    assert c.dma_buffers == 128 + 128 + 128 + 128
    assert c.dma_bytes_under_256 == 128 * 64 * 2
    assert c.dma_bytes_under_2k == 128 * 64 * 2 + 128 * 100 * 4
    assert emulator.count(k, (a.shape, "bfloat16"), (b.shape, "float32")) == c


def test_padding_waste_and_accumulation(tmp_path, monkeypatch):
    """K=64, M=100, N=300 issues the full 128 x 128 array; two matmuls into one PSUM tile accumulate."""
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((100, 300), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a[0:64, 0:100])
        m = nl.load(a[0:64, 0:300])
        acc = nl.ndarray((100, 300), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, s, m)
        nisa.nc_matmul(acc, s, m)
        res = nl.ndarray((100, 300), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    a = np.random.default_rng(1).standard_normal((64, 300)).astype(np.float32)
    out, c = emulator.run(k, a)
    np.testing.assert_allclose(out, 2 * a[:, :100].T @ a, rtol=1e-5, atol=1e-4)
    assert c.pe_macs_issued == 2 * 128 * 128 * 300 == c.pe_macs_issued_fp32
    assert c.pe_macs_useful == 2 * 64 * 100 * 300
    assert emulator.pe_utilisation(c) == pytest.approx(64 * 100 / (128 * 128))


def test_small_vector_op_counts_min_ii_and_idle_lanes(tmp_path, monkeypatch):
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((5, 10), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a[0:5, 0:10])
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.multiply)
        nl.store(out, t)
        return out
    """)
    x = np.arange(50, dtype=np.float32).reshape(5, 10)
    out, c = emulator.run(k, x)
    np.testing.assert_array_equal(out, x * x)
    assert (c.vector_elems_issued, c.vector_elems_useful) == (128 * 64, 50)
    assert c.dma_bytes == 2 * 50 * 4


def test_row_tiled_matmuls_are_charged_their_row_tile(tmp_path, monkeypatch):
    """Two K=64 matmuls on the two 64-row tiles run in parallel (nc_matmul "Tiling mode"): each is
    charged 64 x 128 x N, together one full-array pass; the same matmuls untiled cost twice that."""
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a[0:64, 0:128])
        m = nl.load(a[0:64, 0:256])
        acc0 = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
        acc1 = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc0, s, m, tile_position=(0, 0), tile_size=(64, 128))
        nisa.nc_matmul(acc1, s, m, tile_position=(64, 0), tile_size=(64, 128))
        nisa.nc_matmul(acc1, s, m)
        res = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc1)
        nl.store(out, res)
        return out
    """)
    a = np.random.default_rng(3).standard_normal((64, 256)).astype(ml_dtypes.bfloat16)
    out, c = emulator.run(k, a)
    a32 = a.astype(np.float32)
    np.testing.assert_allclose(out, 2 * a32[:, :128].T @ a32, rtol=1e-4, atol=1e-3)
    assert c.pe_macs_issued == 2 * 64 * 128 * 256 + 128 * 128 * 256
    assert c.pe_macs_useful == 3 * 64 * 128 * 256


def test_column_tiled_matmuls_are_charged_their_tile_and_write_its_partitions(tmp_path, monkeypatch):
    """A [64, 64] stationary fits one of the four 64 x 64 tiles of the PE array on NeuronCore-v2 (row and
    column tiling, nc_matmul "Tiling mode"): charged 64 x 64 x N; the column tile at 64 writes PSUM
    partitions 64..127 (rule matmul.tiling_dst)."""
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a[0:64, 0:64])
        m = nl.load(a[0:64, 0:256])
        acc = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc[0:64], s, m, tile_position=(0, 0), tile_size=(64, 64))
        nisa.nc_matmul(acc[64:128], s, m, tile_position=(64, 64), tile_size=(64, 64))
        res = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    a = np.random.default_rng(4).standard_normal((64, 256)).astype(ml_dtypes.bfloat16)
    out, c = emulator.run(k, a)
    a32 = a.astype(np.float32)
    np.testing.assert_allclose(out, np.concatenate([a32[:, :64].T @ a32] * 2), rtol=1e-4, atol=1e-3)
    assert c.pe_macs_issued == c.pe_macs_useful == 2 * 64 * 64 * 256


def test_onezero_stationary_matmul_is_issued_not_useful(tmp_path, monkeypatch):
    """A 0/1 stationary (is_stationary_onezero: a mask or selection) moves data, like a transpose."""
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a)
        acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, s, s, is_stationary_onezero=True)
        res = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    eye = np.eye(128, dtype=ml_dtypes.bfloat16)
    out, c = emulator.run(k, eye)
    np.testing.assert_array_equal(out, np.eye(128, dtype=np.float32))
    assert (c.pe_macs_issued, c.pe_macs_useful) == (128 * 128 * 128, 0)


def test_recomputed_product_is_issued_not_useful(tmp_path, monkeypatch):
    """A matmul named "recompute..." (nc_matmul's documented `name`) computes a product the kernel already
    computed, in another layout: it runs and is issued, with zero useful MACs; other names count."""
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(a)
        acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, s, s, name="recompute s^T")
        nisa.nc_matmul(acc, s, s, name="scores")
        res = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
        return out
    """)
    a = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    out, c = emulator.run(k, a)
    np.testing.assert_allclose(out, 2 * a.T @ a, rtol=1e-5, atol=1e-4)
    assert (c.pe_macs_issued, c.pe_macs_useful) == (2 * 128 * 128 * 128, 128 * 128 * 128)


def test_two_input_vector_instructions_cost_2n(tmp_path, monkeypatch):
    """tensor_tensor / scalar_tensor_tensor read two tiles: ~2N cycles (arch guide, VectorE cost model);
    tensor_scalar reads one: N."""
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        u = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.add)
        nisa.scalar_tensor_tensor(dst=u, data=u, op0=nl.multiply, operand0=0.5, op1=nl.add, operand1=t)
        nisa.tensor_scalar(dst=u, data=u, op0=nl.multiply, operand0=2.0)
        nl.store(out, u)
        return out
    """)
    x = np.random.default_rng(4).standard_normal((128, 512)).astype(np.float32)
    out, c = emulator.run(k, x)
    np.testing.assert_allclose(out, 2 * (0.5 * (2 * x) + x), rtol=1e-6)
    assert c.vector_instructions == 3 and c.vector_elems_issued == 128 * (2 * 512 + 2 * 512 + 512)
    assert c.vector_elems_useful == 3 * 128 * 512


def test_loop_reallocation_releases_memory(tmp_path, monkeypatch):
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        for i in nl.affine_range(50):
            big = nl.ndarray((128, 20 * 1024), dtype=nl.float32, buffer=nl.sbuf)
            acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        return nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    """)
    _, c = emulator.run(k, np.zeros((1, 1), np.float32))
    assert c.sbuf_peak_bytes == 2 * 20 * 1024 * 4 and c.psum_peak_banks == 2


def test_automatic_sbuf_overflow_is_a_spill_not_an_error(tmp_path, monkeypatch):
    """Live automatically allocated SBUF beyond the partition is spilled by the compiler (memory-hierarchy-
    overview.rst): counted, not refused; directly allocated tiles are not in the live total."""
    k, _ = _kernel_module(tmp_path, monkeypatch, """
        b = nl.ndarray((128, 40 * 1024), dtype=nl.float32, buffer=nl.sbuf)
        c = nl.ndarray((128, 9 * 1024), dtype=nl.float32, buffer=nl.sbuf)
        d = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 7 * 2048))
        return nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    """)
    _, c = emulator.run(k, np.zeros((1, 1), np.float32))
    assert c.sbuf_peak_bytes == 49 * 1024 * 4 and c.sbuf_spill_peak_bytes == 49 * 1024 * 4 - 192 * 1024
    _, c2 = emulator.run(k, np.zeros((1, 1), np.float32), target="trn2")
    assert c2.sbuf_spill_peak_bytes == 0
    k, where = _kernel_module(tmp_path, monkeypatch, """
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 1024))  # <-
        return p
    """)
    with pytest.raises(emulator.NkiRuleError, match="sbuf.capacity.*bank") as info:
        emulator.run(k, np.zeros((1, 1), np.float32))
    assert str(info.value).startswith(where)


def test_outputs_must_be_shared_hbm(tmp_path, monkeypatch):
    k, _ = _kernel_module(tmp_path, monkeypatch, """
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
    attention = emulator.load_kernel_module("kernels_nki.attention")
    assert sys.modules.get("kernels_nki.tiles") is before and "nki" not in sys.modules
    helper = loader._modules["kernels_nki.tiles"]
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
