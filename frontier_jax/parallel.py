"""Data parallelism on JAX's own runtime: a `data` mesh over all devices of all processes.

The batch is sharded along `data` and parameters are replicated; the steps run per device inside
`jax.shard_map` with explicit collectives (frontier_jax.steps: the gradient `pmean`, the evaluation
`psum`). With `parallel.zero1` the optimizer state is sharded along `data` too (ZeRO-1: each device
keeps a slice of the moments between steps; the step all-gathers it for the update and keeps its slice). Multi-host runs call
`initialize()` before any computation; each process then feeds only its own slice of every batch
(`jax.make_array_from_process_local_data`), and reductions (gradients, evaluation sums) are global.

What the run records about this runtime: `environment` (env.json's backend, devices and processes, with the
package versions and git hash of `frontier_jax.run.rundir.environment`) and `matmul_peak`, the dense matmul
rate of all devices that MFU is computed against (documented where AWS documents it, else a repeated probe
reported with its spread).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from frontier_jax.config import ConfigError
from frontier_jax.run import rundir
from frontier_jax.run.progress import probe_summary


def initialize(coordinator: str | None, num_processes: int | None, process_id: int | None,
               heartbeat_timeout_s: int = 30, auto: bool = False) -> None:
    """jax.distributed.initialize, explicitly (coordinator given) or by the cluster's auto-detection.

    A peer that dies is detected by the coordination service's heartbeat: the others fail with an
    error within about `heartbeat_timeout_s` instead of hanging in a collective.
    """
    if coordinator is None and not auto:
        return
    kwargs = dict(heartbeat_timeout_seconds=heartbeat_timeout_s, initialization_timeout=120)
    if coordinator is not None:
        if num_processes is None or process_id is None:
            raise ConfigError("--coordinator needs --num-processes and --process-id")
        kwargs.update(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    jax.distributed.initialize(**kwargs)


@dataclasses.dataclass(frozen=True)
class DataParallel:
    mesh: jax.sharding.Mesh
    zero1: bool = False

    @property
    def num_devices(self) -> int:
        return self.mesh.devices.size

    @property
    def process_index(self) -> int:
        return jax.process_index()

    @property
    def process_count(self) -> int:
        return jax.process_count()

    @property
    def is_main(self) -> bool:
        return jax.process_index() == 0

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def batch_sharding(self, ndim: int, batch_axis: int = 0) -> NamedSharding:
        spec = [None] * ndim
        spec[batch_axis] = "data"
        return NamedSharding(self.mesh, P(*spec))

    def put_batch(self, local: np.ndarray, batch_axis: int = 0) -> jax.Array:
        """This process's rows of a global batch -> one global array sharded along `data`."""
        return jax.make_array_from_process_local_data(self.batch_sharding(local.ndim, batch_axis), local)

    def state_shardings(self, tree):
        """NamedShardings of `state_specs` on this mesh."""
        return jax.tree_util.tree_map(lambda spec: NamedSharding(self.mesh, spec),
                                      state_specs(tree, self.num_devices, self.zero1),
                                      is_leaf=lambda x: isinstance(x, P))

    def state_specs(self, tree):
        return state_specs(tree, self.num_devices, self.zero1)

    def describe(self) -> str:
        d = jax.devices()
        return (f"data parallel over {self.num_devices} device(s) [{d[0].platform}] in {self.process_count} "
                f"process(es); this is process {self.process_index} with {jax.local_device_count()} local "
                f"device(s); optimizer state {'sharded (ZeRO-1)' if self.zero1 else 'replicated'}")


def state_specs(tree, num_devices: int, zero1: bool):
    """PartitionSpecs of an optimizer state: replicated, or (zero1) sharded along `data` on the first axis
    that divides evenly by the device count (the step gathers it for the update: frontier_jax.steps)."""

    def one(x):
        if zero1 and num_devices > 1:
            for axis, size in enumerate(x.shape):
                if size % num_devices == 0 and size >= num_devices:
                    spec = [None] * len(x.shape)
                    spec[axis] = "data"
                    return P(*spec)
        return P()

    return jax.tree_util.tree_map(one, tree)


