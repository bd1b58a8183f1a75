"""The trained bias on constructed corpora, measured with `frontier_jax.ngram.analyze`.

Text is random lowercase words (byte tokens), so a small network cannot predict much beyond letter
frequencies, while a repeated document is fully predictable from an order-5+ byte context.
  repeats: the builder's shard (the last train shard) holds documents E and D; the trainer's shard
      holds E several times among fresh text (near-duplicates across the corpus, as on the web), so
      the bias learns that long matching contexts are right; val is D, which the trainer never sees.
      The bias must lower val bpb by a large margin vs the same run (same seed, same trainer tokens)
      with the n-gram disabled.
  no repeats: every document fresh. The bias must cost < 0.001 bpb after training. The comparison
      is paired on the same trained network (bias as learned vs zeroed, `analyze`), because two tiny
      runs differ by more than 0.001 bpb through training noise alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import tiny_config
from frontier_jax import trainer
from frontier_jax.data.shards import write_shard
from frontier_jax.ngram import analyze
from frontier_jax.ngram import runtime as ngram_runtime

from test_ngram_runtime import HookedRuntime  # noqa: E402 (waits for the builder before step 0)

SETS = ["ngram.enabled=True", "ngram.table_log2_size=16", "ngram.min_order=2", "ngram.max_order=8",
        "ngram.snapshot_every_tokens=1000000", "ngram.builder_niceness=0", "optim.ngram_lr=0.1",
        "train.max_steps=200", "optim.warmdown_mode='steps'", "optim.warmdown_steps=50"]


def random_docs(n: int, rng) -> list[np.ndarray]:
    """Documents of random lowercase words as byte tokens (BOS=1 first, byte b -> b + 4)."""
    docs = []
    for _ in range(n):
        words = [rng.integers(97, 123, size=int(rng.integers(2, 8))).astype(np.uint8).tobytes() for _ in range(int(rng.integers(30, 70)))]
        docs.append(np.concatenate([[1], np.frombuffer(b" ".join(words), np.uint8).astype(np.int64) + 4]))
    return docs


def write_corpus(d, repeats: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    E, D = (random_docs(20, rng), random_docs(20, rng)) if repeats else ([], [])
    trainer = random_docs(60, rng) + (E * 3)
    rng.shuffle(trainer)
    builder = random_docs(25, rng) + E + D
    rng.shuffle(builder)
    val = D if repeats else random_docs(20, rng)
    d.mkdir(parents=True)
    write_shard(d / "c_train_000000.bin", np.concatenate(trainer).astype(np.uint16))
    write_shard(d / "c_train_000001.bin", np.concatenate(builder).astype(np.uint16))
    write_shard(d / "c_val_000000.bin", np.concatenate(val).astype(np.uint16))
    trainer_only = d.parent / f"{d.name}_trainer_only"
    trainer_only.mkdir()
    for name in ("c_train_000000.bin", "c_val_000000.bin"):
        (trainer_only / name).write_bytes((d / name).read_bytes())
    return d, trainer_only


def _train(data, out, *sets, monkeypatch):
    monkeypatch.setattr(ngram_runtime, "NgramRuntime", HookedRuntime)
    HookedRuntime.wait_at_step = 0
    return trainer.run(tiny_config(data, *sets), out, echo=False)


@pytest.mark.slow
def test_bias_wins_big_on_repeated_documents(tmp_path, monkeypatch, capsys):
    data, trainer_only = write_corpus(tmp_path / "rep", repeats=True)
    # the builder's shard holds the val documents on purpose (the bias's gain on repeats): the split check
    # would refuse that leak (frontier_jax.data.integrity), so this run allows it explicitly
    on = _train(data, tmp_path / "on", *SETS, "data.max_val_duplicate_share=1.0", monkeypatch=monkeypatch)
    off = _train(trainer_only, tmp_path / "off", *SETS[6:], monkeypatch=monkeypatch)
    r = analyze.analyze_run(tmp_path / "on")
    print(analyze.format_report(r))
    assert abs(r["bpb_with_bias"] - on["val_bpb"]) < 1e-4  # analyze reproduces the run's final evaluation
    assert on["val_bpb"] < off["val_bpb"] - 1.0, (on["val_bpb"], off["val_bpb"])
    assert r["gain_bpb"] > 1.0
    high = r["orders"][-1]
    assert high["coverage"] > 0.7 and high["top1_acc"] > 0.95
    assert r["tables"]["ngram_bpb"] < r["bpb_network"]
    # the CLI prints the same numbers
    capsys.readouterr()
    assert analyze.main(["--run", str(tmp_path / "on"), "--json"]) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["bpb_with_bias"] == pytest.approx(r["bpb_with_bias"], abs=1e-9)
    passes = len(r["orders"]) + 2  # progress on stderr before each pass over the val split (JSON on stdout intact)
    assert "ngram.analyze: scoring " in shown.err and f"with the bias (1/{passes})" in shown.err
    assert f"({passes}/{passes})" in shown.err
    off_r = analyze.analyze_run(tmp_path / "off")
    assert abs(off_r["bpb_network"] - off["val_bpb"]) < 1e-4 and "bpb_with_bias" not in off_r


@pytest.mark.slow
def test_bias_costs_nothing_without_repeats(tmp_path, monkeypatch):
    data, _ = write_corpus(tmp_path / "norep", repeats=False)
    on = _train(data, tmp_path / "on", *SETS, monkeypatch=monkeypatch)
    r = analyze.analyze_run(tmp_path / "on")
    print(analyze.format_report(r))
    assert abs(r["bpb_with_bias"] - on["val_bpb"]) < 1e-4
    assert r["bpb_with_bias"] - r["bpb_network"] < 1e-3, r
    # python -m frontier_jax.evaluate scores an n-gram run with the snapshot its final evaluation used
    from frontier_jax.evaluate import evaluate_run

    ev = evaluate_run(tmp_path / "on")
    assert ev["nll_sum_nats"] == pytest.approx(on["val_nll_sum_nats"], rel=1e-6)
    assert ev["bytes"] == on["val_bytes"]


def _tables_snapshot(data, tmp_path, log2_size=16):
    from frontier_jax.config import NgramConfig
    from frontier_jax.data.shards import read_shard
    from frontier_jax.ngram import snapshot as S
    from frontier_jax.ngram import tables as T

    tables = T.NgramTables.from_config(NgramConfig(enabled=True, min_order=2, max_order=8, table_log2_size=log2_size))
    tables.consume(np.asarray(read_shard(data / "c_train_000001.bin")))
    return S.write_snapshot(tables, tmp_path / "snaps", 1, complete=True)


def test_tables_alone_report_and_normalised_backoff(tmp_path, capsys):
    """--tables without a network: repeated val text is far cheaper for the n-gram than fresh text."""
    rep, _ = write_corpus(tmp_path / "rep", repeats=True)
    fresh, _ = write_corpus(tmp_path / "fresh", repeats=False)
    r_rep = analyze.analyze_tables(_tables_snapshot(rep, tmp_path / "a"), rep, "bytes", seq_len=64)
    r_fresh = analyze.analyze_tables(_tables_snapshot(fresh, tmp_path / "b"), fresh, "bytes", seq_len=64)
    assert r_rep["ngram_bpb"] < 0.5 * r_fresh["ngram_bpb"], (r_rep["ngram_bpb"], r_fresh["ngram_bpb"])
    assert r_rep["orders"][-1]["coverage"] > 0.7 and r_rep["orders"][-1]["top1_acc"] > 0.95
    assert r_fresh["orders"][-1]["coverage"] < 0.01
    # the backoff model is a distribution over the whole vocabulary at every position
    from frontier_jax.ngram import snapshot as S

    snap = S.load_snapshot(r_rep["snapshot"])
    from frontier_jax.data.shards import read_shard

    x = np.asarray(read_shard(rep / "c_val_000000.bin"), np.int64)[:200]
    pred = analyze.window_predictions(np.asarray(snap.rows_OK4), snap.min_order, x[:-1], 64)
    V = 260
    total = np.zeros(x.size - 1)
    for y in range(V):
        nll, _ = analyze.backoff_nll(pred, np.full(x.size - 1, y), snap.unigram_V, V)
        total += np.exp(-nll)
    np.testing.assert_allclose(total, 1.0, rtol=1e-9)
    # the CLI on tables alone
    assert analyze.main(["--tables", str(r_rep["snapshot"]), "--data", str(rep), "--tokenizer", "bytes",
                         "--seq-len", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ngram_bpb"] == pytest.approx(r_rep["ngram_bpb"])
    # the table: one number format for bpb, no nan: orders without a hit are named on one line
    text = analyze.format_tables_report(r_fresh)
    assert "nan" not in text.lower() and f"n-gram alone {r_fresh['ngram_bpb']:.5f} bpb" in text
    empty = [o["order"] for o in r_fresh["orders"] if not o["coverage"]]
    assert all(o["top1_acc"] is None for o in r_fresh["orders"] if not o["coverage"])
    if empty:
        assert f"{empty[0]}-{empty[-1]}: no hit on the val split" in text or f"order {empty[0]}: no hit" in text
    json.dumps(r_fresh, allow_nan=False)  # valid JSON: no NaN


@pytest.mark.parametrize("make", [lambda d: None, lambda d: (d / "config.json").write_text("{not json")])
def test_run_that_is_not_a_run_directory_is_one_line_and_exit_2(tmp_path, capsys, make):
    """#11: `ngram.analyze --run` on a directory without (or with a corrupt) config.json: one line, exit 2."""
    make(tmp_path)
    with pytest.raises(SystemExit) as e:
        analyze.main(["--run", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(f"error: {tmp_path}")
