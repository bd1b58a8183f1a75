"""Data parallelism on JAX's own runtime: a `data` mesh over all devices of all processes.

The batch is sharded along `data` and parameters are replicated; the steps run per device inside
`jax.shard_map` with explicit collectives (frontier_jax.steps: the gradient `pmean`, the evaluation
`psum`). With `parallel.zero1` the optimizer state is sharded along `data` too (ZeRO-1: each device
keeps a slice of the moments between steps; the step all-gathers it for the update and keeps its slice). Multi-host runs call
`initialize()` before any computation; each process then feeds only its own slice of every batch
(`jax.make_array_from_process_local_data`), and reductions (gradients, evaluation sums) are global.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from frontier_jax.config import ConfigError


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
