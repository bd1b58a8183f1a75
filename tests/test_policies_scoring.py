"""The val score (frontier_jax.policies.scoring): bits per byte from the sums, and the windows a capped
validation scores."""

from __future__ import annotations

import math

import numpy as np
import pytest

from frontier_jax.policies import scoring


def test_val_result_and_windows():
    v = scoring.val_result({"nll_sum_nats": 2 * math.log(2.0) * 10, "tokens": 4, "bytes": 10})
    assert v["bpb"] == pytest.approx(2.0) and v["loss"] == pytest.approx(5 * math.log(2.0))
    toks = np.arange(1000)
    assert scoring.val_window_tokens(toks, 0, 64).size == (999 // 64) * 64 + 1
    assert scoring.val_window_tokens(toks, 200, 64).size == 3 * 64 + 1  # at most 200 targets, whole windows


def test_bpb_refuses_zero_bytes_instead_of_dividing_by_one():
    """`bpb` divided by max(n_bytes, 1): a split of byte-less targets scored 13,489 bpb. No bytes: no score."""
    from frontier_jax.errors import BadInput

    with pytest.raises(BadInput, match="0 scored bytes"):
        scoring.bpb(100.0, 0)
    with pytest.raises(BadInput, match="carry no bytes"):
        scoring.val_result({"nll_sum_nats": 5.0, "tokens": 4, "bytes": 0})
