"""NumPy stand-in for `nki.language` as NKI 0.6 documents it (rules.NKI_VERSION; differences from 0.3 in
rules.CHANGES): what the project's kernels and AWS's nki-library core kernels use.

Installed as `nki.language` only while `kernels_nki.emulator.loader` executes a kernel module.
Op identifiers (`nl.exp`, `nl.add`, ...) are `Op` objects: passed as `op=` to `nki.isa` calls, or
called directly as the `nl.*` convenience functions (which allocate an SBUF result).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from scipy.special import erf as _erf

from kernels_nki.emulator import machine as _m

# ----------------------------------------------------------------------------- dtypes and buffers

float32 = np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
tfloat32 = float32  # stored as float32 (TensorE rounds it; the emulator computes in float32)
# NKI 0.4 made float8_e4m3 (legacy, 1S4E3M with inf: max 240) and float8_e4m3fn (OCP, no inf: max 448) distinct
# types (release-notes/components/nki.rst, NKI 0.4.0 "nc_matmul float8_e4m3fn input dtype"; nki/api/nki/language)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)  # NKI 0.5.0: the MX scale dtype
# 4x packed MX types (NeuronCore-v4 nc_matmul_mx only): distinct 4-byte types, names for kernels to refer to
float8_e4m3fn_x4 = np.dtype([("float8_e4m3fn_x4", np.uint32)])
float8_e5m2_x4 = np.dtype([("float8_e5m2_x4", np.uint32)])
float4_e2m1fn_x4 = np.dtype([("float4_e2m1fn_x4", np.uint16)])
int32 = np.dtype(np.int32)
int16 = np.dtype(np.int16)
int8 = np.dtype(np.int8)
uint32 = np.dtype(np.uint32)
uint16 = np.dtype(np.uint16)
uint8 = np.dtype(np.uint8)
bool_ = uint8

sbuf = _m.Buffer("sbuf")
psum = _m.Buffer("psum")
hbm = _m.Buffer("hbm")
shared_hbm = _m.Buffer("shared_hbm")
private_hbm = _m.Buffer("private_hbm")


class _TileSize:
    """`nl.tile_size` (nki/api/nki/language `_TileSize`, nki/api/nki.language.tile_size.rst): the fixed tile limits
    and, since NKI 0.4.0, the byte-aware capacities of the running kernel's target (release-notes NKI 0.4.0
    "tile_size bytes-aware constants"; psum_num_banks NKI 0.5.0). `total_available_sbuf_size` (deprecated in
    0.4.0) is the per-partition SBUF size in bytes, as the notes say it returns."""

    pmax = 128
    psum_fmax = 512  # deprecated in 0.4.0 for psum_bank_fmax
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512

    @staticmethod
    def _spec():
        from kernels_nki.emulator import rules

        machine = getattr(_m._local, "machine", None)
        return machine.spec if machine is not None else rules.spec("trn1")

    @property
    def psum_num_banks(self) -> int:
        return self._spec().psum_banks

    @property
    def sbuf_fmax_bytes(self) -> int:
        return self._spec().sbuf_partition_bytes

    @property
    def sbuf_fmax(self) -> int:
        return self.sbuf_fmax_bytes // 4

    @property
    def sbuf_size_bytes(self) -> int:
        return _m.PMAX * self.sbuf_fmax_bytes

    @property
    def total_available_sbuf_size(self) -> int:
        return self.sbuf_fmax_bytes


tile_size = _TileSize()


# ----------------------------------------------------------------------------- op identifiers


def _cmp(f):
    return lambda a, b: f(a, b).astype(np.float32)


def _silu(x):
    return x / (1.0 + np.exp(-x))


class Op:
    """An ALU operator or activation function: `fn` on float32 NumPy arrays; `kind` unary|binary.

    `alu`: in the ALU operator table; `act`: a Scalar Engine activation function, `act_range` its valid
    input range (lo, hi, symmetric) when narrower than the reals; `reduce`: the NumPy ufunc of a legal
    reduction op (nki/api/nki.api.shared.rst)."""

    def __init__(self, name: str, kind: str, fn, reduce=None, alu=False, act=False, act_range=None):
        self.name, self.kind, self.fn, self.reduce = name, kind, fn, reduce
        self.alu, self.act, self.act_range = alu, act, act_range

    def __repr__(self):
        return f"nl.{self.name}"

    def __call__(self, x, y=None, dtype=None):
        from kernels_nki.emulator import isa  # the convenience form runs the matching instruction

        m = _m.current()
        if not isinstance(x, _m.Tensor):
            _m.fail(f"nl.{self.name}: first operand must be a tile", _m.NkiEmulatorError)
        if not (self.alu or self.act):
            _m.rule("alu.op_table", f"nl.{self.name} is not a supported operator")
        out = m.allocate(x.shape, dtype or x.dtype, sbuf)
        if self.kind == "unary":
            if self.act:
                isa.activation(out, self, x)
            else:
                isa.tensor_scalar(out, x, self, 0.0)
        elif isinstance(y, _m.Tensor):
            if y.shape != x.shape:
                _m.rule("alu.no_broadcast", f"nl.{self.name} of {x.shape} and {y.shape}")
            isa.tensor_tensor(out, x, y, self)
        elif isinstance(y, (int, float)):
            isa.tensor_scalar(out, x, self, float(y))
        else:
            _m.fail(f"nl.{self.name}: second operand must be a tile of the same shape or a number", _m.NkiEmulatorError)
        return out


def _unary(name, fn, alu=False, act=True, act_range=None):
    return Op(name, "unary", fn, alu=alu, act=act, act_range=act_range)


def _binary(name, fn, reduce=None, alu=True):
    return Op(name, "binary", fn, reduce=reduce, alu=alu)


exp = _unary("exp", np.exp)
log = _unary("log", np.log, act_range=(2.0 ** -64, 2.0 ** 64, False))
rsqrt = _unary("rsqrt", lambda x: 1.0 / np.sqrt(x), alu=True, act_range=(2.0 ** -87, 2.0 ** 97, False))
sqrt = _unary("sqrt", np.sqrt, act_range=(2.0 ** -116, 2.0 ** 118, False))
square = _unary("square", np.square, alu=True)
reciprocal = _unary("reciprocal", lambda x: 1.0 / x, alu=True, act_range=(2.0 ** -42, 2.0 ** 42, True))
tanh = _unary("tanh", np.tanh)
sigmoid = _unary("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)))
silu = _unary("silu", _silu)
relu = _unary("relu", lambda x: np.maximum(x, 0.0), alu=True)
copy = _unary("copy", lambda x: x)
sign = _unary("sign", np.sign)
sin = _unary("sin", np.sin, act_range=(-math.pi, math.pi, False))
arctan = _unary("arctan", np.arctan, act_range=(-math.pi / 2, math.pi / 2, False))
softplus = _unary("softplus", lambda x: np.logaddexp(0.0, x))
abs = _unary("abs", np.abs, alu=True)  # noqa: A001 (mirrors the nki.language name)
negative = _unary("negative", np.negative, act=False)  # nl.* only: runs as a VectorE multiply by -1
# the rest of the Scalar Engine function table (nki/api/nki.api.shared.rst, Supported Activation Functions)
gelu = _unary("gelu", lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))))
gelu_dx = _unary("gelu_dx", lambda x: 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
                 + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))
gelu_apprx_tanh = _unary("gelu_apprx_tanh",
                         lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))))
gelu_apprx_sigmoid = _unary("gelu_apprx_sigmoid", lambda x: x / (1.0 + np.exp(-1.702 * x)))
gelu_apprx_sigmoid_dx = _unary("gelu_apprx_sigmoid_dx", lambda x: (lambda s: s + 1.702 * x * s * (1.0 - s))(
    1.0 / (1.0 + np.exp(-1.702 * x))))
silu_dx = _unary("silu_dx", lambda x: (lambda s: s * (1.0 + x * (1.0 - s)))(1.0 / (1.0 + np.exp(-x))))
mish = _unary("mish", lambda x: x * np.tanh(np.logaddexp(0.0, x)))
erf = _unary("erf", lambda x: _erf(x))
erf_dx = _unary("erf_dx", lambda x: 2.0 / math.sqrt(math.pi) * np.exp(-x * x))

add = _binary("add", np.add, reduce=np.add)
subtract = _binary("subtract", np.subtract, reduce=np.subtract)
multiply = _binary("multiply", np.multiply, reduce=np.multiply)
divide = _binary("divide", np.divide, alu=False)  # not an ALU operator (0.3 known issues)
maximum = _binary("maximum", np.maximum, reduce=np.maximum)
minimum = _binary("minimum", np.minimum, reduce=np.minimum)
power = _binary("power", np.power)
equal = _binary("equal", _cmp(np.equal))
not_equal = _binary("not_equal", _cmp(np.not_equal))
greater = _binary("greater", _cmp(np.greater))
greater_equal = _binary("greater_equal", _cmp(np.greater_equal))
less = _binary("less", _cmp(np.less))
less_equal = _binary("less_equal", _cmp(np.less_equal))
logical_and = _binary("logical_and", _cmp(np.logical_and), reduce=np.logical_and)
logical_or = _binary("logical_or", _cmp(np.logical_or), reduce=np.logical_or)
logical_xor = _binary("logical_xor", _cmp(np.logical_xor), reduce=np.logical_xor)


def _negative_call(x, dtype=None):
    from kernels_nki.emulator import isa

    out = _m.current().allocate(x.shape, dtype or x.dtype, sbuf)
    isa.tensor_scalar(out, x, multiply, -1.0)
    return out


def _copy_call(x, dtype=None):
    """nl.copy: a copy of an SBUF/PSUM tile in SBUF on VectorE (tensor_copy), per NKI 0.6."""
    from kernels_nki.emulator import isa

    out = _m.current().allocate(x.shape, dtype or x.dtype, sbuf)
    isa.tensor_copy(out, x, engine="vector")
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
    from kernels_nki.emulator import isa

    out = _m.current().allocate(x.shape, dtype or x.dtype, sbuf)
    isa.tensor_scalar(out, x, rsqrt, 0.0, engine="gpsimd")
    return out


negative = _CallAs(negative, _negative_call)
copy = _CallAs(copy, _copy_call)
rsqrt = _CallAs(rsqrt, _rsqrt_call)


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


def ndarray(shape, dtype, buffer=sbuf, name=None, address=None):
    """`address=(partition_offset, free_offset_bytes)` places an on-chip tile directly (rule sbuf.capacity)."""
    return _m.current().allocate(shape, dtype, buffer, address=address)


def empty_like(x, dtype=None, buffer=None, name=None):
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer)


def broadcast_to(x, shape, dtype=None):
    """A new SBUF tile of `shape` (same rank as x; each dim equal or broadcast from 1) holding x's values
    (one VectorE copy)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != x.ndim or any(a not in (1, b) for a, b in zip(x.shape, shape)):
        _m.rule("alu.no_broadcast", f"nl.broadcast_to {x.shape} -> {shape}")
    m = _m.current()
    out = m.allocate(shape, dtype or x.dtype, sbuf)
    m.count_engine("vector", out)
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
    """HBM -> a new SBUF tile of the same shape (one DMA; `dtype` casts in the DMA engine through float32)."""
    from kernels_nki.emulator import isa

    tile = _m.current().allocate(src.shape, src.dtype if dtype is None else dtype, sbuf)
    isa.dma_copy(tile, src)
    return tile


def store(dst, value, name=None):
    from kernels_nki.emulator import isa

    if value.buffer == psum or dst.buffer not in _m.HBM:
        _m.rule("dma.buffers", f"nl.store of a {value.buffer} tile into {dst.buffer}")
    isa.dma_copy(dst, value)


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
    from kernels_nki.emulator import isa

    m = _m.current()
    src = m.wrap_hbm(np.eye(int(n), dtype=_m.as_dtype(dtype)), "shared_hbm")
    out = dst if dst is not None else m.allocate((int(n), int(n)), dtype, sbuf)
    isa.dma_copy(out, src)
    return out


# ----------------------------------------------------------------------------- runtime loops (not emulated)


def _runtime_loop(name: str):
    def construct(*args, **kwargs):
        _m.fail(f"nl.{name}: a runtime (register-bounded) loop, which the emulator does not run (NKI 0.6 "
                "nl.fori_loop / nl.while_loop; nl.dynamic_range is deprecated)", _m.NkiEmulatorError)

    construct.__name__ = name
    return construct


dynamic_range = _runtime_loop("dynamic_range")
fori_loop = _runtime_loop("fori_loop")
while_loop = _runtime_loop("while_loop")
