"""Emulated `nki.isa.tensor_scalar_reduce` (VectorE): tensor_scalar with one operator and a reduction over the
free axes into a per-partition accumulator (aws-neuron-sdk nki/api/nki/isa/__init__.py, tensor_scalar_reduce).

The Vector Engine's accumulator registers persist between instructions: `reduce_cmd.reset_reduce` (default)
starts from the identity of `reduce_op`, `reduce` continues, `load_reduce` starts from `reduce_init`;
`reduce_res=None` keeps the result in the accumulator (NKI 0.6.0). Cost: one VectorE pass over `data` (the
document's "small additional performance cost" of the reduction is not charged).
"""

from __future__ import annotations

import numpy as np

from kernels_nki.emulator import machine as _m
from kernels_nki.emulator.optable import add, maximum, minimum, multiply
from kernels_nki.emulator.operands import _alu, _apply, _expand, _operand, _read, _same_layout, _tile, _write

_IDENTITY = {"add": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}


def _accumulator(m) -> np.ndarray:
    if getattr(m, "vector_reduce_regs", None) is None:
        m.vector_reduce_regs = np.full((_m.PMAX,), np.nan, dtype=np.float32)
    return m.vector_reduce_regs


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd="reset_reduce", reduce_init=None, reduce_res_negate=False, name=None):
    _tile(dst, "tensor_scalar_reduce dst"), _tile(data, "tensor_scalar_reduce data")
    _same_layout(dst, data, "tensor_scalar_reduce")
    _alu(op0, "tensor_scalar_reduce op0", unary_ok=True)
    if reduce_op not in (add, multiply, maximum, minimum):
        _m.rule("reduce.op", f"tensor_scalar_reduce reduce_op {reduce_op!r} (add, multiply, max or min)")
    p = data.shape[0]
    if reduce_res is not None:
        _tile(reduce_res, "tensor_scalar_reduce reduce_res")
        if reduce_res.shape[0] != p or reduce_res.size != p:
            _m.rule("alu.no_broadcast", f"tensor_scalar_reduce reduce_res {reduce_res.shape} for {p} partitions")
    v0 = _expand(_operand(operand0, p, "tensor_scalar_reduce operand0", "tensor_scalar.operands"), data.ndim) \
        if operand0 is not None else 0.0
    m = _m.current()
    m.count_engine("vector", data, op="tensor_scalar_reduce", reads=(data, operand0), writes=(dst, reduce_res))
    if not m.compute:
        return
    out = _apply(op0, _read(data), v0, reverse0).astype(np.float32)
    _write(dst, out)
    acc = _accumulator(m)
    cmd = getattr(reduce_cmd, "name", reduce_cmd)
    if cmd == "reset_reduce":
        acc[:p] = _IDENTITY[reduce_op.name]
    elif cmd == "load_reduce":
        acc[:p] = _read(reduce_init).reshape(p) if isinstance(reduce_init, _m.Tensor) else np.float32(reduce_init)
    part = reduce_op.reduce.reduce(out.reshape(p, -1), axis=1)
    acc[:p] = reduce_op.fn(acc[:p], part)
    if reduce_res is not None:
        _write(reduce_res, -acc[:p] if reduce_res_negate else acc[:p])
