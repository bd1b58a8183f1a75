"""A run's artifact in either format, behind one interface: write it, read it back, tell the formats apart.

    int8_zlib  the baseline's `final_model.int8.ptz`: zlib level 9 of torch.save(the int8_clean_per_row_v1
               object) (`frontier_jax.interop.quantize`)
    int6_lzma  record 2026-03-23's `final_model.int6.ptz`: lzma preset 6 (xz container, CRC64) of
               torch.save({"w", "m"}) of its mixed int6 quantization (`frontier_jax.interop.int6`), written from
               the state dict as the record holds it (its unbanked order, the embedding tables in bfloat16)

A file is recognised by its first bytes (an xz stream starts with FD 37 7A 58 5A 00, a zlib stream with a
deflate header whose first two bytes are a multiple of 31), whatever its name. Decompression is bounded by
half of this host's memory. numpy only: no torch, no JAX.
"""

from __future__ import annotations

import lzma
import zlib
from pathlib import Path

import numpy as np

from frontier_jax.config import host_memory_bytes
from frontier_jax.interop import int6, quantize, torch_format
from frontier_jax.interop.quantize import ArtifactError

NAMES = {"int8_zlib": quantize.ARTIFACT, "int6_lzma": "final_model.int6.ptz"}
LABELS = {"int8_zlib": "int8+zlib", "int6_lzma": "int6+lzma"}  # as the size lines name them
LZMA_PRESET = 6
XZ_MAGIC = b"\xfd7zXZ\x00"


def artifact_path(run_dir, fmt: str) -> Path:
    """Where a run writes its artifact of format `fmt` (eval.artifact)."""
    return Path(run_dir) / NAMES[fmt]


def detect(blob: bytes, source: str = "<artifact>") -> str:
    """The format of an artifact's bytes; ArtifactError (one line naming `source`) for anything else."""
    if blob.startswith(XZ_MAGIC):
        return "int6_lzma"
    if len(blob) >= 2 and blob[0] & 0x0F == 8 and (blob[0] << 8 | blob[1]) % 31 == 0:
        return "int8_zlib"
    raise ArtifactError(f"{source}: not an artifact: not a zlib stream (int8+zlib, {NAMES['int8_zlib']}) nor an xz "
                        f"stream (int6+lzma, {NAMES['int6_lzma']})")


def _decompress_lzma(blob: bytes, source: str) -> bytes:
    limit = max((host_memory_bytes() or 8 << 30) // 2, 1 << 20)
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        raw = dec.decompress(blob, max_length=limit)
    except lzma.LZMAError as e:
        raise ArtifactError(f"{source}: not a readable xz stream ({e})") from None
    if not dec.eof:
        why = "truncated" if dec.needs_input else f"it decompresses to more than {limit} bytes (half of this host's memory)"
        raise ArtifactError(f"{source}: unreadable int6+lzma artifact ({why})")
    return raw


def loads(blob: bytes, source: str = "<artifact>") -> tuple[str, dict[str, np.ndarray]]:
    """(format, dequantized state dict) of an artifact's bytes (ours, the PyTorch baseline's, the official
    script's or the record's): the int6 tensors in the dtypes the record holds them in."""
    fmt = detect(blob, source)
    if fmt == "int8_zlib":
        return fmt, quantize.dequantize_state_dict(quantize.loads_artifact(blob, source))
    try:
        obj = torch_format.loads(_decompress_lzma(blob, source))
    except torch_format.TorchFormatError as e:
        raise ArtifactError(f"{source}: {e}") from None
    if not (isinstance(obj, dict) and isinstance(obj.get("w"), dict) and isinstance(obj.get("m"), dict)):
        raise ArtifactError(f"{source}: not an int6+lzma artifact (no {{'w': tensors, 'm': meta}} object)")
    try:
        return fmt, int6.dequantize_mixed(obj)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ArtifactError(f"{source}: unreadable int6+lzma artifact ({type(e).__name__}: {str(e)[:120]})") from None


def load(path) -> tuple[str, dict[str, np.ndarray]]:
    """(format, dequantized state dict) of an artifact file (`loads`)."""
    return loads(quantize.read_artifact(path), str(path))


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
    _, back = loads(blob, str(path))
    return back, {"format": fmt, "artifact": str(path), "artifact_bytes": len(blob), "raw_bytes": raw_bytes,
                  "stats": stats}
