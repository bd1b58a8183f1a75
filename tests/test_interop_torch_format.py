"""frontier_jax.interop.torch_format: torch.save's file format without torch: our bytes round-trip and load in torch, torch's
bytes load here, and a pickle with any other global is refused, never run."""

from __future__ import annotations

import io
import pickle
import zipfile
import zlib

import ml_dtypes
import numpy as np
import pytest

from frontier_jax.interop import torch_format as tf


def _obj():
    return {"name": "x", "n": 3, "nested": {"a": np.arange(-5, 5, dtype=np.int8).reshape(2, 5),
                                            "s": np.array(0.25, np.float32)},
            "half": np.array([0.5, 0.25], np.float16), "bf": (np.ones(3) * 1.5).astype(ml_dtypes.bfloat16),
            "t": np.arange(12, dtype=np.float32).reshape(3, 4).T, "list": [1, "b"]}


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return a == b


def test_round_trip_keeps_dtypes_shapes_and_values():
    data = tf.dumps(_obj())
    assert zipfile.ZipFile(io.BytesIO(data)).namelist()[:2] == ["archive/data.pkl", "archive/byteorder"]
    back = tf.loads(data)
    assert _equal(back, _obj()) and back["nested"]["s"].shape == ()
    assert tf.dumps(_obj()) == data  # deterministic


def test_torch_loads_our_bytes_and_we_load_torchs():
    torch = pytest.importorskip("torch", reason="needs the optional extra: pip install -e .[torch]")
    t = torch.load(io.BytesIO(tf.dumps(_obj())))  # weights_only=True, torch's default
    assert t["bf"].dtype == torch.bfloat16 and t["nested"]["s"].shape == () and t["t"].shape == (4, 3)
    assert torch.equal(t["t"], torch.arange(12, dtype=torch.float32).reshape(3, 4).T)
    buf = io.BytesIO()
    torch.save({"w": torch.arange(6, dtype=torch.float16).reshape(2, 3)[:, 1:], "k": "v"}, buf)
    back = tf.loads(buf.getvalue())
    assert back["k"] == "v" and back["w"].dtype == np.float16 and back["w"].tolist() == [[1, 2], [4, 5]]


def test_other_globals_are_refused_not_executed():
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(Evil(), protocol=2))
    with pytest.raises(tf.TorchFormatError, match="unsupported global .*print"):
        tf.loads(buf.getvalue())
    with pytest.raises(tf.TorchFormatError, match="not a torch.save archive"):
        tf.loads(b"plain bytes")


# ----------------------------------------------------------------------------- forged archives (memory safety)


class _Forged:
    """A tensor whose offset, size and stride are whatever a forger writes into the pickle."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.args = storage, (offset, tuple(size), tuple(stride))

    def __reduce__(self):
        return (tf._Global(*tf._REBUILD), (self.storage, *self.args, False, __import__("collections").OrderedDict()))


def forged_archive(tensors: dict, data: np.ndarray) -> bytes:
    """torch.save bytes of {name: (offset, size, stride)} views of one storage holding `data`."""
    storage = tf._Storage("0", data)
    buf = io.BytesIO()
    tf._Pickler(buf, protocol=2).dump({k: _Forged(storage, *v) for k, v in tensors.items()})
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/data/0", data.astype("<f4").tobytes())
        z.writestr("archive/version", b"3\n")
    return out.getvalue()


def test_tensors_are_rebuilt_only_inside_their_storage():
    """A view that reads past the storage (a huge stride), before it (a negative stride), from an offset past
    it, or that declares a (10^6, 10^6) tensor over one element (stride 0), is refused in one line; the
    in-bounds views (a transpose, a stride-0 broadcast, an offset) read exactly torch's elements."""
    data = np.arange(12, dtype=np.float32)
    good = tf.loads(forged_archive({"t": (0, (4, 3), (1, 4)), "b": (2, (2, 3), (0, 1)), "e": (12, (0, 5), (5, 1)),
                                    "s": (11, (), ())}, data))
    assert good["t"].tolist() == data.reshape(3, 4).T.tolist() and good["b"].tolist() == [[2, 3, 4], [2, 3, 4]]
    assert good["e"].shape == (0, 5) and good["s"].shape == () and float(good["s"]) == 11.0
    forged = {"stride past the storage": ((0, (3, 4), (1_000_000, 1)), "reads element 2000003, past its storage"),
              "negative stride": ((4, (3, 4), (-4, 1)), "stride -4 is not a non-negative integer"),
              "offset past the storage": ((20, (2,), (1,)), "reads element 21, past its storage"),
              "0-d offset past the storage": ((12, (), ()), "reads element 12, past its storage"),
              "negative offset": ((-3, (2,), (1,)), "offset -3 is not a non-negative integer"),
              "a (10^6, 10^6) tensor": ((0, (10**6, 10**6), (0, 0)), "needs 4,000,000,000,000 bytes")}
    for name, (view, message) in forged.items():
        with pytest.raises(tf.TorchFormatError, match=message) as e:
            tf.loads(forged_archive({"w": view}, data))
        assert "\n" not in str(e.value), name


def test_a_forged_stride_never_crashes_the_reader(tmp_path):
    """The probe's case in a process of its own (before the fix it died with SIGSEGV): an artifact whose
    tensor has stride (1000000, 1) is refused with one line and exit 2."""
    import subprocess
    import sys

    from frontier_jax.interop import quantize

    data = np.zeros(1 << 16, np.float32)
    blob = zlib.compress(forged_archive({"w": (0, (1 << 12, 1 << 12), (1_000_000, 1))}, data))
    path = tmp_path / "oob.ptz"
    path.write_bytes(blob)
    code = ("import sys; from frontier_jax.errors import exit_on_error; from frontier_jax.interop import quantize\n"
            f"with exit_on_error(): quantize.load_artifact({str(path)!r})")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "past its storage" in res.stderr, res
    assert quantize.ARTIFACT  # the module the subprocess used
