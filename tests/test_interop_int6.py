"""frontier_jax.interop.int6 and .artifact: record 2026-03-23's mixed int6 + lzma artifact equals an independent
port of its specification (written here, literally, from the record's quantize_int6_per_row / mixed_quantize_int6
/ dequantize_mixed_int6) bit for bit, on shapes where the int6 branch runs and rows above the 1/31 scale floor
(so the five-percentile search decides); the file is torch.save + xz; both formats are told apart by their bytes
and anything else is refused in one line."""

from __future__ import annotations

import io
import lzma

import ml_dtypes
import numpy as np
import pytest

from frontier_jax.interop import artifact, int6, quantize, torch_format
from frontier_jax.interop.quantize import ArtifactError

BF16 = np.dtype(ml_dtypes.bfloat16)


# ----------------------------------------------------------------------------- the port of the specification


def _quantile(a: np.ndarray, q: float) -> np.ndarray:
    """torch.quantile(a, q, dim=1), linear: rank = q (n-1) in float32, torch.lerp of the neighbours."""
    s = np.sort(a, axis=1)
    rank = np.float32(q) * np.float32(a.shape[1] - 1)
    lo = int(np.floor(rank))
    w = np.float32(rank - np.float32(lo))
    b, e = s[:, lo], s[:, min(lo + 1, a.shape[1] - 1)]
    return b + w * (e - b) if w < 0.5 else e - (e - b) * (np.float32(1) - w)


def _port_int6(t: np.ndarray):
    """quantize_int6_per_row, clip_range 31; also which percentile won."""
    t32 = t.astype(np.float32)
    if t32.ndim != 2:
        amax = float(np.abs(t32).max())
        s = np.float16(np.float32(amax / 31 if amax > 0 else 1.0))
        return np.clip(np.rint(t32 / np.float32(s)), -31, 31).astype(np.int8), np.array(s), None
    best = (None, None, float("inf"), None)
    for pct in [0.9990, 0.9995, 0.9999, 0.99999, 1.0]:
        row_clip = _quantile(np.abs(t32), pct) if pct < 1.0 else np.abs(t32).max(axis=1)
        s = np.maximum(row_clip / np.float32(31), np.float32(1 / 31)).astype(np.float16)
        q = np.clip(np.rint(t32 / s.astype(np.float32)[:, None]), -31, 31).astype(np.int8)
        err = float(np.mean((t32 - q.astype(np.float32) * s.astype(np.float32)[:, None]) ** 2, dtype=np.float64))
        if err < best[2]:
            best = (q, s, err, pct)
    return best[0], best[1], best[3]


def _port_int8(t: np.ndarray):
    """The baseline's quantize_float_tensor (2-D: per row, clip at the 99.99984th percentile)."""
    t32 = t.astype(np.float32)
    clip = _quantile(np.abs(t32), 99.99984 / 100)
    s = np.maximum(clip / np.float32(127), np.float32(1 / 127))
    q = np.clip(np.rint(np.clip(t32, -clip[:, None], clip[:, None]) / s[:, None]), -127, 127).astype(np.int8)
    return q, s.astype(np.float16)


CONTROL = ("attn_scale", "attn_scales", "mlp_scale", "mlp_scales", "resid_mix", "resid_mixes", "q_gain", "skip_weight",
           "skip_weights", "smear", "dtg_gate", "ve_layer_scales", "ve_shared.scale", "attn_gate", "vr_lambda")


def _port_category(name: str) -> str:
    if "tok_emb" in name or "lm_head" in name:
        return "embed"
    if ".mlp." in name:
        return "mlp"
    return "attn" if ".attn." in name or (".proj." in name and ".mlp." not in name) else "other"


