"""14 layers, otherwise the baseline; the n-gram logit bias and the fused optimizer kernels on.

Every section is the baseline's with only the named fields replaced, so a field set in baseline.py is
kept here too.
"""

import dataclasses

from configs.baseline import get_config as _baseline


def get_config():
    cfg = _baseline()
    return dataclasses.replace(
        cfg,
        name="frontier14",
        model=dataclasses.replace(cfg.model, num_layers=14),
        ngram=dataclasses.replace(cfg.ngram, enabled=True),
        optim=dataclasses.replace(cfg.optim, fused=True),
    )
