"""Orbax behind three functions: save, restore, latest_step.

A checkpoint is `<run>/checkpoints/<step>/` holding `state` (parameters and optimizer state, orbax
StandardSave) and `meta` (JSON: step, data position, elapsed training time, model hash, config).
Orbax writes each step into a temporary directory and renames it when complete, so a crash or a full
disk never leaves a half-written checkpoint that `latest_step` would pick up.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from frontier_jax.data.shards import DataError


class CheckpointError(DataError):
    """A checkpoint that cannot be used (missing, another model, unreadable)."""


def _manager(run_dir: Path, keep: int = 2) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=False,
        preservation_policy=ocp.checkpoint_managers.LatestN(keep),
        create=True,
    )
    return ocp.CheckpointManager(Path(run_dir).absolute() / "checkpoints", options=options)


def save(run_dir: Path, step: int, state, meta: dict) -> Path:
    """Save `state` (a pytree of arrays) and `meta` (JSON) as checkpoint `step`; returns its directory."""
    logging.getLogger("absl").setLevel(logging.WARNING)
    with _manager(run_dir) as mngr:
        mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                  force=True)
        mngr.wait_until_finished()
    return Path(run_dir) / "checkpoints" / str(step)


def latest_step(run_dir: Path) -> int | None:
    ckpt = Path(run_dir) / "checkpoints"
    if not ckpt.is_dir():
        return None
    with _manager(run_dir) as mngr:
        return mngr.latest_step()


def read_meta(run_dir: Path, step: int | None = None) -> tuple[int, dict]:
    step = latest_step(run_dir) if step is None else step
    if step is None:
        raise CheckpointError(f"{run_dir}: no checkpoint found (expected {run_dir}/checkpoints/<step>/)")
    with _manager(run_dir) as mngr:
        out = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return step, dict(out["meta"])


def restore(run_dir: Path, abstract_state, step: int | None = None, expect_model_hash: str | None = None):
    """Restore (state, meta). `abstract_state` gives shapes/dtypes (e.g. jax.eval_shape of the init).

    A checkpoint whose model hash differs from `expect_model_hash` is refused before any array is read.
    """
    step, meta = read_meta(run_dir, step)
    if expect_model_hash is not None and meta.get("model_hash") != expect_model_hash:
        raise CheckpointError(
            f"{run_dir}/checkpoints/{step}: checkpoint is from another model "
            f"(model hash {meta.get('model_hash')} != {expect_model_hash}; model {meta.get('model')})")
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_state)
    try:
        with _manager(run_dir) as mngr:
            out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise CheckpointError(f"{run_dir}/checkpoints/{step}: cannot restore: {str(e).splitlines()[0]}") from None
    return out["state"], meta
