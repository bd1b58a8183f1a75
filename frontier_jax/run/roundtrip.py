"""What a run submits and how it is reported: parameter-golf's size is "code bytes plus compressed model
bytes", the code being `train_gpt.py`; here the code is packages, so a run's code files are the project's
modules it imported and its config (`frontier_jax.contest.codebytes`, which never counts an environment's
site-packages; docs/rules.md). A trainer's artifact (`Trainer.roundtrip`, the int8 + zlib or int6 + lzma
artifact of `frontier_jax.interop.artifact`) becomes the summary's artifact entries and the size lines here;
`score_lines` is the one formatter of every final score line (the final pipeline, `frontier_jax.run.final`,
and the entry points' last lines), each ending with the run's rules tag. No JAX."""

from __future__ import annotations

import time

from frontier_jax.config import line_name
from frontier_jax.contest import codebytes

FORMAT_LABELS = {"int8_zlib": "int8+zlib", "int6_lzma": "int6+lzma"}  # eval.artifact as the size lines name it


def artifact_fields(info: dict) -> dict:
    """summary.json's artifact entries from a trainer's artifact info (format, path, bytes, torch.save bytes,
    the quantizer's stats, the code files): the artifact's and the code's bytes, their sum."""
    files = info.get("code_files") or []
    code = codebytes.count_bytes(files)
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


def summary_fields(r: dict) -> dict:
    """summary.json's round-trip entries from a trainer's round trip (artifact info + val sums + code files)."""
    return {"roundtrip_val_loss": r["loss"], "roundtrip_val_bpb": r["bpb"], "roundtrip_val_nll_sum_nats": r["nll_sum_nats"],
            "roundtrip_val_tokens": r["tokens"], "roundtrip_val_bytes": r["bytes"],
            "roundtrip_eval_seconds": r["eval_seconds"], **artifact_fields(r)}


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


def score_lines(name: str, loss: float, bpb: float, eval_seconds: float | None = None, detail: str = "",
                tag: str = "") -> list[str]:
    """The one formatter of a score line and its `_exact` twin, as the official script and the record print them,
    each ending with the run's rules tag (` rules:<profile>`, frontier_jax.contest.limits.end_of_run):
    `NAME val_loss:%.4f val_bpb:%.4f[ DETAIL][ eval_time:%.0fms]TAG` and `NAME_exact val_loss:%.8f val_bpb:%.8fTAG`."""
    timed_ms = "" if eval_seconds is None else f" eval_time:{1000.0 * eval_seconds:.0f}ms"
    return [f"{name} val_loss:{loss:.4f} val_bpb:{bpb:.4f}{' ' + detail if detail else ''}{timed_ms}{tag}",
            f"{name}_exact val_loss:{loss:.8f} val_bpb:{bpb:.8f}{tag}"]


def timed(evaluate) -> dict:
    """`evaluate()`'s result with its wall-clock seconds as `eval_seconds` (the scripts' eval_time)."""
    t0 = time.perf_counter()
    v = evaluate()
    return {**v, "eval_seconds": time.perf_counter() - t0}


def stage_lines(f: dict, stage: str) -> list[str]:
    """The score lines of one final stage (`roundtrip`, `sliding`, `ttt`) of a summary: the official script's two
    final lines for the int8+zlib artifact's round trip, the record's `final_int6_*` lines for int6+lzma, its
    `legal_ttt` lines for test-time training."""
    name = line_name(f.get("artifact_format", "int8_zlib"), stage)
    return score_lines(name, f[f"{stage}_val_loss"], f[f"{stage}_val_bpb"], f[f"{stage}_eval_seconds"],
                       f"stride:{f['sliding_stride']}" if stage == "sliding" else "", f.get("rules_tag", ""))


def roundtrip_lines(f: dict) -> list[str]:
    """The final score lines of a summary: its round trip's, then its sliding windows' and its TTT's when it has
    them."""
    return [line for stage in ("roundtrip", "sliding", "ttt") if f.get(f"{stage}_val_bpb") is not None
            for line in stage_lines(f, stage)]
