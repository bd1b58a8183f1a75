"""NumPy stand-in for the subset of `nki.isa` (NKI 0.3+: explicit `dst` first) the project's kernels use.

Every instruction checks the NeuronCore-v2 rules (../shared/specs/nki.md section 3) and raises with
the kernel's file:line, counts its work on its engine, and (unless count-only) computes in float32
and rounds on the write to the destination dtype (bf16 through ml_dtypes), as ScalarE/VectorE do.
"""

from __future__ import annotations

import math

import numpy as np

from kernels_nki.emulator import machine as _m
from kernels_nki.emulator.language import Op, add, tile_size
from kernels_nki.emulator.language import equal as _equal


class engine:
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    unknown = None


class reduce_cmd:
    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"


class nc_version:
    gen2 = "gen2"
    gen3 = "gen3"
    gen4 = "gen4"


def get_nc_version():
    return nc_version.gen2  # the emulator models trn1 / NeuronCore-v2 only


# ----------------------------------------------------------------------------- operand helpers


def _tile(t, what: str, buffers=_m.ON_CHIP) -> _m.Tensor:
    if not isinstance(t, _m.Tensor):
        _m.fail(f"{what} must be a tile, got {type(t).__name__}", _m.NkiEmulatorError)
    if t.buffer not in buffers:
        if t.buffer in _m.HBM:
            _m.fail(f"{what} is an HBM tensor: compute engines reach only SBUF/PSUM "
                    "(move HBM data with nl.load / nl.store / nisa.dma_copy)")
        _m.fail(f"{what} must be in {' or '.join(buffers)}, got {t.buffer}")
    if t.buffer in _m.HBM:
        return t
    if t.ndim < 1 or t.shape[0] > _m.PMAX:
        _m.fail(f"{what} {t.shape}: partition dimension exceeds {_m.PMAX}")
    free = math.prod(t.shape[1:])
    if t.buffer == "sbuf" and free > _m.FREE_MAX_SBUF:
        _m.fail(f"{what} {t.shape}: free size {free} exceeds {_m.FREE_MAX_SBUF} elements per instruction")
    return t


def _same_shape(a: _m.Tensor, b: _m.Tensor, what: str):
    if a.shape != b.shape:
        _m.fail(f"{what}: shapes {a.shape} and {b.shape} differ (NKI binary ops do not broadcast)")


def _read(t: _m.Tensor) -> np.ndarray:
    return t.data.astype(np.float32)


def _write(dst: _m.Tensor, value) -> None:
    if dst.machine.compute:
        dst.data[...] = np.asarray(value, dtype=np.float32).astype(dst.dtype)


def _operand(x, partitions: int, what: str):
    """A scalar operand: a Python number or a [P, 1] column broadcast along the free axes."""
    if isinstance(x, (int, float, np.floating, np.integer)):
        return float(x)
    t = _tile(x, what)
    if t.shape[0] != partitions or math.prod(t.shape[1:]) != 1:
        _m.fail(f"{what} {t.shape} must be a number or a [{partitions}, 1] column")
    return _read(t).reshape(partitions, 1) if t.machine.compute else 0.0


def _expand(v, ndim: int):
    if isinstance(v, np.ndarray):
        return v.reshape(v.shape[0], *([1] * (ndim - 1)))
    return v


def _apply(op: Op, a, b, reverse: bool):
    return op.fn(b, a) if reverse else op.fn(a, b)


def _check_op(op, kind: str, what: str):
    if not isinstance(op, Op) or op.kind != kind:
        _m.fail(f"{what}: expected a {kind} nl op, got {op!r}", _m.NkiEmulatorError)


# ----------------------------------------------------------------------------- data movement


class oob_mode:
    error = "error"
    skip = "skip"


class dge_mode:
    unknown = "unknown"
    none = "none"
    swdge = "swdge"
    hwdge = "hwdge"


