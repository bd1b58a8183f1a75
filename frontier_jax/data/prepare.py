"""Tokenize documents into train/val shards: `python -m frontier_jax.data.prepare`.

    python -m frontier_jax.data.prepare --input docs.jsonl --out data/sp1024 --tokenizer fineweb_1024_bpe.model
    python -m frontier_jax.data.prepare --input a.txt b.txt --out data/bytes --bytes
    python -m frontier_jax.data.prepare --input docs.jsonl --out data/sp512 --train-tokenizer 512

Inputs: a `.jsonl` file holds one document per line as {"text": ...} (blank lines are skipped; a bad
line is an error naming the file and line). Any other file is plain UTF-8 text and is ONE document.
Documents keep input order; the first `--val-docs` documents form the val split, the rest train
(as the baseline: "the first 50k documents"). Every document is preceded by the tokenizer's BOS id;
no EOS. Tokens are packed into `<prefix>_{train,val}_%06d.bin` shards of `--shard-tokens` tokens
(documents may straddle shards). `--train-tokenizer V` trains a SentencePiece BPE model (baseline
settings) on the train documents only, never val, into OUT/tokenizer.model.

`manifest.json` is written last (atomically), so its presence marks a complete directory. It records
per split: documents, tokens (BOS included), bytes (UTF-8 of the raw text) and shard names; and the
tokenizer (path -- relative to OUT when inside it --, sha256, vocab size). While shards are written,
OUT holds the marker `.prepare-incomplete`; a failure removes what this run wrote (and the marker), and
a killed run leaves the marker, so a cut-short directory is never taken for a prepared one: the
loader (`frontier_jax.data.dataset`) refuses shards beside the marker and checks them against the
manifest.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from frontier_jax.data.manifest import INCOMPLETE, MANIFEST, MANIFEST_VERSION, read_manifest  # noqa: F401 - re-exported
from frontier_jax.data.files import within
from frontier_jax.data.shards import DataError, atomic_write_text, write_shard
from frontier_jax.data.tokenizer import load_tokenizer, train_sentencepiece
from frontier_jax.errors import ArgumentParser, exit_on_error, int_in

DEFAULT_SHARD_TOKENS = 100_000_000
_ENCODE_CHUNK = 256  # documents encoded per call (SentencePiece batches them across threads)


def iter_documents(inputs: list[Path]) -> Iterator[str]:
    """Every document of every input, in order (see the module docstring for the formats)."""
    for path in inputs:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: input file does not exist")
        if path.suffix != ".jsonl":
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not valid UTF-8 text ({e.reason} at byte {e.start})") from None
            continue
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line.decode("utf-8"))
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise DataError(f"{path}:{lineno}: bad JSON ({e})") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise DataError(f"{path}:{lineno}: line has no string field 'text'")
                yield obj["text"]


def count_documents(inputs: list[Path]) -> int:
    """Number of documents in `inputs` (JSONL non-blank lines; one per other file), without parsing."""
    total = 0
    for path in inputs:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: input file does not exist")
        if path.suffix == ".jsonl":
            with open(path, "rb") as f:
                total += sum(1 for line in f if line.strip())
        else:
            total += 1
    return total


class _ShardWriter:
    """Packs token ids into fixed-size shards named <prefix>_<split>_%06d.bin."""

    def __init__(self, out_dir: Path, prefix: str, split: str, shard_tokens: int, written: list[Path]):
        self.out_dir, self.prefix, self.split, self.written = out_dir, prefix, split, written
        self.buf = np.empty(shard_tokens, dtype=np.uint16)
        self.fill = 0
        self.names: list[str] = []
        self.tokens = 0

    def add(self, ids: list[int]) -> None:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.uint16).max):
            raise DataError(f"{self.out_dir}: token id {int(arr.max())} does not fit a uint16 shard")
        self.tokens += arr.size
        while arr.size:
            k = min(arr.size, self.buf.size - self.fill)
            self.buf[self.fill : self.fill + k] = arr[:k]
            self.fill, arr = self.fill + k, arr[k:]
            if self.fill == self.buf.size:
                self.flush()

    def flush(self) -> None:
        if self.fill == 0:
            return
        name = f"{self.prefix}_{self.split}_{len(self.names):06d}.bin"
        path = within(self.out_dir, self.out_dir / name)
        self.written.append(path)
        write_shard(path, self.buf[: self.fill])
        self.names.append(name)
        self.fill = 0


def _existing_outputs(out_dir: Path, prefix: str) -> list[Path]:
    found = [p for split in ("train", "val") for p in out_dir.glob(f"{prefix}_{split}_*.bin")]
    return sorted(found) + [out_dir / n for n in (MANIFEST, INCOMPLETE) if (out_dir / n).exists()]


def prepare(
    inputs,
    out_dir,
    tokenizer_spec: str | None = None,
    train_tokenizer_vocab: int | None = None,
    val_docs: int = 50,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    prefix: str = "fineweb",
    overwrite: bool = False,
    source: dict | None = None,
) -> dict:
    """Tokenize `inputs` into shards under `out_dir`; returns the manifest (also written as manifest.json).

    Exactly one of `tokenizer_spec` ("bytes" or a .model path) and `train_tokenizer_vocab` is given.
    Existing shards/manifest with this prefix are an error unless `overwrite` (then they are removed).
    `source` is an optional JSON-able dict stored verbatim in the manifest (e.g. by the demo).
    """
    inputs = [Path(p) for p in inputs]
    out_dir = Path(out_dir)
    if (tokenizer_spec is None) == (train_tokenizer_vocab is None):
        raise DataError(f"{out_dir}: give exactly one of a tokenizer and a vocabulary size to train")
    if not inputs:
        raise DataError(f"{out_dir}: no input files given")
    if shard_tokens <= 0:
        raise DataError(f"{out_dir}: shard_tokens must be positive, got {shard_tokens}")
    if val_docs < 0:
        raise DataError(f"{out_dir}: val_docs must be >= 0, got {val_docs}")
    if not prefix or os.sep in prefix or "/" in prefix:
        raise DataError(f"{out_dir}: --prefix {prefix!r} must be a file name prefix (no directory part)")
    within(out_dir, out_dir / f"{prefix}_train_000000.bin")  # every output inside --out (e.g. not --prefix ..)
    n_docs = count_documents(inputs)
    if n_docs == 0:
        raise DataError(f"{inputs[0]}: input holds no documents")
    if val_docs >= n_docs:
        raise DataError(f"{inputs[0]}: --val-docs {val_docs} leaves no training documents (the input has {n_docs})")
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = _existing_outputs(out_dir, prefix)
    if stale and not overwrite:
        raise DataError(f"{out_dir}: already holds {stale[0].name} (and {len(stale) - 1} more); use an empty directory or --overwrite")
    atomic_write_text(out_dir / INCOMPLETE, "data.prepare has not finished writing this directory\n")
    for p in stale:
        if p.name != INCOMPLETE:
            p.unlink()
    written: list[Path] = []
    try:
        manifest = _write_shards(inputs, out_dir, tokenizer_spec, train_tokenizer_vocab, val_docs, shard_tokens,
                                 prefix, source, n_docs, written)
    except BaseException:
        for p in [*written, out_dir / MANIFEST, out_dir / INCOMPLETE]:
            p.unlink(missing_ok=True)
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    (out_dir / INCOMPLETE).unlink()
    return manifest


def _write_shards(inputs, out_dir: Path, tokenizer_spec, train_tokenizer_vocab, val_docs: int, shard_tokens: int,
                  prefix: str, source, n_docs: int, written: list[Path]) -> dict:
    """The body of `prepare`: every file it creates is appended to `written` (removed on failure)."""
    if train_tokenizer_vocab is not None:
        train_docs = (t for i, t in enumerate(iter_documents(inputs)) if i >= val_docs)
        tokenizer_spec = str(train_sentencepiece(train_docs, train_tokenizer_vocab, out_dir / "tokenizer"))
        written.append(Path(tokenizer_spec))
    tok = load_tokenizer(tokenizer_spec)

    writers = {s: _ShardWriter(out_dir, prefix, s, shard_tokens, written) for s in ("val", "train")}
    stats = {s: {"documents": 0, "tokens": 0, "bytes": 0} for s in writers}

    def flush_chunk(split: str, texts: list[str]) -> None:
        for ids in tok.encode_batch(texts):
            writers[split].add([tok.bos_id, *ids])
        stats[split]["documents"] += len(texts)
        stats[split]["bytes"] += sum(len(t.encode("utf-8")) for t in texts)

    chunk, chunk_split = [], "val"
    with tqdm(total=n_docs, unit="doc", desc=f"prepare {out_dir.name}", disable=None, file=sys.stderr) as bar:
        for i, text in enumerate(iter_documents(inputs)):
            split = "val" if i < val_docs else "train"
            if chunk and (split != chunk_split or len(chunk) == _ENCODE_CHUNK):
                flush_chunk(chunk_split, chunk)
                bar.update(len(chunk))
                chunk = []
            chunk_split = split
            chunk.append(text)
        if chunk:
            flush_chunk(chunk_split, chunk)
            bar.update(len(chunk))
    for split, w in writers.items():
        w.flush()
        stats[split]["tokens"] = w.tokens
        stats[split]["shards"] = w.names

    tok_path = Path(tok.path)
    if tok.kind != "bytes":
        tok_path = tok_path.resolve()
        if tok_path.parent == out_dir.resolve():
            tok_path = Path(tok_path.name)
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "prefix": prefix,
        "shard_tokens": shard_tokens,
        "inputs": [str(p) for p in inputs],
        "tokenizer": {"kind": tok.kind, "path": str(tok_path), "sha256": tok.sha256, "vocab_size": tok.vocab_size},
        "bos_id": tok.bos_id,
        "splits": {"train": stats["train"], "val": stats["val"]},
        "source": source,
    }
    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")  # last: marks the directory complete
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m frontier_jax.data.prepare", description=__doc__.splitlines()[0])
    ap.add_argument("--input", nargs="+", required=True, type=Path, help=".jsonl ({'text':...} per line) or text files")
    ap.add_argument("--out", required=True, type=Path, help="output directory for shards and manifest.json")
    tk = ap.add_mutually_exclusive_group(required=True)
    tk.add_argument("--tokenizer", help="a SentencePiece .model file")
    tk.add_argument("--train-tokenizer", type=int_in(261, 65536), metavar="VOCAB", help="train a SentencePiece BPE on the train docs")
    tk.add_argument("--bytes", action="store_true", help="byte-level tokenizer (vocab 260)")
    ap.add_argument("--val-docs", type=int_in(0), default=50, help="first N documents form val (default 50)")
    ap.add_argument("--shard-tokens", type=int_in(1), default=DEFAULT_SHARD_TOKENS,
                    help=f"tokens per shard file (default {DEFAULT_SHARD_TOKENS:,}, the competition's); the n-gram "
                         "bias's builder reads the last ngram.builder_shards_from_end train shards, so a small corpus "
                         "needs smaller shards to leave the trainer some")
    ap.add_argument("--prefix", default="fineweb",
                    help="shard file names: PREFIX_train_NNNNNN.bin, PREFIX_val_NNNNNN.bin (default fineweb)")
    ap.add_argument("--overwrite", action="store_true", help="replace existing shards with this prefix")
    args = ap.parse_args(argv)
    spec = "bytes" if args.bytes else args.tokenizer
    with exit_on_error():
        m = prepare(args.input, args.out, spec, args.train_tokenizer, args.val_docs, args.shard_tokens, args.prefix, args.overwrite)
    for split in ("train", "val"):
        s = m["splits"][split]
        print(f"{split}: {s['documents']} docs, {s['tokens']} tokens, {s['bytes']} bytes, {len(s['shards'])} shards")
    print(f"wrote {args.out / MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
