"""Trainer side of the n-gram bias: the builder process, snapshot swaps between steps, the bias function.

The builder reads only the last `ngram.builder_shards_from_end` training shards; the trainer's stream
is built from the others, so the tables never hold tokens the network trains on (the run log states
both lists). Snapshots swap in between steps as device arrays of fixed shapes: no recompilation, no
stall (a snapshot is loaded only when its version changes, and at most every `poll_seconds`).
With several processes, every process swaps to the newest version that all of them have published,
so all hosts use the same tables at the same step.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from frontier_jax.config import NgramConfig
from frontier_jax.ngram import tables as T
from frontier_jax.ngram.bias import empty_tables, ngram_sparse_bias, tables_to_device
from frontier_jax.ngram.builder import NgramBuilder, shard_usage_text, split_shards_for_builder


def bias_fn(model, x_BT, tables):
    """The model's sparse logit bias from the current tables (called inside the jitted steps)."""
    return ngram_sparse_bias(x_BT, tables, model.ngram_bias[...])


def num_orders(cfg: NgramConfig) -> int:
    return cfg.max_order - cfg.min_order + 1


class NgramRuntime:
    def __init__(self, cfg: NgramConfig, train_files, run_dir: Path, log, replicated, strict: bool = False,
                 poll_seconds: float = 2.0, poll_every_steps: int = 10):
        self.cfg, self.log, self.replicated, self.strict = cfg, log, replicated, strict
        try:
            self.trainer_files, self.builder_files = split_shards_for_builder(train_files, cfg)
        except ValueError as e:
            from frontier_jax.config import ConfigError

            raise ConfigError(str(e)) from None
        log(shard_usage_text(self.trainer_files, self.builder_files))
        self.out_dir = Path(run_dir) / f"ngram-p{jax.process_index()}"
        self.builder = NgramBuilder(cfg, self.builder_files, self.out_dir)
        self.tables = jax.device_put(empty_tables(cfg), replicated)
        self.version = -1
        self.poll_seconds, self.poll_every_steps = poll_seconds, poll_every_steps
        self._last_poll = 0.0
        self.swaps: list[dict] = []

    def start(self) -> "NgramRuntime":
        self.builder.start()
        self.log(f"ngram: builder process {self.builder.pid} started (niceness {self.cfg.builder_niceness})")
        return self

    def _agreed_version(self) -> int | None:
        latest = self.builder.latest_snapshot()
        mine = latest[0] if latest else -1
        if jax.process_count() > 1:
            mine = int(multihost_utils.process_allgather(np.array([mine])).min())
        return mine if mine >= 0 else None

    def poll(self, step: int, force: bool = False) -> bool:
        """Swap in a newer snapshot if there is one; True when the tables changed."""
        now = time.monotonic()
        if jax.process_count() > 1:  # every process must take the same decision (a collective follows)
            if not force and step % self.poll_every_steps:
                return False
        elif not force and now - self._last_poll < self.poll_seconds:
            return False
        self._last_poll = now
        if self.builder.error():
            if self.strict:
                self.builder.raise_if_failed()
            # logged loudly once by the builder; training continues on the last snapshot
        version = self._agreed_version()
        if version is None or version <= self.version:
            return False
        path = self.out_dir / T.snapshot_name(version)
        try:
            snap = T.load_snapshot(path)
        except FileNotFoundError:  # replaced while we looked: take the next one at the next poll
            return False
        self.tables = jax.device_put(tables_to_device(snap, self.cfg.confidence_buckets), self.replicated)
        self.version = version
        info = {"step": step, "version": version, "tokens": snap.header.get("tokens_consumed", 0),
                "complete": snap.header.get("complete")}
        self.swaps.append(info)
        self.log(f"ngram: snapshot v{version} ({info['tokens']:,} tokens, complete={info['complete']}) "
                 f"in use from step {step}")
        return True

    def stop(self) -> None:
        self.builder.stop()
