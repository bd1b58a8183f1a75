"""The emulator's exceptions, how a kernel's source line is found, and byte reinterpretation of a storage (shared by
every emulator module)."""

from __future__ import annotations

import os
import sys

import numpy as np

_EMULATOR_DIR = os.path.dirname(os.path.abspath(__file__))


class NkiEmulatorError(RuntimeError):
    """A kernel did something the emulator (or the NKI API) does not allow."""


class NkiLimitError(NkiEmulatorError):
    """A documented NeuronCore or NKI rule was violated."""


class NkiRuleError(NkiLimitError):
    """A row of `kernels_nki.emulator.rules.RULES` was violated; `.rule` is that row, `.location` file:line."""

    def __init__(self, message: str, rule, location: str):
        super().__init__(message)
        self.rule, self.location = rule, location


def kernel_location() -> str:
    """file:line of the innermost frame outside the emulator package (the kernel source line)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _EMULATOR_DIR:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def fail(message: str, cls: type[NkiEmulatorError] = NkiLimitError):
    raise cls(f"{kernel_location()}: {message}")


def reinterpret(storage: np.ndarray, dtype: np.dtype, on_chip: bool) -> np.ndarray:
    """The storage's bytes as `dtype` (per partition on chip; the partition's bytes must divide evenly)."""
    rows = storage.shape[0] if on_chip and storage.ndim > 1 else 1
    nbytes = storage.size * storage.itemsize // rows
    if nbytes % dtype.itemsize:
        fail(f".ap(dtype={dtype}): {nbytes} B per partition is not a whole number of {dtype}", NkiEmulatorError)
    shape = (rows, nbytes // dtype.itemsize) if on_chip and storage.ndim > 1 else (nbytes // dtype.itemsize,)
    if storage.strides and 0 in storage.strides:  # count-only mode: zero-stride data
        return np.broadcast_to(np.zeros((), dtype), shape)
    return storage.reshape(rows, -1).view(dtype).reshape(shape)
