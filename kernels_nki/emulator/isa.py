"""NumPy stand-in for `nki.isa` (NKI 0.6, rules.NKI_VERSION: explicit `dst` first) as documented in aws-neuron-sdk
nki/api/nki/isa/__init__.py.

Every instruction checks its rows of `rules.RULES` (raising with the kernel's file:line, the rule id and
its AWS source), counts its work on its engine, and (unless count-only) computes in float32 and rounds on
the write to the destination dtype (bf16 through ml_dtypes), as the engines do.
"""

from __future__ import annotations

import math

import numpy as np

from kernels_nki.emulator import machine as _m
from kernels_nki.emulator import trace as _trace
from kernels_nki.emulator.dma import dge_mode, dma_compute, dma_copy, oob_mode  # noqa: F401 (nki.isa names)
from kernels_nki.emulator.gather import nc_n_gather  # noqa: F401 (an nki.isa name)
from kernels_nki.emulator.search import max8, nc_find_index8, nc_match_replace8  # noqa: F401 (nki.isa names)
from kernels_nki.emulator.vector_reduce import tensor_scalar_reduce  # noqa: F401 (an nki.isa name)
from kernels_nki.emulator.dma_transpose import dma_transpose  # noqa: F401 (an nki.isa name)
from kernels_nki.emulator.shuffle import nc_stream_shuffle  # noqa: F401 (an nki.isa name)
from kernels_nki.emulator.optable import Op, _not_emulated, add, equal
from kernels_nki.emulator.optable import tile_size as _ts
from kernels_nki.emulator.machine import rule
from kernels_nki.emulator.operands import (  # noqa: F401 (engine is an nki.isa name)
    _alu, _apply, _engine_psum, _expand, _not_both_psum, _number, _operand, _per_partition, _read, _same_layout,
    _tile, _write, engine)


class reduce_cmd:
    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"
    load_reduce = "load_reduce"


class nc_version:
    gen2 = "gen2"
    gen3 = "gen3"
    gen4 = "gen4"


class matmul_perf_mode:
    none = "none"
    double_row = "double_row"


def get_nc_version():
    """gen2 on trn1, gen3 on trn2 (the running kernel's target)."""
    machine = getattr(_m._local, "machine", None)
    return machine.spec.nc_version if machine is not None else nc_version.gen2


# ----------------------------------------------------------------------------- data movement

def tensor_copy(dst, src, engine=engine.unknown, name=None):
    _tile(dst, "tensor_copy dst"), _tile(src, "tensor_copy src")
    if engine == "scalar":
        rule("tensor_copy.scalar", "tensor_copy(engine=nisa.engine.scalar)")
    _engine_psum(engine, dst, src)
    _same_layout(dst, src, "tensor_copy")
    _m.current().count_engine(engine or "vector", src, op="tensor_copy", reads=(src,), writes=(dst,))
    if dst.machine.compute:
        dst.data[...] = src.data.reshape(dst.shape).astype(np.float32).astype(dst.dtype) \
            if src.dtype != dst.dtype else src.data.reshape(dst.shape)


def memset(dst, value, engine=engine.unknown, name=None):
    _tile(dst, "memset dst")
    _engine_psum(engine, dst)
    if not _m.is_float(dst.dtype) and isinstance(value, (float, np.floating)):
        rule("memset.value", f"float value {value!r} into a {dst.dtype} tile")
    _m.current().count_engine(engine or "vector", dst, op="memset", writes=(dst,))
    if dst.mask is not None and dst.machine.compute:
        dst.mask[...] = False
    _write(dst, np.full(dst.shape, value, dtype=np.float32))