def _port_mixed(sd: dict) -> tuple[dict, dict, list]:
    w, m, won = {}, {}, []
    for name, t in sd.items():
        is_float = t.dtype.kind == "f" or t.dtype == BF16
        if not is_float or t.size <= 65536:
            w[name], m[name] = (t.astype(np.float16) if is_float else t), "passthrough"
        elif any(p in name for p in CONTROL):
            w[name], m[name] = t.astype(np.float32), "passthrough_ctrl"
        elif _port_category(name) in ("mlp", "attn") and t.ndim >= 1:
            w[name + ".q"], w[name + ".scale"], pct = _port_int6(t)
            m[name] = {"type": "int6"}
            won.append(pct)
        else:
            w[name + ".q"], w[name + ".scale"] = _port_int8(t)
            m[name] = {"type": "int8"}
    return w, m, won


def _port_dequantize(w: dict, m: dict, template: dict) -> dict:
    out = {}
    for name, orig in template.items():
        info = m[name]
        if isinstance(info, str):
            t = w[name]
            out[name] = t.astype(orig.dtype) if t.dtype == np.float16 and orig.dtype in (np.float32, BF16) else t
        else:
            q, s = w[name + ".q"], w[name + ".scale"].astype(np.float32)
            out[name] = (q.astype(np.float32) * (s[:, None] if s.ndim else s)).astype(orig.dtype)
    return out


# ----------------------------------------------------------------------------- the state dicts


