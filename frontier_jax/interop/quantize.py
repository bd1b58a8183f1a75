"""The contest's int8 + zlib round trip, in numpy (no torch, no JAX): the artifact the contest scores.

The spec is parameter-golf's `train_gpt.py` (`quantize_state_dict_int8`, `dequantize_state_dict_int8`
and the export after training), applied to a state dict in the baseline's names and PyTorch layout
(`frontier_jax.interop.state_dict.params_to_state_dict`):

- a float tensor of at most 65,536 elements is kept: as float32 when its name contains one of
  `CONTROL_PATTERNS`, otherwise float32/bfloat16 are stored as float16 (the original dtype recorded in
  `passthrough_orig_dtypes`); non-float tensors are kept exactly;
- a larger 2-D float tensor is quantized per row: clip at the row's 99.99984th percentile of |w|
  (linear interpolation, as `torch.quantile`), scale = clip / 127 (at least 1/127), q = round(w / scale)
  in [-127, 127] as int8, the scale stored as float16 (`qmeta` marks it per_row);
- any other larger float tensor per tensor: the same with one float32 scale (1.0 when the clip is 0);
- the object `{"__quant_format__": "int8_clean_per_row_v1", "quantized", "scales", "dtypes",
  "passthrough", "qmeta", "passthrough_orig_dtypes"}` is serialised as `torch.save` does
  (`frontier_jax.interop.torch_format`) and compressed with zlib level 9: `final_model.int8.ptz`;
- dequantized: q * scale (the scale in float32) cast back to the tensor's dtype; kept tensors cast back.

The arithmetic is float32 as in PyTorch, so the payload equals the baseline's bit for bit (tested
against `baseline_torch/quantize.py`, the PyTorch port of the same spec).

The round trip of a run after training (`roundtrip_state_dict`: write the artifact, read it back,
dequantize) is below; what a run reports of it (the summary fields, the official lines, the code bytes
the contest adds to the artifact's) is `frontier_jax.run.roundtrip`.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from frontier_jax.interop import torch_format
from frontier_jax.errors import BadInput

FORMAT = "int8_clean_per_row_v1"
ARTIFACT = "final_model.int8.ptz"
ZLIB_LEVEL = 9
KEEP_FLOAT_MAX_NUMEL = 65_536
CLIP_Q = 99.99984 / 100.0
CONTROL_PATTERNS = ("attn_scale", "attn_scales", "mlp_scale", "mlp_scales", "resid_mix", "resid_mixes", "q_gain",
                    "skip_weight", "skip_weights")
FLOAT_NAMES = ("float32", "bfloat16", "float16", "float64")


class ArtifactError(BadInput):
    """An artifact that cannot be read or is not in FORMAT (message names the file and the problem)."""


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.name in FLOAT_NAMES


def _quantile_last_axis(a_RN: np.ndarray, q: float) -> np.ndarray:
    """torch.quantile(a, q, dim=-1) (linear interpolation) in float32 arithmetic, for float32 rows."""
    n = a_RN.shape[-1]
    s = np.sort(a_RN, axis=-1)
    rank = np.float32(np.float32(q) * np.float32(n - 1))
    lo = int(np.floor(rank))
    hi = min(lo + 1, n - 1)
    w = np.float32(rank - np.float32(lo))
    below, above = s[..., lo], s[..., hi]
    diff = above - below
    # torch.lerp: start + w (end - start) for w < 0.5, else end - (end - start)(1 - w)
    return below + w * diff if w < 0.5 else above - diff * (np.float32(1.0) - w)


def quantize_float(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, scale): per row (float16 scales) for a 2-D tensor, else one float32 scale."""
    t32 = np.asarray(t).astype(np.float32)
    if t32.ndim == 2:
        clip = _quantile_last_axis(np.abs(t32), CLIP_Q) if t32.size else np.zeros(t32.shape[0], np.float32)
        clipped = np.maximum(np.minimum(t32, clip[:, None]), -clip[:, None])
        scale = np.maximum(clip / np.float32(127.0), np.float32(1.0 / 127.0))
        q = np.clip(np.rint(clipped / scale[:, None]), -127, 127).astype(np.int8)
        return q, scale.astype(np.float16)
    clip = float(_quantile_last_axis(np.abs(t32).reshape(1, -1), CLIP_Q)[0]) if t32.size else 0.0
    scale = np.array(clip / 127.0 if clip > 0 else 1.0, dtype=np.float32)
    clipped = np.clip(t32, np.float32(-clip), np.float32(clip))
    q = np.clip(np.rint(clipped / scale), -127, 127).astype(np.int8)
    return q, scale


