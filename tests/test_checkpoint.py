"""Checkpoints: exact round trip (params, optimizer state, meta), refusal of another model, no partial checkpoint,
a full disk, a repeated step, corrupt checkpoints."""

import errno
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from frontier_jax import checkpoint, optim
from frontier_jax.config import Config, ModelConfig, NgramConfig, OptimConfig, model_hash
from frontier_jax.model import GPT, build

CFG = ModelConfig(vocab_size=64, num_layers=2, model_dim=32, num_heads=4, num_kv_heads=2)


def _state(seed=0, cfg=CFG):
    """Parameters (bf16 embedding) and an optimizer state after one update, so nothing is trivially zero."""
    graphdef, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(seed), compute_dtype="bfloat16"))
    tx = optim.build_optimizer(OptimConfig(muon_ns_dtype="float32"))
    opt_state = tx.init(params)
    grads = jax.tree_util.tree_map(lambda p: jnp.ones(p.shape, p.dtype), params)
    _, opt_state = tx.update(grads, opt_state, params, lr_scale=jnp.float32(1.0), momentum=jnp.float32(0.9))
    return {"params": params, "opt_state": opt_state}


def _meta(step=3, cfg=CFG):
    return {"step": step, "train_seconds": 1.5, "tokens": 4096, "data": {"shard": 1, "offset": 77, "position_tokens": 4097},
            "model_hash": model_hash(Config(model=cfg)), "reason": "final"}


def _assert_identical(a, b):
    la, lb = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (path, x), (_, y) in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape, path
        assert np.array_equal(np.asarray(x), np.asarray(y)), path


def test_round_trip_is_bit_identical(tmp_path):
    state, meta = _state(), _meta()
    checkpoint.save(tmp_path, 3, state, meta)
    assert checkpoint.latest_step(tmp_path) == 3
    abstract = jax.eval_shape(lambda: state)
    restored, rmeta = checkpoint.restore(tmp_path, abstract, expect_model_hash=model_hash(Config(model=CFG)))
    _assert_identical(restored, state)
    assert restored["params"]["tok_emb"].dtype == jnp.bfloat16
    assert rmeta == meta


def test_latest_step_is_the_newest_and_none_without_checkpoints(tmp_path):
    assert checkpoint.latest_step(tmp_path) is None
    s = _state()
    checkpoint.save(tmp_path, 2, s, _meta(2))
    checkpoint.save(tmp_path, 5, s, _meta(5))
    assert checkpoint.latest_step(tmp_path) == 5 and checkpoint.read_meta(tmp_path)[1]["step"] == 5
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint found"):
        checkpoint.read_meta(tmp_path / "elsewhere")


def test_another_models_checkpoint_is_refused(tmp_path):
    checkpoint.save(tmp_path, 1, _state(), _meta(1))
    other = ModelConfig(vocab_size=64, num_layers=3, model_dim=32, num_heads=4, num_kv_heads=2)
    abstract = jax.eval_shape(lambda: _state(cfg=other))
    with pytest.raises(checkpoint.CheckpointError, match="another model") as e:
        checkpoint.restore(tmp_path, abstract, expect_model_hash=model_hash(Config(model=other)))
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)


def test_a_checkpoint_with_other_ngram_bias_orders_is_refused(tmp_path):
    """Two configs differing only in the n-gram orders have different parameter trees (the bias is
    [orders, buckets]) and different model hashes: the other's checkpoint is refused in one line."""
    def cfg(max_order):
        return Config(model=CFG, ngram=NgramConfig(enabled=True, table_log2_size=4, min_order=2, max_order=max_order))

    a, b = cfg(4), cfg(5)
    assert model_hash(a) != model_hash(b)
    params = lambda c: nnx.split(build(c, "float32"))[1]
    assert params(a)["ngram_bias"].shape == (3, 8) and params(b)["ngram_bias"].shape == (4, 8)
    checkpoint.save(tmp_path, 1, {"params": params(a)}, {**_meta(1), "model_hash": model_hash(a)})
    abstract = jax.eval_shape(lambda: {"params": params(b)})
    with pytest.raises(checkpoint.CheckpointError, match="another model") as e:
        checkpoint.restore(tmp_path, abstract, expect_model_hash=model_hash(b))
    assert "\n" not in str(e.value)
    restored, _ = checkpoint.restore(tmp_path, jax.eval_shape(lambda: {"params": params(a)}),
                                     expect_model_hash=model_hash(a))
    assert restored["params"]["ngram_bias"].shape == (3, 8)


