"""Shared fixtures: ../shared/data (skipped with a reason when absent), prepared sp1024 shards, a synthetic
byte-level dataset that needs nothing outside the repository, tiny configs, one trained tiny run and the configs'
programs traced as on Neuron."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

from frontier_jax.run import host
from helpers import DEV_JSONL_NAME, SHARED_DATA, SP_MODEL_NAME, tiny_config, write_byte_dataset

pytest_plugins = ["kernel_coverage"]  # --kernel-branch-coverage (tests/kernel_coverage.py)

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
# The trainer's allocator setting (frontier_jax.run.host), before the backend starts: as in a real run.
host.tune_allocator("auto")

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


@pytest.fixture(scope="session")
def byte_data(tmp_path_factory) -> Path:
    """A synthetic byte-level shard directory (tokenizer "bytes", vocab 260): no ../shared needed."""
    return write_byte_dataset(tmp_path_factory.mktemp("bytes_data"))


@pytest.fixture(scope="session")
def trained_run(byte_data, tmp_path_factory) -> tuple[Path, dict]:
    """(run dir, summary) of a tiny model trained for 200 steps (~10 s) on the synthetic byte data."""
    from frontier_jax import trainer

    out = tmp_path_factory.mktemp("trained") / "run"
    cfg = tiny_config(byte_data, "train.max_steps=200", "optim.warmdown_mode='steps'", "optim.warmdown_steps=50",
                      "train.measure_peak=True")
    summary = trainer.run(cfg, out, echo=False)
    return out, summary


@pytest.fixture(scope="session")
def neuron_traced():
    """neuron_traced(cfg): `program.trace_steps(cfg, kernel_calls.CORES, *program.on_neuron(cfg))`, what
    `neuron_check` checks and `kernel_calls.program` takes the train step from (one trn1 chip's 2 NeuronCores), traced
    once per session for each distinct config (a full-size config takes seconds; the program check and the kernel
    report's docs test read the same one)."""
    from frontier_jax.neuron.kernel_calls import CORES
    from frontier_jax.neuron.program import on_neuron, trace_steps

    traced = {}

    def get(cfg):
        if cfg not in traced:
            traced[cfg] = trace_steps(cfg, CORES, *on_neuron(cfg))
        return traced[cfg]

    return get
