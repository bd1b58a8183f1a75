"""Trainer side of the n-gram bias: the builder process, snapshot swaps between steps, the bias function.

The builder reads only the last `ngram.builder_shards_from_end` training shards; the trainer's stream
is built from the others, so the tables never hold tokens the network trains on (the run log states
both lists, and <run>/ngram-p<i>/runtime.json records them with every swap). Snapshots swap in between
steps as device arrays of fixed shapes: no recompilation (a snapshot is read only when its version
changes, at most every `poll_seconds`, and prepared on a background thread; the times are logged).
With several processes, every process swaps to the newest version that all of them have published,
synchronously, so all hosts use the same tables at the same step. A builder failure is written to the run log loudly and training continues
on the last snapshot; with `ngram.strict` the run stops with the builder's error instead.
`finish()` stops the builder at the end of the budget and swaps in the newest snapshot it published,
so the final evaluation uses tables built within the budget, and runtime.json names that snapshot.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from frontier_jax.config import NgramConfig
from frontier_jax.run.interface import RunHook
from frontier_jax.data.files import atomic_write_text, within
from frontier_jax.errors import BadInput
from frontier_jax.ngram import snapshot as S
from frontier_jax.ngram.bias import DeviceTables, empty_tables, host_arrays, ngram_sparse_bias
from frontier_jax.ngram.builder import NgramBuilder, shard_usage_text, split_shards_for_builder

RECORD_FILE = "runtime.json"


class NgramBuilderFailed(BadInput):
    """The builder process failed and `ngram.strict` is set."""


def bias_fn(model, x_BT, tables):
    """The model's sparse logit bias from the current tables (called inside the jitted steps)."""
    return ngram_sparse_bias(x_BT, tables, model.ngram_bias[...])


def ngram_dir(run_dir, process_index: int = 0) -> Path:
    """Where process `process_index` of a run keeps its snapshots and runtime.json."""
    return Path(run_dir) / f"ngram-p{process_index}"


class NullNgram(RunHook):
    """The n-gram runtime when `ngram.enabled` is off: no tables, no bias, every train shard the trainer's."""

    tables = None
    bias_fn = None

    def __init__(self, train_files):
        self.trainer_files = list(train_files)


def for_config(cfg: NgramConfig, train_files, run_dir: Path, log, replicated) -> "NgramRuntime | NullNgram":
    """The run hook of the n-gram runtime (the null one when `ngram.enabled` is off)."""
    if not cfg.enabled:
        return NullNgram(train_files)
    return NgramRuntime(cfg, train_files, run_dir, log, replicated)


