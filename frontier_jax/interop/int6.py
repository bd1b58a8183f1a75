"""Record 2026-03-23's mixed int6 quantization (its `final_model.int6.ptz`), in numpy: no torch, no JAX.

The spec is the record's `mixed_quantize_int6(sd, {"mlp", "attn"})`, `quantize_int6_per_row`,
`dequantize_mixed_int6` and `_classify_param` (train_gpt.py L1232-1379 of
records/track_10min_16mb/2026-03-23_LeakyReLU_LegalTTT_ParallelMuon), applied to a state dict in the record's
unbanked names and order (`record_order`), each tensor in the dtype the record holds it in (`as_record_dtypes`:
the three embedding tables bfloat16, everything else float32), per tensor in that order:

1. not floating point, or at most 65,536 elements: kept, a float stored as float16 (control tensors too: the
   size test comes first), meta "passthrough";
2. a larger float tensor whose name contains a control pattern (`CONTROL_PATTERNS`): kept as float32, meta
   "passthrough_ctrl";
3. a larger tensor of category "attn" or "mlp" (`classify`: ".mlp." -> mlp; ".attn." or ".proj." outside the
   MLP -> attn, so `bigram.proj.weight` and `ve_shared.proj.weight` are attn): int6 (`quantize_int6_rows`),
   keys `name.q` (int8 holding -31..31) and `name.scale` (float16), meta {"type": "int6"};
4. the rest: the baseline's per-row int8 (`quantize.quantize_float`), keys `name.q`, `name.scale`, meta
   {"type": "int8"}.

The object `{"w": tensors, "m": meta}` is what the record passes to `torch.save`; lzma preset 6 compresses it
(`frontier_jax.interop.artifact`). Dequantized (`dequantize_mixed`): a float16 kept tensor cast back to its
template dtype, a quantized one `q * scale` in float32 cast to the template dtype, so the bfloat16 tables come
back rounded to bfloat16 (the record's Q22). The arithmetic is float32 as in PyTorch: the dequantized weights
equal the record's functions' output bit for bit (tests/test_interop_int6.py checks an independent port of the
spec; docs/evaluation.md gives the check against the record's own code).
"""

from __future__ import annotations

import re

import numpy as np

from frontier_jax.interop.pg_record import record_dtype  # the template dtype of the dequantization
from frontier_jax.interop.quantize import KEEP_FLOAT_MAX_NUMEL, ArtifactError, quantile_last_axis, quantize_float

INT6_CATEGORIES = ("mlp", "attn")
CLIP_RANGE = 31  # int6 values -31..31 (one int8 byte each: lzma removes the slack)
CLIP_PERCENTILES = (0.9990, 0.9995, 0.9999, 0.99999, 1.0)  # tried in this order; 1.0: the row's max |w|
# the record's CONTROL_TENSOR_NAME_PATTERNS (train_gpt.py L363-370)
CONTROL_PATTERNS = ("attn_scale", "attn_scales", "mlp_scale", "mlp_scales", "resid_mix", "resid_mixes", "q_gain",
                    "skip_weight", "skip_weights", "smear", "dtg_gate", "ve_layer_scales", "ve_shared.scale",
                    "attn_gate", "vr_lambda")


def classify(name: str) -> str:
    """The record's `_classify_param`: embed | mlp | attn | other."""
    if "tok_emb" in name or "lm_head" in name:
        return "embed"
    if ".mlp." in name:
        return "mlp"
    if ".attn." in name or (".proj." in name and ".mlp." not in name):
        return "attn"
    return "other"


