"""weights.npz, the interop format both trainers read and write: float32 arrays in the PyTorch baseline's
state_dict names plus `__dtypes__` / `__meta__` JSON entries. Every header is checked (declared shapes
and bytes against the archive and the host's memory, and against the expected keys and shapes) before
any array is read. No JAX (numpy only)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np

from frontier_jax.config import host_memory_bytes
from frontier_jax.data.files import atomic_write
from frontier_jax.data.shards import DataError

class WeightsError(DataError):
    """An npz that cannot be read, or does not fit the model."""


FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")  # what a parameter may be stored as


def check_weights(sd: dict, expect: dict[str, tuple], source: str) -> None:
    """The one validator of weights a model is given (`interop import`, the artifact's dequantized weights,
    `baseline_torch --init-weights`): exactly the keys of `expect` ({state_dict key: shape}; metadata keys
    `__*` aside), each of its shape, floating point and finite. WeightsError naming `source` and the key."""
    given = {k for k in sd if not k.startswith("__")}
    missing, extra = [k for k in expect if k not in given], sorted(given - set(expect))
    if missing:
        raise WeightsError(f"{source}: missing key {missing[0]!r} ({len(missing)} missing of {len(expect)})")
    if extra:
        raise WeightsError(f"{source}: unexpected key {extra[0]!r} ({len(extra)} not in the model)")
    for key, shape in expect.items():
        a = np.asarray(sd[key])
        if a.shape != tuple(shape):
            raise WeightsError(f"{source}: key {key!r} has shape {list(a.shape)}, the model expects {list(shape)}")
        if a.dtype.name not in FLOAT_DTYPES:
            raise WeightsError(f"{source}: key {key!r} has dtype {a.dtype}; parameters must be floating point "
                               f"({', '.join(FLOAT_DTYPES)})")
        if not np.isfinite(a.astype(np.float32)).all():
            raise WeightsError(f"{source}: key {key!r} holds non-finite values (NaN or inf)")


def save_npz(path, sd: dict[str, np.ndarray], meta: dict | None = None) -> None:
    """Write `sd` as float32 arrays plus `__dtypes__` (and `__meta__`) JSON entries, atomically.

    Keys are the PyTorch baseline's state_dict names; float32 holds bf16 values exactly, and the
    original dtype of each key is recorded so `load_npz` restores it."""
    path = Path(path)
    dtypes = {k: str(v.dtype) for k, v in sd.items()}
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in sd.items()}
    arrays["__dtypes__"] = np.array(json.dumps(dtypes, sort_keys=True))
    arrays["__meta__"] = np.array(json.dumps(meta or {}, sort_keys=True))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write(path, [buf.getbuffer()])  # renamed into place: never written through a symlink


def _dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16 and friends
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _npz_members(z: zipfile.ZipFile, path: Path) -> dict[str, tuple[tuple, np.dtype]]:
    """{key: (shape, dtype)} of an npz's members from their .npy headers alone (no array is read); a header
    that declares more bytes than its member holds (a forged 4 TiB shape) or an object dtype is refused."""
    out = {}
    for info in z.infolist():
        key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        with z.open(info) as fh:
            version = np.lib.format.read_magic(fh)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = reader(fh)
            offset = fh.tell()
        if dtype.hasobject:
            raise ValueError(f"member {key!r} holds Python objects (dtype {dtype})")
        declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if declared != info.file_size - offset:
            raise ValueError(f"member {key!r} declares shape {list(shape)} ({declared} bytes) but holds "
                             f"{info.file_size - offset} bytes")
        out[key] = (tuple(shape), dtype)
    return out


def load_npz(path, expect: dict[str, tuple] | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """(state_dict with the recorded dtypes restored, meta); WeightsError (one line) when unreadable.

    Keys, shapes and sizes are checked from the members' headers before any array is read: the total
    must fit in half of this host's memory, and with `expect` ({key: shape}, metadata keys `__*` aside)
    the keys and shapes must be exactly those."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            members = _npz_members(zf, path)
        total = sum(int(np.prod(sh, dtype=object)) * dt.itemsize for sh, dt in members.values())
        limit = host_memory_bytes()
        if limit is not None and total > limit // 2:
            raise ValueError(f"its arrays need {total} bytes, over half of this host's {limit} bytes of memory")
        if expect is not None:
            params = {k: v for k, v in members.items() if not k.startswith("__")}
            missing, extra = sorted(set(expect) - set(params)), sorted(set(params) - set(expect))
            if missing or extra:
                what = f"missing key {missing[0]!r}" if missing else f"unexpected key {extra[0]!r}"
                raise WeightsError(f"{path}: {what} ({len(missing)} missing, {len(extra)} not in the model)")
            for k, shape in expect.items():
                if tuple(params[k][0]) != tuple(shape):
                    raise WeightsError(f"{path}: key {k!r} has shape {list(params[k][0])}, the model expects "
                                       f"{list(shape)}")
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an npz archive")
            raw = {k: z[k] for k in z.files}
        dtypes = json.loads(str(raw.pop("__dtypes__"))) if "__dtypes__" in raw else {}
        meta = json.loads(str(raw.pop("__meta__"))) if "__meta__" in raw else {}
        sd = {k: (v.astype(_dtype(dtypes[k])) if dtypes.get(k) else v) for k, v in raw.items()}
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such npz file") from None
    except (OSError, ValueError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, WeightsError):
            raise
        raise WeightsError(f"{path}: not a readable npz ({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None
    return sd, meta