def dma_copy(dst, src, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, unique_indices=True,
             name=None):
    """Any of HBM/SBUF to HBM/SBUF (not PSUM); same shape and dtype (a plain copy does not cast).

    Either side may be an HBM access pattern (`t.ap(...)`; with vector_offset: gather as src,
    scatter as dst). dst_rmw_op=nl.add: dst = dst + src, computed in fp32 inside the DMA engine and
    cast to dst's dtype. unique_indices=True promises that a scatter's rows are distinct: with
    duplicates the hardware keeps one of the colliding writes (emulated: the last), so scatter-adds
    with repeated rows must pass unique_indices=False (serialised read-modify-writes).
    """
    indirect = (_m.AccessPattern,)
    if not isinstance(dst, indirect):
        _tile(dst, "dma_copy dst", ("sbuf",) + _m.HBM)
    if not isinstance(src, indirect):
        _tile(src, "dma_copy src", ("sbuf",) + _m.HBM)
    if isinstance(dst, indirect) and isinstance(src, indirect):
        _m.fail("dma_copy: at most one side may be an access pattern", _m.NkiEmulatorError)
    if dst.shape != src.shape:
        _m.fail(f"dma_copy: shapes {src.shape} and {dst.shape} differ")
    if dst_rmw_op is not None and (not isinstance(dst_rmw_op, Op) or dst_rmw_op.name != "add"):
        _m.fail(f"dma_copy: dst_rmw_op must be nl.add, got {dst_rmw_op!r}")
    if dst.dtype != src.dtype and dst_rmw_op is None:
        _m.fail(f"dma_copy: dtypes {src.dtype} -> {dst.dtype} differ (cast on an engine, e.g. nisa.tensor_copy)")
    m = _m.current()
    m.count_dma(math.prod(src.shape) * src.dtype.itemsize)
    if not m.compute:
        return
    value = src.base.data.reshape(-1)[src.flat_index()] if isinstance(src, indirect) else src.data
    if isinstance(dst, indirect):
        flat, idx = dst.base.data.reshape(-1), dst.flat_index()
        if not dst.base.data.flags.c_contiguous:
            _m.fail("dma_copy: scatter into a non-contiguous HBM tensor", _m.NkiEmulatorError)
        if dst_rmw_op is None:
            flat[idx] = value
        elif unique_indices:  # colliding read-modify-writes: one wins, the others are lost
            flat[idx] = (flat[idx].astype(np.float32) + value.astype(np.float32)).astype(flat.dtype)
        else:
            acc = flat.astype(np.float32)
            np.add.at(acc, idx.reshape(-1), value.astype(np.float32).reshape(-1))
            flat[...] = acc.astype(flat.dtype)
    elif dst_rmw_op is not None:
        dst.data[...] = (dst.data.astype(np.float32) + value.astype(np.float32)).astype(dst.dtype)
    else:
        dst.data[...] = value


def tensor_copy(dst, src, engine=engine.vector, name=None):
    _tile(dst, "tensor_copy dst"), _tile(src, "tensor_copy src")
    _same_shape(dst, src, "tensor_copy")
    _m.current().count_engine(engine or "vector", src)
    _write(dst, _read(src))


def memset(dst, value, engine=engine.vector, name=None):
    _tile(dst, "memset dst")
    _m.current().count_engine(engine or "vector", dst)
    if dst.mask is not None and dst.machine.compute:
        dst.mask[...] = False
    _write(dst, np.full(dst.shape, value, dtype=np.float32))


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """dst[p, i1, i2, ...] = offset + channel_multiplier * p + sum_k pattern[k][0] * i_(k+1) on GpSimd;
    pattern: one [step, count] pair per free axis of dst."""
    _tile(dst, "iota dst")
    pattern = [(int(a), int(n)) for a, n in pattern]
    if tuple(n for _, n in pattern) != dst.shape[1:]:
        _m.fail(f"iota: pattern counts {[n for _, n in pattern]} do not match dst free shape {dst.shape[1:]}")
    _m.current().count_engine("gpsimd", dst)
    if not dst.machine.compute:
        return
    val = _affine_values(dst.shape, pattern, offset, channel_multiplier)
    if dst.mask is not None:
        _m.fail("iota: dst must be in SBUF")
    dst.data[...] = val.astype(dst.dtype)


