"""NumPy stand-in for `nki.language` as NKI 0.6 documents it (rules.NKI_VERSION; differences from 0.3 in
rules.CHANGES): what the project's kernels and AWS's nki-library core kernels use.

Installed as `nki.language` only while `kernels_nki.emulator.loader` executes a kernel module.
Op identifiers (`nl.exp`, `nl.add`, ...) are `Op` objects: passed as `op=` to `nki.isa` calls, or
called directly as the `nl.*` convenience functions (which allocate an SBUF result). Dtypes, buffers, `tile_size`
and the `Op` table are defined in optable.py (which the instruction modules import) and re-exported here; this
module installs the convenience form (`Op.run`) and adds the `nl.*`-only calls.
"""

from __future__ import annotations

import math

import numpy as np

from kernels_nki.emulator import isa as _isa
from kernels_nki.emulator import machine as _m
from kernels_nki.emulator.optable import *  # noqa: F401,F403 (dtypes, buffers, tile_size and the Op table: nl.* names)
from kernels_nki.emulator.scheduling import no_reorder  # noqa: F401 (an nl name: scheduling.py)
from kernels_nki.emulator.optable import Op, _not_emulated, add, copy, maximum, minimum, multiply, negative, psum, rsqrt, sbuf, uint8


def _run(self: Op, x, y=None, dtype=None):
    """`Op.run`: the `nl.*` convenience form of an operator, run as the matching instruction."""
    m = _m.current()
    if not isinstance(x, _m.Tensor):
        _m.fail(f"nl.{self.name}: first operand must be a tile", _m.NkiEmulatorError)
    if not (self.alu or self.act):
        _m.rule("alu.op_table", f"nl.{self.name} is not a supported operator")
    out = m.allocate(x.shape, dtype or x.dtype, sbuf)
    if self.kind == "unary":
        if self.act:
            _isa.activation(out, self, x)
        else:
            _isa.tensor_scalar(out, x, self, 0.0)
    elif isinstance(y, _m.Tensor):
        if y.shape != x.shape:
            _m.rule("alu.no_broadcast", f"nl.{self.name} of {x.shape} and {y.shape}")
        _isa.tensor_tensor(out, x, y, self)
    elif isinstance(y, (int, float)):
        _isa.tensor_scalar(out, x, self, float(y))
    else:
        _m.fail(f"nl.{self.name}: second operand must be a tile of the same shape or a number", _m.NkiEmulatorError)
    return out


Op.run = _run


def _negative_call(x, dtype=None):
    out = _m.current().allocate(x.shape, dtype or x.dtype, sbuf)
    _isa.tensor_scalar(out, x, multiply, -1.0)
    return out


def _copy_call(x, dtype=None):
    """nl.copy: a copy of an SBUF/PSUM tile in SBUF on VectorE (tensor_copy), per NKI 0.6."""
    out = _m.current().allocate(x.shape, dtype or x.dtype, sbuf)
    _isa.tensor_copy(out, x, engine="vector")
    return out


class _CallAs(Op):
    """An Op whose nl.* convenience call runs a fixed instruction sequence."""

    def __init__(self, op: Op, call):
        super().__init__(op.name, op.kind, op.fn, op.reduce, op.alu, op.act, op.act_range)
        self._call = call

    def __call__(self, x, y=None, dtype=None):
        return self._call(x, dtype=dtype)


def _rsqrt_call(x, dtype=None):
    """nl.rsqrt: on GpSimd since NKI 0.5.0 ("higher numerical precision using the GpSimd Engine. PSUM inputs are
    no longer supported"), a tensor_scalar with op0 rsqrt (rule gpsimd.psum for a PSUM input)."""
    out = _m.current().allocate(x.shape, dtype or x.dtype, sbuf)
    _isa.tensor_scalar(out, x, rsqrt, 0.0, engine="gpsimd")
    return out


negative = _CallAs(negative, _negative_call)
copy = _CallAs(copy, _copy_call)
rsqrt = _CallAs(rsqrt, _rsqrt_call)


def _reduce_convenience(op: Op, scale_by_count: bool):
    def fn(x, axis, dtype=None, keepdims=False):
        m = _m.current()
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape)) if keepdims else \
            tuple(s for i, s in enumerate(x.shape) if i not in axes)
        out = m.allocate(shape, dtype or x.dtype, sbuf)
        _isa.tensor_reduce(out, op, x, axis, keepdims=keepdims)
        if scale_by_count:
            count = math.prod([x.shape[a] for a in axes])
            _isa.tensor_scalar(out, out, multiply, 1.0 / count)
        return out

    return fn


sum = _reduce_convenience(add, False)  # noqa: A001
max = _reduce_convenience(maximum, False)  # noqa: A001
min = _reduce_convenience(minimum, False)  # noqa: A001
mean = _reduce_convenience(add, True)

# ----------------------------------------------------------------------------- creation, loops, indexing


def ndarray(shape, dtype, buffer=sbuf, name=None, address=None):
    """`address=(partition_offset, free_offset_bytes)` places an on-chip tile directly (rule sbuf.capacity)."""
    return _m.current().allocate(shape, dtype, buffer, address=address)


def empty_like(x, dtype=None, buffer=None, name=None):
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer)


