"""The step's peak memory per device, estimated before anything is compiled or allocated, against what a
device has; the micro-batch that fits.

`peak_bytes(closed_jaxpr)` is a live-buffer walk of a traced program: its equations in trace order, each
output allocated when its equation runs and freed after its last use, the program's inputs and constants live
throughout, a sub-program (jit, the micro-batch scan's body, the per-device shard_map body, custom_vjp, cond,
while) adding its own peak above its inputs while it runs. It counts every intermediate as a buffer (XLA fuses
many away) and packs buffers perfectly (XLA's buffer assignment does not): measured against XLA's own memory
analysis of the compiled CPU train step (`python -m bench.memory_estimate`, table in bench/README.md), XLA's
figure is 0.96x to 1.39x the walk's. `estimate_bytes` is the walk times `MARGIN`, a bound above every measured
XLA figure.

`device_memory(backend, local_devices)` is what one device may use: a trn1 NeuronCore-v2's HBM as AWS documents
it, the host's available RAM shared by the local CPU devices (read as the set-up's cheaper floor reads it,
`policies.sizing.available_memory_bytes`; that floor, parameters and inputs only, runs first, before anything is
traced), an accelerator's own limit where its runtime reports one. `fit(...)` checks a set `train.micro_batch_seqs` against it (`DoesNotFit`, a one-line ConfigError:
exit 2 before anything is allocated) or, for `0` (auto), chooses the largest micro-batch that fits, up to
`policies.geometry.AUTO_MAX_MICRO_SEQS`; accumulation fills the rest of the step, whose tokens and result do
not change. The walk reads jaxprs the caller traced (`frontier_jax.neuron.program`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np
from jax.extend.core import Literal

from frontier_jax.config import ConfigError
from frontier_jax.policies import sizing
from frontier_jax.policies.geometry import AUTO_MAX_MICRO_SEQS, micro_batch_candidates

GiB = 1 << 30
# AWS: "16GiB per Inferentia2/Trainium1 NeuronCore" (aws-neuron-sdk
# about-neuron/transformers/generative-llm-inference-with-neuron.rst); a Trainium chip's "32 GiB of device
# memory" over its two NeuronCore-v2 (about-neuron/arch/neuron-hardware/trainium.rst, trn1-arch.rst).
NEURONCORE_V2_HBM = 16 * GiB
NEURON_SOURCE = ("16 GiB HBM per trn1 NeuronCore-v2 (aws-neuron-sdk "
                 "about-neuron/transformers/generative-llm-inference-with-neuron.rst; 32 GiB per 2-core chip, "
                 "about-neuron/arch/neuron-hardware/trainium.rst)")
# The walk times MARGIN bounds every XLA figure measured (`python -m bench.memory_estimate`, bench/README.md:
# XLA / walk 0.96 to 1.39, the largest for the baseline in bfloat16, whose element-wise work XLA:CPU widens to
# float32 buffers; 1.32 for the baseline at 64 sequences), with room for programs not measured.
MARGIN = 1.5


class DoesNotFit(ConfigError):
    """The step's estimated peak memory is over the device's (one line: the estimate, the limit, the setting)."""


def is_var(v) -> bool:
    return hasattr(v, "aval") and not isinstance(v, Literal)


def nbytes(v) -> int:
    """Bytes of a jaxpr variable's array (0 for a token or an abstract value without a shape)."""
    aval = getattr(v, "aval", None)
    if aval is None or not hasattr(aval, "shape"):
        return 0
    try:
        item = np.dtype(aval.dtype).itemsize
    except TypeError:  # an extended dtype (a PRNG key): its words
        item = getattr(aval.dtype, "itemsize", 8)
    return math.prod(aval.shape) * item


def sub_jaxprs(eqn):
    """Every jaxpr an equation's parameters hold (a scan's body, a jit's, a cond's branches ...)."""
    for v in eqn.params.values():
        for j in (v if isinstance(v, (tuple, list)) else (v,)):
            inner = getattr(j, "jaxpr", j)  # ClosedJaxpr -> Jaxpr
            if hasattr(inner, "eqns"):
                yield inner


