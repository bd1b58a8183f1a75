"""A run's artifact in either format, behind one interface: write it, read it back, tell the formats apart.

    int8_zlib  the baseline's `final_model.int8.ptz`: zlib level 9 of torch.save(the int8_clean_per_row_v1
               object) (`frontier_jax.interop.quantize`)
    int6_lzma  record 2026-03-23's `final_model.int6.ptz`: lzma preset 6 (xz container, CRC64) of
               torch.save({"w", "m"}) of its mixed int6 quantization (`frontier_jax.interop.int6`), written from
               the state dict as the record holds it (its unbanked order, the embedding tables in bfloat16)

A file is recognised by what it holds (a zlib or an lzma stream, `quantize.decompress`; the baseline's object or
the record's), whatever its name; decompression is bounded (`quantize.raw_limit`) and the object is checked
before any use. numpy only: no torch, no JAX.
"""

from __future__ import annotations

import lzma
import zlib
from pathlib import Path

import numpy as np

from frontier_jax.interop import int6, quantize, torch_format
from frontier_jax.interop.quantize import ArtifactError

NAMES = {"int8_zlib": quantize.ARTIFACT, "int6_lzma": "final_model.int6.ptz"}
LZMA_PRESET = 6


def artifact_path(run_dir, fmt: str) -> Path:
    """Where a run writes its artifact of format `fmt` (eval.artifact)."""
    return Path(run_dir) / NAMES[fmt]


def loads(blob: bytes, source: str = "<artifact>", max_raw_bytes: int | None = None) -> tuple[str, dict[str, np.ndarray]]:
    """(format, dequantized state dict) of an artifact's bytes (ours, the PyTorch baseline's, the official
    script's or the record's), decompressed (zlib or lzma) to at most `max_raw_bytes` (`quantize.raw_limit`) and
    its object checked before any use; the int6 tensors in the dtypes the record holds them in."""
    limit = quantize.raw_limit() if max_raw_bytes is None else max_raw_bytes
    raw = quantize.decompress(blob, limit, source)
    try:
        obj = torch_format.loads(raw, max_bytes=limit)
    except torch_format.TorchFormatError as e:
        raise ArtifactError(f"{source}: {e}") from None
    if isinstance(obj, dict) and "__quant_format__" in obj:
        return "int8_zlib", quantize.dequantize_state_dict(quantize.check_artifact(obj, source))
    if isinstance(obj, dict) and set(obj) == {"w", "m"}:
        return "int6_lzma", int6.dequantize_mixed(int6.check_mixed(obj, source))
    raise ArtifactError(f"{source}: not an artifact (neither the baseline's {quantize.FORMAT} object nor the "
                        "record's {'w': tensors, 'm': meta} one)")


def load(path, max_raw_bytes: int | None = None) -> tuple[str, dict[str, np.ndarray]]:
    """(format, dequantized state dict) of an artifact file (`loads`; a FIFO, a device or an oversized file is
    refused unread)."""
    limit = quantize.raw_limit() if max_raw_bytes is None else max_raw_bytes
    return loads(quantize.read_artifact(path, limit), str(path), limit)


def encode(sd: dict[str, np.ndarray], fmt: str) -> tuple[bytes, int, dict]:
    """(compressed artifact, torch.save bytes, the quantizer's stats) of a state dict in the baseline's names."""
    if fmt == "int8_zlib":
        obj, stats = quantize.quantize_state_dict(sd)
        blob, raw_bytes = quantize.compress(obj)
        return blob, raw_bytes, stats
    obj, stats = int6.mixed_quantize(int6.record_order(int6.as_record_dtypes(sd)))
    raw = torch_format.dumps(obj)
    return lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=LZMA_PRESET), len(raw), stats


def roundtrip(sd: dict[str, np.ndarray], run_dir, fmt: str, write: bool = True) -> tuple[dict, dict]:
    """(dequantized state dict, info) of the export after training: quantize, compress, write
    `artifact_path(run_dir, fmt)` (write=False: a process that does not write; it uses its own bytes, which
    are the same), read it back from disk, dequantize. info: format, artifact path and bytes, torch.save
    bytes, the quantizer's stats."""
    blob, raw_bytes, stats = encode(sd, fmt)
    path = artifact_path(run_dir, fmt)
    if write:
        quantize.write_artifact(path, blob)
        blob = path.read_bytes()
    _, back = loads(blob, str(path), quantize.raw_limit(sum(int(np.asarray(t).size) for t in sd.values()), len(sd)))
    return back, {"format": fmt, "artifact": str(path), "artifact_bytes": len(blob), "raw_bytes": raw_bytes,
                  "stats": stats}
