"""frontier_jax.interop.torch_format: torch.save's file format without torch: our bytes round-trip and load in torch, torch's
bytes load here, and a pickle with any other global is refused, never run."""

from __future__ import annotations

import io
import pickle
import zipfile

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
