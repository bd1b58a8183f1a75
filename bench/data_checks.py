"""Start-up cost of the data checks (token ids, split integrity) on competition-sized synthetic shards.

    python -m bench.data_checks --dir /tmp/shards --tokenizer fineweb_1024_bpe.model [--train-shards 4] [--train-tokens 100000000] \\
        [--val-tokens 62000000] [--doc-tokens 1200]

Writes `--train-shards` train shards of `--train-tokens` tokens and one val shard of `--val-tokens`
(the competition's fineweb10B_sp1024: 100M tokens per train shard, a ~62M-token val split; no
manifest, as downloaded), documents of geometric length with mean `--doc-tokens` after a BOS (id 1),
random ids below 1024; then times `load_dataset` uncached (the first start), cached (a later start),
and each check alone, per train shard. The shards are left in --dir (remove them afterwards).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from frontier_jax.data import integrity
from frontier_jax.data.dataset import ID_CACHE, check_token_ids, load_dataset
from frontier_jax.data.shards import list_shards, write_shard


def synthetic_shard(n: int, doc_tokens: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(2, 1024, n, dtype=np.uint16)
    starts = np.cumsum(rng.geometric(1 / doc_tokens, size=n // doc_tokens * 2))
    tokens[0] = 1
    tokens[starts[starts < n]] = 1
    return tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--tokenizer", required=True, help="a SentencePiece model of vocabulary 1024 with BOS id 1 (sp1024)")
    ap.add_argument("--train-shards", type=int, default=4)
    ap.add_argument("--train-tokens", type=int, default=100_000_000)
    ap.add_argument("--val-tokens", type=int, default=62_000_000)
    ap.add_argument("--doc-tokens", type=int, default=1200)
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    for i in range(a.train_shards):
        f = a.dir / f"fineweb_train_{i:06d}.bin"
        if not f.exists():
            write_shard(f, synthetic_shard(a.train_tokens, a.doc_tokens, i + 1))
    if not (a.dir / "fineweb_val_000000.bin").exists():
        write_shard(a.dir / "fineweb_val_000000.bin", synthetic_shard(a.val_tokens, a.doc_tokens, 0))
    for cache in (ID_CACHE, integrity.CACHE):
        (a.dir / cache).unlink(missing_ok=True)
    train, val = list_shards(a.dir, "*_train_*.bin"), list_shards(a.dir, "*_val_*.bin")
    for f in train + val:  # page cache warm, as a start right after the download or a previous run
        f.read_bytes()
    out = {}
    t0 = time.perf_counter()
    integrity.check_distinct_files(train, val)
    out["distinct_files_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    check_token_ids(a.dir, train + val, 1024)
    out["token_ids_uncached_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    share, read, docs = integrity.check_duplicates(a.dir, train, val, 1, 0.001)
    out["duplicates_uncached_s"] = time.perf_counter() - t0
    out.update(duplicate_share=share, val_documents=docs, train_shards=len(train))
    for cache in (ID_CACHE, integrity.CACHE):
        (a.dir / cache).unlink()
    t0 = time.perf_counter()
    load_dataset(a.dir, a.tokenizer, 1024, 1024)
    out["load_dataset_uncached_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds = load_dataset(a.dir, a.tokenizer, 1024, 1024)
    out["load_dataset_cached_s"] = time.perf_counter() - t0
    per_shard = (out["duplicates_uncached_s"], out["token_ids_uncached_s"])
    out["per_train_shard_s"] = {"duplicates": per_shard[0] / len(train), "token_ids": per_shard[1] / (len(train) + 1)}
    print(json.dumps(out, indent=1))
    print(ds.provenance)


if __name__ == "__main__":
    main()
