"""14 layers, otherwise the baseline; the n-gram logit bias and the fused optimizer kernels on."""

import dataclasses

from configs.baseline import get_config as _baseline
from frontier_jax.config import ModelConfig, NgramConfig


def get_config():
    cfg = _baseline()
    return dataclasses.replace(
        cfg,
        name="frontier14",
        model=ModelConfig(num_layers=14),
        ngram=NgramConfig(enabled=True),
        optim=dataclasses.replace(cfg.optim, fused=True),
    )
