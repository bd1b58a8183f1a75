"""The dtype policy, resolved once per run: which dtypes "auto" means on a platform. The model computes
in `Dtypes.compute` (bfloat16 matmuls on accelerators, as the baseline; float32 on CPU, where bf16 dots
are slower) and Muon's Newton-Schulz iteration runs in `Dtypes.muon_ns` (the same rule). A trainer calls
`resolve(cfg, platform)` at its set-up and hands the result to the model (`frontier_jax.model.build`), the
optimizer (`frontier_jax.optim.build_optimizer`), the Neuron program check and its log; the PyTorch
baseline maps the same names to torch dtypes. No JAX."""

from __future__ import annotations

import dataclasses

from frontier_jax.config import Config

AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Dtypes:
    """The resolved dtype names of a run ("bfloat16" or "float32")."""

    compute: str  # model.compute_dtype: the matmuls and the tied embedding
    muon_ns: str  # optim.muon_ns_dtype: Muon's Newton-Schulz iteration


def _auto(setting: str, platform: str) -> str:
    """A dtype setting with "auto" resolved: bfloat16 on accelerators (the baseline), float32 on CPU."""
    if setting != AUTO:
        return setting
    return "float32" if platform == "cpu" else "bfloat16"


def resolve(cfg: Config, platform: str) -> Dtypes:
    """`cfg`'s model.compute_dtype and optim.muon_ns_dtype on `platform` ("cpu", "neuron", "cuda", ...)."""
    return Dtypes(compute=_auto(cfg.model.compute_dtype, platform), muon_ns=_auto(cfg.optim.muon_ns_dtype, platform))