def _affine_values(shape, pattern, offset, channel_multiplier) -> np.ndarray:
    """offset + channel_multiplier * p + sum_k pattern[k][0] * i_(k+1) over a tile of `shape` (iota, affine_select)."""
    val = np.full(shape, float(offset), dtype=np.float64)
    val += channel_multiplier * np.arange(shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
    for axis, (step, n) in enumerate(pattern, start=1):
        val += step * np.arange(n).reshape((n,) + (1,) * (len(shape) - axis - 1))
    return val


def affine_select(dst, pattern, offset, channel_multiplier, on_true_tile, on_false_value, cmp_op=None, name=None):
    """dst = on_true_tile where cmp_op(offset + channel_multiplier * p + sum_k pattern[k][0] * i_(k+1), 0),
    else on_false_value (a number), on GpSimd; pattern as in iota; dst and on_true_tile in SBUF (e.g. causal masks)."""
    _tile(dst, "affine_select dst", ("sbuf",)), _tile(on_true_tile, "affine_select on_true_tile", ("sbuf",))
    _same_shape(dst, on_true_tile, "affine_select")
    cmp_op = cmp_op if cmp_op is not None else _equal
    _check_op(cmp_op, "binary", "affine_select cmp_op")
    pattern = [(int(a), int(n)) for a, n in pattern]
    if tuple(n for _, n in pattern) != dst.shape[1:]:
        _m.fail(f"affine_select: pattern counts {[n for _, n in pattern]} do not match dst free shape {dst.shape[1:]}")
    if not isinstance(on_false_value, (int, float, np.floating, np.integer)):
        _m.fail("affine_select: on_false_value must be a number", _m.NkiEmulatorError)
    _m.current().count_engine("gpsimd", dst)
    if not dst.machine.compute:
        return
    val = _affine_values(dst.shape, pattern, offset, channel_multiplier)
    keep = cmp_op.fn(val, 0.0).astype(bool)
    _write(dst, np.where(keep, _read(on_true_tile), np.float32(on_false_value)))


# ----------------------------------------------------------------------------- TensorE


def nc_matmul(dst, stationary, moving, accumulate=None, name=None):
    """dst[M, N] (fp32 PSUM) = stationary[K, M].T @ moving[K, N]; K on the partition axis.

    accumulate=None: the first write to a PSUM element overwrites, later writes accumulate (the
    hardware default); True: always accumulate; False: always overwrite.
    """
    _tile(stationary, "nc_matmul stationary", ("sbuf",))
    _tile(moving, "nc_matmul moving", ("sbuf",))
    _tile(dst, "nc_matmul dst", ("psum",))
    if stationary.ndim != 2 or moving.ndim != 2 or dst.ndim != 2:
        _m.fail("nc_matmul operands must be 2-D tiles")
    (k, mm), (k2, n) = stationary.shape, moving.shape
    if k != k2:
        _m.fail(f"nc_matmul: contraction must be the partition axis of both operands, got {k} and {k2}")
    if mm > tile_size.gemm_stationary_fmax:
        _m.fail(f"nc_matmul: stationary free size {mm} exceeds {tile_size.gemm_stationary_fmax}")
    if n > tile_size.gemm_moving_fmax:
        _m.fail(f"nc_matmul: moving free size {n} exceeds {tile_size.gemm_moving_fmax}")
    if dst.shape != (mm, n):
        _m.fail(f"nc_matmul: dst {dst.shape} must be [{mm}, {n}]")
    if dst.dtype != np.float32:
        _m.fail(f"nc_matmul: dst must be float32 PSUM on NeuronCore-v2, got {dst.dtype}")
    fp32 = [stationary.dtype == np.float32, moving.dtype == np.float32]
    if any(fp32) and not all(fp32):
        _m.fail("nc_matmul: if one input is float32 the other must be too")
    for t in (stationary, moving):
        if not (np.issubdtype(t.dtype, np.floating) or t.dtype.name == "bfloat16"):
            _m.fail(f"nc_matmul: TensorE takes floating inputs, got {t.dtype}")
    m = _m.current()
    m.count_matmul(k, mm, n, fp32=all(fp32))
    if not m.compute:
        return
    prod = _read(stationary).T @ _read(moving)
    if accumulate is None:
        written = dst.mask.copy()
        out = np.where(written, _read(dst) + prod, prod)
    elif accumulate:
        out = _read(dst) + prod
    else:
        out = prod
    _write(dst, out)
    dst.mask[...] = True


def nc_transpose(dst, data, engine=engine.tensor, name=None):
    """dst[F, P] = data[P, F].T: on TensorE (identity matmul into PSUM, up to 128 x 128) or VectorE (32 x 32)."""
    _tile(data, "nc_transpose data")
    p, f = data.shape if data.ndim == 2 else _m.fail("nc_transpose takes a 2-D tile")
    if dst.shape != (f, p):
        _m.fail(f"nc_transpose: dst {dst.shape} must be [{f}, {p}]")
    m = _m.current()
    if engine == "vector":
        _tile(dst, "nc_transpose dst")
        if p > 32 or f > 32:
            _m.fail(f"nc_transpose on VectorE handles 32 x 32 blocks, got {data.shape}")
        m.count_engine("vector", data)
    else:
        _tile(data, "nc_transpose data", ("sbuf",)), _tile(dst, "nc_transpose dst", ("psum",))
        if f > _m.PMAX:
            _m.fail(f"nc_transpose: free size {f} exceeds {_m.PMAX}")
        m.count_matmul(p, f, p, fp32=data.dtype == np.float32, useful=False)
    _write(dst, _read(data).T)


# ----------------------------------------------------------------------------- ScalarE


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, name=None):
    """dst = op(data * scale + bias) on ScalarE; bias/scale: number or [P, 1] column.

    With reduce_op=nl.add and reduce_cmd reset_reduce (or reduce), the free-axis row sums are
    stored into (or added onto) the engine's reduce registers, which are then written to reduce_res.
    """
    _tile(dst, "activation dst"), _tile(data, "activation data")
    _same_shape(dst, data, "activation")
    _check_op(op, "unary", "activation op")
    p = data.shape[0]
    scale_v = _operand(scale, p, "activation scale")
    bias_v = _operand(0.0 if bias is None else bias, p, "activation bias")
    if reduce_op is not None:
        if reduce_op is not add:
            _m.fail(f"activation: reduce_op must be nl.add on NeuronCore-v2, got {reduce_op!r}")
        if reduce_cmd not in ("reset_reduce", "reduce"):
            _m.fail("activation: reduce_op needs reduce_cmd=reset_reduce or reduce", _m.NkiEmulatorError)
        if reduce_res is not None:
            _tile(reduce_res, "activation reduce_res")
            if reduce_res.shape[0] != p or math.prod(reduce_res.shape[1:]) != 1:
                _m.fail(f"activation: reduce_res {reduce_res.shape} must be [{p}, 1]")
    m = _m.current()
    m.count_engine("scalar", data, extra_instructions=1 if reduce_op is not None else 0)
    if reduce_cmd == "reset":
        m.scalar_reduce_regs[:] = 0.0
    if not m.compute:
        return
    nd = data.ndim
    out = op.fn(_read(data) * _expand(scale_v, nd) + _expand(bias_v, nd))
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


