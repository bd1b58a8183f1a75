"""NumPy stand-in for the subset of `nki.language` (NKI 0.3+) the project's kernels use.

Installed as `nki.language` only while `kernels_nki.emulator.loader` executes a kernel module.
Op identifiers (`nl.exp`, `nl.add`, ...) are `Op` objects: passed as `op=` to `nki.isa` calls, or
called directly as the `nl.*` convenience functions (which allocate an SBUF result).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from kernels_nki.emulator import machine as _m

# ----------------------------------------------------------------------------- dtypes and buffers

float32 = np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
int32 = np.dtype(np.int32)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)

sbuf = "sbuf"
psum = "psum"
hbm = "hbm"
shared_hbm = "shared_hbm"
private_hbm = "private_hbm"


class tile_size:
    pmax = 128
    psum_fmax = 512
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512


# ----------------------------------------------------------------------------- op identifiers


def _cmp(f):
    return lambda a, b: f(a, b).astype(np.float32)


def _silu(x):
    return x / (1.0 + np.exp(-x))


class Op:
    """An ALU/activation function: `fn` on float32 NumPy arrays; `kind` unary|binary."""

    def __init__(self, name: str, kind: str, fn, reduce=None):
        self.name, self.kind, self.fn, self.reduce = name, kind, fn, reduce

    def __repr__(self):
        return f"nl.{self.name}"

    def __call__(self, x, y=None, dtype=None):
        from kernels_nki.emulator import isa  # the convenience form runs the matching instruction

        m = _m.current()
        if not isinstance(x, _m.Tensor):
            _m.fail(f"nl.{self.name}: first operand must be a tile", _m.NkiEmulatorError)
        out = m.allocate(x.shape, dtype or x.dtype, sbuf)
        if self.kind == "unary":
            isa.activation(out, self, x)
        elif isinstance(y, _m.Tensor):
            isa.tensor_tensor(out, x, y, self)
        elif isinstance(y, (int, float)):
            isa.tensor_scalar(out, x, self, float(y))
        else:
            _m.fail(f"nl.{self.name}: second operand must be a tile of the same shape or a number", _m.NkiEmulatorError)
        return out


exp = Op("exp", "unary", np.exp)
log = Op("log", "unary", np.log)
rsqrt = Op("rsqrt", "unary", lambda x: 1.0 / np.sqrt(x))
sqrt = Op("sqrt", "unary", np.sqrt)
square = Op("square", "unary", np.square)
reciprocal = Op("reciprocal", "unary", lambda x: 1.0 / x)
tanh = Op("tanh", "unary", np.tanh)
sigmoid = Op("sigmoid", "unary", lambda x: 1.0 / (1.0 + np.exp(-x)))
silu = Op("silu", "unary", _silu)
relu = Op("relu", "unary", lambda x: np.maximum(x, 0.0))
copy = Op("copy", "unary", lambda x: x)
negative = Op("negative", "unary", np.negative)
abs = Op("abs", "unary", np.abs)  # noqa: A001 (mirrors the nki.language name)

add = Op("add", "binary", np.add, reduce=np.add)
subtract = Op("subtract", "binary", np.subtract)
multiply = Op("multiply", "binary", np.multiply, reduce=np.multiply)
divide = Op("divide", "binary", np.divide)
maximum = Op("maximum", "binary", np.maximum, reduce=np.maximum)
minimum = Op("minimum", "binary", np.minimum, reduce=np.minimum)
equal = Op("equal", "binary", _cmp(np.equal))
not_equal = Op("not_equal", "binary", _cmp(np.not_equal))
greater = Op("greater", "binary", _cmp(np.greater))
greater_equal = Op("greater_equal", "binary", _cmp(np.greater_equal))
less = Op("less", "binary", _cmp(np.less))
less_equal = Op("less_equal", "binary", _cmp(np.less_equal))


def _reduce_convenience(op: Op, scale_by_count: bool):
    def fn(x, axis, dtype=None, keepdims=False):
        from kernels_nki.emulator import isa

        m = _m.current()
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape)) if keepdims else \
            tuple(s for i, s in enumerate(x.shape) if i not in axes)
        out = m.allocate(shape, dtype or x.dtype, sbuf)
        isa.tensor_reduce(out, op, x, axis, keepdims=keepdims)
        if scale_by_count:
            count = math.prod([x.shape[a] for a in axes])
            isa.tensor_scalar(out, out, multiply, 1.0 / count)
        return out

    return fn


sum = _reduce_convenience(add, False)  # noqa: A001
max = _reduce_convenience(maximum, False)  # noqa: A001
min = _reduce_convenience(minimum, False)  # noqa: A001
mean = _reduce_convenience(add, True)

# ----------------------------------------------------------------------------- creation, loops, indexing


def ndarray(shape, dtype, buffer=sbuf, name=None):
    return _m.current().allocate(shape, dtype, buffer)


def full(shape, fill_value, dtype, buffer=sbuf, name=None):
    m = _m.current()
    t = m.allocate(shape, dtype, buffer, fill=fill_value)
    if buffer in _m.ON_CHIP:
        m.count_engine("vector", t)  # the compiler emits a memset
    else:
        m.count_dma(math.prod(t.shape) * t.dtype.itemsize)
    return t


def zeros(shape, dtype, buffer=sbuf, name=None):
    return full(shape, 0, dtype, buffer, name)


def ones(shape, dtype, buffer=sbuf, name=None):
    return full(shape, 1, dtype, buffer, name)


def zeros_like(a, dtype=None, buffer=None, name=None):
    return zeros(a.shape, dtype or a.dtype, buffer or a.buffer, name)


def affine_range(*args):
    return range(*args)


sequential_range = affine_range
static_range = affine_range


def ds(start, size):
    return slice(int(start), int(start) + int(size))


def program_id(axis):
    return 0  # trn1 runs a kernel as one instance (no LNC)


def num_programs(axes=None):
    return 1


def program_ndim():
    return 0


# ----------------------------------------------------------------------------- HBM <-> SBUF


def load(src, dtype=None, name=None):
    """HBM -> a new SBUF tile of the same shape and dtype (one DMA)."""
    from kernels_nki.emulator import isa

    if dtype is not None and _m.as_dtype(dtype) != src.dtype:
        _m.fail("nl.load does not cast: load, then nisa.tensor_copy into a tile of the wanted dtype", _m.NkiEmulatorError)
    tile = _m.current().allocate(src.shape, src.dtype, sbuf)
    isa.dma_copy(tile, src)
    return tile


def store(dst, value, name=None):
    from kernels_nki.emulator import isa

    if value.buffer == psum:
        _m.fail("nl.store cannot take a PSUM tile: copy it to SBUF first", _m.NkiEmulatorError)
    if dst.buffer not in _m.HBM:
        _m.fail(f"nl.store destination must be in HBM, got {dst.buffer}", _m.NkiEmulatorError)
    isa.dma_copy(dst, value)
