"""Read and write PyTorch's `torch.save` file format with numpy alone (no torch import).

The contest's artifact is `zlib(torch.save(obj))`, so the JAX trainer writes the same container and
`evaluate --artifact` reads one written by either trainer or by the official script. The format, as
PyTorch's `torch/serialization.py` defines it (the zip "new" format, the default since PyTorch 1.6):

- a zip archive, entries stored uncompressed, all under one top directory (`archive/`):
  `data.pkl` (the object, pickle protocol 2), `byteorder` (`little`), one `data/<key>` entry per tensor
  storage (its raw little-endian bytes), `version` (`3`);
- in `data.pkl` a tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
  requires_grad, backward_hooks)` and its storage a persistent id `("storage", torch.<Type>Storage,
  key, "cpu", numel)`.

Supported: dicts, lists, tuples, strings, numbers, None and numpy arrays of the dtypes in `STORAGES`
(bfloat16 through ml_dtypes). Reading accepts only those globals (as `torch.load(weights_only=True)`
accepts only an allowlist): anything else in a pickle is refused, never executed.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile

import numpy as np

ARCHIVE = "archive"
FORMAT_VERSION = "3"
_REBUILD = ("torch._utils", "_rebuild_tensor_v2")


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# torch storage class name -> numpy dtype name (torch/storage.py's typed storages)
STORAGES = {"FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
            "DoubleStorage": "float64", "CharStorage": "int8", "ByteStorage": "uint8", "ShortStorage": "int16",
            "IntStorage": "int32", "LongStorage": "int64", "BoolStorage": "bool"}
_STORAGE_OF = {v: k for k, v in STORAGES.items()}


class TorchFormatError(ValueError):
    """Bytes that are not a torch.save archive this module can read (message says what is wrong)."""


# ----------------------------------------------------------------------------- writing


class _Global:
    """A reference to a torch global, pickled by name (torch is never imported)."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __call__(self, *args):  # pickle requires a reduce function to be callable
        raise TypeError("a stand-in for a torch global; it is only pickled")


class _Storage:
    def __init__(self, key: str, array: np.ndarray):
        self.key, self.array = key, array


class _Tensor:
    def __init__(self, storage: _Storage, shape: tuple[int, ...]):
        self.storage, self.shape = storage, shape

    def __reduce__(self):
        stride, acc = [], 1
        for n in reversed(self.shape):
            stride.append(acc)
            acc *= n
        return (_Global(*_REBUILD), (self.storage, 0, tuple(self.shape), tuple(reversed(stride)), False,
                                      collections.OrderedDict()))


class _Pickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table can take the stand-ins
    dispatch = dict(pickle._Pickler.dispatch)

    def _save_global_ref(self, obj: _Global) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    dispatch[_Global] = _save_global_ref

    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", _Global("torch", _STORAGE_OF[_dtype_name(obj.array.dtype)]), obj.key, "cpu",
                    int(obj.array.size))
        return None


def _dtype_name(dtype: np.dtype) -> str:
    name = np.dtype(dtype).name
    if name not in _STORAGE_OF:
        raise TorchFormatError(f"dtype {name} has no torch storage type")
    return name


def dumps(obj) -> bytes:
    """The bytes `torch.save(obj)` would load from (numpy arrays become CPU tensors)."""
    storages: list[_Storage] = []

    def convert(o):
        if isinstance(o, np.ndarray | np.generic):
            a = np.asarray(o)
            a = a if a.flags.c_contiguous else a.copy()  # (np.ascontiguousarray makes 0-d arrays 1-d)
            _dtype_name(a.dtype)
            s = _Storage(str(len(storages)), a)
            storages.append(s)
            return _Tensor(s, a.shape)
        if isinstance(o, dict):
            return {k: convert(v) for k, v in o.items()}
        if isinstance(o, list | tuple):
            return type(o)(convert(v) for v in o)
        return o

    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(convert(obj))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        def put(name: str, data: bytes) -> None:
            z.writestr(zipfile.ZipInfo(f"{ARCHIVE}/{name}", date_time=(1980, 1, 1, 0, 0, 0)), data)

        put("data.pkl", buf.getvalue())
        put("byteorder", b"little")
        for s in storages:
            put(f"data/{s.key}", s.array.astype(s.array.dtype.newbyteorder("<"), copy=False).tobytes())
        put("version", FORMAT_VERSION.encode() + b"\n")
    return out.getvalue()


# ----------------------------------------------------------------------------- reading


def _rebuild_tensor(storage: np.ndarray, offset: int, size, stride, requires_grad=False, hooks=None, *rest):
    item = storage.itemsize
    if not size:
        return np.array(storage[offset])  # a 0-d array
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size), strides=tuple(s * item for s in stride))
    return np.ascontiguousarray(view)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, zf: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))
        self.zf, self.prefix, self.cache = zf, prefix, {}

    def find_class(self, module: str, name: str):
        if (module, name) == _REBUILD:
            return _rebuild_tensor
        if module == "torch" and name in STORAGES:
            return ("dtype", STORAGES[name])
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise TorchFormatError(f"unsupported global {module}.{name} in the pickle (only tensors, dicts, "
                               "lists and plain values are read)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise TorchFormatError(f"unsupported persistent id {pid!r:.80}")
        _, kind, key, _location, numel = pid
        if key not in self.cache:
            dt = _dtype(kind[1]).newbyteorder("<")
            raw = self.zf.read(f"{self.prefix}data/{key}")
            arr = np.frombuffer(raw, dtype=dt)
            if arr.size != numel:
                raise TorchFormatError(f"storage {key}: {arr.size} elements, the pickle says {numel}")
            self.cache[key] = arr
        return self.cache[key]


def loads(data: bytes):
    """The object in `torch.save` bytes, tensors as numpy arrays; TorchFormatError when it cannot be read."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        names = zf.namelist()
        pkl = next((n for n in names if n.endswith("/data.pkl") and n.count("/") == 1), None)
        if pkl is None:
            raise TorchFormatError("not a torch.save archive (no <archive>/data.pkl)")
        prefix = pkl[: -len("data.pkl")]
        if f"{prefix}byteorder" in names and zf.read(f"{prefix}byteorder") != b"little":
            raise TorchFormatError("big-endian archive: not supported")
        return _Unpickler(zf.read(pkl), zf, prefix).load()
    except zipfile.BadZipFile as e:
        raise TorchFormatError(f"not a torch.save archive ({e})") from None
    except (pickle.UnpicklingError, EOFError, KeyError, AttributeError) as e:
        raise TorchFormatError(f"unreadable torch.save archive ({type(e).__name__}: {str(e)[:120]})") from None
