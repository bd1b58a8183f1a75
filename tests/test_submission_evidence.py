"""The TTT log contract (ttt.jsonl: score before update, one left-to-right pass) and the n-gram record."""

import json

import pytest

from frontier_jax.submission import evidence
from frontier_jax.submission.evidence import TTTLogError, read_ttt_log, ttt_order


def _log(tmp_path, *events):
    keys = ("chunk", "event", "first_target", "last_target")
    (tmp_path / evidence.TTT_LOG).write_text("".join(json.dumps(dict(zip(keys, e))) + "\n" for e in events))
    return read_ttt_log(tmp_path)


def test_score_first_ttt_passes(tmp_path):
    o = ttt_order(_log(tmp_path, (0, "score", 0, 99), (0, "train", 0, 99), (1, "score", 100, 199),
                       (1, "train", 50, 199), (2, "score", 200, 249)))
    assert (o.events, o.chunks, o.order_violations, o.pass_violations) == (5, 3, [], [])


def test_scoring_after_training_fails(tmp_path):
    o = ttt_order(_log(tmp_path, (0, "train", 0, 99), (0, "score", 0, 99)))
    assert len(o.order_violations) == 2  # trained before scored, and scored after training on it
    assert "chunk 0 is trained on before it is scored" in o.order_violations[0]
    assert "scores targets 0..99 after training on 0..99" in o.order_violations[1]
    assert f"{evidence.TTT_LOG}:2" in o.order_violations[1]


def test_training_on_targets_not_yet_scored_fails(tmp_path):
    o = ttt_order(_log(tmp_path, (0, "score", 0, 99), (0, "train", 0, 150), (1, "score", 100, 199)))
    assert any("trains on targets 0..150, not all scored before" in v for v in o.order_violations)
    assert any("scores targets 100..199 after training on 100..150" in v for v in o.order_violations)


def test_rescoring_or_going_back_breaks_the_single_pass(tmp_path):
    o = ttt_order(_log(tmp_path, (0, "score", 0, 99), (1, "score", 50, 149)))
    assert o.order_violations == [] and "a second time" in o.pass_violations[0]
    o = ttt_order(_log(tmp_path, (1, "score", 100, 199), (0, "score", 0, 99)))
    assert "left of ones already scored" in o.pass_violations[0]


@pytest.mark.parametrize("line, problem", [
    ("{not json", "not JSON"),
    ('{"chunk": 0, "event": "score", "first_target": 0}', "exactly the keys"),
    ('{"chunk": 0, "event": "update", "first_target": 0, "last_target": 1}', "event must be"),
    ('{"chunk": 0, "event": "score", "first_target": 5, "last_target": 1}', "first_target <= last_target"),
    ('{"chunk": -1, "event": "score", "first_target": 0, "last_target": 1}', "integers >= 0"),
    ('{"chunk": true, "event": "score", "first_target": 0, "last_target": 1}', "integers >= 0"),
])
def test_a_log_off_the_contract_is_bad_input(tmp_path, line, problem):
    (tmp_path / evidence.TTT_LOG).write_text('{"chunk": 0, "event": "score", "first_target": 0, "last_target": 9}\n'
                                             + line + "\n")
    with pytest.raises(TTTLogError) as e:
        read_ttt_log(tmp_path)
    assert f"{tmp_path / evidence.TTT_LOG}:2: " in str(e.value) and problem in str(e.value) and "\n" not in str(e.value)


def test_no_log_is_no_ttt(tmp_path):
    assert read_ttt_log(tmp_path) is None and evidence.read_ngram_record(tmp_path) is None


def test_shard_split_by_the_run_patterns():
    assert evidence.shard_split("/d/fineweb_train_000079.bin", "*_train_*.bin", "*_val_*.bin") == "train"
    assert evidence.shard_split("/d/fineweb_val_000000.bin", "*_train_*.bin", "*_val_*.bin") == "val"
    assert evidence.shard_split("/d/other.bin", "*_train_*.bin", "*_val_*.bin") == "unknown"
