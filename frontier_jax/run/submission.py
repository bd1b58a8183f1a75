"""What a run submits and how it is reported: the contest's size is "code bytes plus compressed model
bytes", the code being `train_gpt.py`; here the code is a package, so `code_files` lists every source file
of this repository that the training process has imported (`sys.modules`), plus its config file
(docs/evaluation.md, "The contest's score"). A trainer's round trip (`Trainer.roundtrip`: the int8 + zlib
artifact of `frontier_jax.interop.quantize`, scored by the run's own evaluation) becomes the summary's
round-trip entries and the official script's lines here (`run_roundtrip`, called by the driver). No JAX."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from frontier_jax.errors import BadInput, describe_os_error

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


def summary_fields(r: dict) -> dict:
    """summary.json's round-trip entries from a trainer's round trip (artifact info + val sums + code files)."""
    files = r.get("code_files") or []
    code = code_bytes(files)
    return {"roundtrip_val_loss": r["loss"], "roundtrip_val_bpb": r["bpb"], "roundtrip_val_nll_sum_nats": r["nll_sum_nats"],
            "roundtrip_val_tokens": r["tokens"], "roundtrip_val_bytes": r["bytes"],
            "roundtrip_eval_seconds": r["eval_seconds"], "artifact": r["artifact"],
            "artifact_bytes": r["artifact_bytes"], "artifact_raw_bytes": r["raw_bytes"],
            "int8_payload_bytes": r["stats"]["int8_payload_bytes"],
            "baseline_tensor_bytes": r["stats"]["baseline_tensor_bytes"], "code_bytes": code,
            "code_files": len(files), "submission_bytes": r["artifact_bytes"] + code}


def export_lines(f: dict) -> list[str]:
    """The official script's size lines for the artifact (train_gpt.py's formats)."""
    ratio = f["baseline_tensor_bytes"] / max(f["int8_payload_bytes"], 1)
    return [f"Serialized model int8+zlib: {f['artifact_bytes']} bytes (payload:{f['int8_payload_bytes']} "
            f"raw_torch:{f['artifact_raw_bytes']} payload_ratio:{ratio:.2f}x)",
            f"Code size: {f['code_bytes']} bytes ({f['code_files']} source files this run imported, and its "
            "config.json)",
            f"Total submission size int8+zlib: {f['submission_bytes']} bytes"]


def roundtrip_lines(f: dict) -> list[str]:
    """The official script's two final lines (train_gpt.py's formats): the score the contest uses."""
    return [f"final_int8_zlib_roundtrip val_loss:{f['roundtrip_val_loss']:.4f} val_bpb:{f['roundtrip_val_bpb']:.4f} "
            f"eval_time:{1000.0 * f['roundtrip_eval_seconds']:.0f}ms",
            f"final_int8_zlib_roundtrip_exact val_loss:{f['roundtrip_val_loss']:.8f} "
            f"val_bpb:{f['roundtrip_val_bpb']:.8f}"]


def run_roundtrip(roundtrip, evaluate, log) -> dict:
    """Run a trainer's round trip (`roundtrip(timed evaluate)`), log the official lines; its summary fields
    ({} when `roundtrip` returns None: the trainer has none). An artifact that cannot be written or read is
    logged and reported as `roundtrip_error`."""
    def timed() -> dict:
        t0 = time.perf_counter()
        v = evaluate()
        return {**v, "eval_seconds": time.perf_counter() - t0}

    try:
        result = roundtrip(timed)
        if result is None:
            return {}
        fields = summary_fields(result)
    except (OSError, BadInput) as e:
        msg = describe_os_error(e) if isinstance(e, OSError) else str(e)
        log(f"int8+zlib round trip failed: {msg}")
        return {"roundtrip_error": msg}
    for line in export_lines(fields) + roundtrip_lines(fields):
        log(line)
    return fields
