"""The step's geometry, as both trainers, the Neuron program check and the kernel report split it: a
step of `train.tokens_per_step` tokens into micro-batches per device (`split_batch`) and one step's rows
read as a single chunk of the token stream (`step_batch`), so the data never depends on the split. No JAX."""

from __future__ import annotations

import numpy as np

from frontier_jax.config import ConfigError

# train.micro_batch_seqs = 0 (auto) chooses at most the baseline's micro-batch: train_gpt.py runs 524,288 tokens per
# step on 8 GPUs as 64 sequences of 1,024 per GPU, so where that fits, auto runs the same program.
AUTO_MAX_MICRO_SEQS = 64


def micro_batch_candidates(per_device_seqs: int, cap: int = AUTO_MAX_MICRO_SEQS) -> list[int]:
    """The micro-batches auto may choose, largest first: divisors of the per-device step up to `cap` (the JAX
    trainer takes the largest whose estimated memory fits, frontier_jax.neuron.memory; the PyTorch baseline,
    which estimates none, the first)."""
    return [m for m in range(min(cap, per_device_seqs), 0, -1) if per_device_seqs % m == 0]


def split_batch(seqs_per_step: int, micro_batch_seqs: int, num_devices: int, process_count: int = 1):
    """(global sequences per micro-batch, accumulation steps) keeping tokens per step fixed.

    micro_batch_seqs is per device; it shrinks when the global step is smaller than one micro-batch
    on every device. An impossible split is a ConfigError naming the numbers.
    """
    if seqs_per_step % num_devices:
        raise ConfigError(f"{seqs_per_step} sequences per step cannot be split over {num_devices} devices "
                          "(train.tokens_per_step / train.seq_len must be a multiple of the device count)")
    per_device = seqs_per_step // num_devices
    micro = min(micro_batch_seqs, per_device)
    if per_device % micro:
        raise ConfigError(f"{per_device} sequences per device per step is not a multiple of "
                          f"train.micro_batch_seqs={micro}")
    global_micro = micro * num_devices
    if global_micro % process_count:
        raise ConfigError(f"a micro-batch of {global_micro} sequences cannot be split over {process_count} processes")
    return global_micro, seqs_per_step // global_micro


def step_batch(loader, seqs_per_step: int, accum: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One step's rows of this process as [accum, rows / accum, T]: a single chunk of tokens_per_step + 1
    tokens, so the data never depends on how a step is split into devices and micro-batches (and the
    JAX and PyTorch trainers read exactly the same tokens)."""
    x, y = loader.next_batch(seqs_per_step)
    shape = (accum, x.shape[0] // accum, seq_len)
    return x.reshape(shape), y.reshape(shape)