def peak_bytes(closed) -> int:
    """The live-buffer walk's peak of `closed` (a ClosedJaxpr or Jaxpr), its inputs and constants included."""
    jaxpr = getattr(closed, "jaxpr", closed)
    last: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if is_var(v):
                last[v] = i
    kept = {v for v in (*jaxpr.invars, *jaxpr.constvars, *jaxpr.outvars) if is_var(v)}
    live = sum(nbytes(v) for v in {*jaxpr.invars, *jaxpr.constvars})
    peak = live
    for i, eqn in enumerate(jaxpr.eqns):
        made = sum(nbytes(v) for v in eqn.outvars)
        inner = max((peak_bytes(sub) - sum(nbytes(v) for v in {*sub.invars, *sub.constvars})
                     for sub in sub_jaxprs(eqn)), default=None)
        if inner is None:
            peak = max(peak, live + made)
        elif eqn.primitive.name == "scan":  # the stacked outputs exist while the body (its carries included) runs
            peak = max(peak, live + sum(nbytes(v) for v in eqn.outvars[eqn.params["num_carry"]:]) + inner)
        else:  # the sub-program's peak holds the outputs it returns
            peak = max(peak, live + max(made, inner))
        live += sum(nbytes(v) for v in eqn.outvars if v in last or v in kept)  # an unused output dies at once
        live -= sum(nbytes(v) for v in {v for v in eqn.invars if is_var(v)} if last[v] == i and v not in kept)
    return peak


def estimate_bytes(programs) -> int:
    """The estimated peak per device over traced programs: the largest walk times MARGIN."""
    return math.ceil(MARGIN * max(peak_bytes(p) for p in programs))


# ----------------------------------------------------------------------------- what a device has


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    bytes: int | None  # what one device may use (None: unknown, nothing is checked)
    source: str  # where the figure comes from, in a few words
    unit: str = "device"  # what one device is called in a report line


def host_available_bytes() -> int | None:
    """The host's available RAM, as the set-up's floor reads it (policies.sizing.available_memory_bytes:
    MemAvailable within the memory cgroup's room); no environment variable is read."""
    return sizing.available_memory_bytes()