def tensor_tensor(dst, data1, data2, op, engine=engine.vector, name=None):
    _tile(dst, "tensor_tensor dst"), _tile(data1, "tensor_tensor data1"), _tile(data2, "tensor_tensor data2")
    _same_shape(data1, data2, "tensor_tensor")
    _same_shape(dst, data1, "tensor_tensor dst")
    _check_op(op, "binary", "tensor_tensor op")
    _m.current().count_engine(engine or "vector", data1)
    if dst.machine.compute:
        _write(dst, op.fn(_read(data1), _read(data2)))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.vector, name=None):
    """dst = (data op0 operand0) op1 operand1; operands: numbers or [P, 1] columns."""
    _tile(dst, "tensor_scalar dst"), _tile(data, "tensor_scalar data")
    _same_shape(dst, data, "tensor_scalar")
    _check_op(op0, "binary", "tensor_scalar op0")
    p, nd = data.shape[0], data.ndim
    v0 = _expand(_operand(operand0, p, "tensor_scalar operand0"), nd)
    if op1 is not None:
        _check_op(op1, "binary", "tensor_scalar op1")
        v1 = _expand(_operand(operand1, p, "tensor_scalar operand1"), nd)
    _m.current().count_engine(engine or "vector", data)
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
    _same_shape(dst, data, "scalar_tensor_tensor")
    _same_shape(data, operand1, "scalar_tensor_tensor operand1")
    _check_op(op0, "binary", "scalar_tensor_tensor op0"), _check_op(op1, "binary", "scalar_tensor_tensor op1")
    v0 = _expand(_operand(operand0, data.shape[0], "scalar_tensor_tensor operand0"), data.ndim)
    _m.current().count_engine("vector", data)
    if dst.machine.compute:
        _write(dst, _apply(op1, _apply(op0, _read(data), v0, reverse0), _read(operand1), reverse1))


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce `data` along free axes (never the partition axis 0) with op in add|maximum|minimum|multiply."""
    _tile(dst, "tensor_reduce dst"), _tile(data, "tensor_reduce data")
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if any(a <= 0 or a >= data.ndim for a in axes):
        _m.fail(f"tensor_reduce: axis {axis} must name free axes (1..{data.ndim - 1}); "
                "cross-partition reductions need a matmul or GpSimd")
    if not isinstance(op, Op) or op.reduce is None:
        _m.fail(f"tensor_reduce: op must be nl.add/maximum/minimum/multiply, got {op!r}", _m.NkiEmulatorError)
    kept = tuple(1 if i in axes else s for i, s in enumerate(data.shape))
    if dst.shape not in (kept, tuple(s for i, s in enumerate(data.shape) if i not in axes)):
        _m.fail(f"tensor_reduce: dst {dst.shape} does not match the reduced shape {kept}")
    _m.current().count_engine("vector", data)
    if dst.machine.compute:
        out = op.reduce.reduce(_read(data), axis=axes, keepdims=True)
        _write(dst, (-out if negate else out).reshape(dst.shape))


def reciprocal(dst, data, name=None):
    _tile(dst, "reciprocal dst"), _tile(data, "reciprocal data")
    _same_shape(dst, data, "reciprocal")
    _m.current().count_engine("vector", data)
    if dst.machine.compute:
        _write(dst, 1.0 / _read(data))
