"""What a run submits and how it is reported: parameter-golf's size is "code bytes plus compressed model
bytes", the code being `train_gpt.py`; here the code is packages, so a run's code files are the project's
modules it imported and its config (`frontier_jax.contest.codebytes`, which never counts an environment's
site-packages; docs/rules.md). A trainer's round trip (`Trainer.roundtrip`: the int8 + zlib
artifact of `frontier_jax.interop.quantize`, scored by the run's own evaluation) becomes the summary's
round-trip entries and the official script's lines here (`run_roundtrip`, called by the driver). No JAX."""

from __future__ import annotations

import time

from frontier_jax.contest import codebytes
from frontier_jax.errors import BadInput, describe_os_error


def summary_fields(r: dict) -> dict:
    """summary.json's round-trip entries from a trainer's round trip (artifact info + val sums + code files)."""
    files = r.get("code_files") or []
    code = codebytes.count_bytes(files)
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
    """The official script's two final lines (train_gpt.py's formats): the score the contest uses, each ending
    with the run's rules profile (`rules_tag`: ` rules:<profile>`, frontier_jax.contest.limits.end_of_run)."""
    tag = f.get("rules_tag", "")
    return [f"final_int8_zlib_roundtrip val_loss:{f['roundtrip_val_loss']:.4f} val_bpb:{f['roundtrip_val_bpb']:.4f} "
            f"eval_time:{1000.0 * f['roundtrip_eval_seconds']:.0f}ms{tag}",
            f"final_int8_zlib_roundtrip_exact val_loss:{f['roundtrip_val_loss']:.8f} "
            f"val_bpb:{f['roundtrip_val_bpb']:.8f}{tag}"]


def run_roundtrip(roundtrip, evaluate, log, tag=None) -> dict:
    """Run a trainer's round trip (`roundtrip(timed evaluate)`), log the official lines; its summary fields
    ({} when `roundtrip` returns None: the trainer has none). An artifact that cannot be written or read is
    logged and reported as `roundtrip_error`. `tag(fields)`: fields to add before the lines are logged (the
    rules profile's `rules_tag`, which the score lines end with)."""
    def timed() -> dict:
        t0 = time.perf_counter()
        v = evaluate()
        return {**v, "eval_seconds": time.perf_counter() - t0}

    try:
        result = roundtrip(timed)
        if result is None:
            return {}
        fields = summary_fields(result)
        if tag is not None:
            fields.update(tag(fields))
    except (OSError, BadInput) as e:
        msg = describe_os_error(e) if isinstance(e, OSError) else str(e)
        log(f"int8+zlib round trip failed: {msg}")
        return {"roundtrip_error": msg}
    for line in export_lines(fields) + roundtrip_lines(fields):
        log(line)
    return fields