def make_data_parallel(num_devices: int = 0, zero1: bool = False) -> DataParallel:
    """A 1-D `data` mesh over the first `num_devices` devices (0: all devices of all processes)."""
    devices = jax.devices()
    n = num_devices or len(devices)
    if n > len(devices):
        raise ConfigError(f"parallel.num_devices={n} but only {len(devices)} devices are visible")
    if jax.process_count() > 1 and n != len(devices):
        raise ConfigError("multi-process runs use every device (parallel.num_devices must be 0)")
    mesh = jax.sharding.Mesh(np.asarray(devices[:n]), ("data",))
    return DataParallel(mesh, zero1)


# ----------------------------------------------------------------------------- the runtime's environment and matmul peak

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "sentencepiece", "ml_dtypes")


def environment() -> dict:
    """env.json's entries: rundir.environment (versions, git) plus JAX's backend, devices and processes."""
    return {
        **rundir.environment(PACKAGES),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,  # the rules profiles' hardware (frontier_jax.contest.limits)
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
    }


# Documented dense matmul peaks per device, keyed by the XLA device kind. AWS documents the kind
# "NC_v2" for Trainium1 (aws-neuron-sdk `archive/nxd-training/pytorch-neuron-programming-guide.rst`,
# `xla_device_kind`) and a NeuronCore-v2's TensorE at "a maximum throughput of 92 TFLOPS, as well as 23 TFLOPS
# for FP32 inputs" (`nki/guides/architecture/trainium_inferentia2_arch.rst`, "Tensor Engine"): the per-core
# figure, the one the trn1 step estimate uses too (kernels_nki/emulator/cost.py: 128 x 128 MACs at 2.8 GHz).
# The chip table's 190 BF16 / 47.5 FP32 TFLOPS per 2-core chip (`about-neuron/arch/neuron-hardware/trainium.rst`)
# halves to 95 / 23.75, a rounder figure of the same engines.
DOCUMENTED_PEAKS = {
    "NC_v2": {"bfloat16": 92e12, "float32": 23e12,
              "source": "documented: AWS NeuronCore-v2 (trn1) TensorE 92 BF16 / 23 FP32 TFLOPS, aws-neuron-sdk "
                        "nki/guides/architecture/trainium_inferentia2_arch.rst"},
}
PROBE_ROUNDS = 5


def matmul_peak(dtype=jnp.float32, num_devices: int = 1) -> dict:
    """The MFU denominator for all `num_devices` devices: {"matmul_peak_flops", "peak_source", "peak_spread"}.

    The device's documented peak where `DOCUMENTED_PEAKS` knows its kind (spread None), else the median
    of `PROBE_ROUNDS` probes (`measure_matmul_peak`, each the best of 5 timings), with their min and max
    as the spread: one probe read 72 to 168 GFLOP/s on the same loaded CPU, so a single one is noise."""
    kind = jax.devices()[0].device_kind
    doc = DOCUMENTED_PEAKS.get(kind)
    name = jnp.dtype(dtype).name
    if doc and name in doc:
        return {"matmul_peak_flops": doc[name] * num_devices, "peak_source": f"{doc['source']} ({name})",
                "peak_spread": None}
    backend = jax.default_backend()
    samples = [measure_matmul_peak(dtype, round_=i) * num_devices for i in range(PROBE_ROUNDS)]
    n = 2048 if backend == "cpu" else 8192  # measure_matmul_peak's default
    return probe_summary(samples, f"{n}^3 {name} matmul on {backend} ({kind}) x {num_devices} device(s)")


def measure_matmul_peak(dtype=jnp.float32, n: int | None = None, reps: int = 5, round_: int = 0) -> float:
    """FLOP/s of an n^3 matmul on the default device, best of `reps` (the MFU denominator).

    n defaults to 2048 on CPU and 8192 on accelerators (2048^3 is far too small to fill a GPU: on an
    H200 it measured 117 TFLOP/s in bf16, a sixth of the device's rate). Measured once per process for
    each (backend, dtype, n, reps): a process that trains several times (the test session: about 3 s a
    probe on two loaded cores) reuses the first measurement.
    """
    backend = jax.default_backend()
    if n is None:
        n = 2048 if backend == "cpu" else 8192
    return _matmul_peak(backend, jnp.dtype(dtype), n, reps, round_)


@functools.cache
def _matmul_peak(backend: str, dtype: jnp.dtype, n: int, reps: int, round_: int) -> float:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best
