"""Orbax behind a few functions: save, restore (with fallback to the newest intact checkpoint), steps,
discard.

A checkpoint is `<run>/checkpoints/<step>/` holding `state` (parameters and optimizer state, orbax
StandardSave) and `meta` (JSON: step, data position, elapsed training time, model hash, config).
Orbax writes each step into a temporary directory and renames it when complete, so a crash never
leaves a half-written checkpoint that `latest_step` would pick up; a failed save (a full disk)
removes its temporary directory and is reported in one line. Saving a step that is already saved
is a no-op (a stop on a step that already has a periodic checkpoint); a save that orbax declines
(a newer step exists) is an error, never a silent skip. A checkpoint that cannot be read (a corrupt
file) is skipped by `restore` with one line naming it, in favour of the next older; the trainer then
moves it aside (`set_aside`, to `<run>/corrupt-checkpoints/`) so the run's later saves of those
steps reach disk and its newest checkpoint is one that restores.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import shutil
import sys
import time
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from frontier_jax.data.files import NUMBER, UnsafeFile, check_schema, within
from frontier_jax.data.shards import DataError
from frontier_jax.errors import describe_os_error

SET_ASIDE = "corrupt-checkpoints"  # <run>/corrupt-checkpoints/<step>[-n]: checkpoints restore could not read
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's temporary directory marker (orbax/checkpoint/_src/path/atomicity_types.py)


# what a checkpoint's meta holds (trainer.JaxTrainer.save, interop import), checked before any use
META_SCHEMA = {"step": int, "train_seconds": NUMBER, "tokens": int, "data": {"shard": int, "offset": int},
               "model_hash": str, "late_qat_step?": (int, type(None))}


class CheckpointError(DataError):
    """A checkpoint that cannot be used or written (missing, another model, unreadable, disk full)."""


class _OtherModel(CheckpointError):
    """Not a corrupt checkpoint: a different model. Never skipped in favour of an older one."""


@contextlib.contextmanager
def _quiet():
    """Orbax logs every failed read at ERROR through absl, and a failed read leaves coroutines whose
    exceptions Python would print when they are collected: both are silenced here (collected before
    leaving), as the caller reports the failure in one line."""
    absl, aio = logging.getLogger("absl"), logging.getLogger("asyncio")  # asyncio: "Task exception was never retrieved"
    levels, hook = (absl.level, aio.level), sys.unraisablehook
    absl.setLevel(logging.CRITICAL)
    aio.setLevel(logging.CRITICAL)
    sys.unraisablehook = lambda unraisable: None
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = hook
        absl.setLevel(levels[0])
        aio.setLevel(levels[1])


def _manager(run_dir: Path, keep: int = 2) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=False,
        preservation_policy=ocp.checkpoint_managers.LatestN(keep),
        create=True,
    )
    return ocp.CheckpointManager(Path(run_dir).absolute() / "checkpoints", options=options)


def _first_line(e: BaseException) -> str:
    if isinstance(e, OSError):
        return describe_os_error(OSError(e.errno, e.strerror))  # the path is orbax's temporary one
    if _is_disk_full(e):  # TensorStore reports ENOSPC as RESOURCE_EXHAUSTED in a ValueError
        return "disk full (ENOSPC)"
    text = str(e).split(" See full TensorStore details")[0].strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _is_disk_full(e: BaseException) -> bool:
    text = str(e)
    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left" in text or (
        "RESOURCE_EXHAUSTED" in text and ("Failed writing" in text or "Failed to write" in text))


def _is_environment_failure(e: BaseException) -> bool:
    """An I/O failure of the file system (disk full, permissions), also as TensorStore reports it."""
    if isinstance(e, OSError):
        return True
    text = str(e)
    return _is_disk_full(e) or any(s in text for s in ("Permission denied", "Read-only file system", "Disk quota"))


def steps(run_dir: Path) -> list[int]:
    """The committed checkpoint steps of a run, oldest first (temporary directories are not listed)."""
    if not (Path(run_dir) / "checkpoints").is_dir():
        return []
    with _manager(run_dir) as mngr:
        return sorted(mngr.all_steps())


def latest_step(run_dir: Path) -> int | None:
    found = steps(run_dir)
    return found[-1] if found else None


def save(run_dir: Path, step: int, state, meta: dict) -> Path | None:
    """Save `state` (a pytree of arrays) and `meta` (JSON) as checkpoint `step`; returns its directory, or
    None when that step is already saved (the state of a step is the same whenever it is saved).

    A write that fails on the file system (disk full, permissions) removes its temporary directory,
    leaves the older checkpoints as they were and raises CheckpointError in one line.
    """
    logging.getLogger("absl").setLevel(logging.WARNING)
    ckpt_dir = within(run_dir, Path(run_dir) / "checkpoints")  # a symlink out of the run is refused
    # Already saved: orbax renames a step's directory into place only once it is complete, and every
    # process returns from a save only after all have finished it, so all see the same answer here.
    # (Listing through `steps` would open a CheckpointManager, whose creation is a collective, on only
    # the processes that already see `checkpoints/` - a race with the first save's mkdir.)
    if (ckpt_dir / str(step)).is_dir():
        return None
    newer = [s for s in _step_dirs(ckpt_dir) if s > step]
    if newer:  # orbax would decline the save (should_save is False when latest_step >= step)
        raise CheckpointError(f"{ckpt_dir / str(step)}: checkpoint not written: {ckpt_dir} already holds the "
                              f"later step {newer[-1]} (move it aside or resume from it)")
    try:
        with _quiet(), _manager(run_dir) as mngr:
            saved = mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                            meta=ocp.args.JsonSave(meta)))
            mngr.wait_until_finished()
    except Exception as e:
        _remove_temporary(ckpt_dir, step)
        if _is_environment_failure(e):
            raise CheckpointError(f"{ckpt_dir / str(step)}: checkpoint not written ({_first_line(e)}); "
                                  f"the older checkpoints are intact") from None
        raise
    if not saved or not (ckpt_dir / str(step)).is_dir():
        raise CheckpointError(f"{ckpt_dir / str(step)}: checkpoint not written (orbax declined the save; "
                              f"steps on disk: {_step_dirs(ckpt_dir)})")
    return ckpt_dir / str(step)


def _step_dirs(ckpt_dir: Path) -> list[int]:
    """The step directories in `ckpt_dir` by name (no CheckpointManager: see `save`), oldest first."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit() and p.is_dir())


