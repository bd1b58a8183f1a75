"""The n-gram builder: a separate process (spawn) that reads training shards and publishes snapshots.

The trainer gives the builder the last `builder_shards_from_end` training shards
(`split_shards_for_builder`) and never reads them itself, so the tables never contain tokens the
network trains on. The child process sets its niceness, streams the shards in order through
`NgramTables`, and every `snapshot_every_tokens` tokens (and at the end) publishes
out_dir/snap_<version> through a temporary directory renamed into place, keeping the newest `keep`.
It ignores SIGINT (the trainer decides when to stop), exits when asked between chunks or when its
parent disappears, and on any error writes out_dir/builder_error.txt before exiting with code 1.
`stop()` (also on context exit and interpreter exit) ends the process - politely, then terminate,
then kill - and removes leftover temporary directories. Only published snapshots remain.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import shutil
import signal
import time
import traceback
import weakref
from pathlib import Path

from frontier_jax.data.files import atomic_write_text
from frontier_jax.data.shards import shard_token_count
from frontier_jax.ngram import snapshot as S
from frontier_jax.ngram import tables as T

log = logging.getLogger(__name__)
ERROR_FILE = "builder_error.txt"
_LIVE: "weakref.WeakSet[NgramBuilder]" = weakref.WeakSet()


def split_shards_for_builder(train_files, cfg) -> tuple[list[Path], list[Path]]:
    """(trainer_files, builder_files): the builder takes the last cfg.builder_shards_from_end files."""
    files = [Path(f) for f in train_files]
    k = int(cfg.builder_shards_from_end)
    if k < 1:
        raise ValueError(f"ngram.builder_shards_from_end must be >= 1, got {k}")
    if k >= len(files):
        raise ValueError(_too_few_shards(files, k))
    trainer, builder = files[:-k], files[-k:]
    assert_disjoint(trainer, builder)
    return trainer, builder


def _too_few_shards(files: list[Path], k: int) -> str:
    """The one line for a train split the builder would take whole, with the remedies: more, smaller shards (the
    --shard-tokens that gives the trainer three of them) or no n-gram bias."""
    where = f"{files[0].parent}: " if files else ""
    try:
        total = sum(shard_token_count(f) for f in files)
    except (OSError, ValueError):
        total = 0
    size = f" {-(-total // (k + 3))}" if total else " N"
    return (f"{where}ngram.builder_shards_from_end={k} leaves the trainer no shards ({len(files)} train shard(s); the "
            f"n-gram builder reads the last {k} on its own): prepare the data in more, smaller shards "
            f"(python -m frontier_jax.data.prepare ... --shard-tokens{size}"
            + (f", {k + 3} shards of its {total:,} train tokens" if total else "") + ") or train without the bias "
            "(--set ngram.enabled=False)")


def assert_disjoint(trainer_files, builder_files) -> None:
    """ValueError if a shard (by resolved path) is used by both the trainer and the builder."""
    shared = sorted({Path(f).resolve() for f in trainer_files} & {Path(f).resolve() for f in builder_files})
    if shared:
        raise ValueError(f"n-gram builder and trainer share shards: {', '.join(str(p) for p in shared)}")


def shard_usage_text(trainer_files, builder_files) -> str:
    """Run-log lines stating which shards each side reads."""
    t = [Path(f).name for f in trainer_files]
    b = [Path(f).name for f in builder_files]
    return (
        f"ngram: trainer reads {len(t)} shards ({t[0]} .. {t[-1]}); "
        f"builder reads {len(b)} shards from the far end ({', '.join(b)}); disjoint: yes"
    )


def cleanup_temp(out_dir) -> int:
    """Remove unpublished temporary snapshot directories in out_dir; return how many."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return 0
    stale = [p for p in out_dir.iterdir() if p.name.startswith(S.TMP_PREFIX)]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return len(stale)


