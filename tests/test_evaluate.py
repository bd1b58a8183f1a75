"""python -m frontier_jax.evaluate: JSON output, equality with the training run's final val, sliding windows,
errors, and the val byte count against the SentencePiece pieces (with ../shared/data)."""

import json
import shutil

import numpy as np
import pytest
from flax import nnx

from helpers import tiny_config
from frontier_jax.config import apply_overrides
from frontier_jax.data.stream import val_batches
from frontier_jax.evaluate import evaluate_run, main


def test_sliding_masks_score_every_target_once_and_pad_to_full_batches():
    tokens = np.arange(1 + 64 * 5, dtype=np.int32)
    seen = []
    for x, y, mask in val_batches(tokens, 64, 4, stride=16):
        assert x.shape == y.shape == mask.shape == (4, 64)
        seen += list(y[mask.astype(bool)])
        assert np.all(y[mask.astype(bool)] == x[mask.astype(bool)] + 1)
    assert sorted(seen) == list(range(1, tokens.size))


@pytest.mark.slow
def test_artifact_scoring_from_the_command_line(trained_run, capsys):
    run_dir, summary = trained_run
    assert main(["--run", str(run_dir), "--artifact", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["artifact"] == str(run_dir / "final_model.int8.ptz") and r["bpb"] == summary["roundtrip_val_bpb"]
    with pytest.raises(SystemExit) as e:
        main(["--run", str(run_dir), "--artifact", "--step", "200"])
    assert e.value.code == 2 and "choose one" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--run", str(run_dir), "--artifact", str(run_dir / "config.json")])
    assert e.value.code == 2 and "not a zlib or lzma stream" in capsys.readouterr().err


@pytest.mark.slow
def test_json_output_and_equality_with_the_training_summary(trained_run, capsys):
    run_dir, summary = trained_run
    assert main(["--run", str(run_dir), "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    r = json.loads(out[0])
    assert {"nll_sum_nats", "tokens", "bytes", "bpb", "stride", "run", "checkpoint_step"} <= set(r)
    assert r["checkpoint_step"] == summary["steps"] and r["stride"] == 64
    # Same forward, same windows, same batch shape: the exact same sums as the run's final validation.
    assert r["nll_sum_nats"] == summary["val_nll_sum_nats"]
    assert (r["tokens"], r["bytes"]) == (summary["val_tokens"], summary["val_bytes"])
    assert r["bpb"] == summary["val_bpb"]


@pytest.mark.slow
def test_sliding_window_scores_the_same_targets_with_more_context(trained_run, capsys):
    run_dir, summary = trained_run
    r = evaluate_run(run_dir, stride=32)
    assert (r["tokens"], r["bytes"]) == (summary["val_tokens"], summary["val_bytes"])
    assert r["bpb"] <= summary["val_bpb"] + 1e-3
    assert main(["--run", str(run_dir), "--stride", "32", "--batch-seqs", "8"]) == 0
    assert "val_bpb" in capsys.readouterr().out


def _err(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    return err


def test_errors_missing_run_no_checkpoint_bad_stride_and_vocab(trained_run, tmp_path, capsys):
    run_dir, _ = trained_run
    assert str(tmp_path / "nope") in _err(["--run", str(tmp_path / "nope")], capsys)
    empty = tmp_path / "no_ckpt"
    empty.mkdir()
    shutil.copy(run_dir / "config.json", empty / "config.json")
    assert "no checkpoint" in _err(["--run", str(empty)], capsys)
    assert "--stride 65" in _err(["--run", str(run_dir), "--stride", "65"], capsys)
    wrong = tmp_path / "vocab"
    wrong.mkdir()
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["model"]["vocab_size"] = 1024
    (wrong / "config.json").write_text(json.dumps(cfg))
    assert "does not match model.vocab_size" in _err(["--run", str(wrong)], capsys)


def test_a_corrupt_newest_checkpoint_is_skipped_with_one_line_or_chosen_by_step(trained_run, tmp_path, capsys):
    """Fallback to the newest intact checkpoint, naming the skipped one on stderr; --step picks one; none
    intact is one line (TensorStore's own report is hundreds of lines)."""
    run = tmp_path / "run"
    shutil.copytree(trained_run[0], run)
    shutil.copytree(run / "checkpoints" / "200", run / "checkpoints" / "150")  # an older intact checkpoint
    meta = run / "checkpoints" / "150" / "meta" / "metadata"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "step": 150}))
    for f in (run / "checkpoints" / "200" / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"garbage" * 8)
    assert main(["--run", str(run), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["checkpoint_step"] == 150
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"skipped {run}/checkpoints/200: unreadable checkpoint"), err
    assert "checkpoints/200: unreadable" in _err(["--run", str(run), "--step", "200"], capsys)
    shutil.rmtree(run / "checkpoints" / "150")
    assert "no intact checkpoint" in _err(["--run", str(run)], capsys)


@pytest.mark.shared_data
@pytest.mark.slow
def test_val_byte_count_matches_the_sentencepiece_pieces(sp1024_data, tmp_path):
    """Untrained sp1024 model imported as a run; its evaluated byte count equals the rule applied by hand."""
    import sentencepiece as spm

    from frontier_jax.data.shards import list_shards
    from frontier_jax.data.stream import load_val_tokens
    from frontier_jax.interop.state_dict import import_run, params_to_state_dict, save_npz
    from frontier_jax.model import GPT

    data_dir, model_path = sp1024_data
    cfg = apply_overrides(tiny_config(data_dir, tokenizer=str(model_path)), ["model.vocab_size=1024"])
    _, params = nnx.split(GPT(cfg.model, rngs=nnx.Rngs(0), compute_dtype="float32"))
    save_npz(tmp_path / "w.npz", params_to_state_dict(params))
    import_run(tmp_path / "w.npz", cfg, tmp_path / "run")
    r = evaluate_run(tmp_path / "run", batch_seqs=16)

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    tokens = load_val_tokens(list_shards(data_dir, "*_val_*.bin"), cfg.train.seq_len)

    def boundary(i):
        return sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)

    expected = 0
    for prev, tok in zip(tokens[:-1].tolist(), tokens[1:].tolist()):
        if boundary(tok):
            continue
        if sp.is_byte(tok):
            expected += 1
            continue
        piece = sp.id_to_piece(tok)
        if piece.startswith("\u2581"):
            expected += len(piece[1:].encode("utf-8")) + (0 if boundary(prev) else 1)
        else:
            expected += len(piece.encode("utf-8"))
    assert r["tokens"] == tokens.size - 1
    assert r["bytes"] == expected
    assert 2.0 < r["bytes"] / r["tokens"] < 5.0  # sp1024 on FineWeb: about 2.4 bytes per token
    assert abs(r["loss"] - np.log(1024)) < 0.1  # untrained: near uniform


def test_a_non_finite_score_is_an_error_and_json_is_strict(trained_run, capsys, monkeypatch):
    """Round 3: a broken shard scored `bpb: NaN` with exit 0, and --json printed a bare NaN (not JSON)."""
    import frontier_jax.steps as steps

    monkeypatch.setattr(steps, "evaluate_batches",
                        lambda *a, **k: {"nll_sum_nats": float("nan"), "tokens": 64, "bytes": 100})
    with pytest.raises(SystemExit) as e:
        main(["--run", str(trained_run[0]), "--json"])
    captured = capsys.readouterr()
    assert e.value.code == 2 and captured.err.count("\n") == 1 and "val bpb is nan" in captured.err
    assert "NaN" not in captured.out


def test_a_missing_step_is_one_line_naming_the_steps(trained_run, capsys):
    """Round 3: `--step 7` of a run without step 7 read 'unreadable ... ([Errno None] None)'."""
    with pytest.raises(SystemExit) as e:
        main(["--run", str(trained_run[0]), "--step", "7"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip() == \
        f"error: {trained_run[0]}/checkpoints/7: no checkpoint of step 7 (steps saved: 200)"


@pytest.mark.slow
def test_eval_seq_len_windows_and_the_cut_of_the_val_split(trained_run, capsys):
    """--eval-seq-len T: non-overlapping windows of T over the val split cut to whole windows of max(train.seq_len,
    T), as the run's final pipeline and the record cut it; with --stride every target of that cut once."""
    run_dir, summary = trained_run
    r = evaluate_run(run_dir, eval_seq_len=128)
    n = summary["val_tokens"] // 128 * 128  # the run's split cut to whole 128-token windows
    assert r["seq_len"] == 128 and r["tokens"] == n and r["stride"] == 128
    s = evaluate_run(run_dir, eval_seq_len=128, stride=32, batch_seqs=8)
    assert s["tokens"] == n and s["bytes"] == r["bytes"] and s["batch_seqs"] == 8
    assert "argument --eval-seq-len: 0 is outside [1, inf]" in _err(["--run", str(run_dir), "--eval-seq-len", "0"], capsys)
    assert "--stride 129: must be in [1, eval seq_len=128]" in _err(
        ["--run", str(run_dir), "--eval-seq-len", "128", "--stride", "129"], capsys)


def test_ttt_from_the_command_line_and_its_errors(trained_run, capsys):
    """evaluate --ttt with the run's ttt section (its defaults: one chunk of 32,768 targets holds the whole split,
    so the pass scores it and trains on nothing, the last chunk never being trained on): the sliding windows' score
    at the same stride over train.seq_len windows; the record's progress lines and the full-val estimate on stderr,
    legal_ttt and legal_ttt_exact on stdout. A TTT stride over train.seq_len or another window length: one line."""
    run_dir, _ = trained_run
    assert main(["--run", str(run_dir), "--ttt", "--stride", "32"]) == 0
    out, err = capsys.readouterr()
    sliding = evaluate_run(run_dir, stride=32)
    r = evaluate_run(run_dir, stride=32, ttt=True)
    assert r["nll_sum_nats"] == pytest.approx(sliding["nll_sum_nats"], rel=1e-12)
    assert (r["tokens"], r["bytes"]) == (sliding["tokens"], sliding["bytes"])
    assert r["ttt"]["chunks"] == 1 and r["ttt"]["sgd_steps"] == 0 and r["ttt"]["estimate"]["targets"] == 62_021_632
    lines = out.strip().splitlines()
    assert lines[-2].startswith(f"legal_ttt val_loss:{r['loss']:.4f} val_bpb:{r['bpb']:.4f} eval_time:")
    assert lines[-1] == f"legal_ttt_exact val_loss:{r['loss']:.8f} val_bpb:{r['bpb']:.8f}"
    assert "ttt_sliding:start chunks=1 chunk_tokens=32768 " in err and " stride=32 " in err
    assert "ttt_estimate: the full FineWeb val split (62,021,632 targets" in err
    assert "--ttt --eval-seq-len 128" in _err(["--run", str(run_dir), "--ttt", "--eval-seq-len", "128"], capsys)
    assert "--ttt: eval.stride=65 is longer than" in _err(["--run", str(run_dir), "--ttt", "--stride", "65"], capsys)