def quantize_state_dict(sd: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """(the FORMAT object, stats) of a state dict in the baseline's names (see the module docstring)."""
    quantized, scales, dtypes, passthrough, orig, qmeta = {}, {}, {}, {}, {}, {}
    stats = dict.fromkeys(("param_count", "num_tensors", "num_float_tensors", "num_nonfloat_tensors",
                           "baseline_tensor_bytes", "int8_payload_bytes"), 0)
    for name, tensor in sd.items():
        t = np.ascontiguousarray(tensor)
        stats["param_count"] += int(t.size)
        stats["num_tensors"] += 1
        stats["baseline_tensor_bytes"] += int(t.nbytes)
        if not _is_float(t):
            stats["num_nonfloat_tensors"] += 1
            passthrough[name] = t
            stats["int8_payload_bytes"] += int(t.nbytes)
            continue
        if t.size <= KEEP_FLOAT_MAX_NUMEL:
            if any(p in name for p in CONTROL_PATTERNS):
                kept = t.astype(np.float32)
            elif t.dtype.name in ("float32", "bfloat16"):
                orig[name] = t.dtype.name
                kept = t.astype(np.float16)
            else:
                kept = t
            passthrough[name] = kept
            stats["int8_payload_bytes"] += int(kept.nbytes)
            continue
        stats["num_float_tensors"] += 1
        q, s = quantize_float(t)
        if s.ndim > 0:
            qmeta[name] = {"scheme": "per_row", "axis": 0}
        quantized[name], scales[name], dtypes[name] = q, s, t.dtype.name
        stats["int8_payload_bytes"] += int(q.nbytes + s.nbytes)
    obj = {"__quant_format__": FORMAT, "quantized": quantized, "scales": scales, "dtypes": dtypes,
           "passthrough": passthrough}
    if qmeta:
        obj["qmeta"] = qmeta
    if orig:
        obj["passthrough_orig_dtypes"] = orig
    return obj, stats


def dequantize_state_dict(obj: dict) -> dict[str, np.ndarray]:
    """The state dict a FORMAT object stands for, each tensor in its original dtype."""
    out = {}
    qmeta, orig = obj.get("qmeta", {}), obj.get("passthrough_orig_dtypes", {})
    for name, q in obj["quantized"].items():
        dtype = torch_format._dtype(obj["dtypes"][name])
        s = np.asarray(obj["scales"][name])
        if qmeta.get(name, {}).get("scheme") == "per_row" or s.ndim > 0:
            s32 = s.astype(np.float32).reshape(q.shape[0], *([1] * (q.ndim - 1)))
            out[name] = (q.astype(np.float32) * s32).astype(dtype)
        else:
            out[name] = (q.astype(np.float32) * np.float32(float(s))).astype(dtype)
    for name, t in obj["passthrough"].items():
        out[name] = t.astype(torch_format._dtype(orig[name])) if isinstance(orig.get(name), str) else t.copy()
    return out


# ----------------------------------------------------------------------------- the artifact file


def compress(obj: dict) -> tuple[bytes, int]:
    """(zlib level 9 of the torch.save bytes, length of the torch.save bytes)."""
    raw = torch_format.dumps(obj)
    return zlib.compress(raw, level=ZLIB_LEVEL), len(raw)


def write_artifact(path, blob: bytes) -> int:
    """Write the compressed artifact (temporary name, then rename); its size in bytes on disk."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(blob)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path.stat().st_size


def load_artifact(path) -> dict:
    """The FORMAT object of a `final_model.int8.ptz` (ours, the PyTorch baseline's or the official script's)."""
    path = Path(path)
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read the artifact ({e.strerror or e})") from None
    return loads_artifact(blob, str(path))


def loads_artifact(blob: bytes, source: str = "<artifact>") -> dict:
    try:
        obj = torch_format.loads(zlib.decompress(blob))
    except zlib.error as e:
        raise ArtifactError(f"{source}: not a zlib stream ({e})") from None
    except torch_format.TorchFormatError as e:
        raise ArtifactError(f"{source}: {e}") from None
    if not isinstance(obj, dict) or obj.get("__quant_format__") != FORMAT:
        got = obj.get("__quant_format__") if isinstance(obj, dict) else type(obj).__name__
        raise ArtifactError(f"{source}: not an {FORMAT} artifact (format {got!r})")
    return obj


# ----------------------------------------------------------------------------- the round trip of a run


def roundtrip_state_dict(sd: dict[str, np.ndarray], run_dir, write: bool = True) -> tuple[dict, dict]:
    """(dequantized state dict, info) of the export after training: quantize, compress, write
    `<run_dir>/final_model.int8.ptz` (write=False: a process that does not write; it uses its own
    bytes, which are the same), read it back from disk, dequantize. info: artifact path and bytes,
    torch.save bytes, the quantizer's stats."""
    obj, stats = quantize_state_dict(sd)
    blob, raw_bytes = compress(obj)
    path = Path(run_dir) / ARTIFACT
    if write:
        write_artifact(path, blob)
        blob = path.read_bytes()
    back = dequantize_state_dict(loads_artifact(blob, str(path)))
    return back, {"artifact": str(path), "artifact_bytes": len(blob), "raw_bytes": raw_bytes, "stats": stats}