class NgramBuilder:
    """Owns the builder process; use as a context manager or call start()/stop()."""

    def __init__(self, cfg, shard_files, out_dir, *, chunk_tokens: int = 1 << 20, keep: int = 2):
        T.check_memory(cfg)
        if int(getattr(cfg, "builder_processes", 1)) != 1:
            raise ValueError(f"ngram.builder_processes={cfg.builder_processes} is not supported yet (one process builds all orders)")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.cfg = cfg
        self.shard_files = [Path(f) for f in shard_files]
        if not self.shard_files:
            raise ValueError("NgramBuilder needs at least one shard file")
        self.out_dir = Path(out_dir)
        self.chunk_tokens = chunk_tokens
        self.keep = keep
        self._ctx = mp.get_context("spawn")
        self._stop = None
        self._proc = None
        self._reported = False
        self._exitcode = None  # after stop()

    def start(self) -> "NgramBuilder":
        if self._proc is not None:
            raise RuntimeError("NgramBuilder already started")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / ERROR_FILE).unlink(missing_ok=True)
        cleanup_temp(self.out_dir)
        self._stop = self._ctx.Event()
        args = (self.cfg, [str(f) for f in self.shard_files], str(self.out_dir), self._stop, os.getpid(), self.chunk_tokens, self.keep)
        self._proc = self._ctx.Process(target=_builder_main, args=args, name="ngram-builder", daemon=True)
        self._proc.start()
        _LIVE.add(self)
        log.info("ngram builder started (pid %d) on %d shards -> %s", self._proc.pid, len(self.shard_files), self.out_dir)
        return self

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def done(self) -> bool:
        """True once the process finished every shard and published its final snapshot."""
        return self._proc is not None and not self._proc.is_alive() and self._proc.exitcode == 0

    def error(self) -> str | None:
        """The builder's failure (logged loudly once), or None while it runs or after it succeeded."""
        if self._proc is None and self._exitcode is None:
            return None
        msg = None
        err_file = self.out_dir / ERROR_FILE
        if err_file.exists():
            msg = err_file.read_text()
        elif self._proc is not None and not self._proc.is_alive() and self._proc.exitcode != 0:
            msg = f"ngram builder process exited with code {self._proc.exitcode}"
        if msg and not self._reported:
            self._reported = True
            log.error("NGRAM BUILDER FAILED; training continues on the last snapshot:\n%s", msg)
        return msg

    def raise_if_failed(self) -> None:
        """Strict mode: RuntimeError when the builder failed."""
        msg = self.error()
        if msg:
            raise RuntimeError(f"ngram builder failed: {msg.strip().splitlines()[-1]}")

    def latest_snapshot(self) -> tuple[int, Path] | None:
        snaps = S.list_snapshots(self.out_dir)
        return snaps[-1] if snaps else None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the process to finish; True when it has."""
        if self._proc is None:
            return True
        self._proc.join(timeout)
        return not self._proc.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """End the process (event, then SIGTERM, then SIGKILL) and remove temporary directories."""
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        if proc.is_alive():
            self._stop.set()
            proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
        self._exitcode = proc.exitcode
        proc.close()
        cleanup_temp(self.out_dir)

    def __enter__(self) -> "NgramBuilder":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for b in list(_LIVE):
        b.stop(timeout=2.0)


# ----------------------------------------------------------------------------- child process


def _builder_main(cfg, shard_files, out_dir, stop_event, parent_pid, chunk_tokens, keep) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out_dir = Path(out_dir)
    try:
        if cfg.builder_niceness:
            os.nice(int(cfg.builder_niceness))
        _build(cfg, [Path(f) for f in shard_files], out_dir, stop_event, parent_pid, chunk_tokens, keep)
    except BaseException:
        text = f"ngram builder (pid {os.getpid()}) failed:\n{traceback.format_exc()}"
        atomic_write_text(out_dir / ERROR_FILE, text)  # renamed into place, never through a symlink
        cleanup_temp(out_dir)
        raise SystemExit(1)


def _build(cfg, shard_files, out_dir, stop_event, parent_pid, chunk_tokens, keep) -> None:
    from frontier_jax.data.shards import read_shard

    tables = T.NgramTables.from_config(cfg, chunk_tokens=chunk_tokens)
    version = max((v for v, _ in S.list_snapshots(out_dir)), default=0)
    next_snap = cfg.snapshot_every_tokens
    t0 = time.perf_counter()

    def publish(complete: bool) -> None:
        nonlocal version
        version += 1
        extra = {"build_seconds": round(time.perf_counter() - t0, 3)}
        S.write_snapshot(tables, out_dir, version, complete, extra)
        for _, old in S.list_snapshots(out_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    for path in shard_files:
        tokens = read_shard(path)
        entry = {"file": str(path), "start": 0, "stop": 0, "shard_tokens": int(tokens.size)}
        tables.sources.append(entry)
        for start in range(0, tokens.size, chunk_tokens):
            if stop_event.is_set() or os.getppid() != parent_pid:
                return
            stop = min(start + chunk_tokens, tokens.size)
            tables.consume(tokens[start:stop])
            entry["stop"] = stop
            if tables.tokens_consumed >= next_snap:
                publish(complete=False)
                next_snap = tables.tokens_consumed + cfg.snapshot_every_tokens
    publish(complete=True)
