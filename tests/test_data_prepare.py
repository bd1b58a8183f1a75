"""The prepare CLI end to end (sp1024, bytes, trained tokenizer), its errors, and the demo corpus."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from frontier_jax.data.demo import DEMO_VAL_DOCS, demo_corpus, prepare_demo
from frontier_jax.data.prepare import main, prepare, read_manifest
from frontier_jax.data.shards import DataError, list_shards, read_shard
from frontier_jax.errors import BadInput
from frontier_jax.data.tokenizer import ByteTokenizer, SentencePieceTokenizer, count_bytes

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SP_MODEL = SHARED / "fineweb_1024_bpe.model"
DEV_JSONL = SHARED / "fineweb_dev.jsonl"


def _shared():
    if not (SP_MODEL.is_file() and DEV_JSONL.is_file()):
        pytest.skip(f"../shared/data not present: {SP_MODEL.name} and {DEV_JSONL.name} are needed under {SHARED}")


def _exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _split_tokens(out: Path, split: str) -> np.ndarray:
    return np.concatenate([np.asarray(read_shard(f), np.int64) for f in list_shards(out, f"*_{split}_*.bin")])


@pytest.mark.shared_data
def test_cli_sp1024_end_to_end(tmp_path, capsys):
    _shared()
    out = tmp_path / "sp"
    assert main(["--input", str(DEV_JSONL), "--out", str(out), "--tokenizer", str(SP_MODEL), "--val-docs", "10", "--shard-tokens", "60000"]) == 0
    assert "train: 90 docs" in capsys.readouterr().out
    m = read_manifest(out)
    tok = SentencePieceTokenizer(SP_MODEL)
    texts = [json.loads(line)["text"] for line in DEV_JSONL.read_text(encoding="utf-8").splitlines()]
    assert m["tokenizer"] == {"kind": "sentencepiece", "path": str(SP_MODEL.resolve()), "sha256": tok.sha256, "vocab_size": 1024}
    for split, docs in (("val", texts[:10]), ("train", texts[10:])):
        s = m["splits"][split]
        tokens = _split_tokens(out, split)
        expected = np.concatenate([[1, *tok.encode(t)] for t in docs])
        assert tokens.tolist() == expected.tolist()  # BOS before every document, no EOS, input order
        assert s["documents"] == len(docs) and s["tokens"] == tokens.size == int((tokens == 1).sum()) + sum(len(tok.encode(t)) for t in docs)
        assert s["bytes"] == sum(len(t.encode("utf-8")) for t in docs)
        assert s["shards"] == [p.name for p in list_shards(out, f"*_{split}_*.bin")]
    assert len(m["splits"]["train"]["shards"]) > 1  # split at --shard-tokens, documents straddle shards
    assert all(read_shard(out / n).size == 60000 for n in m["splits"]["train"]["shards"][:-1])
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*"))


def test_cli_bytes_with_text_files(tmp_path):
    texts = ["first document\n\nwith a blank line", "second, caf\u00e9 \U0001f600", "third"]
    inputs = []
    for i, t in enumerate(texts):
        (tmp_path / f"d{i}.txt").write_text(t, encoding="utf-8")
        inputs.append(str(tmp_path / f"d{i}.txt"))
    out = tmp_path / "bytes"
    r = subprocess.run(
        [sys.executable, "-m", "frontier_jax.data.prepare", "--input", *inputs, "--out", str(out), "--bytes", "--val-docs", "1", "--prefix", "tiny"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr, r.stderr  # runpy's: the module must not be imported before it runs
    m = read_manifest(out)
    assert m["prefix"] == "tiny" and m["tokenizer"]["kind"] == "bytes" and m["tokenizer"]["vocab_size"] == 260
    assert m["tokenizer"]["sha256"] == ByteTokenizer().sha256
    val, train = _split_tokens(out, "val"), _split_tokens(out, "train")
    assert val.tolist() == [1] + [b + 4 for b in texts[0].encode()]
    assert train.size == m["splits"]["train"]["tokens"] == 2 + sum(len(t.encode()) for t in texts[1:])
    tables = ByteTokenizer().byte_tables()
    assert int(count_bytes(tables, train[:-1], train[1:]).sum()) == m["splits"]["train"]["bytes"]


def test_cli_train_tokenizer_uses_train_docs_only(tmp_path):
    docs = demo_corpus()[:60]  # ~0.35 MB of real English text
    docs[:5] = ["zqxv" * 200 + " zqxv zqxv" for _ in range(5)]  # val-only string: BPE would merge it if it saw val
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    out = tmp_path / "trained"
    t0 = time.perf_counter()
    assert main(["--input", str(src), "--out", str(out), "--train-tokenizer", "512", "--val-docs", "5"]) == 0
    assert time.perf_counter() - t0 < 30
    m = read_manifest(out)
    tok = SentencePieceTokenizer(out / "tokenizer.model")
    assert m["tokenizer"]["path"] == "tokenizer.model" and m["tokenizer"]["vocab_size"] == 512 == tok.vocab_size
    assert m["tokenizer"]["sha256"] == tok.sha256
    assert not any("zqx" in tok.id_to_piece(i) or "qxv" in tok.id_to_piece(i) for i in range(tok.vocab_size))
    assert any(tok.id_to_piece(i) == "\u2581the" for i in range(tok.vocab_size))
    assert m["splits"]["val"]["documents"] == 5 and m["splits"]["train"]["documents"] == 55
    assert _split_tokens(out, "val")[0] == 1 and int((_split_tokens(out, "train") == 1).sum()) == 55


def test_bad_jsonl_lines(tmp_path, capsys):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "ok"}\n\n{"text": "fine"}\n{"txt": "no text"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{src}:4: line has no string field 'text'")):
        prepare([src], tmp_path / "o1", tokenizer_spec="bytes", val_docs=1)
    src.write_text('{"text": "ok"}\n{"text": \n', encoding="utf-8")
    assert _exit_code(["--input", str(src), "--out", str(tmp_path / "o2"), "--bytes", "--val-docs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {src}:2: bad JSON") and err.count("\n") == 1
    assert not (tmp_path / "o2" / "manifest.json").exists()


def test_refusals(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError, match="input holds no documents"):
        prepare([empty], tmp_path / "o", tokenizer_spec="bytes")
    two = tmp_path / "two.jsonl"
    two.write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    assert _exit_code(["--input", str(two), "--out", str(tmp_path / "o"), "--bytes", "--val-docs", "2"]) == 2
    assert "--val-docs 2 leaves no training documents (the input has 2)" in capsys.readouterr().err
    with pytest.raises(DataError, match="input file does not exist"):
        prepare([tmp_path / "missing.jsonl"], tmp_path / "o", tokenizer_spec="bytes")
    with pytest.raises(DataError, match="exactly one of"):
        prepare([two], tmp_path / "o", tokenizer_spec="bytes", train_tokenizer_vocab=512)
    prepare([two], tmp_path / "o", tokenizer_spec="bytes", val_docs=1)
    with pytest.raises(DataError, match="already holds fineweb_train_000000.bin"):
        prepare([two], tmp_path / "o", tokenizer_spec="bytes", val_docs=1)
    m = prepare([two], tmp_path / "o", tokenizer_spec="bytes", val_docs=0, overwrite=True)
    assert m["splits"]["val"] == {"documents": 0, "tokens": 0, "bytes": 0, "shards": []}
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["fineweb_train_000000.bin", "manifest.json"]


def test_prepare_writes_nothing_outside_out(tmp_path, capsys):
    """`prepare --prefix ../x` wrote its shards next to --out; a prefix with a directory part is refused in one
    line (exit 2) and nothing is written anywhere; a shard name inside --out that is a symlink to elsewhere is
    refused too (every output proven inside --out: frontier_jax.data.files.within)."""
    two = tmp_path / "two.jsonl"
    two.write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    out = tmp_path / "o"
    before = sorted(p.name for p in tmp_path.iterdir())
    assert _exit_code(["--input", str(two), "--out", str(out), "--bytes", "--val-docs", "1", "--prefix", "../x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prefix '../x' must be a file name prefix" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    out.mkdir()
    (out / "fineweb_train_000000.bin").symlink_to(tmp_path / "elsewhere.bin")
    with pytest.raises(BadInput, match="outside"):
        prepare([two], out, tokenizer_spec="bytes", val_docs=1)
    assert not (tmp_path / "elsewhere.bin").exists()


def test_demo_corpus_deterministic():
    a, b = demo_corpus(), demo_corpus()
    assert a == b and len(a) > 100 and all(isinstance(d, str) and d for d in a)
    assert sum(len(d.encode("utf-8")) for d in a) > 500_000


def test_prepare_demo_builds_and_reuses(tmp_path):
    t0 = time.perf_counter()
    data_dir, tok_path = prepare_demo(tmp_path / "demo")
    assert time.perf_counter() - t0 < 30
    m = read_manifest(data_dir)
    assert tok_path.is_file() and SentencePieceTokenizer(tok_path).vocab_size == 1024
    assert m["splits"]["val"]["documents"] == DEMO_VAL_DOCS and m["splits"]["val"]["tokens"] > 1025
    assert m["splits"]["train"]["tokens"] > 100_000
    stamp = (data_dir / "manifest.json").stat().st_mtime_ns
    assert prepare_demo(tmp_path / "demo") == (data_dir, tok_path)
    assert (data_dir / "manifest.json").stat().st_mtime_ns == stamp  # cached, not rebuilt
    (data_dir / m["splits"]["val"]["shards"][0]).unlink()
    prepare_demo(tmp_path / "demo")
    assert (data_dir / m["splits"]["val"]["shards"][0]).is_file()  # a damaged cache is rebuilt


def test_unwritable_output_is_one_line_and_exit_2(tmp_path, capsys):
    """#11: `data.prepare` to a path that cannot be created: one line naming it, exit 2, nothing written."""
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    assert _exit_code(["--input", str(src), "--out", str(blocker / "out"), "--bytes", "--val-docs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(blocker / "out") in err and "Not a directory" in err


def test_prepare_demo_returns_absolute_paths(tmp_path, monkeypatch):
    """A run records the demo's data paths; relative ones break `evaluate --run` from another directory."""
    import frontier_jax.data.demo as demo

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo, "_cached", lambda out_dir: True)  # the paths only; building is tested above
    data_dir, tok = demo.prepare_demo("runs/demo-data")
    assert data_dir.is_absolute() and tok.is_absolute() and data_dir == tmp_path / "runs" / "demo-data"