class NgramRuntime(RunHook):
    """The builder process and the tables the trainer uses, as a run hook (frontier_jax.run.interface): the
    builder starts with the timed budget (its time counts against it), new snapshots are swapped in
    before steps, it stops at the end of the budget (the final evaluation uses the newest snapshot it
    published), and it is stopped whatever happens."""

    @property
    def bias_fn(self):
        """The model's sparse logit bias (the module's `bias_fn`, looked up when the steps are built)."""
        return bias_fn

    def __init__(self, cfg: NgramConfig, train_files, run_dir: Path, log, replicated,
                 poll_seconds: float = 2.0, poll_every_steps: int = 10):
        self.cfg, self.log, self.replicated = cfg, log, replicated
        self.strict = cfg.strict
        try:
            self.trainer_files, self.builder_files = split_shards_for_builder(train_files, cfg)
        except ValueError as e:
            from frontier_jax.config import ConfigError

            raise ConfigError(str(e)) from None
        log(shard_usage_text(self.trainer_files, self.builder_files))
        self.run_dir = Path(run_dir)
        self.out_dir = within(run_dir, ngram_dir(run_dir, jax.process_index()))  # never a symlink out of the run
        chunk = max(1024, min(1 << 20, int(cfg.snapshot_every_tokens)))  # snapshots fall between chunks
        self.builder = NgramBuilder(cfg, self.builder_files, self.out_dir, chunk_tokens=chunk)
        self.tables = jax.device_put(empty_tables(cfg), replicated)
        self.version = -1
        self.skipped_version = -1  # the newest snapshot that failed to load (not retried)
        self.poll_seconds, self.poll_every_steps = poll_seconds, poll_every_steps
        self._last_poll = 0.0
        self._failure_logged = False
        self._builder_pid = None
        self.background = jax.process_count() == 1  # prepare snapshots on a thread (see poll)
        self._pool = None
        self._pending = None  # (version, future) being prepared
        self.swaps: list[dict] = []
        self.final: dict | None = None

    def start(self) -> "NgramRuntime":
        self.builder.start()
        self._builder_pid = self.builder.pid
        self.log(f"ngram: builder process {self.builder.pid} started (niceness {self.cfg.builder_niceness}) "
                 f"-> {self.out_dir}")
        self._record()
        return self

    def _agreed_version(self) -> int | None:
        latest = self.builder.latest_snapshot()
        mine = latest[0] if latest else -1
        if jax.process_count() > 1:
            mine = int(multihost_utils.process_allgather(np.array([mine])).min())
        return mine if mine >= 0 else None

    def check_builder(self) -> str | None:
        """The builder's failure (written to the run log once), or None; raises in strict mode."""
        msg = self.builder.error()
        if msg and not self._failure_logged:
            self._failure_logged = True
            where = "stopping (ngram.strict)" if self.strict else f"training continues on snapshot v{self.version}"
            self.log("!" * 72 + f"\nNGRAM BUILDER FAILED; {where}:\n{msg.rstrip()}\n" + "!" * 72)
            self._record()
        if msg and self.strict:
            raise NgramBuilderFailed(f"ngram builder failed (ngram.strict): {msg.strip().splitlines()[-1]}")
        return msg

    def poll(self, step: int, force: bool = False) -> bool:
        """Swap in a newer snapshot if there is one; True when the tables changed.

        Single process: a new snapshot is read and converted on a background thread (numpy, which
        releases the GIL) and swapped in at the first poll after it is ready, so the loop never waits
        for the disk or the conversion. Several processes (or force=True): synchronous, so every
        process swaps the same version at the same step."""
        now = time.monotonic()
        if jax.process_count() > 1:  # every process must take the same decision (a collective follows)
            if not force and step % self.poll_every_steps:
                return False
        elif not force and now - self._last_poll < self.poll_seconds:
            return False
        self._last_poll = now
        self.check_builder()
        changed = False
        if self._pending is not None and (force or self._pending[1].done()):
            (version, future), self._pending = self._pending, None
            changed = self._install(step, version, future)
        if self._pending is not None:
            return changed
        version = self._agreed_version()
        if version is None or version <= max(self.version, self.skipped_version):
            return changed
        if self.background and not force:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ngram-snapshot")
            self._pending = (version, self._pool.submit(self._prepare, version))
            return changed
        return self._install(step, version, None) or changed

    def _prepare(self, version: int):
        """(header, host DeviceTables, seconds): read a snapshot and convert it, numpy only."""
        t0 = time.perf_counter()
        snap = S.load_snapshot(self.out_dir / S.snapshot_name(version))
        fp_OK, top_OK, conf_OK = host_arrays(snap.rows_OK4, self.cfg.confidence_buckets)
        return snap.header, DeviceTables(fp_OK, top_OK, conf_OK, snap.min_order), time.perf_counter() - t0

    def _install(self, step: int, version: int, future) -> bool:
        try:
            header, host_tables, prepare_s = future.result() if future is not None else self._prepare(version)
        except FileNotFoundError:  # replaced while we looked: take the next one at the next poll
            return False
        except Exception as e:  # a snapshot that cannot be loaded (truncated, foreign): never the end of the run
            self.skipped_version = version
            first = (str(e).splitlines() or [""])[0][:200]
            self.log(f"ngram: WARNING snapshot v{version} could not be loaded ({type(e).__name__}: {first}); "
                     + ("stopping (ngram.strict)" if self.strict else f"skipped, training continues on snapshot "
                        f"v{self.version}" if self.version >= 0 else "skipped, training continues without tables"))
            self._record()
            if self.strict:
                raise NgramBuilderFailed(f"{self.out_dir / S.snapshot_name(version)}: snapshot could not be loaded "
                                         f"({type(e).__name__}: {first})") from None
            return False
        t0 = time.perf_counter()
        self.tables = jax.block_until_ready(jax.device_put(host_tables, self.replicated))
        self.version = version
        info = {"step": step, "version": version, "tokens": header.get("tokens_consumed", 0),
                "complete": header.get("complete"), "prepare_seconds": round(prepare_s, 4),
                "background": future is not None, "swap_seconds": round(time.perf_counter() - t0, 4)}
        self.swaps.append(info)
        where = "background" if future is not None else "in the loop"
        self.log(f"ngram: snapshot v{version} ({info['tokens']:,} tokens, complete={info['complete']}) in use from "
                 f"step {step} (prepared {where} in {prepare_s * 1e3:.0f} ms, swap {info['swap_seconds'] * 1e3:.0f} ms)")
        self._record()
        return True

    def finish(self, step: int) -> None:
        """End of the budget: stop the builder, then use the newest snapshot it published."""
        self.builder.stop()
        self.check_builder()
        self.poll(step, force=True)
        self.final = {"step": step, "version": self.version,  # the snapshot relative to runtime.json's directory
                      "snapshot": S.snapshot_name(self.version) if self.version >= 0 else None}
        if self.version < 0:
            self.log("ngram: WARNING no snapshot was published within the budget; the bias was never active")
        else:
            self.log(f"ngram: final evaluation uses snapshot v{self.version} ({self.swaps[-1]['tokens']:,} tokens)")
        self._record()

    def on_start(self, state) -> None:
        self.start()

    def before_step(self, state) -> None:
        self.poll(state.step)

    def on_end(self, state) -> None:
        self.finish(state.step)

    def close(self) -> None:
        self.stop()

    def stop(self) -> None:
        self.builder.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._pending = None, None
        self._record()

    def _record(self) -> None:
        record = {  # what the tables are built from, and their size: the rules' eval-state check reads these
            "built_from": "train shards", "table_bytes": self.cfg.table_bytes,
            "trainer_shards": [str(f) for f in self.trainer_files],
            "builder_shards": [str(f) for f in self.builder_files],
            "builder_pid": self._builder_pid, "strict": self.strict, "swaps": self.swaps, "final": self.final,
            "builder_error": self.builder.error() if self._failure_logged else None,
        }
        atomic_write_text(self.out_dir / RECORD_FILE, json.dumps(record, indent=1), root=self.run_dir)
