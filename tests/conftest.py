"""Shared fixtures: ../shared/data (skipped with a reason when absent), prepared sp1024 shards, a synthetic
byte-level dataset that needs nothing outside the repository, tiny configs and one trained tiny run."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from frontier_jax import host

# JAX's persistent compilation cache, shared by this session and the processes its tests start (they inherit
# the environment): the same tiny train and eval steps compile in dozens of tests, and a hit skips XLA's compile
# (a repeated tiny run took ~8 s instead of ~25 s on two loaded cores). A fresh directory per session, removed
# at exit, unless JAX_COMPILATION_CACHE_DIR is already set (e.g. by CI to keep it between runs).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="frontier_jax-test-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # small steps too: they repeat
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))

# Simulated devices for the data-parallel tests; must happen before JAX initialises its backend.
# Other tests pin parallel.num_devices=1 (TINY_OVERRIDES) to stay fast on two cores.
jax.config.update("jax_num_cpu_devices", 4)
# The trainer's allocator setting (frontier_jax.host), before the backend starts: as in a real run.
host.tune_allocator("auto")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SP_MODEL_NAME = "fineweb_1024_bpe.model"
DEV_JSONL_NAME = "fineweb_dev.jsonl"

# configs/tiny.py shrunk further so a run takes seconds on two CPU cores (fp32: no bf16 surprises on CPU).
TINY_OVERRIDES = [
    "model.vocab_size=260",
    "model.num_layers=2",
    "model.model_dim=64",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.compute_dtype='float32'",
    "train.seq_len=64",
    "train.tokens_per_step=512",
    "train.micro_batch_seqs=4",
    "train.compile_warmup_steps=1",
    "train.val_batch_seqs=4",
    "train.val_every_steps=0",
    "train.val_max_tokens=0",
    "train.max_steps=6",
    "train.budget_seconds=1000.0",
    "optim.warmdown_steps=4",
    "optim.muon_momentum_warmup_steps=4",
    "parallel.num_devices=1",
    "train.measure_peak=False",  # no start-up matmul probe (seconds per run); tests of MFU turn it back on
]

# Kernel-vs-reference tolerances, max mode: |a - b| <= tol + tol * max|b| (docs/testing.md).
KERNEL_TOL = {"float32": 1e-5, "bfloat16": 2e-2}


def _neuron_skip_reason(device: bool) -> str | None:
    """Why a `neuron` test cannot run here (None: it can). `nki.simulate` needs the Neuron SDK's `nki`
    (PyPI's `nki` is a placeholder that raises ImportError); device=True also needs JAX on a Neuron device."""
    import importlib

    try:
        nki = importlib.import_module("nki")
    except ImportError as e:
        return f"needs the Neuron SDK's nki package (docs/trn1.md, kernel tests on a Neuron DLAMI): {e}"
    if not hasattr(nki, "simulate"):
        return f"nki {getattr(nki, '__version__', '?')} has no nki.simulate (docs/trn1.md)"
    if device and jax.default_backend() != "neuron":
        return f"needs a Neuron device (JAX backend is {jax.default_backend()})"
    return None


def pytest_collection_modifyitems(config, items):
    """Tests marked `neuron` (AWS's nki.simulate) or `neuron(device=True)` (Trainium hardware) are skipped
    with the reason where they cannot run."""
    reasons = {}
    for item in items:
        marker = item.get_closest_marker("neuron")
        if marker is None:
            continue
        device = bool(marker.kwargs.get("device", False))
        if device not in reasons:
            reasons[device] = _neuron_skip_reason(device)
        if reasons[device]:
            item.add_marker(pytest.mark.skip(reason=reasons[device]))


def assert_close_max(a, b, tol):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert not np.isnan(a).any()
    err, bound = np.abs(a - b).max(), tol + tol * np.abs(b).max()
    assert err <= bound, f"max |a-b| = {err:.3g} > {bound:.3g}"


# Kernels written as source for the emulator's tests (tests/test_emulator_*.py), loaded as modules by name.
_kernel_modules = [0]


def write_kernel(tmp_path, monkeypatch, body: str, header: str = "", sig: str = "a", mark_jit: bool = False):
    """Write a kernel module (`header` lines, then `@nki.jit def k(<sig>):` with `body`) importable by name.

    Returns (module name, "path:line" of the line marked `# <-`, or of the @nki.jit line when mark_jit)."""
    _kernel_modules[0] += 1
    name = f"emu_case_{_kernel_modules[0]}"
    src = f"import nki\nimport nki.language as nl\nimport nki.isa as nisa\n{header}\n\n"
    src += f"@nki.jit{'  # <-' if mark_jit else ''}\ndef k({sig}):\n"
    src += textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    line = next((i + 1 for i, text in enumerate(src.splitlines()) if "# <-" in text), None)
    return name, f"{path}:{line}"


def load_kernel(tmp_path, monkeypatch, body: str, reading: str = "any", **kw):
    """Write and load (AST pass, then execution against the emulated nki, under `reading`) a kernel module ->
    (its kernel k, the marked line)."""
    from kernels_nki import emulator

    name, where = write_kernel(tmp_path, monkeypatch, body, **kw)
    return emulator.load_kernel_module(name, reading=reading).k, where


def run_kernel(tmp_path, monkeypatch, body, *args, target="trn1", **kw):
    """Write, load and run a kernel module on `args`: its first output."""
    from kernels_nki import emulator

    k, _ = load_kernel(tmp_path, monkeypatch, body, **kw)
    return emulator.run(k, *args, target=target)[0]


_WORDS = ("the of and to in is was for on that with as by at from his her it an were are which this be or "
          "had not but first one their its new after who they have two she been other when there all during "
          "into school time may years more most only over city some world would where later up such used many").split()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the checkout (sp1024 tokenizer + 100 FineWeb documents), or skip."""
    if not ((SHARED_DATA / SP_MODEL_NAME).is_file() and (SHARED_DATA / DEV_JSONL_NAME).is_file()):
        pytest.skip(f"../shared/data not present: {SP_MODEL_NAME} and {DEV_JSONL_NAME} are needed under {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def sp1024_data(shared_data, tmp_path_factory) -> tuple[Path, Path]:
    """(shard dir, tokenizer path): fineweb_dev.jsonl prepared with sp1024, the first 20 documents as val."""
    from frontier_jax.data.prepare import prepare

    out = tmp_path_factory.mktemp("sp1024")
    model = shared_data / SP_MODEL_NAME
    prepare([shared_data / DEV_JSONL_NAME], out, str(model), val_docs=20, shard_tokens=50_000)
    return out, model


def synthetic_documents(n_docs: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        n = int(rng.integers(20, 80))
        probs = np.linspace(2.0, 0.2, len(_WORDS))
        words = rng.choice(_WORDS, size=n, p=probs / probs.sum())
        docs.append(" ".join(words).capitalize() + ".")
    return docs


def write_byte_dataset(out: Path, train_tokens: int = 60_000, val_tokens: int = 6_000, seed: int = 0) -> Path:
    """Shards of random English-word documents, byte-tokenized (BOS=1 before each), 2 train shards + 1 val."""
    from frontier_jax.data.shards import write_shard
    from frontier_jax.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    out.mkdir(parents=True, exist_ok=True)

    def stream(n_tokens: int, seed_: int) -> np.ndarray:
        ids: list[int] = []
        for doc in synthetic_documents(10_000, seed_):
            ids += [tok.bos_id, *tok.encode(doc)]
            if len(ids) >= n_tokens:
                break
        return np.asarray(ids[:n_tokens], np.uint16)

    train = stream(train_tokens, seed)
    half = train_tokens // 2
    write_shard(out / "synth_train_000000.bin", train[:half])
    write_shard(out / "synth_train_000001.bin", train[half:])
    write_shard(out / "synth_val_000000.bin", stream(val_tokens, seed + 1))
    return out


@pytest.fixture(scope="session")
def byte_data(tmp_path_factory) -> Path:
    """A synthetic byte-level shard directory (tokenizer "bytes", vocab 260): no ../shared needed."""
    return write_byte_dataset(tmp_path_factory.mktemp("bytes_data"))


def tiny_config(data_dir, *extra: str, tokenizer: str = "bytes"):
    """configs/tiny.py with TINY_OVERRIDES, the data directory and `extra` overrides applied."""
    from frontier_jax.config import apply_overrides, load_config

    sets = [*TINY_OVERRIDES, f"data.data_dir={str(data_dir)!r}", f"data.tokenizer={str(tokenizer)!r}", *extra]
    return apply_overrides(load_config(REPO / "configs" / "tiny.py"), sets)


@pytest.fixture(scope="session")
def trained_run(byte_data, tmp_path_factory) -> tuple[Path, dict]:
    """(run dir, summary) of a tiny model trained for 200 steps (~10 s) on the synthetic byte data."""
    from frontier_jax import loop

    out = tmp_path_factory.mktemp("trained") / "run"
    cfg = tiny_config(byte_data, "train.max_steps=200", "optim.warmdown_mode='steps'", "optim.warmdown_steps=50",
                      "train.measure_peak=True")
    summary = loop.run(cfg, out, echo=False)
    return out, summary
