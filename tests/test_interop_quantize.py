"""frontier_jax.interop.quantize: the contest's int8 + zlib round trip equals the baseline's quantizer (the PyTorch port
in baseline_torch/quantize.py) bit for bit, its artifact is a torch.save file, bad artifacts are refused in one
line, and a trained run carries the artifact, its sizes and the round-trip score (also from `evaluate`)."""

from __future__ import annotations

import io
import json
import zlib

import ml_dtypes
import numpy as np
import pytest

from frontier_jax.interop import quantize
from frontier_jax.interop.quantize import ArtifactError


def _state_dict() -> dict[str, np.ndarray]:
    """Every branch of the rules: per-row int8 (fp32 and bf16, a zero row, a near-zero row, an outlier),
    per-tensor int8 (a large 1-D tensor), kept control tensors (fp32), kept small fp32/bf16 (-> fp16),
    a non-float tensor."""
    rng = np.random.default_rng(1)
    sd = {"tok_emb.weight": (rng.standard_normal((1024, 80)) * 0.005).astype(ml_dtypes.bfloat16),
          "blocks.0.attn.c_q.weight": (rng.standard_normal((300, 256)) * 0.05).astype(np.float32),
          "blocks.0.mlp.fc.weight": np.zeros((260, 260), np.float32),
          "big_vector": rng.standard_normal(70_000).astype(np.float32),
          "blocks.0.attn.q_gain": np.full(8, 1.5, np.float32),
          "blocks.0.resid_mix": rng.standard_normal((2, 64)).astype(np.float32),
          "skip_weights": rng.standard_normal((4, 64)).astype(np.float32),
          "blocks.0.mlp.proj.weight": rng.standard_normal((64, 128)).astype(np.float32),
          "small_bf16": rng.standard_normal(10).astype(ml_dtypes.bfloat16),
          "counter": np.arange(5, dtype=np.int64)}
    sd["blocks.0.mlp.fc.weight"][3] = 1e-6 * rng.standard_normal(260)
    sd["blocks.0.attn.c_q.weight"][5, 7] = 3.0
    return sd


def _f32(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32) if np.asarray(a).dtype == ml_dtypes.bfloat16 else np.asarray(a)


def test_the_rules_route_every_tensor_as_the_baseline_does():
    obj, stats = quantize.quantize_state_dict(_state_dict())
    assert obj["__quant_format__"] == "int8_clean_per_row_v1"
    assert set(obj["quantized"]) == {"tok_emb.weight", "blocks.0.attn.c_q.weight", "blocks.0.mlp.fc.weight",
                                     "big_vector"}
    assert obj["dtypes"]["tok_emb.weight"] == "bfloat16" and obj["scales"]["tok_emb.weight"].dtype == np.float16
    assert obj["scales"]["big_vector"].shape == () and obj["scales"]["big_vector"].dtype == np.float32
    assert set(obj["qmeta"]) == {"tok_emb.weight", "blocks.0.attn.c_q.weight", "blocks.0.mlp.fc.weight"}
    kept = obj["passthrough"]
    assert all(kept[k].dtype == np.float32 for k in ("blocks.0.attn.q_gain", "blocks.0.resid_mix", "skip_weights"))
    assert kept["blocks.0.mlp.proj.weight"].dtype == np.float16 and kept["small_bf16"].dtype == np.float16
    assert obj["passthrough_orig_dtypes"] == {"blocks.0.mlp.proj.weight": "float32", "small_bf16": "bfloat16"}
    assert kept["counter"].dtype == np.int64
    assert np.abs(obj["quantized"]["blocks.0.attn.c_q.weight"]).max() == 127
    assert stats["num_float_tensors"] == 4 and stats["num_nonfloat_tensors"] == 1


