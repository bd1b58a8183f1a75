"""How big a run is before anything is built, and the guard both trainers run first in their set-up.

`num_params(cfg)` counts the model's parameters from its config alone (frontier_jax.model's GPT, and the PyTorch
port's: the tied embedding, per block the attention and MLP matrices, the query gains, the two scales and the
residual mix, the U-Net skip weights, with the n-gram bias on its table, and the recipe's BigramHash, SmearGate
and value embeddings with their per-layer scales; tests/test_policies_sizing.py checks it against the built model). `check_host_memory(cfg)` is the cheap pre-allocation guard: a lower bound of
what training holds in host memory - 16 bytes a parameter (float32 weights, gradients and two optimizer moments:
Adam's m and v, Muon's one buffer being fewer) and the step's int32 inputs and targets (8 bytes a token) - against
the memory this host has available (`available_memory_bytes`: Linux's MemAvailable, within the memory cgroup's
room). A model that cannot fit (`--set model.num_layers=1000000` once spent 13 minutes building, deaf to signals)
is refused in one line, exit 2, before anything is allocated. It is a floor, not an estimate of a step's peak
(activations, compiled buffers): the JAX trainer's next check is that estimate (frontier_jax.neuron.memory, the
traced step against the same available memory; the PyTorch baseline has only this floor). No JAX.
"""

from __future__ import annotations

import os
from pathlib import Path

from frontier_jax.config import Config, ConfigError

BYTES_PER_PARAM = 16  # float32 weights, gradients and two optimizer moments (the module docstring)
BYTES_PER_STEP_TOKEN = 8  # the step's inputs and targets, int32 each, built on the host


def num_params(cfg: Config) -> int:
    """Parameters of the model `cfg` describes (without building it), the recipe's (docs/recipe.md) included."""
    m = cfg.model
    D, H, G, K, L = m.model_dim, m.num_heads, m.num_kv_heads, m.head_dim, m.num_layers
    F = m.mlp_hidden
    per_block = 2 * D * H * K + 2 * D * G * K + 2 * D * F + H + 4 * D  # q, proj, k, v, fc, proj, gains, scales, mix
    skips = min(L // 2, L - L // 2) * D
    bias = cfg.ngram.bias_orders * cfg.ngram.confidence_buckets

    def table(rows: int, width: int, out: int) -> int:  # BigramHash / value embeddings: table, projection, scale
        return rows * width + (width * out if width != out else 0) + 1

    bigram = table(m.bigram_buckets, m.bigram_dim, D) if m.bigram_buckets else 0
    smear = D if m.smear_gate else 0
    ve = table(m.vocab_size, m.ve_dim, G * K) + len(m.ve_layers) if m.ve_layers else 0  # + one scale a VE layer
    return m.vocab_size * D + L * per_block + skips + bias + bigram + smear + ve


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Memory this host can give a new allocation now (/proc/meminfo's MemAvailable; else the free pages), within
    what this process's memory cgroup still allows (a container's limit less its usage), or None where neither
    can be read. Both guards read it: this module's floor and the step's estimate (frontier_jax.neuron.memory)."""
    avail = None
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    room = _cgroup_room(cgroup)
    return avail if room is None else min(avail, room)


def _cgroup_room(root: Path) -> int | None:
    """What this process's memory cgroup still allows (v2 memory.max - memory.current, v1 likewise), or None."""
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            cap = (root / limit).read_text().strip()
            if cap == "max" or int(cap) >= 1 << 60:
                continue
            return max(0, int(cap) - int((root / usage).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_host_memory(cfg: Config, available: int | None = None) -> int:
    """The lower bound (bytes) of the module docstring; ConfigError in one line naming the settings when it is
    over `available` (default: `available_memory_bytes()`; no check where that cannot be read)."""
    params = num_params(cfg)
    need = BYTES_PER_PARAM * params + BYTES_PER_STEP_TOKEN * cfg.train.tokens_per_step
    available = available_memory_bytes() if available is None else available
    if available is not None and need > available:
        m, t = cfg.model, cfg.train
        raise ConfigError(
            f"config {cfg.name}: model.num_layers={m.num_layers}, model.model_dim={m.model_dim}, model.vocab_size="
            f"{m.vocab_size}, model.mlp_mult={m.mlp_mult} give {params:,} parameters, and train.tokens_per_step="
            f"{t.tokens_per_step:,}: training needs at least {_gib(need)} ({BYTES_PER_PARAM} bytes a parameter, "
            f"{BYTES_PER_STEP_TOKEN} a step token), over the {_gib(available)} this host has available; make the "
            "model or the step smaller")
    return need