def as_record_dtypes(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float tensors cast to the dtypes the record holds them in (the tables' values rounded to bfloat16); other
    tensors unchanged."""
    return {k: np.asarray(v).astype(record_dtype(k)) if _is_float(v) else np.asarray(v) for k, v in sd.items()}


# the record's unbanked state_dict order (SPEC §6.1): its own parameters, the unbanked matrices grouped as the banks
# hold them, then the submodules in registration order; a name it does not have goes last, in the given order
_ORDER = [(re.compile(p), rank) for rank, p in enumerate((
    r"skip_weights$", r"blocks\.(\d+)\.attn\.(c_q|proj)\.weight$", r"blocks\.(\d+)\.attn\.(c_k|c_v)\.weight$",
    r"blocks\.(\d+)\.mlp\.fc\.weight$", r"blocks\.(\d+)\.mlp\.proj\.weight$", r"tok_emb\.weight$", r"bigram\.scale$",
    r"bigram\.embed\.weight$", r"bigram\.proj\.weight$", r"smear\.gate$",
    r"blocks\.(\d+)\.(attn_scale|mlp_scale|resid_mix|attn\.q_gain)$", r"ve_shared\.scale$",
    r"ve_shared\.embed\.weight$", r"ve_shared\.proj\.weight$", r"ve_layer_scales\.(\d+)$"))]
_WITHIN = {"c_q": 0, "proj": 1, "c_k": 0, "c_v": 1, "attn_scale": 0, "mlp_scale": 1, "resid_mix": 2, "attn.q_gain": 3}


def _order_key(item: tuple[int, str]):
    i, name = item
    for pattern, rank in _ORDER:
        m = pattern.match(name)
        if m:
            groups = m.groups()
            return (rank, int(groups[0]) if groups else 0, _WITHIN.get(groups[1], 0) if len(groups) > 1 else 0, i)
    return (len(_ORDER), 0, 0, i)


def record_order(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`sd` in the order of the record's unbanked state dict (the order its artifact stores the tensors in)."""
    return {name: sd[name] for _, name in sorted(enumerate(sd), key=_order_key)}


def _is_float(a) -> bool:
    return np.asarray(a).dtype.name in ("float32", "bfloat16", "float16", "float64")


def quantize_int6_rows(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The record's `quantize_int6_per_row`: (int8 values in [-31, 31], float16 scales).

    2-D: for each clip percentile in CLIP_PERCENTILES, per row clip = the row's percentile of |w| (torch.quantile's
    linear interpolation; 1.0: the max), scale = float16(max(clip / 31, 1/31)), q = round-half-even(w / scale)
    clamped to +-31 (w itself is not clipped); the percentile with the smallest mean squared error over the whole
    matrix wins, ties keeping the earlier one (strict <). Other shapes: one float16 scale from the max |w|.
    """
    t32 = np.asarray(t).astype(np.float32)
    if t32.ndim != 2:
        amax = float(np.abs(t32).max()) if t32.size else 0.0
        # torch.tensor(python float, dtype=float16) rounds the double to float32, then to float16
        scale = np.float32(amax / CLIP_RANGE if amax > 0 else 1.0).astype(np.float16)
        q = np.clip(np.rint(t32 / np.float32(scale)), -CLIP_RANGE, CLIP_RANGE).astype(np.int8)
        return q, np.asarray(scale)
    a = np.sort(np.abs(t32), axis=1)  # one sort for the four quantiles; its last column is the max
    best_q, best_s, best_err = None, None, np.inf
    for pct in CLIP_PERCENTILES:
        clip = quantile_last_axis(a, pct, presorted=True) if pct < 1.0 else a[:, -1]
        s = np.maximum(clip / np.float32(CLIP_RANGE), np.float32(1.0 / CLIP_RANGE)).astype(np.float16)
        s32 = s.astype(np.float32)[:, None]
        q = np.clip(np.rint(t32 / s32), -CLIP_RANGE, CLIP_RANGE).astype(np.int8)
        # the squares in float32 as torch's pow(2); their mean in float64 (torch sums float32 in a cascade: two
        # candidates could order differently only when their errors agree to float32 rounding)
        err = float(np.mean(np.square(t32 - q.astype(np.float32) * s32), dtype=np.float64))
        if err < best_err:
            best_q, best_s, best_err = q, s, err
    return best_q, best_s


def mixed_quantize(sd: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """({"w": tensors, "m": meta}, stats) of a state dict as the record holds it (see the module docstring:
    callers pass `record_order(as_record_dtypes(sd))`). stats: the tensor names per kind (int6, int8,
    passthrough, passthrough_ctrl) and the stored bytes (`payload_bytes`)."""
    result, meta = {}, {}
    kinds = {"int6": [], "int8": [], "passthrough": [], "passthrough_ctrl": []}
    for name, tensor in sd.items():
        t = np.asarray(tensor)
        t = t if t.flags.c_contiguous else t.copy()  # (np.ascontiguousarray makes 0-d arrays 1-d)
        if not _is_float(t) or t.size <= KEEP_FLOAT_MAX_NUMEL:
            result[name], meta[name] = (t.astype(np.float16) if _is_float(t) else t), "passthrough"
        elif any(p in name for p in CONTROL_PATTERNS):
            result[name], meta[name] = t.astype(np.float32), "passthrough_ctrl"
        else:
            int6 = classify(name) in INT6_CATEGORIES and t.ndim >= 1
            q, s = quantize_int6_rows(t) if int6 else quantize_float(t)
            result[name + ".q"], result[name + ".scale"] = q, s
            meta[name] = {"type": "int6" if int6 else "int8"}
        kinds[meta[name] if isinstance(meta[name], str) else meta[name]["type"]].append(name)
    stats = {**{k: len(v) for k, v in kinds.items()}, "names": kinds,
             "payload_bytes": int(sum(np.asarray(v).nbytes for v in result.values()))}
    return {"w": result, "m": meta}, stats


def check_mixed(obj: dict, source: str = "<artifact>") -> dict:
    """`obj` when it is an {"w", "m"} object `dequantize_mixed` can use (checked before any use): every meta entry
    names a kept tensor or an int8 tensor of int6 / int8 values with its float scale (one per row, or one);
    ArtifactError naming `source` and the first entry that is not."""
    def bad(what: str):
        raise ArtifactError(f"{source}: malformed int6+lzma artifact ({what})")

    w, m = obj.get("w"), obj.get("m")
    for key, table in (("w", w), ("m", m)):
        if not isinstance(table, dict) or not all(isinstance(k, str) for k in table):
            bad(f"{key} is {type(table).__name__}, expected a dict of tensor names")
    for name, info in m.items():
        if info in ("passthrough", "passthrough_ctrl"):
            if not isinstance(w.get(name), np.ndarray):
                bad(f"kept tensor {name!r} is missing or not a tensor")
            continue
        if not isinstance(info, dict) or info.get("type") not in ("int6", "int8"):
            bad(f"meta[{name!r}] is {info!r:.40}")
        q, s = w.get(name + ".q"), w.get(name + ".scale")
        if not isinstance(q, np.ndarray) or q.dtype != np.int8 or q.ndim == 0:
            bad(f"{name}.q is not an int8 tensor")
        if not isinstance(s, np.ndarray) or not _is_float(s) or (s.shape != (q.shape[0],) and s.size != 1):
            bad(f"{name}.scale is not a float scale per row of {name}.q (or one)")
    return obj


def dequantize_mixed(obj: dict, dtypes: dict[str, np.dtype] | None = None) -> dict[str, np.ndarray]:
    """The record's `dequantize_mixed_int6`: the state dict of an {"w", "m"} object, each tensor in its template
    dtype (`dtypes`, default `record_dtype` of each name), in the object's order."""
    w, m = obj["w"], obj["m"]
    out = {}
    for name, info in m.items():
        dtype = (dtypes or {}).get(name, record_dtype(name))
        if isinstance(info, str):  # passthrough, passthrough_ctrl: a float16 tensor goes back to its template dtype
            t = np.asarray(w[name])
            out[name] = t.astype(dtype) if t.dtype == np.float16 and dtype.name in ("float32", "bfloat16") else t
            continue
        q, s = np.asarray(w[name + ".q"]), np.asarray(w[name + ".scale"])
        s32 = s.astype(np.float32)
        if s.ndim > 0:
            s32 = s32.reshape(q.shape[0], *([1] * (q.ndim - 1)))
        out[name] = (q.astype(np.float32) * s32).astype(dtype)
    return out
