"""Tokenizers (SentencePiece and byte-level) and the per-token byte tables of the exact bpb rule.

The bpb rule (README, "Design opinions: Exact bpb"; parameter-golf `build_sentencepiece_luts` / `eval_val`): for a
scored target `y` with preceding input token `x`,

    bytes(y) = base_bytes[y] + (has_leading_space[y] and not is_boundary[x])

where `base_bytes` is the UTF-8 length of the piece with one leading "▁" removed (byte-fallback
pieces count 1; control, unknown and unused ids count 0 and are boundaries). So the space a piece
carries is charged only when something real precedes it (not after BOS). `count_bytes` is the numpy
reference of this rule; the evaluator applies the same tables on device.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from frontier_jax.data.files import atomic_write
from frontier_jax.data.shards import DataError

BYTE_VOCAB = 260
BYTE_OFFSET = 4  # ids 0..3: pad, bos, eos, unk; ids 4..259: bytes 0..255
SP_SPACE = "\u2581"  # "▁", SentencePiece's whitespace marker


@dataclass(frozen=True)
class ByteTables:
    """Per-token lookup tables of the bpb rule, indexed by token id."""

    base_bytes: np.ndarray  # int16[V]: UTF-8 bytes of the piece without its leading "▁"
    has_leading_space: np.ndarray  # bool[V]: the piece starts with "▁"
    is_boundary: np.ndarray  # bool[V]: control / unknown / unused (and padding) ids

    @property
    def size(self) -> int:
        return int(self.base_bytes.shape[0])


def _empty_tables(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(size, np.int16), np.zeros(size, np.bool_), np.ones(size, np.bool_)


class SentencePieceTokenizer:
    """A SentencePiece `.model` file; `byte_tables` builds the bpb tables exactly as the baseline."""

    kind = "sentencepiece"

    def __init__(self, path):
        import sentencepiece as spm

        self.path = Path(path)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            raise DataError(f"{self.path}: tokenizer model file does not exist") from None
        except IsADirectoryError:
            raise DataError(f"{self.path}: is a directory, not a tokenizer model") from None
        if not data:
            raise DataError(f"{self.path}: empty file, not a SentencePiece model")
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=data)
        except (RuntimeError, OSError, TypeError) as e:
            raise DataError(f"{self.path}: not a SentencePiece model ({str(e).splitlines()[0][:120]})") from None
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab_size = int(self._sp.vocab_size())
        if self.vocab_size == 0:
            raise DataError(f"{self.path}: not a SentencePiece model (no pieces)")
        self.bos_id = int(self._sp.bos_id())
        if self.bos_id < 0:
            raise DataError(f"{self.path}: SentencePiece model has no BOS id (bos_id=-1)")

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self._sp.encode(list(texts))]

    def decode(self, ids) -> str:
        return self._sp.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def byte_tables(self, table_size: int | None = None) -> ByteTables:
        sp = self._sp
        size = max(self.vocab_size, table_size or 0)
        base, lead, boundary = _empty_tables(size)
        for i in range(self.vocab_size):
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                continue
            boundary[i] = False
            if sp.is_byte(i):
                base[i] = 1
                continue
            piece = sp.id_to_piece(i)
            if piece.startswith(SP_SPACE):
                lead[i] = True
                piece = piece[1:]
            base[i] = len(piece.encode("utf-8"))
        return ByteTables(base, lead, boundary)


class ByteTokenizer:
    """Byte-level tokenizer: ids 0 pad, 1 bos, 2 eos, 3 unk, then byte b -> id b + 4 (vocab 260)."""

    kind = "bytes"
    path = Path("bytes")
    vocab_size = BYTE_VOCAB
    bos_id = 1
    sha256 = hashlib.sha256(b"bytes-v1").hexdigest()

    def encode(self, text: str) -> list[int]:
        return (np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int64) + BYTE_OFFSET).tolist()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        raw = bytes(int(i) - BYTE_OFFSET for i in ids if BYTE_OFFSET <= int(i) < BYTE_VOCAB)
        return raw.decode("utf-8", errors="replace")

    def id_to_piece(self, i: int) -> str:
        i = int(i)
        return ("<pad>", "<s>", "</s>", "<unk>")[i] if i < BYTE_OFFSET else f"<0x{i - BYTE_OFFSET:02X}>"

    def byte_tables(self, table_size: int | None = None) -> ByteTables:
        size = max(BYTE_VOCAB, table_size or 0)
        base, lead, boundary = _empty_tables(size)
        base[BYTE_OFFSET:BYTE_VOCAB] = 1
        boundary[BYTE_OFFSET:BYTE_VOCAB] = False
        return ByteTables(base, lead, boundary)


def load_tokenizer(spec: str):
    """"bytes" -> ByteTokenizer; anything else is the path of a SentencePiece .model file."""
    if spec == "bytes":
        return ByteTokenizer()
    if not spec:
        raise DataError("<tokenizer>: no tokenizer given (a .model path or 'bytes')")
    return SentencePieceTokenizer(spec)


def count_bytes(tables: ByteTables, x_prev: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bytes charged for each target `y` given its preceding input token `x_prev` (same shapes), int64."""
    x_prev, y = np.asarray(x_prev), np.asarray(y)
    if x_prev.shape != y.shape:
        raise ValueError(f"count_bytes: x_prev shape {x_prev.shape} differs from y shape {y.shape}")
    extra = tables.has_leading_space[y] & ~tables.is_boundary[x_prev]
    return tables.base_bytes[y].astype(np.int64) + extra


