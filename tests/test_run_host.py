"""frontier_jax.run.host: the allocator setting keeps XLA's per-run temporary buffer resident (no page faults
per step), and is validated, reported and idempotent. Each case runs in a fresh process: the setting is
process-wide and must precede the JAX backend."""

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from frontier_jax.run import host
from frontier_jax.config import ConfigError, TrainConfig

PROBE = textwrap.dedent("""
    import json, resource, sys
    from frontier_jax.run import host
    info = host.tune_allocator(sys.argv[1])
    import jax, jax.numpy as jnp

    @jax.jit
    def f(x):  # ~110 MB of temporaries per call (three [3072, 3072] f32 intermediates), 58 GFLOP
        a = jnp.outer(x, x)
        b = jnp.sin(a) @ jnp.cos(a)
        return jnp.sum(b)

    x = jnp.linspace(0.0, 1.0, 3072)
    for _ in range(3):
        f(x).block_until_ready()
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        f(x).block_until_ready()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 5
    print(json.dumps({"info": info, "faults_per_call": faults}))
""")


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator setting tunes glibc's malloc only")
def test_reuse_keeps_temporaries_resident():
    reuse, system = _probe("reuse"), _probe("system")
    assert reuse["info"]["applied"] and not reuse["info"]["backend_started_before"]
    assert not system["info"]["applied"]
    # system: every call maps its temporaries afresh (a 4 KiB page fault each: ~27k for 110 MB, more with the dot's
    # own buffers)
    assert system["faults_per_call"] > 10_000, system
    assert reuse["faults_per_call"] < 0.05 * system["faults_per_call"], (reuse, system)


def test_tune_allocator_validates_and_is_idempotent():
    with pytest.raises(ValueError, match="allocator must be one of"):
        host.tune_allocator("jemalloc")
    first = host.tune_allocator("reuse")  # the test process (conftest) already applied it: same answer
    assert host.tune_allocator("system") == first
    assert first["allocator"] in ("reuse", "system") and host.describe(first).startswith(first["allocator"])


def test_config_rejects_unknown_allocator():
    with pytest.raises(ConfigError, match="train.allocator must be auto|reuse|system"):
        TrainConfig(allocator="tcmalloc")
    assert TrainConfig().allocator == "auto"


def test_auto_reuses_on_cpu_only():
    assert host.resolve_allocator("auto", [], None) == "reuse"
    assert host.resolve_allocator("auto", ["cuda"], None) == "system"  # accelerator host: parallel compiles
    assert host.resolve_allocator("auto", ["cuda"], "cpu") == "reuse"
    assert host.resolve_allocator("auto", [], "neuron,cpu") == "system"
    assert host.resolve_allocator("system", [], "cpu") == "system"
