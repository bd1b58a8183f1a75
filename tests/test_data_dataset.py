"""The start-up loader: manifest completeness, tokenizer provenance, token ids below the vocabulary, the id cache."""

import json
import os
import re
import shutil

import numpy as np
import pytest

from frontier_jax.data import prepare as P
from frontier_jax.data.dataset import ID_CACHE, load_dataset
from frontier_jax.data.shards import DataError, read_shard, write_shard
from frontier_jax.data.tokenizer import train_sentencepiece

DOCS = [f"document {i}: " + " ".join(f"word{(i * 7 + j) % 50}" for j in range(40)) for i in range(30)]


def _jsonl(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    return path


@pytest.fixture
def prepared(tmp_path):
    """A byte-level directory made by data.prepare (3 train shards and 1 val shard, manifest)."""
    out = tmp_path / "data"
    P.prepare([_jsonl(tmp_path)], out, "bytes", val_docs=5, shard_tokens=2500)
    return out


def _load(data_dir, tok="bytes", vocab=260, **kw):
    """(dataset, the warnings of its provenance line)."""
    ds = load_dataset(data_dir, tok, vocab, 64, **kw)
    return ds, [part for part in ds.provenance.split("; ") if "WARNING" in part]


def test_prepared_directory_loads_with_a_provenance_line(prepared):
    ds, warnings = _load(prepared)
    assert warnings == [] and len(ds.train_files) == 3 and ds.val_tokens.dtype == np.int32
    assert "manifest.json complete" in ds.provenance and "token ids < 260" in ds.provenance
    assert ds.tables.size == 260


def test_shards_without_manifest_are_refused_after_a_killed_prepare(prepared):
    """#6: a preparation cut short leaves its marker; the shards beside it are never used."""
    (prepared / P.MANIFEST).unlink()
    (prepared / P.INCOMPLETE).write_text("killed")
    with pytest.raises(DataError, match=re.escape(f"{prepared / P.INCOMPLETE}: data.prepare did not finish")):
        _load(prepared)


def test_failed_prepare_leaves_nothing_usable(tmp_path, monkeypatch):
    """#6: an exception half-way through (here: the second train shard) removes every shard it wrote."""
    calls = {"n": 0}
    real = P.write_shard

    def failing(path, tokens):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device", str(path))
        real(path, tokens)

    monkeypatch.setattr(P, "write_shard", failing)
    out = tmp_path / "data"
    with pytest.raises(OSError):
        P.prepare([_jsonl(tmp_path)], out, "bytes", val_docs=5, shard_tokens=2500)
    assert not out.exists()  # created by this call, emptied, removed
    out.mkdir()
    calls["n"] = 0
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OSError):
        P.prepare([_jsonl(tmp_path)], out, "bytes", val_docs=5, shard_tokens=2500)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_manifest_must_list_exactly_the_shards(prepared):
    shutil.copy(prepared / "fineweb_train_000000.bin", prepared / "fineweb_train_000009.bin")
    with pytest.raises(DataError, match=r"manifest.json: train shards differ from the manifest \(fineweb_train_000009.bin is not listed\)"):
        _load(prepared)
    (prepared / "fineweb_train_000009.bin").unlink()
    (prepared / "fineweb_train_000002.bin").unlink()
    with pytest.raises(DataError, match=r"fineweb_train_000002.bin is missing"):
        _load(prepared)


def test_cut_short_val_split_is_refused(prepared):
    """A val shard rewritten shorter (same name) no longer matches the manifest's token count."""
    val = prepared / "fineweb_val_000000.bin"
    write_shard(val, np.asarray(read_shard(val))[:500])
    with pytest.raises(DataError, match=r"val shards hold 500 tokens, the manifest \d+"):
        _load(prepared)


def test_another_tokenizer_with_the_same_vocabulary_is_refused(tmp_path):
    """#3: shards made by one SentencePiece model, scored with another of the same size: refused by sha256."""
    texts = [d * 3 for d in DOCS]
    a = train_sentencepiece(texts, 300, tmp_path / "a")
    b = train_sentencepiece(texts[::-1] + ["zzz qqq xxx " * 50], 300, tmp_path / "b")
    out = tmp_path / "data"
    P.prepare([_jsonl(tmp_path)], out, str(a), val_docs=5, shard_tokens=2500)
    assert _load(out, str(a), 300)[0].tokenizer.path == a
    with pytest.raises(DataError, match=re.escape(f"{b}: not the tokenizer that made the shards in {out}")):
        _load(out, str(b), 300)