def check_vocab(tokenizer, vocab_size: int, where: str) -> None:
    """DataError unless the tokenizer's vocabulary equals `vocab_size` (named `where` in the message)."""
    if tokenizer.vocab_size != vocab_size:
        raise DataError(f"{tokenizer.path}: vocabulary {tokenizer.vocab_size} does not match {where} {vocab_size}")


def _sentences(texts: Iterable[str], max_chars: int):
    """Non-empty lines of the documents (newlines become spaces under nmt_nfkc anyway), capped in size."""
    used = 0
    for text in texts:
        for line in text.split("\n"):
            line = line.strip()
            if not line:
                continue
            if used + len(line) > max_chars:
                return
            used += len(line)
            yield line


def train_sentencepiece(text_iter: Iterable[str], vocab_size: int, out_prefix, max_chars: int = 20_000_000) -> Path:
    """Train a SentencePiece BPE model with the baseline settings (docs/training.md, "Data"); write `<out_prefix>.model`.

    Documents are fed line by line, at most `max_chars` characters in all (the first ones, no
    shuffling, single thread: deterministic). The model is written atomically; the path is returned.
    """
    import sentencepiece as spm

    if vocab_size < BYTE_VOCAB + 1:
        raise DataError(f"{out_prefix}: vocab_size {vocab_size} leaves no room beyond the 260 special and byte pieces")
    out = Path(f"{out_prefix}.model")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(text_iter, max_chars),
            model_writer=model,
            model_type="bpe",
            vocab_size=vocab_size,
            byte_fallback=True,
            split_digits=True,
            normalization_rule_name="nmt_nfkc",
            add_dummy_prefix=False,
            character_coverage=0.999,
            pad_id=0,
            bos_id=1,
            eos_id=2,
            unk_id=3,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            max_sentence_length=1 << 16,
            num_threads=1,
            hard_vocab_limit=True,
            minloglevel=2,
        )
    except RuntimeError as e:
        reason = str(e).splitlines()[0].split("] ", 1)[-1]  # drop the "INTERNAL: file.cc(638) [check]" prefix
        raise DataError(f"{out}: SentencePiece training failed ({reason[:200]})") from None
    atomic_write(out, [model.getvalue()])
    return out
