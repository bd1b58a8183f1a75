"""The contest's int8 + zlib round trip in PyTorch, written from parameter-golf's `train_gpt.py` spec.

`quantize_state_dict_int8` / `dequantize_state_dict_int8` follow the baseline's rules (the same as
`frontier_jax.interop.quantize`, whose docstring states them): small float tensors kept (float32 for the
control tensors, else float16), larger 2-D float tensors int8 per row with the row's 99.99984th
percentile of |w| as the clip (`torch.quantile`) and float16 scales, other larger float tensors int8
per tensor, format `int8_clean_per_row_v1`. `roundtrip` is the export after training: `torch.save`,
zlib level 9, `final_model.int8.ptz` in the run directory (temporary name, then rename), read back from
disk, dequantized, loaded into the model (which the caller then evaluates).
"""

from __future__ import annotations

import copy
import io
import zlib
from pathlib import Path

import torch

from frontier_jax.contest import codebytes
from frontier_jax.data.files import atomic_write
from frontier_jax.interop.quantize import ARTIFACT, CLIP_Q, CONTROL_PATTERNS, FORMAT, KEEP_FLOAT_MAX_NUMEL, ZLIB_LEVEL
from frontier_jax.run.rundir import CONFIG


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel()) * int(t.element_size())


def _keep_float(name: str, t: torch.Tensor, orig: dict[str, str]) -> torch.Tensor:
    if any(p in name for p in CONTROL_PATTERNS):
        return t.float().contiguous()
    if t.dtype in (torch.float32, torch.bfloat16):
        orig[name] = str(t.dtype).removeprefix("torch.")
        return t.to(torch.float16).contiguous()
    return t


def quantize_float_tensor(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t32 = t.float()
    if t32.ndim == 2:
        clip = (torch.quantile(t32.abs(), CLIP_Q, dim=1) if t32.numel()
                else torch.empty((t32.shape[0],), dtype=torch.float32))
        clipped = torch.maximum(torch.minimum(t32, clip[:, None]), -clip[:, None])
        scale = (clip / 127.0).clamp_min(1.0 / 127.0)
        q = torch.clamp(torch.round(clipped / scale[:, None]), -127, 127).to(torch.int8).contiguous()
        return q, scale.to(torch.float16).contiguous()
    clip = float(torch.quantile(t32.abs().flatten(), CLIP_Q).item()) if t32.numel() else 0.0
    scale = torch.tensor(clip / 127.0 if clip > 0 else 1.0, dtype=torch.float32)
    q = torch.clamp(torch.round(torch.clamp(t32, -clip, clip) / scale), -127, 127).to(torch.int8).contiguous()
    return q, scale


def quantize_state_dict_int8(state_dict: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    quantized, scales, dtypes, passthrough, orig, qmeta = {}, {}, {}, {}, {}, {}
    stats = dict.fromkeys(("param_count", "num_tensors", "num_float_tensors", "num_nonfloat_tensors",
                           "baseline_tensor_bytes", "int8_payload_bytes"), 0)
    for name, tensor in state_dict.items():
        t = tensor.detach().to("cpu").contiguous()
        stats["param_count"] += int(t.numel())
        stats["num_tensors"] += 1
        stats["baseline_tensor_bytes"] += _nbytes(t)
        if not t.is_floating_point():
            stats["num_nonfloat_tensors"] += 1
            passthrough[name] = t
            stats["int8_payload_bytes"] += _nbytes(t)
            continue
        if t.numel() <= KEEP_FLOAT_MAX_NUMEL:
            kept = _keep_float(name, t, orig)
            passthrough[name] = kept
            stats["int8_payload_bytes"] += _nbytes(kept)
            continue
        stats["num_float_tensors"] += 1
        q, s = quantize_float_tensor(t)
        if s.ndim > 0:
            qmeta[name] = {"scheme": "per_row", "axis": 0}
        quantized[name], scales[name] = q, s
        dtypes[name] = str(t.dtype).removeprefix("torch.")
        stats["int8_payload_bytes"] += _nbytes(q) + _nbytes(s)
    obj: dict[str, object] = {"__quant_format__": FORMAT, "quantized": quantized, "scales": scales,
                              "dtypes": dtypes, "passthrough": passthrough}
    if qmeta:
        obj["qmeta"] = qmeta
    if orig:
        obj["passthrough_orig_dtypes"] = orig
    return obj, stats


def dequantize_state_dict_int8(obj: dict) -> dict[str, torch.Tensor]:
    out = {}
    qmeta, orig = obj.get("qmeta", {}), obj.get("passthrough_orig_dtypes", {})
    for name, q in obj["quantized"].items():
        dtype = getattr(torch, obj["dtypes"][name])
        s = obj["scales"][name]
        if qmeta.get(name, {}).get("scheme") == "per_row" or s.ndim > 0:
            s = s.to(torch.float32)
            out[name] = (q.float() * s.view(q.shape[0], *([1] * (q.ndim - 1)))).to(dtype).contiguous()
        else:
            out[name] = (q.float() * float(s.item())).to(dtype).contiguous()
    for name, t in obj["passthrough"].items():
        out_t = t.detach().to("cpu").contiguous()
        if isinstance(orig.get(name), str):
            out_t = out_t.to(getattr(torch, orig[name])).contiguous()
        out[name] = out_t
    return out


def roundtrip(model: torch.nn.Module, run_dir: Path) -> dict:
    """Quantize the model's weights, write `<run_dir>/final_model.int8.ptz`, read it back, load the
    dequantized weights into the model; returns {artifact, artifact_bytes, raw_bytes, stats}."""
    obj, stats = quantize_state_dict_int8(model.state_dict())
    buf = io.BytesIO()
    torch.save(obj, buf)
    raw = buf.getvalue()
    path = Path(run_dir) / ARTIFACT
    atomic_write(path, [zlib.compress(raw, level=ZLIB_LEVEL)])  # renamed into place, never through a symlink
    state = torch.load(io.BytesIO(zlib.decompress(path.read_bytes())), map_location="cpu")
    model.load_state_dict(dequantize_state_dict_int8(state), strict=True)
    return {"artifact": str(path), "artifact_bytes": path.stat().st_size, "raw_bytes": len(raw), "stats": stats}


def roundtrip_scored(model: torch.nn.Module, run_dir: Path, evaluate) -> dict:
    """`Trainer.roundtrip` of the PyTorch baseline (frontier_jax.run.interface): the round trip above, `evaluate(info)`
    on the dequantized model, then the trained weights put back (weights.npz holds the trained ones)."""
    trained = copy.deepcopy(model.state_dict())
    info = {**roundtrip(model, run_dir), "code_files": codebytes.record_run(run_dir, Path(run_dir) / CONFIG)}
    try:
        sums = evaluate(info)
    finally:
        model.load_state_dict(trained)
    return {**info, **sums}