@pytest.mark.parametrize("split", ["train", "val"])
def test_token_ids_at_or_above_the_vocabulary_are_refused(prepared, split):
    """#8: an id >= vocab_size in any shard is named with its shard and position (no nan bpb, no 'non-finite loss')."""
    (prepared / P.MANIFEST).unlink()  # a downloaded-style directory: provenance unknown, ids still checked
    f = prepared / f"fineweb_{split}_000000.bin"
    tokens = np.asarray(read_shard(f)).copy()
    tokens[123] = 260
    write_shard(f, tokens)
    with pytest.raises(DataError, match=re.escape(f"{f}: token id 260 at position 123 is not below the vocabulary size 260")):
        _load(prepared)


def test_downloaded_shards_without_manifest_load_with_one_warning(prepared):
    (prepared / P.MANIFEST).unlink()
    ds, warnings = _load(prepared)
    assert len(warnings) == 1 and "\n" not in warnings[0] and "no manifest.json" in warnings[0]
    assert "WARNING: no manifest.json" in ds.provenance and "\n" not in ds.provenance


def test_id_cache_skips_unchanged_shards_and_rereads_changed_ones(prepared):
    ds, _ = _load(prepared)
    assert "4 of 4 shards read" in ds.provenance
    assert "0 of 4 shards read" in _load(prepared)[0].provenance
    f = prepared / "fineweb_train_000001.bin"
    tokens = np.asarray(read_shard(f)).copy()
    tokens[7] = 300
    f.write_bytes(f.read_bytes()[:1024] + tokens.astype("<u2").tobytes())  # in place: same size and inode
    os.utime(f, ns=(1, 1))  # a new mtime (whatever the file system's timestamp granularity)
    with pytest.raises(DataError, match="token id 300 at position 7"):
        _load(prepared, vocab=260, train_pattern="*_train_*.bin")
    write_shard(f, np.asarray(read_shard(f)).clip(0, 259))  # atomic rewrite: a new inode
    assert "1 of 4 shards read" in _load(prepared)[0].provenance
    cache = json.loads((prepared / ID_CACHE).read_text())
    assert set(cache) == {p.name for p in prepared.glob("*.bin")}


