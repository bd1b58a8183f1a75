"""The benchmark cases, named once: every script in bench/ picks its cases from CASES by these names.

A case is a model config and one step's batch: `batch` sequences of `seq_len` tokens, one micro-batch
(the name ends in the tokens per step). bench/README.md names the case behind every number.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from frontier_jax.config import Config, apply_overrides, load_config

REPO = Path(__file__).resolve().parents[1]
FP32 = ["model.compute_dtype='float32'", "optim.muon_ns_dtype='float32'"]  # the fp32 policy, Newton-Schulz included


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    config: str  # under configs/
    seq_len: int
    batch: int  # sequences per step, one micro-batch

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    def load(self, *overrides: str) -> Config:
        """The config with this case's step shape (train.seq_len, tokens_per_step, micro_batch_seqs) and `overrides`."""
        shape = [f"train.seq_len={self.seq_len}", f"train.tokens_per_step={self.tokens}",
                 f"train.micro_batch_seqs={self.batch}"]
        return apply_overrides(load_config(REPO / "configs" / self.config), shape + list(overrides))

    def describe(self, cfg: Config) -> str:
        m = cfg.model
        return (f"{self.name}: {m.num_layers}x{m.model_dim}, seq {self.seq_len}, {self.batch} seqs = "
                f"{self.tokens:,} tokens/step")


CASES = {c.name: c for c in (
    Case("tiny-2k", "tiny.py", 256, 8),
    Case("tiny-8k", "tiny.py", 256, 32),  # configs/tiny.py's own training step
    Case("baseline-shaped-4k", "baseline.py", 1024, 4),  # the baseline's model and sequence length; it trains on 524,288 tokens/step
    Case("baseline-shaped-8k", "baseline.py", 1024, 8),
    Case("smoke", "tiny.py", 32, 2),  # seconds per script: tests/test_bench_smoke.py
)}
STEP_CASES = ["tiny-2k", "baseline-shaped-4k"]  # jax_vs_torch, step_ablation, step_parts
PROFILE_CASES = ["tiny-8k", "baseline-shaped-8k"]  # profile_ops, train_throughput


def random_batch(case: Case, vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x_BT, y_BT) int32 inputs and next-token targets of random ids: the step's cost does not depend on them."""
    toks = np.random.default_rng(seed).integers(0, vocab_size, (case.batch, case.seq_len + 1)).astype(np.int32)
    return toks[:, :-1], toks[:, 1:]