def set_aside(run_dir: Path, steps_to_move) -> list[Path]:
    """Move the given (unreadable) checkpoint steps to `<run>/corrupt-checkpoints/<step>` (a `-n` suffix
    when that exists); returns where each went. The run's history is then consistent: later saves of
    those steps are written, and the newest checkpoint is one that restores."""
    run_dir, moved = Path(run_dir), []
    for step in steps_to_move:
        src = run_dir / "checkpoints" / str(step)
        if not src.is_dir():
            continue
        dst_dir = within(run_dir, run_dir / SET_ASIDE)
        dst_dir.mkdir(exist_ok=True)
        dst, n = dst_dir / str(step), 1
        while dst.exists():
            dst, n = dst_dir / f"{step}-{n}", n + 1
        src.rename(dst)
        moved.append(dst)
    return moved


def _remove_temporary(ckpt_dir: Path, step: int, settle_s: float = 0.3, wait_s: float = 10.0) -> None:
    """Remove a failed save's temporary directory. The writes of its other items may still be in flight
    when the first one fails: wait until nothing in it changes for `settle_s` (at most `wait_s`), so no
    writer finds its files gone; their own failures, logged by orbax at ERROR, are silenced, as the
    failure is reported in one line."""
    logging.getLogger("absl").setLevel(logging.CRITICAL)

    def size(f: Path) -> int:
        try:
            return f.stat().st_size
        except FileNotFoundError:  # a writer's transient file (e.g. TensorStore's ocdbt lock) just went away
            return -1

    def snapshot():
        try:
            return {(str(f), size(f)) for f in ckpt_dir.glob(f"{step}{TMP_SUFFIX}*/**/*")}
        except FileNotFoundError:  # a directory went away while it was listed: still changing
            return None

    deadline = time.monotonic() + wait_s
    while True:  # a writer still in flight may recreate what was removed: repeat until it stays gone
        last, quiet_since = None, time.monotonic()
        while time.monotonic() < deadline:
            now = snapshot()
            if now != last:
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= settle_s:
                break
            time.sleep(0.05)
        for tmp in ckpt_dir.glob(f"{step}{TMP_SUFFIX}*"):
            shutil.rmtree(tmp, ignore_errors=True)
        time.sleep(settle_s)
        if not any(ckpt_dir.glob(f"{step}{TMP_SUFFIX}*")) or time.monotonic() >= deadline:
            return


