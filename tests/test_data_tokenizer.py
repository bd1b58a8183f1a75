"""Tokenizers and the exact bpb byte tables (checked against an independent count on real data)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from frontier_jax.data.prepare import prepare
from frontier_jax.data.shards import DataError, list_shards, read_shard
from frontier_jax.data.stream import load_val_tokens, val_batches
from frontier_jax.data.tokenizer import (
    ByteTokenizer,
    SentencePieceTokenizer,
    check_vocab,
    count_bytes,
    load_tokenizer,
    train_sentencepiece,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SP_MODEL = SHARED / "fineweb_1024_bpe.model"
DEV_JSONL = SHARED / "fineweb_dev.jsonl"


@pytest.fixture(scope="module")
def sp1024():
    if not SP_MODEL.is_file():
        pytest.skip(f"../shared/data not present: {SP_MODEL} is needed for the sp1024 byte-table tests")
    return SentencePieceTokenizer(SP_MODEL)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, sp1024):
    if not DEV_JSONL.is_file():
        pytest.skip(f"../shared/data not present: {DEV_JSONL} is needed to prepare real shards")
    out = tmp_path_factory.mktemp("sp1024")
    manifest = prepare([DEV_JSONL], out, tokenizer_spec=str(SP_MODEL), val_docs=50)
    return out, manifest


@pytest.mark.shared_data
def test_sp1024_tables_crafted_cases(sp1024):
    t = sp1024.byte_tables()
    assert sp1024.vocab_size == 1024 and sp1024.bos_id == 1 and t.size == 1024
    the, in_, byte_c3 = (sp1024._sp.piece_to_id(p) for p in ("\u2581the", "in", "<0xC3>"))
    assert (the, byte_c3) == (267, 199)
    # control ids: boundary, 0 bytes, no leading space
    assert t.is_boundary[:4].all() and not t.base_bytes[:4].any() and not t.has_leading_space[:4].any()
    assert not t.is_boundary[4:].any()
    assert t.base_bytes[byte_c3] == 1 and (t.base_bytes[4:260] == 1).all()
    assert t.base_bytes[the] == 3 and t.has_leading_space[the]
    assert t.base_bytes[in_] == 2 and not t.has_leading_space[in_]
    x = np.array([1, in_, byte_c3, 0, 2, 3])
    y = np.array([the, the, the, the, the, byte_c3])
    # "▁the" after BOS / pad / eos is not charged the space; after a real token (byte piece too) it is
    assert count_bytes(t, x, y).tolist() == [3, 4, 4, 3, 3, 1]
    assert count_bytes(t, np.array([[in_]]), np.array([[1]])).tolist() == [[0]]  # a BOS target carries 0
    # a census of this model: 325 leading-space pieces, 256 byte pieces
    assert int(t.has_leading_space.sum()) == 325


@pytest.mark.shared_data
def test_table_padding(sp1024):
    t = sp1024.byte_tables(1100)
    assert t.base_bytes.shape == t.has_leading_space.shape == t.is_boundary.shape == (1100,)
    assert t.base_bytes.dtype == np.int16 and t.is_boundary.dtype == np.bool_
    assert t.is_boundary[1024:].all() and not t.base_bytes[1024:].any()
    assert sp1024.byte_tables(10).size == 1024


@pytest.mark.shared_data
def test_sentencepiece_basics(sp1024):
    text = "The year 2024 was hot."
    ids = sp1024.encode(text)
    assert sp1024.decode(ids) == text
    assert [sp1024.id_to_piece(i) for i in sp1024.encode("2024")].count("2") == 2  # split_digits
    assert sp1024.encode_batch([text, "x"]) == [ids, sp1024.encode("x")]
    assert sp1024.sha256 == __import__("hashlib").sha256(SP_MODEL.read_bytes()).hexdigest()


def test_byte_tokenizer():
    tok = load_tokenizer("bytes")
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 260 and tok.bos_id == 1
    text = "h\u00e9llo \U0001f600"
    ids = tok.encode(text)
    assert ids == [b + 4 for b in text.encode("utf-8")] and tok.decode([1, *ids, 2]) == text
    t = tok.byte_tables()
    assert t.size == 260 and t.is_boundary[:4].all() and not t.is_boundary[4:].any()
    assert (t.base_bytes[4:] == 1).all() and not t.has_leading_space.any()
    x = np.array([1, *ids[:-1]])
    assert int(count_bytes(t, x, np.array(ids)).sum()) == len(text.encode("utf-8"))
    assert tok.sha256 == ByteTokenizer().sha256 and len(tok.sha256) == 64


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'no.model'}: tokenizer model file does not exist")):
        load_tokenizer(str(tmp_path / "no.model"))
    junk = tmp_path / "junk.model"
    junk.write_text('{"text": "not a model"}\n')
    with pytest.raises(DataError, match=re.escape(f"{junk}: not a SentencePiece model")):
        load_tokenizer(str(junk))


@pytest.mark.shared_data
def test_check_vocab(sp1024):
    check_vocab(sp1024, 1024, "model.vocab_size")
    with pytest.raises(DataError, match=re.escape(f"{SP_MODEL}: vocabulary 1024 does not match model.vocab_size 512")):
        check_vocab(sp1024, 512, "model.vocab_size")
    check_vocab(ByteTokenizer(), 260, "model.vocab_size")
    with pytest.raises(DataError, match="bytes: vocabulary 260 does not match model.vocab_size 256"):
        check_vocab(ByteTokenizer(), 256, "model.vocab_size")


def test_train_sentencepiece_settings_and_determinism(tmp_path):
    docs = [f"Document {i}: the quick brown fox {i * 37} jumps over the lazy dog.\nSecond line, caf\u00e9." for i in range(300)]
    a = train_sentencepiece(iter(docs), 400, tmp_path / "a")
    b = train_sentencepiece(iter(docs), 400, tmp_path / "b")
    assert a == tmp_path / "a.model" and a.read_bytes() == b.read_bytes()
    tok = SentencePieceTokenizer(a)
    assert tok.vocab_size == 400 and tok.bos_id == 1
    assert [tok.id_to_piece(i) for i in range(5)] == ["<pad>", "<s>", "</s>", "<unk>", "<0x00>"]
    pieces = [tok.id_to_piece(i) for i in tok.encode("the 1234 fox")]
    assert not pieces[0].startswith("\u2581")  # add_dummy_prefix off
    assert "".join(pieces).replace("\u2581", " ") == "the 1234 fox"
    assert all(sum(c.isdigit() for c in p) <= 1 for p in pieces)  # split_digits
    assert tok.decode(tok.encode("\u4e2d")) == "\u4e2d"  # unseen character: byte fallback
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.model", "b.model"]
    with pytest.raises(DataError, match="leaves no room"):
        train_sentencepiece(iter(docs), 200, tmp_path / "c")


def _independent_target_bytes(sp_tok, prev: np.ndarray, tgt: np.ndarray) -> int:
    """The bpb byte count written from the piece strings alone (no byte_tables, no is_byte)."""
    specials = {"<pad>", "<s>", "</s>", "<unk>"}
    pieces = {i: sp_tok.id_to_piece(i) for i in np.unique(np.concatenate([prev, tgt])).tolist()}
    total = 0
    for p, t in zip(prev.tolist(), tgt.tolist()):
        piece = pieces[t]
        if piece in specials:
            continue
        if re.fullmatch(r"<0x[0-9A-F]{2}>", piece):
            total += 1
            continue
        text = piece.replace("\u2581", " ")
        n = len(text.encode("utf-8"))
        if piece.startswith("\u2581") and pieces[p] in specials:
            n -= 1  # the space of a piece right after BOS is not text
        total += n
    return total


@pytest.mark.shared_data
def test_val_split_bytes_match_independent_count(prepared, sp1024):
    out, manifest = prepared
    seq = 1024
    files = list_shards(out, "*_val_*.bin")
    tokens = load_val_tokens(files, seq)
    tables = sp1024.byte_tables()
    lut = sum(int((count_bytes(tables, x, y) * m).sum()) for x, y, m in val_batches(tokens, seq, 16))
    assert lut == _independent_target_bytes(sp1024, tokens[:-1], tokens[1:])
    assert manifest["splits"]["val"]["documents"] == 50 and tokens[0] == 1


@pytest.mark.shared_data
def test_lut_bytes_equal_decoded_documents_and_are_close_to_raw(prepared, sp1024):
    out, manifest = prepared
    full = np.concatenate([np.asarray(read_shard(f), np.int64) for f in list_shards(out, "*_val_*.bin")])
    tables = sp1024.byte_tables()
    docs = np.split(full, np.flatnonzero(full == sp1024.bos_id)[1:])
    texts = [json.loads(line)["text"] for line in DEV_JSONL.read_text(encoding="utf-8").splitlines()[:50]]
    assert len(docs) == len(texts) == 50
    lut_total = 0
    for ids, text in zip(docs, texts):
        per_doc = int(count_bytes(tables, ids[:-1], ids[1:]).sum())
        assert per_doc == len(sp1024.decode(ids[1:]).encode("utf-8"))  # bytes of the text the model sees
        lut_total += per_doc
    assert lut_total == int(count_bytes(tables, full[:-1], full[1:]).sum())
    normalised = sum(len(sp1024._sp.normalize(t).replace("\u2581", " ").encode("utf-8")) for t in texts)
    raw = manifest["splits"]["val"]["bytes"]
    assert raw == sum(len(t.encode("utf-8")) for t in texts)
    assert abs(lut_total - normalised) <= 0.01 * normalised
    assert abs(lut_total - raw) <= 0.01 * raw and lut_total <= raw


def test_an_empty_tokenizer_file_says_so(tmp_path):
    """Not "no BOS id": an empty file is not a SentencePiece model at all."""
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=re.escape(f"{empty}: empty file, not a SentencePiece model")):
        load_tokenizer(str(empty))
