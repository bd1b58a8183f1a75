"""Data: token shards, the training stream and validation windows, tokenizers and the bpb byte tables, in
`shards` (the binary shard format), `files` (safe reads and writes: paths inside their root, no write through
a symlink, regular-file inputs, atomic writes, JSON against a schema), `stream` (TokenStream, TrainLoader, the validation batcher),
`tokenizer` (SentencePiece / byte tokenizers, ByteTables, count_bytes), `dataset` (the start-up loader: every
check, provenance and token ids included), `integrity` (distinct files, duplicate documents), `manifest` (what
`prepare` wrote), `prepare` (the command line that builds shards and their manifest, `python -m
frontier_jax.data.prepare`) and `demo` (the offline demo corpus). The ground of the house: a module here imports
`frontier_jax.config` and `frontier_jax.errors` only, no JAX."""

from frontier_jax.data.dataset import Dataset, load_dataset
from frontier_jax.data.shards import DataError, list_shards, read_shard, shard_token_count, write_shard
from frontier_jax.data.stream import TokenStream, TrainLoader, load_val_tokens, sliding_windows, val_batches, window_starts
from frontier_jax.data.tokenizer import ByteTables, ByteTokenizer, SentencePieceTokenizer, check_vocab, count_bytes, load_tokenizer

__all__ = [
    "ByteTables",
    "ByteTokenizer",
    "DataError",
    "Dataset",
    "SentencePieceTokenizer",
    "TokenStream",
    "TrainLoader",
    "check_vocab",
    "count_bytes",
    "list_shards",
    "load_dataset",
    "load_tokenizer",
    "load_val_tokens",
    "read_shard",
    "shard_token_count",
    "sliding_windows",
    "val_batches",
    "window_starts",
    "write_shard",
]