def _affine_values(shape, pattern, offset, channel_multiplier) -> np.ndarray:
    """offset + channel_multiplier * p + sum_k pattern[k][0] * i_(k+1) over a tile of `shape`."""
    val = np.full(shape, float(offset), dtype=np.float64)
    val += channel_multiplier * np.arange(shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
    for axis, (step, n) in enumerate(pattern, start=1):
        val += step * np.arange(n).reshape((n,) + (1,) * (len(shape) - axis - 1))
    return val


def _pattern(pattern, dst, what, rule_id):
    pattern = [(int(a), int(n)) for a, n in pattern]
    if math.prod(n for _, n in pattern) != math.prod(dst.shape[1:]):
        rule(rule_id, f"{what}: pattern counts {[n for _, n in pattern]} do not cover dst free shape {dst.shape[1:]}")
    return pattern


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """dst[p, i1, ...] = offset + channel_multiplier * p + sum_k pattern[k][0] * i_(k+1) on GpSimd."""
    _tile(dst, "iota dst", ("sbuf",), "gpsimd.psum")
    pattern = _pattern(pattern, dst, "iota", "gpsimd.psum")
    _m.current().count_engine("gpsimd", dst, op="iota", writes=(dst,))
    if dst.machine.compute:
        vals = _affine_values((dst.shape[0],) + tuple(n for _, n in pattern), pattern, offset, channel_multiplier)
        dst.data[...] = vals.reshape(dst.shape).astype(dst.dtype)


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=equal, offset=0, name=None):
    """dst = on_true_tile where cmp_op(offset + channel_multiplier * p + sum_k pattern[k][0] * i_(k+1), 0),
    else on_false_value, on GpSimd (NKI 0.3 argument order; offset a keyword defaulting to 0)."""
    _tile(dst, "affine_select dst", ("sbuf",), "affine_select.args")
    _tile(on_true_tile, "affine_select on_true_tile", ("sbuf",), "affine_select.args")
    _same_layout(dst, on_true_tile, "affine_select")
    if not isinstance(cmp_op, Op) or cmp_op.kind != "binary":
        rule("alu.op_table", f"affine_select cmp_op {cmp_op!r}")
    pattern = _pattern(pattern, dst, "affine_select", "affine_select.args")
    if not _number(on_false_value):
        rule("affine_select.args", f"on_false_value {on_false_value!r} is not a number")
    _m.current().count_engine("gpsimd", dst, op="affine_select", reads=(on_true_tile,), writes=(dst,))
    if not dst.machine.compute:
        return
    val = _affine_values((dst.shape[0],) + tuple(n for _, n in pattern), pattern, offset, channel_multiplier)
    keep = cmp_op.fn(val, 0.0).astype(bool).reshape(dst.shape)
    _write(dst, np.where(keep, _read(on_true_tile, dst), np.float32(on_false_value)))


# ----------------------------------------------------------------------------- TensorE