def test_a_failed_save_leaves_no_partial_checkpoint_and_no_temporary_directory(tmp_path):
    good = _state(0)
    checkpoint.save(tmp_path, 1, good, _meta(1))
    bad_meta = {**_meta(2), "unserialisable": object()}  # a bug, not the file system: re-raised as it is
    with pytest.raises(TypeError):
        checkpoint.save(tmp_path, 2, _state(1), bad_meta)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]  # no temporary directory left
    restored, meta = checkpoint.restore(tmp_path, jax.eval_shape(lambda: good))
    _assert_identical(restored, good)
    assert meta["step"] == 1


def test_disk_full_during_a_save_is_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    from orbax.checkpoint._src.handlers import json_checkpoint_handler

    good = _state(0)
    checkpoint.save(tmp_path, 1, good, _meta(1))

    async def no_space(self, x, directory):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", no_space)
    with pytest.raises(checkpoint.CheckpointError, match="disk full") as e:
        checkpoint.save(tmp_path, 2, _state(1), _meta(2))
    assert "\n" not in str(e.value) and "checkpoints/2" in str(e.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]
    monkeypatch.undo()
    restored, meta = checkpoint.restore(tmp_path, jax.eval_shape(lambda: good))
    _assert_identical(restored, good)


def test_saving_an_already_saved_step_is_a_no_op(tmp_path):
    """A stop on a step that already has a periodic checkpoint (orbax would raise StepAlreadyExistsError)."""
    first = _state(0)
    assert checkpoint.save(tmp_path, 2, first, _meta(2)) == tmp_path / "checkpoints" / "2"
    assert checkpoint.save(tmp_path, 2, _state(1), {**_meta(2), "reason": "final"}) is None
    restored, meta = checkpoint.restore(tmp_path, jax.eval_shape(lambda: first))
    _assert_identical(restored, first)


def _corrupt(run_dir, step):
    for f in (run_dir / "checkpoints" / str(step) / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"garbage" * 8)


def test_a_corrupt_newest_checkpoint_falls_back_to_the_older_one_with_one_line(tmp_path):
    good = _state(0)
    checkpoint.save(tmp_path, 1, good, _meta(1))
    checkpoint.save(tmp_path, 2, _state(1), _meta(2))
    _corrupt(tmp_path, 2)
    lines = []
    restored, meta = checkpoint.restore(tmp_path, jax.eval_shape(lambda: good), log=lines.append)
    _assert_identical(restored, good)
    assert meta["step"] == 1
    assert len(lines) == 1 and f"{tmp_path}/checkpoints/2: unreadable checkpoint" in lines[0] and "\n" not in lines[0]
    with pytest.raises(checkpoint.CheckpointError, match="checkpoints/2: unreadable"):  # an explicit step: no fallback
        checkpoint.restore(tmp_path, jax.eval_shape(lambda: good), step=2)
    (tmp_path / "checkpoints" / "1" / "meta" / "metadata").write_text("{not json")
    with pytest.raises(checkpoint.CheckpointError, match="no intact checkpoint") as e:
        checkpoint.restore(tmp_path, jax.eval_shape(lambda: good))
    assert "\n" not in str(e.value) and "steps 2, 1" in str(e.value)


def test_discard_removes_one_step(tmp_path):
    checkpoint.save(tmp_path, 1, _state(0), _meta(1))
    checkpoint.save(tmp_path, 2, _state(0), _meta(2))
    checkpoint.discard(tmp_path, 2)
    assert checkpoint.steps(tmp_path) == [1]


def test_cleanup_after_a_failed_save_tolerates_a_writers_vanishing_files(tmp_path, monkeypatch):
    """A writer still in flight deletes its transient files (TensorStore's ocdbt lock) while the failed
    save's temporary directory is watched: that is not a second failure (seen once under load in CI)."""
    tmp = tmp_path / "checkpoints" / f"4{checkpoint.TMP_SUFFIX}" / "state"
    tmp.mkdir(parents=True)
    (tmp / "manifest.ocdbt.__lock").write_bytes(b"")
    real_stat, seen = type(tmp).stat, []

    def stat(self, *a, **k):
        if self.name == "manifest.ocdbt.__lock":
            seen.append(self)
            if len(seen) > 1:  # there when first looked at, gone at the next look
                self.unlink(missing_ok=True)
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self))
        return real_stat(self, *a, **k)

    monkeypatch.setattr(type(tmp), "stat", stat)
    checkpoint._remove_temporary(tmp_path / "checkpoints", 4, settle_s=0.1, wait_s=2.0)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_a_save_below_a_newer_step_is_an_error_not_a_silent_skip(tmp_path):
    """Round 3, cause 1: with checkpoints/6 on disk, save(4) returned its path and wrote nothing (orbax's
    `should_save` is False when latest_step >= step, and its False return was not checked)."""
    checkpoint.save(tmp_path, 6, _state(0), _meta(6))
    with pytest.raises(checkpoint.CheckpointError, match="checkpoints/4: checkpoint not written: .* later step 6"):
        checkpoint.save(tmp_path, 4, _state(1), _meta(4))
    assert checkpoint.steps(tmp_path) == [6]