def discard(run_dir: Path, step: int) -> None:
    """Delete checkpoint `step` (one whose parameters proved unusable, e.g. after a diverging update)."""
    with _manager(run_dir) as mngr:
        mngr.delete(step)


def read_meta(run_dir: Path, step: int | None = None) -> tuple[int, dict]:
    step = latest_step(run_dir) if step is None else step
    if step is None:
        raise CheckpointError(f"{run_dir}: no checkpoint found (expected {run_dir}/checkpoints/<step>/)")
    if not (Path(run_dir) / "checkpoints" / str(step)).is_dir():
        have = ", ".join(str(s) for s in steps(run_dir)) or "none"
        raise CheckpointError(f"{run_dir}/checkpoints/{step}: no checkpoint of step {step} (steps saved: {have})")
    try:
        with _quiet(), _manager(run_dir) as mngr:
            out = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    except Exception as e:  # orbax and TensorStore raise many types (plain Exception included) for a bad file
        raise CheckpointError(f"{run_dir}/checkpoints/{step}: unreadable checkpoint ({_first_line(e)})") from None
    meta = out["meta"]
    try:
        check_schema(meta, META_SCHEMA, "meta")
    except UnsafeFile as e:  # as unreadable: restore falls back to the next older checkpoint
        raise CheckpointError(f"{run_dir}/checkpoints/{step}: unreadable checkpoint ({e})") from None
    if meta["step"] != step or min(meta["tokens"], meta["train_seconds"], meta["data"]["shard"],
                                   meta["data"]["offset"]) < 0:
        raise CheckpointError(f"{run_dir}/checkpoints/{step}: unreadable checkpoint (meta step {meta['step']}, "
                              f"tokens {meta['tokens']}, train_seconds {meta['train_seconds']}, data {meta['data']})")
    return step, dict(meta)


def _restore_one(run_dir: Path, step: int, abstract, expect_model_hash: str | None):
    step, meta = read_meta(run_dir, step)
    if expect_model_hash is not None and meta.get("model_hash") != expect_model_hash:
        raise _OtherModel(
            f"{run_dir}/checkpoints/{step}: checkpoint is from another model "
            f"(model hash {meta.get('model_hash')} != {expect_model_hash}; model {meta.get('model')})")
    try:
        with _quiet(), _manager(run_dir) as mngr:
            out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    except Exception as e:  # TensorStore reports a corrupt chunk as a plain Exception
        raise CheckpointError(f"{run_dir}/checkpoints/{step}: unreadable checkpoint ({_first_line(e)})") from None
    return out["state"], meta


def restore(run_dir: Path, abstract_state, step: int | None = None, expect_model_hash: str | None = None,
            log=None, skipped_steps: list | None = None):
    """Restore (state, meta). `abstract_state` gives shapes/dtypes/shardings (e.g. jax.eval_shape of the init).

    step None: the newest checkpoint that can be read; each unreadable newer one is skipped with one
    line through `log` naming it (and its step appended to `skipped_steps`). A checkpoint whose model hash differs from `expect_model_hash` is
    refused before any array is read (never skipped). No readable checkpoint: CheckpointError.
    """
    run_dir = Path(run_dir)
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_state)
    if step is not None:
        return _restore_one(run_dir, step, abstract, expect_model_hash)
    candidates = steps(run_dir)[::-1]
    if not candidates:
        raise CheckpointError(f"{run_dir}: no checkpoint found (expected {run_dir}/checkpoints/<step>/)")
    skipped = []
    for s in candidates:
        try:
            out = _restore_one(run_dir, s, abstract, expect_model_hash)
        except _OtherModel:
            raise
        except CheckpointError as e:
            skipped.append((s, str(e)))
            continue
        for bad, why in skipped:  # logged only when an older one is used: otherwise the error says it all
            if log is not None:
                log(f"skipped {why}")
            if skipped_steps is not None:
                skipped_steps.append(bad)
        return out
    steps_text = ", ".join(str(s) for s, _ in skipped)
    raise CheckpointError(f"{run_dir}: no intact checkpoint (unreadable: steps {steps_text}; newest: "
                          f"{skipped[0][1].split(': ', 1)[1]}); the run cannot be resumed or evaluated")