RECOMPUTE = "recompute"  # nc_matmul name prefix: a second computation of a product, counted not useful


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None):
    """dst[M, N] (fp32 PSUM) = stationary[K, M].T @ moving[K, N]; K on the partition axis.

    accumulate=None: the first matmul write to a PSUM element overwrites, later ones accumulate (the
    hardware default); True: accumulate (the element must hold a matmul result); False: overwrite.
    The onezero flags are performance hints (the values are used as given); a 0/1 stationary
    (is_stationary_onezero) selects or moves data, so, like is_transpose (which only labels the
    instruction on NeuronCore-v2), it is counted with zero useful MACs, and so is a matmul whose `name`
    (the instruction's name, a documented nc_matmul parameter) starts with RECOMPUTE: a product the kernel
    already computed once, issued again in another layout; tile_position/tile_size select a row and
    column tile of the PE array (`_matmul_tiling`).
    """
    _tile(stationary, "nc_matmul stationary", ("sbuf",), "matmul.buffers")
    _tile(moving, "nc_matmul moving", ("sbuf",), "matmul.buffers")
    _tile(dst, "nc_matmul dst", ("psum",), "matmul.buffers")
    if perf_mode not in (None, "none"):
        rule("matmul.perf_mode", f"perf_mode={perf_mode}")
    k, mm = stationary.shape[0], math.prod(stationary.shape[1:])
    k2, n = moving.shape[0], math.prod(moving.shape[1:])
    if k != k2:
        rule("matmul.contraction", f"partition sizes {k} (stationary) and {k2} (moving) differ")
    if mm > _ts.gemm_stationary_fmax:
        rule("matmul.stationary_fmax", f"stationary free size {mm} exceeds {_ts.gemm_stationary_fmax}")
    if n > _ts.gemm_moving_fmax:
        rule("matmul.moving_fmax", f"moving free size {n} exceeds {_ts.gemm_moving_fmax}")
    if _per_partition(dst) != (mm, n):
        rule("matmul.contraction", f"dst {dst.shape} must be [{mm}, {n}]")
    if dst.dtype != np.float32:
        rule("matmul.dst_fp32", f"dst dtype {dst.dtype}")
    rows, cols = _matmul_tiling(tile_position, tile_size, k, mm, dst,
                                (("stationary", stationary), ("moving", moving)))
    fp32 = [stationary.dtype == np.float32, moving.dtype == np.float32]
    if (any(fp32) and not all(fp32)) or not all(_m.is_float(t.dtype) for t in (stationary, moving)):
        rule("matmul.dtypes", f"stationary {stationary.dtype}, moving {moving.dtype}")
    m = _m.current()
    if accumulate is True and m.compute and not dst.mask.all():
        rule("matmul.accumulate", "accumulate=True into PSUM not written by a matmul before")
    _inference(dst, accumulate, "nc_matmul")
    recompute = str(name or "").startswith(RECOMPUTE)
    m.count_matmul(k, mm, n, fp32=all(fp32), useful=not (is_transpose or is_stationary_onezero or recompute),
                   rows=rows, cols=cols, op=name or "nc_matmul", stationary=stationary,
                   reads=(stationary, moving, dst), writes=(dst,))
    if not m.compute:
        return
    prod = _read(stationary).reshape(k, mm).T @ _read(moving).reshape(k, n)
    prod = prod.reshape(dst.shape)
    if accumulate is None:
        out = np.where(dst.mask, _read(dst) + prod, prod)
    else:
        out = _read(dst) + prod if accumulate else prod
    _write(dst, out)
    dst.mask[...] = True


def _matmul_tiling(position, size, k, mm, dst, operands) -> tuple[int, int]:
    """Checks tile_position/tile_size; returns the (rows, columns) of the PE array the matmul occupies
    ((128, 128) without tiling mode). Row and column tiles run in parallel (nc_matmul, "Tiling mode"), so
    a matmul is charged its tile. PE column c writes PSUM partition c: a matmul on the column tile at
    start_column writes dst partitions start_column .. start_column + M (AWS's nki-library does so:
    core/mlp/mlp_tkg/mlp_tkg_down_projection.py, core/router_topk/router_topk.py), and one without tiling
    mode partitions 0 .. M. Under the strict reading the (name, tile) `operands` sit on the row tile's
    partitions (rule strict.row_tile_partitions)."""
    if not position and not size:
        if dst.pstart != 0:
            rule("matmul.tiling_dst", f"dst starts at partition {dst.pstart} without column tiling (must be 0)")
        return _m.PMAX, _m.PMAX
    if not position or not size:
        rule("matmul.tiling", "tile_position and tile_size must both be set")
    (row, col), (rows, cols) = position, size
    sizes = (64, 128) if _m.current().target == "trn1" else (32, 64, 128)
    if rows not in sizes or cols not in sizes or row % rows or col % cols or row + rows > 128 or col + cols > 128:
        rule("matmul.tiling", f"tile_position={tuple(position)}, tile_size={tuple(size)} on {_m.current().target}")
    if k > rows or mm > cols:
        rule("matmul.tiling", f"stationary [{k}, {mm}] exceeds tile_size {tuple(size)}")
    if dst.pstart != col:
        rule("matmul.tiling_dst", f"dst starts at partition {dst.pstart}, the column tile at {col}")
    for what, t in operands:
        if not row <= t.pstart <= t.pstart + k <= row + rows:
            rule("strict.row_tile_partitions", f"{what} on partitions {t.pstart}..{t.pstart + k - 1}, the row tile "
                 f"at {row} of {rows} rows (partitions {row}..{row + rows - 1})")
    return int(rows), int(cols)