def test_a_corrupt_checkpoint_restore_skipped_is_set_aside_and_later_saves_reach_disk(tmp_path):
    """Round 3, cause 1: docs/training.md's fallback (restore skips a corrupt newest checkpoint) left it on disk,
    so every later save up to its step was skipped. Skipped steps are reported; `set_aside` moves them to
    corrupt-checkpoints/, after which a save of step 4 and 6 is written and the newest step restores."""
    good = _state(0)
    checkpoint.save(tmp_path, 3, good, _meta(3))
    checkpoint.save(tmp_path, 6, _state(1), _meta(6))
    (tmp_path / "checkpoints" / "6" / "meta" / "metadata").unlink()  # the reproduction
    skipped, lines = [], []
    _, meta = checkpoint.restore(tmp_path, jax.eval_shape(lambda: good), log=lines.append, skipped_steps=skipped)
    assert meta["step"] == 3 and skipped == [6] and "checkpoints/6" in lines[0]
    moved = checkpoint.set_aside(tmp_path, skipped)
    assert moved == [tmp_path / checkpoint.SET_ASIDE / "6"] and moved[0].is_dir()
    assert checkpoint.save(tmp_path, 4, _state(2), _meta(4)) == tmp_path / "checkpoints" / "4"
    assert checkpoint.save(tmp_path, 6, _state(2), _meta(6)) == tmp_path / "checkpoints" / "6"
    assert checkpoint.steps(tmp_path) == [4, 6]
    restored, meta = checkpoint.restore(tmp_path, jax.eval_shape(lambda: good))
    assert meta["step"] == 6
    _assert_identical(restored, _state(2))


def test_a_missing_step_names_the_steps_saved(tmp_path):
    """Round 3: `evaluate --step 7` of a run without step 7 read 'unreadable ... ([Errno None] None)'."""
    checkpoint.save(tmp_path, 2, _state(0), _meta(2))
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.restore(tmp_path, jax.eval_shape(lambda: _state(0)), step=7)
    assert str(e.value) == f"{tmp_path}/checkpoints/7: no checkpoint of step 7 (steps saved: 2)"


def test_tensorstores_resource_exhausted_is_reported_as_disk_full():
    """Round 3: on a real full disk TensorStore raises ValueError('RESOURCE_EXHAUSTED: ... Failed writing ...
    No space ...') (measured on a 1.5 MB tmpfs), which read as a 200-character TensorStore message."""
    e = ValueError('RESOURCE_EXHAUSTED: Failed writing: "/x/checkpoints/2.orbax-checkpoint-tmp/state/d/96f7": '
                   "Failed to write 3289 bytes to file 11: No space ")
    assert checkpoint._is_environment_failure(e) and checkpoint._first_line(e) == "disk full (ENOSPC)"


@pytest.mark.parametrize("bad, what", [({"step": "3"}, 'step is "3", expected int'),
                                       ({"train_seconds": None}, "train_seconds is null, expected int or float"),
                                       ({"data": {"shard": 0}}, "missing key data.offset"),
                                       ({"step": 4}, "meta step 4")])
def test_checkpoint_meta_is_checked_against_its_schema(tmp_path, bad, what):
    """A string checkpoint `step` gave a traceback (comparing it with max_steps). The meta is checked before
    use; a bad one is an unreadable checkpoint (one line; restore falls back to an older intact one)."""
    state = {"w": jnp.arange(4, dtype=jnp.float32)}
    checkpoint.save(tmp_path, 1, state, _meta(step=1))
    checkpoint.save(tmp_path, 3, state, {**_meta(), **bad})
    with pytest.raises(checkpoint.CheckpointError, match="unreadable checkpoint") as e:
        checkpoint.read_meta(tmp_path, 3)
    assert what in str(e.value) and "\n" not in str(e.value)
    skipped = []
    _, meta = checkpoint.restore(tmp_path, jax.eval_shape(lambda: state), log=skipped.append)
    assert meta["step"] == 1 and "checkpoints/3: unreadable checkpoint" in skipped[0]
