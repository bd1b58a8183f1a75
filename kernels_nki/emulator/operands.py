"""Operand checks and NumPy helpers shared by the emulated `nki.isa` instructions (isa.py, dma.py)."""

from __future__ import annotations

import math

import numpy as np

from kernels_nki.emulator import machine as _m
from kernels_nki.emulator.optable import Op
from kernels_nki.emulator.machine import rule


class engine:
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    sync = "sync"
    unknown = None


_PSTART = ((64, (0,)), (32, (0, 64)), (0, (0, 32, 64, 96)))


def _tile(t, what: str, buffers=_m.ON_CHIP, rule_id: str = "engine.hbm", engine_access: bool = True) -> _m.Tensor:
    """An instruction operand: a Tensor in `buffers`, on chip within the partition/access-pattern rules
    (start partition and free access pattern are compute-engine rules; DMA passes engine_access=False)."""
    if not isinstance(t, _m.Tensor):
        _m.fail(f"{what} must be a tile, got {type(t).__name__}", _m.NkiEmulatorError)
    if t.buffer not in buffers:
        if t.buffer in _m.HBM:
            rule("engine.hbm", f"{what} is an HBM tensor (move HBM data with nl.load / nl.store / nisa.dma_copy)")
        rule(rule_id, f"{what} must be in {' or '.join(buffers)}, got {t.buffer}")
    if t.buffer in _m.HBM:
        return t
    n = t.shape[0]
    if n > _m.PMAX:
        rule("partition.max", f"{what} {t.shape}: partition dimension exceeds {_m.PMAX}")
    if not engine_access:
        return t
    allowed = next(starts for above, starts in _PSTART if n > above)
    if t.pstart not in allowed:
        rule("partition.start", f"{what} spans {n} partitions from partition {t.pstart}; allowed starts {allowed}")
    if t.ndim - 1 > _m.FREE_AXES_MAX or any(s > _m.FREE_AXIS_MAX for s in t.shape[1:]):
        rule("free.access_pattern", f"{what} {t.shape}")
    return t


def _per_partition(t) -> tuple[int, int]:
    return t.shape[0], math.prod(t.shape[1:])


def _same_layout(a: _m.Tensor, b: _m.Tensor, what: str):
    """Same partition size and elements per partition (shapes may differ; elements map in row-major order)."""
    if _per_partition(a) != _per_partition(b):
        rule("alu.no_broadcast", f"{what}: {a.shape} and {b.shape} differ in partitions or elements per partition")


def _read(t: _m.Tensor, like: _m.Tensor | None = None) -> np.ndarray:
    v = t.data.astype(np.float32)
    return v.reshape(like.shape) if like is not None and like.shape != t.shape else v


def _write(dst: _m.Tensor, value) -> None:
    if dst.machine.compute:
        dst.data[...] = np.asarray(value, dtype=np.float32).reshape(dst.shape).astype(dst.dtype)


def _number(x) -> bool:
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool)


def _operand(x, partitions: int, what: str, rule_id: str):
    """A scalar operand: a Python number or a float32 [P, 1] column broadcast along the free axes."""
    if _number(x):
        return float(x)
    t = _tile(x, what)
    if t.shape[0] != partitions or math.prod(t.shape[1:]) != 1:
        rule(rule_id, f"{what} {t.shape} must be a number or a [{partitions}, 1] column")
    return _read(t).reshape(partitions, 1) if t.machine.compute else 0.0


def _expand(v, ndim: int):
    if isinstance(v, np.ndarray):
        return v.reshape(v.shape[0], *([1] * (ndim - 1)))
    return v


def _apply(op: Op, a, b, reverse: bool):
    if op.kind == "unary":
        return op.fn(a)
    return op.fn(b, a) if reverse else op.fn(a, b)


def _alu(op, what: str, unary_ok: bool = False):
    if not isinstance(op, Op) or not op.alu or (op.kind == "unary" and not unary_ok):
        rule("alu.op_table", f"{what}: {op!r} is not an ALU operator")


def _engine_psum(eng, *tiles):
    if eng == "gpsimd" and any(t.buffer == "psum" for t in tiles):
        rule("gpsimd.psum", "an operand in PSUM on the GpSimd engine")


def _not_both_psum(a, b, rule_id: str, what: str):
    if a.buffer == "psum" and b.buffer == "psum":
        rule(rule_id, f"{what}: both inputs are in PSUM")