def device_memory(backend: str, local_devices: int = 1, device=None) -> DeviceMemory:
    """What one device may use on `backend` ("cpu": the available RAM over the `local_devices` sharing it;
    "neuron": a NeuronCore-v2's HBM; else `device.memory_stats()["bytes_limit"]` where the runtime reports it)."""
    if backend == "neuron":
        return DeviceMemory(NEURONCORE_V2_HBM, "a trn1 NeuronCore-v2's HBM, as AWS documents it", "NeuronCore")
    if backend == "cpu":
        avail = host_available_bytes()
        if avail is None:
            return DeviceMemory(None, "available host memory unknown")
        share = f" over {local_devices} CPU devices" if local_devices > 1 else ""
        return DeviceMemory(avail // max(local_devices, 1), f"available RAM{share}")
    stats = getattr(device, "memory_stats", lambda: None)() if device is not None else None
    if stats and stats.get("bytes_limit"):
        return DeviceMemory(int(stats["bytes_limit"]), f"{backend} device memory_stats() bytes_limit")
    return DeviceMemory(None, f"{backend}: the device reports no memory limit")


# ----------------------------------------------------------------------------- the micro-batch that fits


def gb(n: int | None) -> str:
    """Bytes in GiB (MiB under 1 GiB), as AWS states a NeuronCore's HBM."""
    if n is None:
        return "unknown"
    return f"{n / GiB:,.1f} GiB" if n >= GiB else f"{n / (1 << 20):,.1f} MiB"


@dataclasses.dataclass(frozen=True)
class Fit:
    micro_seqs: int  # sequences per device per micro-batch (resolved)
    auto: bool  # chosen (train.micro_batch_seqs = 0) rather than set
    estimate: int  # bytes per device, the estimate at micro_seqs
    limit: DeviceMemory

    @property
    def fits(self) -> bool:
        return self.limit.bytes is None or self.estimate <= self.limit.bytes

    def line(self) -> str:
        how = "auto: the largest that fits" if self.auto else "train.micro_batch_seqs"
        over = (f" (not checked: {self.limit.source})" if self.limit.bytes is None else
                f" of {gb(self.limit.bytes)} ({self.limit.source})")
        seqs = f"{self.micro_seqs} sequence{'' if self.micro_seqs == 1 else 's'}"
        return f"memory: step peak estimated {gb(self.estimate)} per {self.limit.unit} at {seqs} per micro-batch ({how}){over}"


candidates = micro_batch_candidates


def fit(name: str, setting: int, per_device_seqs: int, estimate: Callable[[int], int], limit: DeviceMemory,
        fixed: Callable[[], int] | None = None, strict: bool = True) -> Fit:
    """The micro-batch per device for config `name`: `setting` (> 0) checked, or (0) the largest candidate
    whose `estimate(micro_seqs)` (bytes per device) fits `limit` (none fits: 1). `fixed()`: the estimate of
    what does not depend on the micro-batch (the eval step), checked after. strict: a step over the limit
    raises DoesNotFit, one line naming the estimate, the limit and the setting to change; else the Fit says
    it does not fit."""
    got = _fit_train(name, setting, per_device_seqs, estimate, limit, strict)
    if fixed is not None and limit.bytes is not None and strict:
        need = fixed()
        if need > limit.bytes:
            raise DoesNotFit(f"config {name}: the eval step needs an estimated {gb(need)} per {limit.unit}, over the "
                             f"{gb(limit.bytes)} a {limit.unit} has ({limit.source}): lower train.val_batch_seqs")
    return got


def _fit_train(name: str, setting: int, per_device_seqs: int, estimate, limit: DeviceMemory, strict: bool) -> Fit:
    where, over = f"config {name}: ", f"over the {gb(limit.bytes)} a {limit.unit} has ({limit.source})"
    if setting:
        got = Fit(min(setting, per_device_seqs), False, estimate(min(setting, per_device_seqs)), limit)
        if got.fits or not strict:
            return got
        smaller = _largest_fitting(per_device_seqs, estimate, limit, below=got.micro_seqs)
        advice = (f"set train.micro_batch_seqs={smaller.micro_seqs} (estimated {gb(smaller.estimate)}) or 0 "
                  "(auto: the largest that fits)" if smaller else
                  "even 1 sequence per micro-batch does not fit: a smaller model (model.*) or train.seq_len, or a "
                  "device with more memory")
        raise DoesNotFit(f"{where}the train step needs an estimated {gb(got.estimate)} per {limit.unit} at "
                         f"train.micro_batch_seqs={got.micro_seqs}, {over}: {advice}")
    if limit.bytes is None:
        m = candidates(per_device_seqs)[0]
        return Fit(m, True, estimate(m), limit)
    got = _largest_fitting(per_device_seqs, estimate, limit)
    if got is not None:
        return got
    one = Fit(1, True, estimate(1), limit)
    if not strict:
        return one
    raise DoesNotFit(f"{where}the train step needs an estimated {gb(one.estimate)} per {limit.unit} even at 1 sequence "
                     f"per micro-batch (train.micro_batch_seqs=0, auto), {over}: a smaller model (model.*) or "
                     "train.seq_len, or a device with more memory")


def _largest_fitting(per_device_seqs: int, estimate, limit: DeviceMemory, below: int | None = None) -> Fit | None:
    """The largest candidate (under `below`) that fits; candidates a known estimate rules out are not traced (the
    estimate grows with the micro-batch at least in proportion to its part that scales: e(m) >= e(M) m / M)."""
    known: tuple[int, int] | None = None
    for m in candidates(per_device_seqs, (below - 1) if below else AUTO_MAX_MICRO_SEQS):
        if known is not None and known[1] * m / known[0] > limit.bytes:
            continue
        got = Fit(m, below is None, estimate(m), limit)
        if got.fits:
            return got
        known = (m, got.estimate)
    return None