def test_payload_and_dequantized_weights_equal_the_pytorch_port_bit_for_bit():
    torch = pytest.importorskip("torch", reason="the PyTorch port needs the optional extra: pip install -e .[torch]")
    from baseline_torch import quantize as port

    sd = _state_dict()
    tsd = {k: (torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16) if v.dtype == ml_dtypes.bfloat16
               else torch.from_numpy(v.copy())) for k, v in sd.items()}
    obj, stats = quantize.quantize_state_dict(sd)
    tobj, tstats = port.quantize_state_dict_int8(tsd)
    assert stats == tstats
    for section in ("quantized", "scales", "passthrough"):
        assert list(obj[section]) == list(tobj[section])
        for k, t in tobj[section].items():
            a, b = obj[section][k], t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
            assert a.shape == b.shape and str(t.dtype).removeprefix("torch.") == a.dtype.name, (section, k)
            assert np.array_equal(_f32(a), b), (section, k)
    assert {k: obj[k] for k in ("dtypes", "qmeta", "passthrough_orig_dtypes")} == \
           {k: tobj[k] for k in ("dtypes", "qmeta", "passthrough_orig_dtypes")}
    # our artifact bytes load with torch.load (weights_only) and dequantize, by the port, to our dequantized weights
    blob, _ = quantize.compress(obj)
    theirs = port.dequantize_state_dict_int8(torch.load(io.BytesIO(zlib.decompress(blob))))
    ours = quantize.dequantize_state_dict(quantize.loads_artifact(blob))
    assert list(ours) == list(theirs)
    for k, t in theirs.items():
        assert str(t.dtype).removeprefix("torch.") == ours[k].dtype.name
        assert np.array_equal(_f32(ours[k]), t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()), k
    # and torch.save's own bytes (the official script's and the PyTorch baseline's artifacts) read here
    buf = io.BytesIO()
    torch.save(tobj, buf)
    back = quantize.dequantize_state_dict(quantize.loads_artifact(zlib.compress(buf.getvalue(), 9)))
    assert all(np.array_equal(_f32(back[k]), _f32(ours[k])) for k in ours)


def test_dequantized_error_is_within_half_a_step_of_the_clipped_weights():
    sd = _state_dict()
    obj, _ = quantize.quantize_state_dict(sd)
    back = quantize.dequantize_state_dict(obj)
    w = sd["blocks.0.attn.c_q.weight"]
    step = obj["scales"]["blocks.0.attn.c_q.weight"].astype(np.float32)[:, None]
    inside = np.abs(w) < 0.9 * 127 * step  # not clipped
    assert np.all(np.abs(back["blocks.0.attn.c_q.weight"] - w)[inside] <= 0.51 * np.broadcast_to(step, w.shape)[inside])
    assert back["tok_emb.weight"].dtype == ml_dtypes.bfloat16 and back["counter"].dtype == np.int64


def test_artifact_written_atomically_and_bad_artifacts_refused_in_one_line(tmp_path):
    obj, _ = quantize.quantize_state_dict(_state_dict())
    blob, raw = quantize.compress(obj)
    path = tmp_path / quantize.ARTIFACT
    assert quantize.write_artifact(path, blob) == len(blob) < raw
    assert [p.name for p in tmp_path.iterdir()] == [quantize.ARTIFACT]
    assert quantize.load_artifact(path)["__quant_format__"] == quantize.FORMAT
    cases = {"garbage": b"not zlib", "zlib of garbage": zlib.compress(b"garbage"),
             "other format": zlib.compress(__import__("frontier_jax.interop.torch_format", fromlist=["dumps"]).dumps({"a": 1}))}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ArtifactError) as e:
            quantize.load_artifact(tmp_path / name)
        assert str(tmp_path / name) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ArtifactError, match="cannot read"):
        quantize.load_artifact(tmp_path / "missing.ptz")


@pytest.mark.slow
def test_a_trained_run_carries_the_artifact_and_both_scores(trained_run):
    """The artifact's dequantized weights equal the PyTorch port's round trip of the run's final weights; the
    summary has both bpbs and the sizes; `evaluate --artifact` gives the run's round-trip score exactly."""
    from frontier_jax.evaluate import evaluate_run
    from frontier_jax.interop.state_dict import params_to_state_dict, restore_params

    run_dir, summary = trained_run
    art = run_dir / quantize.ARTIFACT
    assert summary["artifact_bytes"] == art.stat().st_size > 0
    assert summary["submission_bytes"] == summary["artifact_bytes"] + summary["code_bytes"]
    assert summary["code_bytes"] > 100_000 and summary["code_files"] > 10
    assert np.isfinite(summary["roundtrip_val_bpb"]) and abs(summary["roundtrip_val_bpb"] - summary["val_bpb"]) < 0.05
    assert json.loads((run_dir / "summary.json").read_text())["roundtrip_val_bpb"] == summary["roundtrip_val_bpb"]
    log = (run_dir / "train.log").read_text()
    assert f"final_int8_zlib_roundtrip_exact val_loss:{summary['roundtrip_val_loss']:.8f} " \
           f"val_bpb:{summary['roundtrip_val_bpb']:.8f}" in log
    assert f"Total submission size int8+zlib: {summary['submission_bytes']} bytes" in log

    _, _, params, _, _ = restore_params(run_dir)
    sd = params_to_state_dict(params)
    ours = quantize.dequantize_state_dict(quantize.load_artifact(art))
    torch = pytest.importorskip("torch", reason="the PyTorch port needs the optional extra")
    from baseline_torch import quantize as port

    tobj, _ = port.quantize_state_dict_int8({k: torch.from_numpy(np.array(v, np.float32)) for k, v in sd.items()})
    theirs = port.dequantize_state_dict_int8(tobj)
    assert set(ours) == set(theirs) == set(sd)
    assert all(np.array_equal(ours[k].astype(np.float32), theirs[k].float().numpy()) for k in sd)

    r = evaluate_run(run_dir, artifact=art)
    assert r["artifact"] == str(art) and r["checkpoint_step"] is None
    assert r["bpb"] == summary["roundtrip_val_bpb"] and r["nll_sum_nats"] == summary["roundtrip_val_nll_sum_nats"]


