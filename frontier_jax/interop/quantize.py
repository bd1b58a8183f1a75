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

The round trip of a run after training (write the artifact, read it back, dequantize, in either this
format or the record's int6 + lzma) is `frontier_jax.interop.artifact`; what a run reports of it (the summary
fields, the official lines, the code bytes the contest adds to the artifact's) is `frontier_jax.run.roundtrip`.
"""

from __future__ import annotations

import lzma
import zlib
from pathlib import Path

import numpy as np

from frontier_jax.data.files import UnsafeFile, atomic_write, read_regular
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


def quantile_last_axis(a_RN: np.ndarray, q: float, presorted: bool = False) -> np.ndarray:
    """torch.quantile(a, q, dim=-1) (linear interpolation) in float32 arithmetic, for float32 rows (`presorted`:
    the rows are sorted already, so several quantiles share one sort)."""
    n = a_RN.shape[-1]
    s = a_RN if presorted else np.sort(a_RN, axis=-1)
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
        clip = quantile_last_axis(np.abs(t32), CLIP_Q) if t32.size else np.zeros(t32.shape[0], np.float32)
        clipped = np.maximum(np.minimum(t32, clip[:, None]), -clip[:, None])
        scale = np.maximum(clip / np.float32(127.0), np.float32(1.0 / 127.0))
        q = np.clip(np.rint(clipped / scale[:, None]), -127, 127).astype(np.int8)
        return q, scale.astype(np.float16)
    clip = float(quantile_last_axis(np.abs(t32).reshape(1, -1), CLIP_Q)[0]) if t32.size else 0.0
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
        t = np.asarray(tensor)
        t = t if t.flags.c_contiguous else t.copy()  # (np.ascontiguousarray makes a 0-d array 1-d)
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
    atomic_write(path, [blob])
    return path.stat().st_size


def raw_limit(num_params: int | None = None, num_tensors: int = 0) -> int:
    """The most bytes an artifact may decompress to: for a model of `num_params` parameters in `num_tensors`
    tensors, 8 bytes a parameter (a float64 kept as it is: the widest the rules keep) plus 4 KiB of pickle a
    tensor and 1 MiB; with no model, `torch_format.max_tensor_bytes()` (a quarter of the host's memory). A
    zlib or lzma bomb stops there instead of filling the memory."""
    if num_params is None:
        return torch_format.max_tensor_bytes()
    return 8 * int(num_params) + 4096 * int(num_tensors) + (1 << 20)


def decompress(blob: bytes, max_bytes: int, source: str = "<artifact>") -> bytes:
    """The bytes a zlib or lzma (xz or .lzma) stream holds, decompressed by a streaming decompressor that stops
    after `max_bytes`; ArtifactError naming `source` when the stream is neither, is cut short or holds more.
    The one decompression of every artifact format (zlib for int8, lzma for the others)."""
    is_zlib = len(blob) >= 2 and blob[0] & 0x0F == 8 and (blob[0] << 8 | blob[1]) % 31 == 0
    try:
        if is_zlib:
            d = zlib.decompressobj()
            out = d.decompress(blob, max_bytes + 1)
            more, done = bool(d.unconsumed_tail), d.eof
        else:
            d = lzma.LZMADecompressor(format=lzma.FORMAT_AUTO)
            out = d.decompress(blob, max_length=max_bytes + 1)
            more, done = not d.needs_input and not d.eof, d.eof
    except (zlib.error, lzma.LZMAError) as e:
        kind = "zlib" if is_zlib else "zlib or lzma"
        raise ArtifactError(f"{source}: not a {kind} stream ({e})") from None
    if len(out) > max_bytes or more:
        raise ArtifactError(f"{source}: decompresses to over {max_bytes:,} bytes, more than the model's weights "
                            "can take (a compression bomb or another model's artifact)")
    if not done:
        raise ArtifactError(f"{source}: compressed stream is cut short (truncated file)")
    return out


def check_artifact(obj, source: str = "<artifact>") -> dict:
    """`obj` when it is a FORMAT object dequantize_state_dict can use (checked before any use): the tables
    are dicts of names; every quantized tensor is int8 with a float scale (per row: one per row) and a float
    dtype name; passthrough tensors are arrays; the optional qmeta and original dtypes name known things.
    ArtifactError naming `source` and the first entry that is not."""
    def bad(what: str):
        raise ArtifactError(f"{source}: malformed {FORMAT} artifact ({what})")

    if not isinstance(obj, dict) or obj.get("__quant_format__") != FORMAT:
        got = obj.get("__quant_format__") if isinstance(obj, dict) else type(obj).__name__
        raise ArtifactError(f"{source}: not an {FORMAT} artifact (format {got!r:.60})")
    tables = {}
    for key in ("quantized", "scales", "dtypes", "passthrough", "qmeta", "passthrough_orig_dtypes"):
        t = obj.get(key, {}) if key in ("qmeta", "passthrough_orig_dtypes") else obj.get(key)
        if not isinstance(t, dict) or not all(isinstance(k, str) for k in t):
            bad(f"{key} is {type(t).__name__}, expected a dict of tensor names")
        tables[key] = t
    for name, q in tables["quantized"].items():
        s, dtype = tables["scales"].get(name), tables["dtypes"].get(name)
        if not isinstance(q, np.ndarray) or q.dtype != np.int8 or q.ndim == 0:
            bad(f"quantized {name!r} is not an int8 tensor")
        if dtype not in FLOAT_NAMES:
            bad(f"dtypes[{name!r}] is {dtype!r:.40}, expected one of {', '.join(FLOAT_NAMES)}")
        if not isinstance(s, np.ndarray) or not _is_float(s):
            bad(f"scales[{name!r}] is not a float tensor")
        meta = tables["qmeta"].get(name, {})
        if not isinstance(meta, dict):
            bad(f"qmeta[{name!r}] is {type(meta).__name__}, expected a dict")
        per_row = meta.get("scheme") == "per_row" or s.ndim > 0
        if per_row and s.shape != (q.shape[0],) or not per_row and s.size != 1:
            bad(f"scales[{name!r}] has shape {list(s.shape)}, quantized {list(q.shape)}")
    for name, t in tables["passthrough"].items():
        if not isinstance(t, np.ndarray):
            bad(f"passthrough {name!r} is {type(t).__name__}, not a tensor")
        orig = tables["passthrough_orig_dtypes"].get(name)
        if orig is not None and (orig not in FLOAT_NAMES or not _is_float(t)):
            bad(f"passthrough_orig_dtypes[{name!r}] is {orig!r:.40} for a {t.dtype} tensor")
    both = set(tables["quantized"]) & set(tables["passthrough"])
    if both:
        bad(f"{sorted(both)[0]!r} is both quantized and passed through")
    return obj


def read_artifact(path, max_raw_bytes: int) -> bytes:
    """An artifact file's bytes (at most what decompresses to `max_raw_bytes` could take); a FIFO or a device is
    refused (never read), as is a file over the limit: ArtifactError naming it."""
    try:
        return read_regular(Path(path), "the artifact", max_bytes=max_raw_bytes + (1 << 20))
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read the artifact ({e.strerror or e})") from None
    except UnsafeFile as e:
        raise ArtifactError(str(e)) from None


def load_artifact(path, max_raw_bytes: int | None = None) -> dict:
    """The FORMAT object of a `final_model.int8.ptz` (ours, the PyTorch baseline's or the official script's),
    decompressed to at most `max_raw_bytes` (default `raw_limit()`; `raw_limit(params, tensors)` of the model
    it is for bounds it tightly)."""
    limit = raw_limit() if max_raw_bytes is None else max_raw_bytes
    return loads_artifact(read_artifact(path, limit), str(path), limit)


def loads_artifact(blob: bytes, source: str = "<artifact>", max_raw_bytes: int | None = None) -> dict:
    """The checked FORMAT object of artifact bytes (`decompress`, `torch_format.loads`, `check_artifact`)."""
    limit = raw_limit() if max_raw_bytes is None else max_raw_bytes
    try:
        obj = torch_format.loads(decompress(blob, limit, source), max_bytes=limit)
    except torch_format.TorchFormatError as e:
        raise ArtifactError(f"{source}: {e}") from None
    return check_artifact(obj, source)