def broadcast_to(x, shape, dtype=None):
    """A new tile of `shape` (same rank as x; each dim equal or broadcast from 1) holding x's values. Across
    partitions (an on-chip x on one partition) it is a TensorE matmul of a ones stationary with x moving, one
    per 512 columns ("NKI invokes such matmul under the hood when broadcast_input.broadcast_to((M,
    broadcast_input.shape[1])) is called": aws-neuron-sdk nki/guides/architecture/trainium_inferentia2_arch.rst,
    "Tensor Engine / Alternative Use Case"); its result is in PSUM, where a consumer reads it in place (the
    emulator keeps it as an SBUF tile and charges no copy out). Along the free axes: one VectorE copy."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != x.ndim or any(a not in (1, b) for a, b in zip(x.shape, shape)):
        _m.rule("alu.no_broadcast", f"nl.broadcast_to {x.shape} -> {shape}")
    m = _m.current()
    out = m.allocate(shape, dtype or x.dtype, sbuf)
    free = math.prod(shape[1:])
    if getattr(x, "on_chip", False) and x.shape[0] == 1 and shape[0] > 1:
        w = _m.PMAX * 4  # moving free size per matmul (nc_matmul: at most 512)
        for c0 in range(0, free, w):
            m.count_matmul(1, shape[0], w if free - c0 > w else free - c0, fp32=x.dtype == np.float32, useful=False,
                           op="broadcast", reads=(x,), writes=(out,))
    else:
        m.count_engine("vector", out, reads=(x,))
    if m.compute:
        out.data[...] = np.broadcast_to(x.data.astype(np.float32), shape).astype(out.dtype)
    return out


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


def _range_alias(name: str):
    def alias(*args):
        """A deprecated alias of range() (NKI 0.6); refused under the strict reading (rule strict.loop_alias)."""
        _m.rule("strict.loop_alias", f"nl.{name}({', '.join(map(str, args))}): iterate range() instead")
        return range(*args)

    alias.__name__ = name
    return alias


affine_range = _range_alias("affine_range")
sequential_range = _range_alias("sequential_range")
static_range = _range_alias("static_range")


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
    """HBM -> a new SBUF tile of the same shape (one DMA; `dtype` casts in the DMA engine through float32)."""
    tile = _m.current().allocate(src.shape, src.dtype if dtype is None else dtype, sbuf)
    _isa.dma_copy(tile, src)
    return tile


def store(dst, value, name=None):
    if value.buffer == psum or dst.buffer not in _m.HBM:
        _m.rule("dma.buffers", f"nl.store of a {value.buffer} tile into {dst.buffer}")
    _isa.dma_copy(dst, value)


# ----------------------------------------------------------------------------- NKI values


class NkiDict(dict):
    """A dictionary built by kernel code: NKI dictionaries take string keys only (nki-language-guide.rst,
    NKI Values: "Dictionaries with string-value keys"; nki/migration/index.rst: "Dictionaries support only
    string keys"); a non-string key is rejected where it is set."""

    def __init__(self, items=(), **kw):
        super().__init__()
        self.update(items, **kw)

    def __setitem__(self, key, value):
        if not isinstance(key, str):
            _m.rule("kernel.dict_keys", f"dictionary key {key!r} ({type(key).__name__})")
        super().__setitem__(key, value)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, other=(), **kw):
        for k, v in (other.items() if isinstance(other, dict) else other):
            self[k] = v
        for k, v in kw.items():
            self[k] = v


class _NKIObjectType(type):
    """Constructs an NKIObject as NKI does: keyword arguments populate the object dictionary
    (nki-language-guide.rst, Classes: "NKI does not look at slots or other object features, only the object
    dictionary"), so a `@dataclass` subclass also takes keywords for class attributes that are not dataclass
    fields (AWS's nki-library attention_cte.SectionParams declares its attributes without annotations), and a
    frozen dataclass subclass constructs (release-notes NKI 0.4.0 bug fixes)."""

    def __call__(cls, *args, **kwargs):
        import inspect

        params = inspect.signature(cls.__init__).parameters
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return super().__call__(*args, **kwargs)
        extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in params}
        obj = super().__call__(*args, **kwargs)
        for k, v in extra.items():
            object.__setattr__(obj, k, v)
        return obj


class NKIObject(metaclass=_NKIObjectType):
    """`nl.NKIObject`, the base of kernel dataclasses and configuration objects (nki/api/nki/language:
    `NKIObject.__init__(self, **kwargs)`; nki-language-guide.rst, Classes: an instance is its object dictionary)."""

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            object.__setattr__(self, k, v)


# ----------------------------------------------------------------------------- constants


def shared_constant(constant):
    """`nl.shared_constant`: a shared_hbm tensor holding `constant` (a NumPy array or a `.npy` path), embedded in
    the binary and in HBM at model load (nki/api/nki/language): no DMA is counted."""
    value = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    return _m.current().wrap_hbm(np.array(value, copy=True), "shared_hbm")


def shared_identity_matrix(n, dtype=uint8, dst=None):
    """`nl.shared_identity_matrix`: an [n, n] identity in SBUF (or written into `dst`), a shared constant loaded
    from HBM: one DMA of its bytes."""
    m = _m.current()
    src = m.wrap_hbm(np.eye(int(n), dtype=_m.as_dtype(dtype)), "shared_hbm")
    out = dst if dst is not None else m.allocate((int(n), int(n)), dtype, sbuf)
    _isa.dma_copy(out, src)
    return out


# ----------------------------------------------------------------------------- runtime loops (not emulated)


_RUNTIME_LOOP = "a runtime (register-bounded) loop (NKI 0.6 nl.fori_loop / nl.while_loop; nl.dynamic_range is deprecated)"
dynamic_range = _not_emulated("nl.dynamic_range", _RUNTIME_LOOP)
fori_loop = _not_emulated("nl.fori_loop", _RUNTIME_LOOP)
while_loop = _not_emulated("nl.while_loop", _RUNTIME_LOOP)