def _inference(dst, accumulate, what):
    """Under the strict reading, a TensorE write leaving accumulate to inference (None) must mean the same per
    bank and per location (rule strict.accumulate_inference): in each of dst's partitions either no matmul has
    written the bank since the tile was allocated, or one has written every location dst covers. The matmul-
    written locations are kept per allocation (`_Allocation.matmul_groups`, count-only mode too) at the view's
    place (its `layout`)."""
    m = _m.current()
    if m.reading != "strict":
        return
    alloc = dst.alloc
    storage = alloc.storage
    per_row = math.prod(storage.shape[1:]) or 1
    if alloc.matmul_groups is None:
        alloc.matmul_groups = np.zeros((storage.shape[0], per_row), dtype=bool)
    lay = dst.layout
    off = lay.ctypes.data - _trace.LAYOUT_BASE
    written = np.lib.stride_tricks.as_strided(alloc.matmul_groups.reshape(-1)[off:], lay.shape, lay.strides)
    if accumulate is None:
        _, p0, p1, f0, f1 = _trace.region(dst)[:5]
        bank = m.spec.psum_bank_bytes // dst.dtype.itemsize
        opened = alloc.matmul_groups[p0:p1, f0 // bank * bank:-(-f1 // bank) * bank].any(axis=1)
        full = written.reshape(written.shape[0], -1).all(axis=1)
        if (opened & ~full).any():
            p = p0 + int(np.argmax(opened & ~full))
            rule("strict.accumulate_inference", f"{what} with accumulate=None into {dst!r} at partitions {p0}..{p1 - 1}"
                 f", columns {f0}..{f1 - 1}: partition {p}'s bank holds matmul results elsewhere or in part of dst "
                 "(accumulates per bank, overwrites per location): pass accumulate, or use another bank")
    written[...] = True


def nc_transpose(dst, data, engine=engine.unknown, name=None):
    """dst[F, P] = data[P, F].T: TensorE (SBUF -> PSUM, up to 128 x 128) or VectorE (up to 32 x 32); free axes
    of data are flattened. Unknown engine: VectorE when both sides fit 32 x 32 and dst is not PSUM-only use."""
    _tile(data, "nc_transpose data"), _tile(dst, "nc_transpose dst")
    p, f = _per_partition(data)
    if _per_partition(dst) != (f, p):
        rule("transpose.engine", f"dst {dst.shape} must be [{f}, {p}] for data {data.shape}")
    if engine is None:
        engine = "tensor" if dst.buffer == "psum" else "vector"
    if dst.dtype != data.dtype and not (engine == "tensor" and dst.dtype == np.float32):
        rule("transpose.dtype", f"data {data.dtype} -> dst {dst.dtype}")
    if engine == "tensor" and data.dtype != np.float32:
        rule("strict.transpose_dtype", f"TensorE nc_transpose of {data.dtype} data into {dst.dtype} PSUM (transpose "
             "by nc_matmul against an identity into float32 PSUM)")
    m = _m.current()
    if engine == "vector":
        if p > 32 or f > 32:
            rule("transpose.engine", f"VectorE transpose of {data.shape} (limit 32 x 32)")
        m.count_engine("vector", data, op="nc_transpose", reads=(data,), writes=(dst,))
    else:
        if data.buffer != "sbuf" or dst.buffer != "psum":
            rule("transpose.engine", f"TensorE transpose {data.buffer} -> {dst.buffer} (must be sbuf -> psum)")
        if f > _m.PMAX:
            rule("transpose.engine", f"TensorE transpose of {data.shape} (limit 128 x 128)")
        _inference(dst, None, "nc_transpose")
        m.count_matmul(p, f, p, fp32=data.dtype == np.float32, useful=False, op="nc_transpose", stationary=data,
                       reads=(data,), writes=(dst,))
    if m.compute:
        dst.data[...] = data.data.reshape(p, f).T.reshape(dst.shape)


# ----------------------------------------------------------------------------- ScalarE


def _check_range(op: Op, x: np.ndarray):
    if op.act_range is None:
        return
    lo, hi, symmetric = op.act_range
    mag = np.abs(x) if symmetric else x
    bad = ~np.isnan(x) & ((mag < lo) | (mag > hi))
    if bad.any():
        v = x[bad].reshape(-1)[0]
        rule("activation.input_range", f"nl.{op.name} input {float(v)!r} outside [{lo!r}, {hi!r}]"
             f"{' in magnitude' if symmetric else ''} ({int(bad.sum())} elements)")


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, name=None):
    """dst = op(data * scale + bias) on ScalarE; scale a number or a float32 [P, 1] column, bias an [P, 1]
    column (a number too on NeuronCore-v3+). With reduce_op=nl.add and reduce_cmd reset_reduce (or reduce),
    the free-axis row sums are stored into (or added onto) the engine's reduce registers, then written to
    reduce_res."""
    _tile(dst, "activation dst"), _tile(data, "activation data")
    _same_layout(dst, data, "activation")
    if not isinstance(op, Op) or not op.act:
        rule("activation.op_table", f"{op!r} is not a Scalar Engine activation function")
    p = data.shape[0]
    if isinstance(scale, _m.Tensor) and scale.dtype != np.float32:
        rule("activation.operands", f"scale tile dtype {scale.dtype} (must be float32)")
    scale_v = _operand(scale, p, "activation scale", "activation.operands")
    if bias is not None and _number(bias):
        rule("activation.bias_vector", f"bias={bias!r} is a Python number")
    if bias is not None and op.name == "reciprocal":
        rule("activation.reciprocal_bias", "activation(op=nl.reciprocal, bias=...)")
    bias_v = _operand(0.0 if bias is None else bias, p, "activation bias", "activation.operands")
    if reduce_op is not None:
        if reduce_op is not add:
            rule("activation.reduce_add", f"reduce_op={reduce_op!r}")
        if reduce_cmd not in ("reset_reduce", "reduce"):
            _m.fail("activation: reduce_op needs reduce_cmd=reset_reduce or reduce", _m.NkiEmulatorError)
        if reduce_res is not None:
            _tile(reduce_res, "activation reduce_res")
            if reduce_res.shape[0] != p or math.prod(reduce_res.shape[1:]) != 1:
                rule("activation.operands", f"reduce_res {reduce_res.shape} must be [{p}, 1]")
    m = _m.current()
    m.count_engine("scalar", data, extra_instructions=1 if reduce_op is not None else 0, op=f"activation.{op.name}",
                   reads=(data, scale, bias), writes=(dst, reduce_res))
    if reduce_cmd == "reset":
        m.scalar_reduce_regs[:] = 0.0
    if not m.compute:
        return
    nd = data.ndim
    x = _read(data) * _expand(scale_v, nd) + _expand(bias_v, nd)
    _check_range(op, x)
    with np.errstate(all="ignore"):
        out = op.fn(x)
    _write(dst, out)
    if reduce_op is not None:
        row = out.reshape(p, -1).sum(axis=1, dtype=np.float32)
        regs = m.scalar_reduce_regs
        regs[:p] = row if reduce_cmd == "reset_reduce" else regs[:p] + row
        if reduce_res is not None:
            _write(reduce_res, regs[:p].reshape(reduce_res.shape))


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=reduce_cmd.reset_reduce)


