"""frontier_jax.ttt: score-first test-time training. The chunk plan is the record's rule (train_gpt.py:1087-1099)
with every target scored exactly once; each chunk is scored before the weights train on it, by weights that
never saw its targets (replayed chunk by chunk), and a protocol that trains first is caught by the submission
check's reading of its log; the scoring step cannot change a weight; the SGD step is the record's (momentum
carried, clipping over the trained parameters, frozen blocks untouched, the cosine rate) and compiles once per
batch shape."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from frontier_jax import ttt
from frontier_jax.config import ConfigError, apply_overrides, load_config
from frontier_jax.data.stream import window_batches
from frontier_jax.data.tokenizer import ByteTables
from frontier_jax.model import build
from frontier_jax.steps import evaluate_batches, make_eval_step, make_ttt_step
from frontier_jax.submission import evidence
from helpers import REPO

# configs/record11_tiny.py's recipe (BigramHash with its projection, SmearGate, XSA, partial RoPE, a value-embedding
# layer, bf16 tables) at 2 x 64; rows of 32, stride 8, chunks of 3 rows trained in batches of 2 (two step shapes),
# block 0 frozen (one pair of compiled steps serves every test)
SMALL = ["model.vocab_size=64", "model.num_layers=2", "model.model_dim=64", "model.num_heads=4", "model.num_kv_heads=2",
         "model.bigram_buckets=96", "model.bigram_dim=32", "model.ve_layers=(1,)", "model.ve_dim=16",
         "model.xsa_last_n=1", "model.compute_dtype='float32'", "train.seq_len=32", "train.tokens_per_step=128",
         "train.micro_batch_seqs=4", "train.val_batch_seqs=4", "eval.stride=8", "ttt.chunk_tokens=96",
         "ttt.batch_seqs=2", "ttt.epochs=2", "ttt.lr=0.05", "ttt.freeze_blocks=1"]
N_TOKENS = 32 * 9 + 1  # 288 targets: 3 chunks of 96


def small_config(*extra):
    return apply_overrides(load_config(REPO / "configs" / "record11_tiny.py"), [*SMALL, *extra])


@pytest.fixture(scope="module")
def setup():
    """(config, params, val tokens, eval step, train step, byte tables): one compiled pair for the module."""
    cfg = small_config()
    model = build(cfg, jnp.float32)
    graphdef, params = nnx.split(model)
    # a weight for every parameter (the record's init leaves BigramHash's table and the output projections zero)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(lambda p: (p + 0.05 * rng.standard_normal(p.shape)).astype(p.dtype), params)
    # a val stream that repeats itself: what a chunk teaches helps the next (TTT has something to learn)
    tokens = np.tile(rng.integers(1, 64, size=40), 8)[:N_TOKENS].astype(np.int32)
    tables = ByteTables(np.full(64, 2, np.int16), np.arange(64) % 3 == 0, np.arange(64) == 0)
    eval_step = make_eval_step(graphdef, tables, attention_exact=True)
    train_step = make_ttt_step(graphdef, ttt.sgd(cfg.ttt), attention_exact=True)
    return cfg, params, tokens, eval_step, train_step, tables


def _record_chunks(n_tokens: int, T: int, stride: int, C: int) -> dict[int, int]:
    """{window start: chunk} by the record's own loop (train_gpt.py:1087-1099), written from its lines."""
    total = n_tokens - 1
    starts = [ws for ws in range(0, total, stride) if min(ws + T, total) - ws >= stride or ws == 0]
    num_chunks = (total + C - 1) // C
    out = {}
    for ws in starts:
        wlen = min(ws + T, total) - ws
        s = 0 if ws == 0 else max(wlen - stride, 0)
        out[ws] = min((ws + s) // C, num_chunks - 1)
    return out


@pytest.mark.parametrize("n_tokens, T, stride, C", [
    (16385, 256, 64, 4096),  # the record's tiny shape: 4 chunks, the tail windows score nothing once
    (1025, 64, 16, 100),  # chunks not a multiple of the stride or the row: windows straddle chunk boundaries
    (1001, 64, 16, 96),  # (targets - T) % stride != 0: one more window ends at the last token
    (1025, 64, 64, 64),  # non-overlapping windows, one row per chunk
    (1025, 64, 16, 1000),  # the last chunk holds 24 targets, less than a row: scored, never trained
])
def test_the_plan_is_the_records_chunks_with_every_target_scored_once(n_tokens, T, stride, C):
    plan = ttt.Plan.build(n_tokens, T, stride, C)
    record = _record_chunks(n_tokens, T, stride, C)
    assert plan.num_chunks == -(-(n_tokens - 1) // C)
    for ws, first, c in zip(plan.starts, plan.starts + plan.score_from, plan.chunk):
        assert c == min(first // C, plan.num_chunks - 1)  # the chunk of the window's first scored target
        if ws in record and ws + T <= n_tokens - 1:  # a window of the record's (full length): the same chunk
            assert c == record[ws], ws
    # every target exactly once, in order
    covered = np.concatenate([np.arange(s + f, s + T) for s, f in zip(plan.starts, plan.score_from)])
    np.testing.assert_array_equal(covered, np.arange(n_tokens - 1))
    # each chunk's scored range is contiguous and follows the previous one's; every trained target of chunk c was
    # scored by chunk c or earlier; the last chunk is never trained on; only whole rows inside the chunk
    scored_to = -1
    for c in range(plan.num_chunks):
        first, last = plan.scored(c)
        assert first == scored_to + 1 and last >= first
        scored_to = last
        rows = plan.train_rows(c)
        if c == plan.num_chunks - 1:
            assert rows == 0 and plan.row_batches(c, 4) == []
            continue
        assert rows == C // T
        lo, hi = plan.trained_targets(c, (0, rows))
        assert c * C <= lo and hi < (c + 1) * C and hi <= last


def test_a_window_whose_first_target_is_past_the_last_chunk_start_belongs_to_the_last_chunk():
    """Chunks of 100 over 960 targets: 10 chunks, the last 60 targets; the windows scoring from 900 on are its."""
    plan = ttt.Plan.build(961, 64, 16, 100)
    last = plan.num_chunks - 1
    firsts = plan.starts + plan.score_from
    assert last == 9 and set(plan.chunk[firsts >= 900]) == {last} and set(plan.chunk[firsts < 900]) <= set(range(9))
    assert plan.train_rows(last) == 0 and plan.train_rows(last - 1) == 1


def test_the_cosine_rate_across_chunks():
    assert ttt.chunk_lr(0.002, 0, 5) == 0.002
    assert ttt.chunk_lr(0.002, 2, 5) == pytest.approx(0.001)
    assert ttt.chunk_lr(0.002, 4, 5) == pytest.approx(0.0, abs=1e-18)
    assert ttt.chunk_lr(0.002, 0, 1) == 0.002  # max(C - 1, 1)
    assert [round(ttt.chunk_lr(1.0, c, 3), 12) for c in range(3)] == [1.0, 0.5, 0.0]


def test_sgd_is_the_records_momentum_clipping_and_freeze():
    """torch.optim.SGD(momentum=0.9) after clip_grad_norm_(trained params, 1.0): buf = 0.9 buf + g (the first buf
    the gradient), the norm over the trained parameters only; a frozen block's update is zero."""
    cfg = small_config("ttt.freeze_blocks=1", "ttt.grad_clip=1.0").ttt
    params = {"blocks": {"0": {"w": jnp.ones(3)}, "1": {"w": jnp.ones(4)}}, "tok_emb": jnp.ones(2)}
    tx = ttt.sgd(cfg)
    state = tx.init(params)
    g1 = {"blocks": {"0": {"w": jnp.full(3, 100.0)}, "1": {"w": jnp.full(4, 0.3)}}, "tok_emb": jnp.full(2, 0.4)}
    u1, state = tx.update(g1, state, params)
    norm = math.sqrt(4 * 0.09 + 2 * 0.16)  # the trained leaves' norm: 0.8246 < 1, not clipped
    np.testing.assert_allclose(u1["blocks"]["1"]["w"], 0.3, rtol=1e-6)
    np.testing.assert_array_equal(u1["blocks"]["0"]["w"], 0.0)
    g2 = jax.tree_util.tree_map(lambda g: 10 * g, g1)  # norm 8.246: clipped to 1
    u2, state = tx.update(g2, state, params)
    np.testing.assert_allclose(u2["tok_emb"], 0.9 * 0.4 + 4.0 / (10 * norm), rtol=1e-5)
    np.testing.assert_array_equal(u2["blocks"]["0"]["w"], 0.0)
    assert ttt.frozen(["blocks", "0", "attn", "c_q"], 1) and not ttt.frozen(["blocks", "1", "mlp_scale"], 1)
    assert not ttt.frozen(["tok_emb"], 5) and not ttt.frozen(["blocks", "0", "attn_scale"], 0)


def test_the_scoring_step_cannot_change_weights(setup):
    """The scoring step is a pure function of the parameters: they are bit-identical after it, its program returns
    the three sums and nothing else, and no output aliases (or donates) an input buffer."""
    cfg, params, tokens, eval_step, _, _ = setup
    before = jax.tree_util.tree_map(np.array, params)
    plan = ttt.Plan.for_config(tokens.size, cfg)
    x, y, m = next(window_batches(tokens, plan.starts, plan.score_from, 32, 4))
    sums = eval_step(params, x, y, m, None)
    assert len(sums) == 3 and all(np.shape(s) == () for s in sums)
    for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(params)):
        assert a.tobytes() == np.asarray(b).tobytes()  # bit for bit
    jaxpr = jax.make_jaxpr(eval_step.jitted)(params, x, y, m, None)
    assert [v.aval.shape for v in jaxpr.jaxpr.outvars] == [(), (), ()]
    text = eval_step.jitted.lower(params, x, y, m, None).as_text()
    assert "tf.aliasing_output" not in text and "jax.buffer_donor" not in text


def test_each_chunk_is_scored_before_it_is_trained_on_by_weights_that_never_saw_it(setup):
    """The pass's log obeys score-before-update, and its sums are exactly those of scoring chunk c with the weights
    after training on chunks 0 .. c-1 only (replayed here with the same steps): no target is scored by a model
    that trained on it. Each step shape compiles once."""
    cfg, params, tokens, eval_step, train_step, _ = setup
    r = ttt.run(params, tokens, cfg, eval_step, train_step, log=lambda m: None)
    events = [evidence.TTTEvent(i + 1, e["chunk"], e["event"], e["first_target"], e["last_target"])
              for i, e in enumerate(r["events"])]
    order = evidence.ttt_order(events)
    assert order.order_violations == [] and order.pass_violations == [] and order.chunks == 3
    assert [e["event"] for e in r["events"]] == ["score"] + ["train"] * 4 + ["score"] + ["train"] * 4 + ["score"]
    assert r["tokens"] == tokens.size - 1 and r["sgd_steps"] == 8 and r["windows"] == 33

    plan, p = ttt.Plan.for_config(tokens.size, cfg), jax.tree_util.tree_map(jnp.copy, params)
    state, total, trained = ttt.sgd(cfg.ttt).init(p), 0.0, set()
    for c in range(plan.num_chunks):
        lo, hi = plan.scored(c)
        assert not trained & set(range(lo, hi + 1))
        s = evaluate_batches(eval_step, p, window_batches(tokens, *plan.windows(c), 32, 4))
        total += s["nll_sum_nats"]
        for _ in range(cfg.ttt.epochs):
            for rows in plan.row_batches(c, cfg.ttt.batch_seqs):
                x, y, valid = ttt._rows(tokens, plan, c, rows, [2, 1], 0, 1)
                p, state, _ = train_step(p, state, x, y, valid, jnp.float32(ttt.chunk_lr(0.05, c, 3)), None)
                trained |= set(range(*np.add(plan.trained_targets(c, rows), (0, 1))))
    assert total == r["nll_sum_nats"]
    for a, b in zip(jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(r["params"])):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert train_step.jitted._cache_size() == 2 and eval_step.jitted._cache_size() == 1


def test_a_protocol_that_trains_before_it_scores_is_caught(setup):
    """A deliberately wrong order (each chunk trained on, then scored: it sees its targets first) scores its first
    chunk better than the honest pass (whose first chunk is scored by the untouched weights), and its log fails the
    submission check's score-before-update reading, naming the chunk."""
    cfg, params, tokens, eval_step, train_step, _ = setup
    plan, p = ttt.Plan.for_config(tokens.size, cfg), jax.tree_util.tree_map(jnp.copy, params)
    state, leaky, events = ttt.sgd(cfg.ttt).init(p), [], []
    for c in range(plan.num_chunks - 1):
        for rows in plan.row_batches(c, cfg.ttt.batch_seqs) * cfg.ttt.epochs:
            x, y, valid = ttt._rows(tokens, plan, c, rows, [2, 1], 0, 1)
            p, state, _ = train_step(p, state, x, y, valid, jnp.float32(0.05), None)
            events.append(evidence.TTTEvent(len(events) + 1, c, "train", *plan.trained_targets(c, rows)))
        leaky.append(evaluate_batches(eval_step, p, window_batches(tokens, *plan.windows(c), 32, 4))["nll_sum_nats"])
        events.append(evidence.TTTEvent(len(events) + 1, c, "score", *plan.scored(c)))
    honest = evaluate_batches(eval_step, params, window_batches(tokens, *plan.windows(0), 32, 4))["nll_sum_nats"]
    assert leaky[0] < 0.99 * honest
    order = evidence.ttt_order(events)
    assert order.order_violations and order.order_violations[0].startswith("ttt.jsonl:1: chunk 0 is trained on before")


def test_frozen_blocks_keep_their_weights_and_the_rest_train(setup):
    cfg, params, tokens, eval_step, train_step, _ = setup
    lines = []
    r = ttt.run(params, tokens, cfg, eval_step, train_step, log=lines.append)
    flat_before = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    changed = {jax.tree_util.keystr(k): not np.array_equal(np.asarray(v), np.asarray(flat_before[k]))
               for k, v in jax.tree_util.tree_flatten_with_path(r["params"])[0]}
    block0 = [k for k in changed if "'blocks'" in k and "[0]" in k.split("'blocks'")[1][:5]]
    assert block0 and not any(changed[k] for k in block0)
    assert changed["['tok_emb'].value"] and any(changed[k] for k in changed if "[1]" in k)
    frozen = sum(int(np.prod(flat_before[k].shape)) for k in flat_before if jax.tree_util.keystr(k) in block0)
    assert lines[1].endswith(f"frozen={frozen}") and lines[0].endswith("freeze_blocks=1")


def test_the_progress_lines_and_the_estimate(setup):
    cfg, params, tokens, eval_step, train_step, _ = setup
    lines = []
    r = ttt.run(params, tokens, cfg, eval_step, train_step, log=lines.append)
    assert lines[0] == ("ttt_sliding:start chunks=3 chunk_tokens=96 total_windows=33 stride=8 ttt_lr=0.05 "
                        "ttt_epochs=2 freeze_blocks=1")
    assert lines[2].startswith("  ttt_chunk [1/3] bpb=") and lines[3].startswith("  ttt_chunk [3/3] bpb=")
    assert lines[4].startswith(f"ttt_sliding:done val_loss={r['nll_sum_nats'] / r['tokens']:.6f}")
    est = r["estimate"]
    # the full split in chunks of 96: every chunk but the last trained with 2 steps per epoch
    assert est["targets"] == ttt.FULL_VAL_TARGETS and est["chunks"] == -(-ttt.FULL_VAL_TARGETS // 96)
    assert est["sgd_steps"] == (est["chunks"] - 1) * 4
    assert est["seconds"] == pytest.approx(est["score_seconds"] + est["train_seconds"])
    assert lines[5].startswith("ttt_estimate: the full FineWeb val split (62,021,632 targets") and "1 x cpu" in lines[5]


@pytest.mark.parametrize("sets, fragment", [
    (["eval.score=ttt", "ttt.enabled=False"], "eval.score='ttt' needs ttt.enabled=True"),
    (["ttt.chunk_tokens=16"], "ttt.chunk_tokens=16 holds no whole row of train.seq_len=32"),
    (["ttt.freeze_blocks=3"], "ttt.freeze_blocks=3 is more than the model's 2 blocks"),
    (["eval.seq_len=64", "eval.stride=48"], "eval.stride=48 is longer than the TTT windows of train.seq_len=32"),
    (["ttt.momentum=1.0"], "ttt.momentum must be in [0, 1), got 1.0"),
])
def test_ttt_settings_are_checked_in_one_line(sets, fragment):
    with pytest.raises(ConfigError) as e:
        small_config(*sets)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_the_record_configs_run_the_records_ttt():
    for name, chunk in (("record11.py", 32768), ("record11_tiny.py", 4096)):
        cfg = load_config(REPO / "configs" / name)
        t = cfg.ttt
        assert (t.enabled, t.lr, t.epochs, t.chunk_tokens, t.freeze_blocks, t.momentum, t.batch_seqs, t.grad_clip) == (
            True, 0.002, 3, chunk, 0, 0.9, 32, 1.0)
        assert cfg.eval.score == "ttt" and cfg.ttt_stride == 64
