"""The one data loader of training and evaluation: every start-up check on a shard directory.

`load_dataset` returns the tokenizer, the bpb byte tables, the train shard files and the val tokens
after checking, before anything trains or is written:

- the directory exists and holds train and val shards; the tokenizer's vocabulary equals the model's;
- every shard's header and size (all of them now, not when the stream reaches one hours later);
- provenance: a directory made by `data.prepare` must have a complete `manifest.json` (no
  `.prepare-incomplete` marker of a failed or killed preparation; exactly the listed shards, with the
  listed token counts), and the manifest's tokenizer sha256 must be the given tokenizer's (a
  tokenizer with the same vocabulary size that did not make the shards gives a wrong bpb). A
  directory with shards but no manifest and no marker -- the competition's downloaded
  `fineweb_{train,val}_*.bin` -- is accepted with a warning (its provenance is unknown) in the
  one-line `Dataset.provenance` that the entry points log;
- every token id of every train and val shard is below the vocabulary size (an id beyond it gives
  `val_bpb: nan`, or a "non-finite loss" in training). The pass is vectorised over the memmapped
  shards in chunks; the maximum id of each shard is cached in `<data_dir>/.token_ids.json`, keyed by
  the shard's size, modification time and inode, so a later start reads only shards that changed (the
  docs/training.md gives the measured cost).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from frontier_jax.data.integrity import check_distinct_files, check_duplicates, file_key
from frontier_jax.data.manifest import INCOMPLETE, MANIFEST, read_manifest
from frontier_jax.data.shards import DataError, atomic_write_text, list_shards, read_shard, shard_token_count
from frontier_jax.data.stream import load_val_tokens
from frontier_jax.data.tokenizer import ByteTables, check_vocab, count_bytes, load_tokenizer

ID_CACHE = ".token_ids.json"
_CHUNK_TOKENS = 1 << 24  # tokens per vectorised max (32 MiB of uint16)


@dataclass
class Dataset:
    tokenizer: object
    tables: ByteTables  # the exact bpb rule's per-token tables, padded to the model's vocabulary
    train_files: list[Path]
    val_tokens: np.ndarray  # int32, whole seq_len windows plus one token
    provenance: str  # one line for the run log: what was checked


def load_dataset(data_dir, tokenizer_spec: str, vocab_size: int, seq_len: int, train_pattern: str = "*_train_*.bin",
                 val_pattern: str = "*_val_*.bin", vocab_where: str = "model.vocab_size",
                 max_val_duplicate_share: float = 0.001, val_max_tokens: int = 0) -> Dataset:
    """Every start-up check of the module docstring; DataError (one line naming the file) on the first failure."""
    if not data_dir:
        raise DataError("<data>: no data directory given (--data DIR or data.data_dir)")
    data_dir = Path(data_dir)
    if (data_dir / INCOMPLETE).exists():  # before listing: a killed prepare may have written no val shard yet
        raise DataError(f"{data_dir / INCOMPLETE}: data.prepare did not finish in this directory; "
                        "prepare it again (--overwrite)")
    tokenizer = load_tokenizer(tokenizer_spec)
    check_vocab(tokenizer, vocab_size, vocab_where)
    train_files = list_shards(data_dir, train_pattern)
    val_files = list_shards(data_dir, val_pattern)
    check_distinct_files(train_files, val_files)
    counts = {f: shard_token_count(f) for f in train_files + val_files}
    source = check_provenance(data_dir, tokenizer, train_files, val_files, counts)
    t0 = time.perf_counter()
    fresh = check_token_ids(data_dir, train_files + val_files, vocab_size)
    id_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    share, dup_read, val_docs = check_duplicates(data_dir, train_files, val_files, tokenizer.bos_id,
                                                 max_val_duplicate_share)
    dup_seconds = time.perf_counter() - t0
    val_tokens = load_val_tokens(val_files, seq_len)
    tables = tokenizer.byte_tables(vocab_size)
    val_bytes = check_scored_bytes(val_files[0] if len(val_files) == 1 else data_dir, tables, val_tokens, seq_len,
                                   val_max_tokens)
    n_train = sum(counts[f] for f in train_files)
    line = (f"data: {data_dir}: {len(train_files)} train shards ({n_train:,} tokens), val {val_tokens.shape[0]:,} "
            f"tokens ({val_bytes:,} scored bytes); {source}; token ids < {vocab_size} ({fresh} of {len(counts)} shards read, {id_seconds:.2f} s); "
            f"train/val distinct files, {share:.3%} of {val_docs:,} val documents' tokens duplicated in train "
            f"(limit {max_val_duplicate_share:g}; {dup_read} of {len(train_files)} train shards read, {dup_seconds:.2f} s)")
    return Dataset(tokenizer, tables, train_files, val_tokens, line)


def load_for_config(cfg) -> Dataset:
    """`load_dataset` of what a config names (data.data_dir, data.tokenizer, the patterns, model.vocab_size, the
    val split cut to whole windows of the longer of train.seq_len and the eval length, `Config.val_seq_len`):
    the one call both trainers make at start-up."""
    d = cfg.data
    return load_dataset(d.data_dir, d.tokenizer, cfg.model.vocab_size, cfg.val_seq_len, d.train_pattern, d.val_pattern,
                        max_val_duplicate_share=d.max_val_duplicate_share, val_max_tokens=cfg.train.val_max_tokens)


# A split is scored in bits per byte only when at least this share of its scored targets carry bytes on average
# (scored bytes >= MIN_BYTES_PER_TARGET x targets). Every piece of real text counts at least one byte (a byte-
# fallback piece one, any other its UTF-8 length: sp1024 averages about 2.4); only BOS, <unk>, control and unused
# ids count none, and text has one BOS per document (hundreds of targets). Below half, most of the loss is charged
# to targets that carry no bytes and bpb measures no text (a split of BOS only scored val_bpb 13,489).
MIN_BYTES_PER_TARGET = 0.5


def check_scored_bytes(where, tables, val_tokens: np.ndarray, seq_len: int, val_max_tokens: int = 0) -> int:
    """The bytes the val split's scored targets carry (the bpb rule, `count_bytes`); DataError naming `where`
    when they are fewer than MIN_BYTES_PER_TARGET per target, over the whole split or over the periodic
    validation's first `val_max_tokens` targets (train.val_max_tokens; 0: the whole split only)."""
    cuts = sorted({val_tokens.size - 1, *([min(val_max_tokens, val_tokens.size - 1) // seq_len * seq_len]
                                          if val_max_tokens else [])})
    total, done = 0, 0
    for cut in cuts:
        for lo in range(done, cut, _CHUNK_TOKENS):
            hi = min(cut, lo + _CHUNK_TOKENS)
            total += int(count_bytes(tables, val_tokens[lo:hi], val_tokens[lo + 1 : hi + 1]).sum())
        done = cut
        if total < MIN_BYTES_PER_TARGET * cut:
            part = "val split's targets" if cut == val_tokens.size - 1 else f"first {cut:,} val targets (train.val_max_tokens)"
            raise DataError(f"{where}: the {part} carry {total:,} bytes for {cut:,} scored targets, under the floor of "
                            f"{MIN_BYTES_PER_TARGET:g} byte per target: the targets are BOS, <unk> or control ids, "
                            "not text, and bits per byte would divide their loss by bytes that are not there")
    return total


def check_provenance(data_dir: Path, tokenizer, train_files: list[Path], val_files: list[Path], counts: dict) -> str:
    """What vouches for the shards (one phrase); DataError when the manifest does not match or is not the
    tokenizer's (the `.prepare-incomplete` marker is checked first, by `load_dataset`)."""
    if not (data_dir / MANIFEST).exists():
        return (f"WARNING: no {MANIFEST}, so the shards were not made by data.prepare (e.g. the competition's "
                "download) and the tokenizer that made them cannot be checked")
    manifest = read_manifest(data_dir)
    where = data_dir / MANIFEST
    try:
        tok_entry = manifest["tokenizer"]
        splits = {s: (manifest["splits"][s]["shards"], int(manifest["splits"][s]["tokens"])) for s in ("train", "val")}
        sha = str(tok_entry["sha256"])
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{where}: incomplete manifest (missing or bad entry {e})") from None
    if sha != tokenizer.sha256:
        raise DataError(f"{tokenizer.path}: not the tokenizer that made the shards in {data_dir} (its sha256 "
                        f"{tokenizer.sha256[:12]}..., the manifest's {sha[:12]}... = {tok_entry.get('path')})")
    for split, files in (("train", train_files), ("val", val_files)):
        listed, tokens = splits[split]
        found = [f.name for f in files]
        if sorted(listed) != found:
            extra = sorted(set(found) - set(listed))
            what = f"{extra[0]} is not listed" if extra else f"{sorted(set(listed) - set(found))[0]} is missing"
            raise DataError(f"{where}: {split} shards differ from the manifest ({what})")
        if sum(counts[f] for f in files) != tokens:
            raise DataError(f"{where}: {split} shards hold {sum(counts[f] for f in files)} tokens, the manifest {tokens}")
    return f"{MANIFEST} complete, tokenizer sha256 {sha[:12]} matches"


def _max_id(path: Path) -> tuple[int, int]:
    """(max token id, index of its first occurrence) of a shard; (-1, -1) when empty."""
    tokens = read_shard(path)
    best, at = -1, -1
    for lo in range(0, tokens.shape[0], _CHUNK_TOKENS):
        chunk = tokens[lo : lo + _CHUNK_TOKENS]
        m = int(chunk.max())
        if m > best:
            best, at = m, lo + int(np.argmax(chunk))
    return best, at


def check_token_ids(data_dir: Path, files: list[Path], vocab_size: int) -> int:
    """DataError naming the shard and position of the first id >= vocab_size; returns how many shards were read.

    A shard's maximum is taken from the cache when its size, mtime, ctime and inode are unchanged (a
    shard rewritten atomically, or a copied directory, gets new inodes; one rewritten in place with its
    mtime restored gets a new ctime, so it is read again); the cache is
    rewritten (atomically) when a shard was read, and left alone where the directory is read-only.
    """
    cache_path = data_dir / ID_CACHE
    try:
        cache = json.loads(cache_path.read_text(encoding="utf-8"))
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    read = 0
    for f in files:
        key = file_key(f.stat())
        hit = cache.get(f.name)
        if isinstance(hit, list) and len(hit) == len(key) + 1 and hit[:-1] == key:
            best, at = int(hit[-1]), -1
        else:
            (best, at), read = _max_id(f), read + 1
            cache[f.name] = [*key, best]
        if best >= vocab_size:
            at = _max_id(f)[1] if at < 0 else at
            raise DataError(f"{f}: token id {best} at position {at} is not below the vocabulary size {vocab_size} "
                            "(shards made with another tokenizer?)")
    if read:
        try:
            atomic_write_text(cache_path, json.dumps(cache, sort_keys=True) + "\n")
        except OSError:
            pass  # a read-only data directory: the check runs again next time
    return read