# ----------------------------------------------------------------------------- VectorE


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """dst = op(data1, data2): same partitions and elements per partition (row-major order)."""
    _tile(dst, "tensor_tensor dst"), _tile(data1, "tensor_tensor data1"), _tile(data2, "tensor_tensor data2")
    _same_layout(data1, data2, "tensor_tensor")
    _same_layout(dst, data1, "tensor_tensor dst")
    _not_both_psum(data1, data2, "tensor_tensor.psum", "tensor_tensor")
    _engine_psum(engine, dst, data1, data2)
    _alu(op, "tensor_tensor op")
    _m.current().count_engine(engine or "vector", data1, inputs=2, op=f"tensor_tensor.{op.name}",
                              reads=(data1, data2), writes=(dst,))
    if dst.machine.compute:
        _write(dst, op.fn(_read(data1), _read(data2, data1)).reshape(dst.shape))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    """dst = (data op0 operand0) op1 operand1; operands: numbers or float32 [P, 1] columns."""
    _tile(dst, "tensor_scalar dst"), _tile(data, "tensor_scalar data")
    _same_layout(dst, data, "tensor_scalar")
    _engine_psum(engine, dst, data)
    _alu(op0, "tensor_scalar op0", unary_ok=True)
    if engine == "gpsimd" and "rsqrt" not in (op0.name, getattr(op1, "name", None)):
        rule("tensor_scalar.gpsimd", f"tensor_scalar(engine=gpsimd, op0={op0!r}, op1={op1!r})")
    p, nd = data.shape[0], data.ndim
    for x, what in ((operand0, "operand0"), (operand1, "operand1")):
        if isinstance(x, _m.Tensor) and x.dtype != np.float32:
            rule("tensor_scalar.operands", f"{what} tile dtype {x.dtype} (must be float32)")
        if x is not None and not _number(x) and not isinstance(x, _m.Tensor):
            rule("tensor_scalar.operands", f"{what} {x!r} is neither a number nor a tile")
    v0 = _expand(_operand(operand0, p, "tensor_scalar operand0", "tensor_scalar.operands"), nd)
    if op1 is not None:
        _alu(op1, "tensor_scalar op1", unary_ok=True)
        v1 = _expand(_operand(operand1, p, "tensor_scalar operand1", "tensor_scalar.operands"), nd)
    _m.current().count_engine(engine or "vector", data, op=f"tensor_scalar.{op0.name}",
                              reads=(data, operand0, operand1), writes=(dst,))
    if not dst.machine.compute:
        return
    out = _apply(op0, _read(data), v0, reverse0)
    if op1 is not None:
        out = _apply(op1, out, v1, reverse1)
    _write(dst, out)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    """dst = (data op0 operand0) op1 operand1; operand0 a number or [P, 1] column, operand1 a tile."""
    _tile(dst, "scalar_tensor_tensor dst"), _tile(data, "scalar_tensor_tensor data")
    _tile(operand1, "scalar_tensor_tensor operand1")
    _same_layout(dst, data, "scalar_tensor_tensor")
    _same_layout(data, operand1, "scalar_tensor_tensor operand1")
    _not_both_psum(data, operand1, "stt.psum", "scalar_tensor_tensor data and operand1")
    _alu(op0, "scalar_tensor_tensor op0"), _alu(op1, "scalar_tensor_tensor op1")
    v0 = _expand(_operand(operand0, data.shape[0], "scalar_tensor_tensor operand0", "tensor_scalar.operands"),
                 data.ndim)
    _m.current().count_engine("vector", data, inputs=2, op="scalar_tensor_tensor",
                              reads=(data, operand0, operand1), writes=(dst,))
    if dst.machine.compute:
        _write(dst, _apply(op1, _apply(op0, _read(data), v0, reverse0), _read(operand1, data), reverse1))


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """Per partition along the flattened free axis: r[i] = op1(op0(data0[i], r[i-1]), data1[i]), r[-1] = initial
    (a number or an [P, 1] column)."""
    _tile(dst, "tensor_tensor_scan dst"), _tile(data0, "tensor_tensor_scan data0")
    _tile(data1, "tensor_tensor_scan data1")
    _same_layout(data0, data1, "tensor_tensor_scan"), _same_layout(dst, data0, "tensor_tensor_scan dst")
    _not_both_psum(data0, data1, "scan.psum", "tensor_tensor_scan")
    _alu(op0, "tensor_tensor_scan op0"), _alu(op1, "tensor_tensor_scan op1")
    p, f = _per_partition(data0)
    init = _operand(initial, p, "tensor_tensor_scan initial", "tensor_scalar.operands")
    _m.current().count_engine("vector", data0, inputs=2, op="tensor_tensor_scan",
                              reads=(data0, data1, initial), writes=(dst,))
    if not dst.machine.compute:
        return
    a, b = _read(data0).reshape(p, f), _read(data1).reshape(p, f)
    out = np.empty((p, f), np.float32)
    prev = np.broadcast_to(np.asarray(init, np.float32).reshape(-1, 1) if isinstance(init, np.ndarray)
                           else np.float32(init), (p, 1)).reshape(p)
    for i in range(f):
        prev = _apply(op1, _apply(op0, a[:, i], prev, reverse0), b[:, i], reverse1).astype(np.float32)
        out[:, i] = prev
    _write(dst, out)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce `data` along its last free axes (never the partition axis 0) with a legal reduction op."""
    _tile(dst, "tensor_reduce dst"), _tile(data, "tensor_reduce data")
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(sorted(a + data.ndim if a < 0 else a for a in axes))
    if not axes or axes[0] <= 0 or axes != tuple(range(axes[0], data.ndim)):
        rule("reduce.axes", f"axis {axis} of a {data.ndim}-D tile (must be the last free axes)")
    if not isinstance(op, Op) or op.reduce is None:
        rule("reduce.op", f"{op!r} is not a legal reduction op")
    kept = tuple(1 if i in axes else s for i, s in enumerate(data.shape))
    if math.prod(dst.shape) != math.prod(kept) or dst.shape[0] != data.shape[0]:
        rule("alu.no_broadcast", f"tensor_reduce: dst {dst.shape} does not match the reduced shape {kept}")
    _m.current().count_engine("vector", data, op="tensor_reduce", reads=(data,), writes=(dst,))
    if dst.machine.compute:
        out = op.reduce.reduce(_read(data), axis=axes, keepdims=True)
        _write(dst, (-out if negate else out).reshape(dst.shape))


def reciprocal(dst, data, name=None):
    _tile(dst, "reciprocal dst"), _tile(data, "reciprocal data")
    _same_layout(dst, data, "reciprocal")
    _m.current().count_engine("vector", data, op="reciprocal", reads=(data,), writes=(dst,))
    if dst.machine.compute:
        with np.errstate(divide="ignore"):
            _write(dst, 1.0 / _read(data, dst))


# ----------------------------------------------------------------------------- nki.isa.constants
def _constants_module():
    """`nki.isa.constants`: the enums nki.isa takes (aws-neuron-sdk nki/api/nki/isa/__init__.py; AWS's
    nki-library imports them from this module: `from nki.isa.constants import oob_mode`)."""
    import types

    mod = types.ModuleType("nki.isa.constants", "NumPy emulator of nki.isa.constants")
    for name in ("oob_mode", "dge_mode", "engine", "reduce_cmd", "nc_version", "matmul_perf_mode"):
        setattr(mod, name, globals()[name])
    return mod


constants = _constants_module()
# deprecated module-level engine constants (nki/api/nki/isa/__init__.py: "deprecated: use engine.vector"), which
# AWS's nki-library passes as engine=nisa.vector_engine / scalar_engine / gpsimd_engine
tensor_engine, vector_engine, scalar_engine = engine.tensor, engine.vector, engine.scalar
gpsimd_engine, unknown_engine = engine.gpsimd, engine.unknown


# names a kernel file may import; called, they need an LNC > 1 launch (nki/api/nki/isa/__init__.py core_barrier:
# "Available only on NeuronCore-v3 or newer"; sendrecv: intra-LNC, LNC2 only, release-notes NKI 0.4.0)
_MULTI_CORE = "synchronises logical NeuronCores of an LNC > 1 launch (NeuronCore-v3 or newer)"
core_barrier = _not_emulated("nisa.core_barrier", _MULTI_CORE)
sendrecv = _not_emulated("nisa.sendrecv", _MULTI_CORE)


def _register(name: str):
    def instruction(*args, **kwargs):
        _m.fail(f"nisa.{name}: runtime registers (dynamic loops and offsets) are not emulated", _m.NkiEmulatorError)

    instruction.__name__ = name
    return instruction


register_alloc, register_load = _register("register_alloc"), _register("register_load")
register_store, register_move = _register("register_store"), _register("register_move")


# every instruction returns its NkiInstruction (nki/api/nki/isa/__init__.py, NkiInstruction: "Returned by nki.isa
# operations during tracing"): scheduling.py
from kernels_nki.emulator.scheduling import NkiInstruction, wrap_instructions  # noqa: E402,F401 (an nki.isa name)

wrap_instructions(globals())