def test_read_only_directory_still_checks(prepared, monkeypatch):
    import frontier_jax.data.dataset as D

    def refuse(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(D, "atomic_write_text", refuse)  # as a read-only directory (chmod does not stop root)
    assert "4 of 4 shards read" in _load(prepared)[0].provenance
    assert "4 of 4 shards read" in _load(prepared)[0].provenance  # no cache was written: checked again


def test_missing_directory_and_no_directory(tmp_path):
    with pytest.raises(DataError, match="no data directory given"):
        _load("")
    with pytest.raises(DataError, match="data directory does not exist"):
        _load(tmp_path / "nope")


@pytest.mark.shared_data
def test_prepared_fineweb_passes_every_check(sp1024_data):
    data_dir, model = sp1024_data
    ds, warnings = _load(data_dir, str(model), 1024)
    assert warnings == [] and "tokenizer sha256" in ds.provenance


# ----------------------------------------------------------------------------- round 3: split integrity


def _competition_layout(prepared):
    """The competition's layout: shards, no manifest (nothing vouches for the splits)."""
    (prepared / P.MANIFEST).unlink()
    return prepared


@pytest.mark.parametrize("how", ["symlink", "hard link", "pattern"])
def test_a_train_shard_that_is_the_val_shard_is_refused(prepared, how):
    """Round 3, cause 2: a train-named symlink (or hard link) to the val shard, or a data.train_pattern
    that matches the val shards, trained on val and scored it as held out (exit 0)."""
    data = _competition_layout(prepared)
    val = data / "fineweb_val_000000.bin"
    kw = {}
    if how == "symlink":
        (data / "fineweb_train_000009.bin").symlink_to(val)
    elif how == "hard link":
        os.link(val, data / "fineweb_train_000009.bin")
    else:
        kw["train_pattern"] = "fineweb_*.bin"
    with pytest.raises(DataError, match=r"train shard is the val shard .*fineweb_val_000000.bin") as e:
        _load(data, **kw)
    assert {"symlink": "a symlink", "hard link": "a hard link", "pattern": "the same path"}[how] in str(e.value)


def test_val_documents_duplicated_in_train_are_reported_and_refused_above_the_limit(prepared):
    """Round 3, cause 2, content level: val documents copied into a train shard (a different file)."""
    data = _competition_layout(prepared)
    ds, _ = _load(data)
    assert "0.000% of 5 val documents' tokens duplicated in train" in ds.provenance
    val = np.asarray(read_shard(data / "fineweb_val_000000.bin"))
    bos = np.flatnonzero(val == 1)
    one_doc = val[bos[1]:bos[2]]  # the second val document, BOS included
    train = data / "fineweb_train_000001.bin"
    write_shard(train, np.concatenate([np.asarray(read_shard(train)), one_doc]))
    share = (one_doc.size - 1) / (val.size - bos.size)
    with pytest.raises(DataError, match=rf"fineweb_train_000001.bin: 1 val documents \({share:.2%}"):
        _load(data)
    ds, _ = _load(data, max_val_duplicate_share=0.5)  # a limit above the share: reported, accepted
    assert f"{share:.3%} of 5 val documents' tokens duplicated in train" in ds.provenance
    assert "0 of 3 train shards read" in _load(data, max_val_duplicate_share=0.5)[0].provenance  # cached


def test_a_shard_rewritten_with_its_mtime_restored_is_read_again(prepared):
    """Round 3: a shard rewritten in place with its mtime put back passed the id cache (then bpb: NaN)."""
    _load(prepared)
    f = prepared / "fineweb_train_000001.bin"
    st = f.stat()
    tokens = np.asarray(read_shard(f)).copy()
    tokens[7] = 300
    f.write_bytes(f.read_bytes()[:1024] + tokens.astype("<u2").tobytes())
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old mtime restored: only ctime tells
    with pytest.raises(DataError, match="token id 300 at position 7"):
        _load(prepared, vocab=260)


def test_a_killed_prepare_is_reported_by_its_marker_not_as_no_val_shard(prepared):
    """Round 3: a prepare killed before it wrote the val shard read 'no files matching *_val_*.bin'."""
    for f in prepared.glob("*_val_*.bin"):
        f.unlink()
    (prepared / P.INCOMPLETE).write_text("")
    with pytest.raises(DataError, match=re.escape(f"{prepared / P.INCOMPLETE}: data.prepare did not finish")):
        _load(prepared)


@pytest.mark.parametrize("ids, what", [(1, "BOS only"), (3, "<unk> only"), (0, "pad (a control id) only")])
def test_a_val_split_whose_targets_carry_no_bytes_is_refused(prepared, ids, what):
    """The probe: a val shard of 20,000 ones (BOS), no manifest, scored val_bpb 13,489 with exit 0. A split with
    fewer scored bytes than half a byte per target is refused at start-up in one line naming the shard; so is
    a periodic validation window (train.val_max_tokens) of such targets in front of real text."""
    (prepared / P.MANIFEST).unlink()
    val = sorted(prepared.glob("*_val_*.bin"))[0]
    real = np.asarray(read_shard(val))
    write_shard(val, np.full(20_000, ids, np.uint16))
    with pytest.raises(DataError, match=rf"^{re.escape(str(val))}: the val split's targets carry 0 bytes for "
                                        r"19,968 scored targets, under the floor of 0.5 byte per target"):
        _load(prepared)
    write_shard(val, np.concatenate([np.full(640, ids, np.uint16), real]))
    ds, _ = _load(prepared)  # the whole split is text enough
    assert "scored bytes" in ds.provenance
    with pytest.raises(DataError, match=r"the first 640 val targets \(train.val_max_tokens\) carry 0 bytes"):
        _load(prepared, val_max_tokens=640)
