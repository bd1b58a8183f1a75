"""What a run submits and how it is reported: the contest's size is "code bytes plus compressed model
bytes", the code being `train_gpt.py`; here the code is a package, so `code_files` lists every source file
of this repository that the training process has imported (`sys.modules`), plus its config file
(docs/evaluation.md, "Code bytes"). A trainer's artifact (`Trainer.roundtrip`) becomes the summary's artifact
entries and the size lines here; `score_lines` is the one formatter of every final score line (the final
pipeline, `frontier_jax.run.final`, and the entry points' last lines). No JAX."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from frontier_jax.config import ARTIFACT_LINES, SCORE_STAGES

REPO = Path(__file__).resolve().parents[2]


def code_files(extra: tuple = (), root: Path | None = None) -> list[Path]:
    """The repository's source files this process imported (sys.modules), plus `extra` (the config file)."""
    root = Path(root or REPO)
    files = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py") or not os.path.isabs(f):  # (torch's _classes is "_classes.py")
            continue
        p = Path(f).resolve()
        if p.is_file() and p.is_relative_to(root) and "tests" not in p.relative_to(root).parts[:1]:
            files.add(p)
    files.update(Path(e).resolve() for e in extra if e and Path(e).is_file())
    return sorted(files)


def code_bytes(files: list[Path]) -> int:
    """UTF-8 bytes of the files (the contest: `len(code.encode("utf-8"))` of train_gpt.py)."""
    return sum(len(Path(f).read_text(encoding="utf-8").encode("utf-8")) for f in files)


FORMAT_LABELS = {"int8_zlib": "int8+zlib", "int6_lzma": "int6+lzma"}  # eval.artifact as the size lines name it


def artifact_fields(info: dict) -> dict:
    """summary.json's artifact entries from a trainer's artifact info (format, path, bytes, torch.save bytes,
    the quantizer's stats, the code files): the artifact's and the code's bytes, their sum."""
    files = info.get("code_files") or []
    code = code_bytes(files)
    fmt, stats = info.get("format", "int8_zlib"), info["stats"]
    out = {"artifact_format": fmt, "artifact": info["artifact"], "artifact_bytes": info["artifact_bytes"],
           "artifact_raw_bytes": info["raw_bytes"], "code_bytes": code, "code_files": len(files),
           "submission_bytes": info["artifact_bytes"] + code}
    if fmt == "int8_zlib":
        out.update(int8_payload_bytes=stats["int8_payload_bytes"], baseline_tensor_bytes=stats["baseline_tensor_bytes"])
    else:
        out.update(payload_bytes=stats["payload_bytes"],
                   artifact_tensors={k: stats[k] for k in ("int6", "int8", "passthrough", "passthrough_ctrl")})
    return out


def export_lines(f: dict) -> list[str]:
    """The size lines of the artifact, in the format of the script that defines it (the baseline's train_gpt.py
    for int8+zlib; record 2026-03-23's for int6+lzma)."""
    code = (f"Code size: {f['code_bytes']} bytes ({f['code_files']} source files this run imported, and its "
            "config.json)")
    if f.get("artifact_format", "int8_zlib") == "int6_lzma":
        return [code, f"Serialized model int6+lzma: {f['artifact_bytes']} bytes",
                f"Total submission size int6+lzma: {f['submission_bytes']} bytes"]
    ratio = f["baseline_tensor_bytes"] / max(f["int8_payload_bytes"], 1)
    return [f"Serialized model int8+zlib: {f['artifact_bytes']} bytes (payload:{f['int8_payload_bytes']} "
            f"raw_torch:{f['artifact_raw_bytes']} payload_ratio:{ratio:.2f}x)", code,
            f"Total submission size int8+zlib: {f['submission_bytes']} bytes"]


def score_lines(name: str, loss: float, bpb: float, eval_seconds: float | None = None, detail: str = "") -> list[str]:
    """The one formatter of a score line and its `_exact` twin, as the official script and the record print them:
    `NAME val_loss:%.4f val_bpb:%.4f[ DETAIL][ eval_time:%.0fms]` and `NAME_exact val_loss:%.8f val_bpb:%.8f`."""
    timed = "" if eval_seconds is None else f" eval_time:{1000.0 * eval_seconds:.0f}ms"
    return [f"{name} val_loss:{loss:.4f} val_bpb:{bpb:.4f}{' ' + detail if detail else ''}{timed}",
            f"{name}_exact val_loss:{loss:.8f} val_bpb:{bpb:.8f}"]


def timed(evaluate) -> dict:
    """`evaluate()`'s result with its wall-clock seconds as `eval_seconds` (the scripts' eval_time)."""
    t0 = time.perf_counter()
    v = evaluate()
    return {**v, "eval_seconds": time.perf_counter() - t0}


def roundtrip_lines(f: dict) -> list[str]:
    """The final score lines of a summary's round trip and sliding windows (the official script's two final
    lines for the int8+zlib artifact; the record's `final_int6_*` lines for int6+lzma)."""
    prefix = ARTIFACT_LINES[f.get("artifact_format", "int8_zlib")]
    lines = score_lines(prefix + SCORE_STAGES["roundtrip"], f["roundtrip_val_loss"], f["roundtrip_val_bpb"],
                        f["roundtrip_eval_seconds"])
    if f.get("sliding_val_bpb") is not None:
        lines += score_lines(prefix + SCORE_STAGES["sliding"], f["sliding_val_loss"], f["sliding_val_bpb"],
                             f["sliding_eval_seconds"], f"stride:{f['sliding_stride']}")
    return lines