def test_malformed_artifact_content_is_refused_in_one_line_naming_the_file(tmp_path):
    """The decoded object is checked before use: tables that are not dicts, a missing dtype or scale, an unknown
    dtype name, a per-row scale that does not fit its rows, a non-tensor passthrough, a non-dict qmeta: each one
    line naming the file (each was a different traceback)."""
    from frontier_jax.interop import torch_format

    obj, _ = quantize.quantize_state_dict(_state_dict())
    name = "blocks.0.attn.c_q.weight"
    forged = {"quantized is a list": lambda o: o.update(quantized=[1, 2]),
              "no dtype": lambda o: o["dtypes"].pop(name),
              "unknown dtype": lambda o: o["dtypes"].update({name: "complex1024"}),
              "scale of the wrong shape": lambda o: o["scales"].update({name: np.ones(3, np.float16)}),
              "int scale": lambda o: o["scales"].update({name: np.ones(300, np.int32)}),
              "passthrough string": lambda o: o["passthrough"].update(counter="abc"),
              "qmeta not a dict": lambda o: o["qmeta"].update({name: ["per_row"]}),
              "quantized not int8": lambda o: o["quantized"].update({name: o["quantized"][name].astype(np.int16)})}
    for what, change in forged.items():
        o = {k: (dict(v) if isinstance(v, dict) else v) for k, v in obj.items()}
        change(o)
        path = tmp_path / f"{what}.ptz"
        path.write_bytes(zlib.compress(torch_format.dumps(o)))
        with pytest.raises(ArtifactError, match="malformed") as e:
            quantize.dequantize_state_dict(quantize.load_artifact(path))
        assert str(path) in str(e.value) and "\n" not in str(e.value), what


def test_decompression_is_bounded_for_zlib_and_lzma(tmp_path):
    """A compression bomb stops at the limit of the model it is for (a 50 MB stream of zeros against a 1 MB
    model: refused at once, never decompressed whole); zlib and lzma (xz and .lzma) streams decompress through the
    same function; a cut-short stream is refused."""
    import lzma
    import time

    raw = quantize.torch_format.dumps({"a": np.arange(10, dtype=np.int8)})
    for blob in (zlib.compress(raw), lzma.compress(raw), lzma.compress(raw, format=lzma.FORMAT_ALONE)):
        assert quantize.decompress(blob, len(raw), "x") == raw
        with pytest.raises(ArtifactError, match="over 100 bytes"):
            quantize.decompress(blob, 100, "x")
        with pytest.raises(ArtifactError, match="cut short|not a"):
            quantize.decompress(blob[: len(blob) // 2], len(raw), "x")
    bomb = tmp_path / "bomb.ptz"
    bomb.write_bytes(zlib.compress(bytes(50_000_000), 9))
    limit = quantize.raw_limit(100_000, 10)
    assert 800_000 < limit < 2_000_000
    t0 = time.perf_counter()
    with pytest.raises(ArtifactError, match=f"{bomb}: decompresses to over {limit:,} bytes"):
        quantize.load_artifact(bomb, limit)
    assert time.perf_counter() - t0 < 2.0


def test_an_artifact_that_is_not_a_regular_file_is_refused_not_read(tmp_path):
    """`evaluate --artifact` on a FIFO blocked forever: it is refused in one line (a directory too)."""
    import os

    fifo = tmp_path / "fifo.ptz"
    os.mkfifo(fifo)
    with pytest.raises(ArtifactError, match="is a FIFO, not a regular file"):
        quantize.load_artifact(fifo)
    with pytest.raises(ArtifactError, match="is a directory"):
        quantize.load_artifact(tmp_path)
