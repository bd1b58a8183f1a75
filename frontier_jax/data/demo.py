"""The offline demo corpus: text already on every machine with Python, no downloads.

Documents, in a fixed order: each topic of the standard library's `pydoc_data.topics.topics` (the
help() texts of the language reference, sorted by key; ~0.47 MB), then, per module of `_MODULES`,
one document joining the module's docstring with those of its public classes, functions and
methods (~0.37 MB). The texts depend on the Python version, so the cache key includes it.
`prepare_demo` trains a 1024-piece SentencePiece BPE on the train documents and writes the shards;
the first `DEMO_VAL_DOCS` documents (help topics) form val.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import warnings
from pathlib import Path

from frontier_jax.data.prepare import prepare, read_manifest
from frontier_jax.data.shards import DataError, atomic_write_text
from frontier_jax.data.tokenizer import SentencePieceTokenizer

DEMO_VERSION = 1
DEMO_VOCAB = 1024
DEMO_VAL_DOCS = 16
_MIN_DOC_CHARS = 200
_MODULES = (
    "argparse", "ast", "base64", "calendar", "collections", "configparser", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools", "gzip", "hashlib",
    "heapq", "http.client", "inspect", "io", "ipaddress", "itertools", "json", "logging", "mailbox",
    "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "shutil", "socket", "sqlite3",
    "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "time", "typing", "unittest", "urllib.parse", "uuid", "warnings", "xml.etree.ElementTree", "zipfile",
)  # fmt: skip


def _module_document(name: str) -> str:
    mod = importlib.import_module(name)
    parts = [inspect.getdoc(mod) or ""]
    for attr, obj in sorted(vars(mod).items()):
        if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if doc := inspect.getdoc(obj):
            parts.append(f"{attr}\n\n{doc}")
        if inspect.isclass(obj):
            for meth, fn in sorted(vars(obj).items()):
                if not meth.startswith("_") and inspect.isfunction(fn) and fn.__doc__:
                    parts.append(f"{attr}.{meth}\n\n{inspect.cleandoc(fn.__doc__)}")
    return "\n\n".join(p for p in parts if p)


def demo_corpus() -> list[str]:
    """The demo documents (deterministic for a given Python version)."""
    from pydoc_data.topics import topics

    docs = [topics[k].strip() for k in sorted(topics)]
    with warnings.catch_warnings():  # some members (typing.io, typing.re) warn when their docs are read
        warnings.simplefilter("ignore", DeprecationWarning)
        docs += [_module_document(m) for m in _MODULES]
    return [d for d in docs if len(d) >= _MIN_DOC_CHARS]


def _source() -> dict:
    return {"demo_version": DEMO_VERSION, "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}


def _cached(out_dir: Path) -> bool:
    try:
        m = read_manifest(out_dir)
    except DataError:
        return False
    if m.get("source") != _source():
        return False
    names = m["splits"]["train"]["shards"] + m["splits"]["val"]["shards"]
    tok_path = out_dir / m["tokenizer"]["path"]
    if not tok_path.is_file() or not all((out_dir / n).is_file() for n in names):
        return False
    return SentencePieceTokenizer(tok_path).sha256 == m["tokenizer"]["sha256"]


def prepare_demo(out_dir) -> tuple[Path, Path]:
    """(data_dir, tokenizer_path) of the demo data under `out_dir`, built once and then reused.

    Both are absolute, so a run directory that records them works from any working directory.
    """
    out_dir = Path(out_dir).resolve()
    if not _cached(out_dir):
        docs_dir = out_dir / "corpus"
        docs_dir.mkdir(parents=True, exist_ok=True)
        jsonl = docs_dir / "demo.jsonl"
        atomic_write_text(jsonl, "".join(json.dumps({"text": d}) + "\n" for d in demo_corpus()))
        prepare([jsonl], out_dir, train_tokenizer_vocab=DEMO_VOCAB, val_docs=DEMO_VAL_DOCS, overwrite=True, source=_source())
    return out_dir, out_dir / "tokenizer.model"
