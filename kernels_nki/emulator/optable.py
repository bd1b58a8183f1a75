"""The leaf definitions of the emulated `nki.language` (language.py re-exports them as `nl.*`): dtypes,
buffers, `tile_size` and the `Op` table (ALU operators and activation functions), which `isa`, `dma`, `gather`
and `operands` take as `op=` arguments. It imports no instruction module; the convenience form of an `Op`
(`nl.exp(x)`, `nl.add(x, y)`) is installed by language.py as `Op.run`.
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

    run = None  # the convenience form: language.py installs it (it runs the matching nki.isa instruction)

    def __call__(self, x, y=None, dtype=None):
        if Op.run is None:
            _m.fail(f"nl.{self.name}: the convenience form needs kernels_nki.emulator.language", _m.NkiEmulatorError)
        return Op.run(self, x, y, dtype)


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


def _not_emulated(qualname: str, why: str):
    """A name kernel code may import whose call the emulator refuses with `why` (e.g. an LNC > 1 instruction,
    a runtime loop): the import succeeds, the call names the construct."""
    def refused(*args, **kwargs):
        _m.fail(f"{qualname}: {why}, which the emulator does not run", _m.NkiEmulatorError)

    refused.__name__ = qualname.rsplit(".", 1)[-1]
    return refused