def _record_state() -> dict[str, np.ndarray]:
    """A record-like state dict (unbanked names, record order and dtypes) at a shape where every block matrix is
    int6: rows far above the 1/31 floor and outliers (the percentile search decides), a zero row, bf16 tables
    (int8), a large 'other' matrix, a large control tensor (fp32 passthrough), a large 1-D and a 3-D attention
    tensor (int6 with one scale), small control tensors and 0-d scalars (fp16), a non-float tensor."""
    rng = np.random.default_rng(7)
    sd = {"skip_weights": rng.standard_normal((2, 96)).astype(np.float32)}
    for i in range(2):
        for name, shape in (("attn.c_q", (288, 288)), ("attn.proj", (288, 288)), ("attn.c_k", (256, 288)),
                            ("attn.c_v", (256, 288)), ("mlp.fc", (600, 288)), ("mlp.proj", (288, 600))):
            a = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            rows = rng.choice(shape[0], shape[0] // 3, replace=False)
            a[rows] *= rng.uniform(20, 400, (rows.size, 1)).astype(np.float32)  # clip up to ~20: scale above 1/31
            a[rows[:3], :2] = rng.choice([-1, 1], (3, 2)) * 900.0  # outliers the high percentiles clip away
            a[rows[3]] = 0.0
            sd[f"blocks.{i}.{name}.weight"] = a
    sd["tok_emb.weight"] = (rng.standard_normal((1024, 96)) * 0.3).astype(BF16)
    sd["bigram.scale"] = np.array(0.050048828125, np.float32)
    sd["bigram.embed.weight"] = (rng.standard_normal((1536, 64)) * 0.2).astype(BF16)
    sd["bigram.proj.weight"] = rng.standard_normal((96, 64)).astype(np.float32)
    sd["smear.gate"] = rng.standard_normal(96).astype(np.float32)
    sd["big_other.weight"] = rng.standard_normal((300, 300)).astype(np.float32)
    sd["blocks.0.attn_scales_large"] = rng.standard_normal(70_000).astype(np.float32)  # a control pattern, > 65,536
    sd["blocks.0.attn.gain_1d"] = (rng.standard_normal(70_000) * 3).astype(np.float32)
    sd["blocks.1.attn.stack_3d"] = rng.standard_normal((3, 200, 120)).astype(np.float32)
    for i in range(2):
        sd[f"blocks.{i}.attn_scale"] = rng.standard_normal(96).astype(np.float32)
        sd[f"blocks.{i}.resid_mix"] = rng.standard_normal((2, 96)).astype(np.float32)
        sd[f"blocks.{i}.attn.q_gain"] = np.full(4, 1.5, np.float32)
    sd["ve_shared.scale"] = np.array(0.10009765625, np.float32)
    sd["ve_shared.embed.weight"] = (rng.standard_normal((1024, 128)) * 0.01).astype(BF16)
    sd["ve_layer_scales.0"] = np.ones(1, np.float32)
    sd["counter"] = np.arange(3, dtype=np.int64)
    return sd


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


# ----------------------------------------------------------------------------- the tests


def test_the_quantized_object_and_the_dequantized_weights_equal_the_specification_bit_for_bit():
    sd = _record_state()
    obj, stats = int6.mixed_quantize(sd)
    w, m, won = _port_mixed(sd)
    assert list(obj["w"]) == list(w) and obj["m"] == m
    for k in w:
        assert obj["w"][k].dtype == w[k].dtype and obj["w"][k].shape == w[k].shape, k
        assert np.array_equal(_bits(obj["w"][k]), _bits(w[k])), k
    assert len(set(won) - {None}) >= 2  # the search chose different percentiles for different matrices
    types = {k: (v if isinstance(v, str) else v["type"]) for k, v in m.items()}
    assert types["blocks.0.attn.c_q.weight"] == types["blocks.1.mlp.proj.weight"] == "int6"
    assert types["tok_emb.weight"] == types["bigram.embed.weight"] == types["big_other.weight"] == "int8"
    assert types["blocks.0.attn_scales_large"] == "passthrough_ctrl"
    assert types["blocks.0.attn.gain_1d"] == types["blocks.1.attn.stack_3d"] == "int6"
    assert obj["w"]["blocks.1.attn.stack_3d.scale"].shape == () and obj["w"]["blocks.0.attn.gain_1d.scale"].shape == ()
    assert types["bigram.proj.weight"] == types["skip_weights"] == types["ve_layer_scales.0"] == "passthrough"
    assert obj["w"]["bigram.scale"].shape == () and obj["w"]["bigram.scale"].dtype == np.float16  # 0-d stays 0-d
    assert obj["w"]["counter"].dtype == np.int64
    assert (stats["int6"], stats["int8"], stats["passthrough_ctrl"]) == (14, 4, 1)
    q = obj["w"]["blocks.0.attn.c_q.weight.q"]
    assert q.dtype == np.int8 and np.abs(q).max() == 31
    back = int6.dequantize_mixed(obj)
    ref = _port_dequantize(w, m, {k: v.astype(int6.record_dtype(k)) if v.dtype.kind == "f" or v.dtype == BF16 else v
                                  for k, v in sd.items()})
    assert list(back) == list(ref)
    for k in ref:
        assert back[k].dtype == ref[k].dtype and np.array_equal(_bits(back[k]), _bits(ref[k])), k
    assert back["tok_emb.weight"].dtype == BF16 and back["blocks.0.attn_scale"].dtype == np.float32  # Q22, Q18


def test_row_scales_below_one_sit_on_the_fixed_grid_and_every_percentile_ties():
    """A matrix whose rows all have |w| < 1 (every measured record state): scale 1/31 (fp16) for every row, the
    five candidates coincide and the first (0.999) is kept by the strict comparison."""
    t = (np.random.default_rng(0).standard_normal((300, 256)) * 0.05).astype(np.float32)
    q, s = int6.quantize_int6_rows(t)
    assert np.all(s == np.float16(1 / 31)) and np.array_equal(q, _port_int6(t)[0]) and _port_int6(t)[2] == 0.999


def test_record_order_and_dtypes():
    names = ["tok_emb.weight", "blocks.1.attn_scale", "blocks.0.mlp.proj.weight", "blocks.1.attn.c_q.weight",
             "skip_weights", "blocks.0.attn.c_v.weight", "blocks.0.attn.proj.weight", "blocks.0.attn.c_q.weight",
             "blocks.0.attn.q_gain", "blocks.0.attn_scale", "blocks.0.mlp.fc.weight", "blocks.0.attn.c_k.weight",
             "ve_layer_scales.0", "smear.gate", "ngram_bias", "blocks.0.resid_mix", "blocks.0.mlp_scale"]
    order = list(int6.record_order({n: np.zeros(1, np.float32) for n in names}))
    assert order == ["skip_weights", "blocks.0.attn.c_q.weight", "blocks.0.attn.proj.weight", "blocks.1.attn.c_q.weight",
                     "blocks.0.attn.c_k.weight", "blocks.0.attn.c_v.weight", "blocks.0.mlp.fc.weight",
                     "blocks.0.mlp.proj.weight", "tok_emb.weight", "smear.gate", "blocks.0.attn_scale",
                     "blocks.0.mlp_scale", "blocks.0.resid_mix", "blocks.0.attn.q_gain", "blocks.1.attn_scale",
                     "ve_layer_scales.0", "ngram_bias"]
    cast = int6.as_record_dtypes({"tok_emb.weight": np.full((2, 2), 1.001, np.float32), "x": np.ones(2, np.float64)})
    assert cast["tok_emb.weight"].dtype == BF16 and cast["x"].dtype == np.float32


def test_the_file_is_torch_save_in_an_xz_container_and_reads_back(tmp_path):
    sd = {k: np.asarray(v).astype(np.float32) if np.asarray(v).dtype == BF16 else v for k, v in _record_state().items()}
    back, info = artifact.roundtrip(sd, tmp_path, "int6_lzma")
    path = tmp_path / "final_model.int6.ptz"
    blob = path.read_bytes()
    assert info["artifact"] == str(path) and info["artifact_bytes"] == len(blob) and info["format"] == "int6_lzma"
    assert blob[:6] == b"\xfd7zXZ\x00" and blob[7] == lzma.CHECK_CRC64  # xz stream flags: CRC64
    raw = lzma.decompress(blob)
    assert len(raw) == info["raw_bytes"] and raw[:2] == b"PK"  # a torch.save zip
    obj = torch_format.loads(raw)
    assert set(obj) == {"w", "m"} and list(obj["m"]) == list(int6.record_order(sd))
    ref = int6.dequantize_mixed(int6.mixed_quantize(int6.record_order(int6.as_record_dtypes(sd)))[0])
    assert list(back) == list(ref) and all(np.array_equal(_bits(back[k]), _bits(ref[k])) for k in ref)
    int8 = quantize.compress(quantize.quantize_state_dict({"w": np.ones((2, 3), np.float32)})[0])[0]
    assert artifact.load(path)[0] == "int6_lzma" and artifact.loads(int8)[0] == "int8_zlib"  # told apart by content
    torch = pytest.importorskip("torch", reason="torch.load of the artifact needs the optional extra")
    loaded = torch.load(io.BytesIO(raw), map_location="cpu")
    assert loaded["m"] == obj["m"] and torch.equal(loaded["w"]["blocks.0.attn.c_q.weight.q"],
                                                   torch.from_numpy(np.array(obj["w"]["blocks.0.attn.c_q.weight.q"])))
    assert loaded["w"]["bigram.scale"].shape == () and loaded["w"]["tok_emb.weight.scale"].dtype == torch.float16


def test_anything_but_an_artifact_is_refused_in_one_line(tmp_path):
    good = lzma.compress(torch_format.dumps({"w": {}, "m": {}}), preset=6)
    cases = {"text": b"hello world, not an artifact", "empty": b"", "truncated xz": good[: len(good) // 2],
             "xz of text": lzma.compress(b"plain text"),
             "xz without w/m": lzma.compress(torch_format.dumps({"a": np.zeros(2, np.float32)})),
             "missing tensor": lzma.compress(torch_format.dumps({"w": {}, "m": {"x": {"type": "int6"}}})),
             "scale per column": lzma.compress(torch_format.dumps({"w": {"x.q": np.zeros((2, 3), np.int8),
                                                                   "x.scale": np.ones(3, np.float16)},
                                                             "m": {"x": {"type": "int6"}}})),
             "bomb": lzma.compress(bytes(1 << 22))}
    for what, blob in cases.items():
        with pytest.raises(ArtifactError) as e:
            artifact.loads(blob, f"art-{what}", 1 << 21)
        msg = str(e.value)
        assert msg.startswith(f"art-{what}: ") and "\n" not in msg, (what, msg)
    assert "not a zlib or lzma stream" in str(pytest.raises(ArtifactError, artifact.loads, b"{}", "x").value)
    assert artifact.loads(good)[1] == {}
