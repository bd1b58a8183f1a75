"""Score-first test-time training: record 2026-03-23's legal TTT (`eval_val_sliding_ttt`, train_gpt.py:1074-1229),
every target scored exactly once (docs/evaluation.md, "Score-first test-time training").

The protocol (`Plan`, then `run`):

- the windows are the sliding windows of `frontier_jax.data.stream.window_starts` at the TTT stride (eval.stride,
  `Config.ttt_stride`) over windows of train.seq_len (the record's TTT uses TRAIN_SEQ_LEN, not EVAL_SEQ_LEN: SPEC
  Q12, reproduced), so every target is scored exactly once;
- the val targets are cut into chunks of ttt.chunk_tokens (C = ceil(targets / chunk_tokens)); a window belongs to
  the chunk of its first scored target, min(first // chunk_tokens, C - 1) (train_gpt.py:1091-1099);
- chunk c: its windows are scored by the pure evaluation step (`steps.make_eval_step`: the parameters in, sums out,
  nothing donated, so scoring cannot change a weight), then, unless c is the last chunk, the weights train on the
  chunk's whole rows of train.seq_len (a partial row at its end is never trained on) for ttt.epochs epochs of
  ttt.batch_seqs rows per step: SGD with momentum ttt.momentum (no Nesterov, no dampening, no weight decay; the
  buffers carry across chunks), the gradient clipped to a global norm of ttt.grad_clip over the trained parameters,
  the learning rate ttt.lr * (1 + cos(pi c / max(C - 1, 1))) / 2 (`chunk_lr`) (train_gpt.py:1175-1207);
- the first ttt.freeze_blocks blocks are frozen: every parameter under `blocks.{i}` for i < freeze_blocks
  (`frozen`); the record's own freeze reaches only its blocks' control tensors, its matrices being banks outside
  `blocks.*` (SPEC Q14; its run uses 0, as configs/record11.py).

The training step (`steps.make_ttt_step`) is one jitted, pure SGD step (parameters and momentum donated, the
learning rate a traced scalar); a trained chunk always has chunk_tokens // train.seq_len rows (only the last chunk
is short, and it is never trained on), so the steps have at most two shapes (the full batch and the remainder),
each compiled, with the scoring step, before any clock starts (`warm_up`: a run's untimed compile warm-up,
`Trainer.warm_up_programs`), so the pass compiles nothing. The events, in the order they happen, are the
run's `ttt.jsonl` (`frontier_jax.submission.evidence`: a "score" event per chunk, a "train" event per SGD step), so
the submission check verifies score-before-update. With the n-gram bias, its tables (built from the train shards
only) are the same in scoring and training, and its learned per-order values train with the other parameters.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from frontier_jax.config import Config, TTTConfig
from frontier_jax.data.stream import window_batches, window_starts
from frontier_jax.optim import path_names
from frontier_jax.policies.scoring import bpb
from frontier_jax.steps import evaluate_batches, make_ttt_step

# The full FineWeb val split's targets (the record's log: `val_loader:shards ... tokens:62021632`), for the time
# estimate of a pass over it
FULL_VAL_TARGETS = 62_021_632
SCORE, TRAIN = "score", "train"  # the events of ttt.jsonl (frontier_jax.submission.evidence)
LOG_EVERY_CHUNKS = 10  # a progress line every this many chunks and at the last (train_gpt.py:1209-1213)


def chunk_lr(lr: float, chunk: int, num_chunks: int) -> float:
    """The SGD learning rate of chunk `chunk` of `num_chunks`: lr * (1 + cos(pi c / max(C - 1, 1))) / 2."""
    return lr * 0.5 * (1.0 + math.cos(math.pi * chunk / max(num_chunks - 1, 1)))


def frozen(names: list[str], freeze_blocks: int) -> bool:
    """Whether a parameter (its path names) is frozen: it is under blocks.{i} with i < freeze_blocks."""
    return len(names) > 1 and names[0] == "blocks" and names[1].isdigit() and int(names[1]) < freeze_blocks


def param_labels(params, freeze_blocks: int):
    """"train" / "frozen" per parameter (the structure of `params`)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, _: "frozen" if frozen(path_names(p), freeze_blocks) else "train", params)


def sgd(cfg: TTTConfig) -> optax.GradientTransformation:
    """The update direction of the record's `torch.optim.SGD(params, momentum)` after `clip_grad_norm_`: the trained
    parameters' gradient clipped to a global norm of cfg.grad_clip (0: not clipped), then the momentum buffer
    (buf = momentum * buf + g, zero at the start: torch's first buffer is the gradient itself); zero for the
    frozen ones. The step multiplies it by -lr (`steps.make_ttt_step`)."""
    train = optax.chain(*([optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []),
                        optax.trace(decay=cfg.momentum, nesterov=False))
    return optax.multi_transform({"train": train, "frozen": optax.set_to_zero()},
                                 lambda params: param_labels(params, cfg.freeze_blocks))


@dataclasses.dataclass(frozen=True)
class Plan:
    """The windows, their chunks and each chunk's training rows over a val stream of `n_tokens` tokens."""

    starts: np.ndarray  # [W] window starts (token index of x[0])
    score_from: np.ndarray  # [W] first scored position in the window
    chunk: np.ndarray  # [W] the window's chunk
    num_chunks: int
    chunk_tokens: int
    seq_len: int
    stride: int
    targets: int  # n_tokens - 1: target i is token i + 1

    @classmethod
    def build(cls, n_tokens: int, seq_len: int, stride: int, chunk_tokens: int) -> Plan:
        starts, score_from = window_starts(n_tokens, seq_len, stride)
        targets = n_tokens - 1
        num_chunks = -(-targets // chunk_tokens)
        chunk = np.minimum((starts + score_from) // chunk_tokens, num_chunks - 1)
        return cls(starts, score_from, chunk, num_chunks, chunk_tokens, seq_len, stride, targets)

    @classmethod
    def for_config(cls, n_tokens: int, cfg: Config) -> Plan:
        return cls.build(n_tokens, cfg.train.seq_len, cfg.ttt_stride, cfg.ttt.chunk_tokens)

    def windows(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, score_from) of chunk c's windows, in order."""
        sel = self.chunk == c
        return self.starts[sel], self.score_from[sel]

    def scored(self, c: int) -> tuple[int, int] | None:
        """(first, last) target chunk c's windows score (inclusive), None when it has no window."""
        starts, score_from = self.windows(c)
        if not starts.size:
            return None
        return int(starts[0] + score_from[0]), int(starts[-1] + self.seq_len - 1)

    def train_rows(self, c: int) -> int:
        """Whole rows of seq_len in chunk c's targets, 0 for the last chunk (scored, never trained on)."""
        if c >= self.num_chunks - 1:
            return 0
        first, end = c * self.chunk_tokens, min((c + 1) * self.chunk_tokens, self.targets)
        return (end - first) // self.seq_len

    def row_batches(self, c: int, batch_seqs: int) -> list[tuple[int, int]]:
        """(first, end) rows of each SGD step of one epoch over chunk c."""
        n = self.train_rows(c)
        return [(r, min(r + batch_seqs, n)) for r in range(0, n, batch_seqs)]

    def trained_targets(self, c: int, rows: tuple[int, int]) -> tuple[int, int]:
        """(first, last) targets of chunk c's rows [first, end) (inclusive): row r is x = tokens[s : s + T],
        y = tokens[s + 1 : s + T + 1], s = c * chunk_tokens + r * T."""
        base = c * self.chunk_tokens
        return base + rows[0] * self.seq_len, base + rows[1] * self.seq_len - 1


def batch_shapes(plan: Plan, batch_seqs: int, multiple: int) -> list[int]:
    """The row counts of the compiled training steps, largest first: the full batch and, when a chunk's rows do
    not divide into full batches, the remainder, each rounded up to a multiple of the devices (pad rows carry no
    loss). Every trained chunk is a whole chunk (only the last may be short, and it is never trained on), so chunk
    0's batches are every chunk's."""
    sizes = {b - a for a, b in plan.row_batches(0, batch_seqs)}
    return sorted({-(-n // multiple) * multiple for n in sizes}, reverse=True)


def step_rows(cfg: Config, multiple: int) -> list[int]:
    """The SGD steps' row counts (`batch_shapes`, largest first) of any val split of more than one chunk: every
    trained chunk is whole, so a two-chunk split has them all."""
    t = cfg.ttt
    return batch_shapes(Plan.build(2 * t.chunk_tokens + 1, cfg.train.seq_len, cfg.ttt_stride, t.chunk_tokens),
                        t.batch_seqs, multiple)


def full_val_estimate(plan: Plan, cfg: TTTConfig, score_seconds: float, train_seconds: float, windows: int,
                      steps: int, targets: int = FULL_VAL_TARGETS) -> dict:
    """The seconds of a pass over `targets` val targets at this pass's measured speed (scoring per window,
    training per SGD step), with its windows, chunks and steps."""
    n = targets + 1
    full = Plan.build(n, plan.seq_len, plan.stride, plan.chunk_tokens)
    per_chunk = len(full.row_batches(0, cfg.batch_seqs)) * cfg.epochs if full.num_chunks > 1 else 0
    full_steps = (full.num_chunks - 1) * per_chunk
    score = score_seconds / max(windows, 1) * full.starts.size
    train = train_seconds / steps * full_steps if steps else 0.0
    return {"targets": targets, "chunks": full.num_chunks, "windows": int(full.starts.size), "sgd_steps": full_steps,
            "score_seconds": score, "train_seconds": train, "seconds": score + train}


def hardware(num_devices: int) -> str:
    """The devices a pass runs on, e.g. `1 x cpu (cpu)`."""
    return f"{num_devices} x {jax.devices()[0].device_kind} ({jax.default_backend()})"


def _copy(tree):
    return jax.tree_util.tree_map(jnp.copy, tree)


def run(params, tokens: np.ndarray, cfg: Config, eval_step, train_step, aux=None, log: Callable[[str], None] = print,
        put: Callable[[np.ndarray], object] = lambda a: a, process_index: int = 0, process_count: int = 1,
        num_devices: int = 1, batch_seqs: int | None = None) -> dict:
    """Score-first TTT of `params` over the val stream `tokens` (the module docstring); the caller's parameters are
    left as they are (training works on a copy). `eval_step` (`steps.make_eval_step`) scores windows of
    train.seq_len, `batch_seqs` (default eval.batch_seqs, else train.val_batch_seqs) per batch; `train_step`
    (`steps.make_ttt_step` with `sgd(cfg.ttt)`) trains; `aux` is both steps' extra argument (the n-gram tables);
    `put` turns this process's rows into the steps' global arrays. Returns the sums of every scored target
    (nll_sum_nats, tokens, bytes), the events (ttt.jsonl), the counts, the timed seconds, the estimate of a pass
    over the full val split at this speed and the trained parameters, and prints the record's progress lines.
    `warm_up` with the same arguments compiles its programs beforehand (else the first chunk's time holds them)."""
    t, T = cfg.ttt, cfg.train.seq_len
    plan = Plan.for_config(tokens.shape[0], cfg)
    batch = batch_seqs or cfg.eval.batch_seqs or cfg.train.val_batch_seqs
    labels = jax.tree_util.tree_leaves(param_labels(params, t.freeze_blocks))
    sizes = [int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params)]
    log(f"ttt_sliding:start chunks={plan.num_chunks} chunk_tokens={t.chunk_tokens} total_windows={plan.starts.size} "
        f"stride={plan.stride} ttt_lr={t.lr} ttt_epochs={t.epochs} freeze_blocks={t.freeze_blocks}")
    log(f"ttt_sliding:params unfrozen={sum(n for n, lab in zip(sizes, labels) if lab == 'train')} "
        f"frozen={sum(n for n, lab in zip(sizes, labels) if lab == 'frozen')}")
    tx = sgd(t)
    params = _copy(params)
    state = tx.init(params)
    shapes = batch_shapes(plan, t.batch_seqs, num_devices) if t.epochs else []

    nll, scored, nbytes, events = 0.0, 0, 0, []
    score_s = train_s = 0.0
    windows = steps = 0
    t0 = time.perf_counter()
    for c in range(plan.num_chunks):
        rng = plan.scored(c)
        if rng is None:  # no window starts scoring here (train_gpt.py:1133-1134: nor is it trained on)
            continue
        a = time.perf_counter()
        starts, score_from = plan.windows(c)
        batches = ((put(x), put(y), put(m)) for x, y, m in
                   window_batches(tokens, starts, score_from, T, batch, process_index, process_count))
        s = evaluate_batches(eval_step, params, batches, aux)
        nll, scored, nbytes = nll + s["nll_sum_nats"], scored + s["tokens"], nbytes + s["bytes"]
        events.append({"chunk": c, "event": SCORE, "first_target": rng[0], "last_target": rng[1]})
        windows += starts.size
        b = time.perf_counter()
        score_s += b - a
        lr = jnp.float32(chunk_lr(t.lr, c, plan.num_chunks))
        for _ in range(t.epochs):
            for rows in plan.row_batches(c, t.batch_seqs):
                x, y, valid = _rows(tokens, plan, c, rows, shapes, process_index, process_count)
                params, state, _ = train_step(params, state, put(x), put(y), put(valid), lr, aux)
                first, last = plan.trained_targets(c, rows)
                events.append({"chunk": c, "event": TRAIN, "first_target": first, "last_target": last})
                steps += 1
        jax.block_until_ready(params)
        train_s += time.perf_counter() - b
        if c % LOG_EVERY_CHUNKS == 0 or c == plan.num_chunks - 1:
            log(f"  ttt_chunk [{c + 1}/{plan.num_chunks}] bpb={bpb(nll, nbytes):.6f} "
                f"time={time.perf_counter() - t0:.1f}s")
    elapsed = time.perf_counter() - t0
    loss, score = nll / max(scored, 1), bpb(nll, nbytes)
    log(f"ttt_sliding:done val_loss={loss:.6f} val_bpb={score:.6f} elapsed={elapsed:.1f}s")
    est = full_val_estimate(plan, t, score_s, train_s, windows, steps)
    log(f"ttt_estimate: the full FineWeb val split ({est['targets']:,} targets: {est['chunks']:,} chunks, "
        f"{est['windows']:,} windows, {est['sgd_steps']:,} SGD steps) at this pass's speed on {hardware(num_devices)}: "
        f"{est['seconds']:.0f} s (scoring {est['score_seconds']:.0f} s, training {est['train_seconds']:.0f} s)")
    return {"nll_sum_nats": nll, "tokens": scored, "bytes": nbytes, "events": events, "chunks": plan.num_chunks,
            "windows": windows, "sgd_steps": steps, "score_seconds": score_s, "train_seconds": train_s,
            "seconds": elapsed, "estimate": est, "hardware": hardware(num_devices), "params": params}


def _rows(tokens: np.ndarray, plan: Plan, c: int, rows: tuple[int, int], shapes: list[int], process_index: int,
          process_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This process's part of one SGD step's rows of chunk c, padded to the smallest compiled shape that holds
    them: (x, y) [B / P, T] and the row mask [B / P] (1: a real row)."""
    T, n = plan.seq_len, rows[1] - rows[0]
    B = min(s for s in shapes if s >= n)
    first = c * plan.chunk_tokens + rows[0] * T
    x_BT = np.zeros((B, T), np.int32)
    y_BT = np.zeros((B, T), np.int32)
    span = tokens[first: first + n * T + 1].astype(np.int32)
    x_BT[:n], y_BT[:n] = span[:-1].reshape(n, T), span[1:].reshape(n, T)
    valid_B = (np.arange(B) < n).astype(np.int32)
    local = B // process_count
    lo = process_index * local
    return x_BT[lo:lo + local], y_BT[lo:lo + local], valid_B[lo:lo + local]


def warm_up(params, n_tokens: int, cfg: Config, eval_step, train_step, aux=None,
            put: Callable[[np.ndarray], object] = lambda a: a, process_count: int = 1, num_devices: int = 1,
            batch_seqs: int | None = None, check: Callable[[], None] = lambda: None) -> list[str]:
    """Runs (so compiles) every program a `run` over `n_tokens` val tokens with these arguments calls: the scoring
    step on one batch of zeros and the SGD step at each of its row counts (`batch_shapes`) on copies of the
    parameters and a fresh momentum at lr 0 (their results dropped; `params` untouched), the copies and the
    momentum's initialisation included; `check()` after each. Called before any clock starts (the trainer's
    untimed warm-up, `Trainer.warm_up_programs`; `evaluate --ttt` before its pass). Returns the programs' names."""
    T = cfg.train.seq_len
    plan = Plan.for_config(n_tokens, cfg)
    batch = batch_seqs or cfg.eval.batch_seqs or cfg.train.val_batch_seqs
    zeros = lambda rows, *shape: put(np.zeros((rows // process_count, *shape), np.int32))  # noqa: E731
    jax.block_until_ready(eval_step(params, zeros(batch, T), zeros(batch, T), zeros(batch, T), aux))
    names = [f"ttt score step {batch}x{T}"]
    check()
    if not cfg.ttt.epochs:
        return names
    tx = sgd(cfg.ttt)
    for rows in batch_shapes(plan, cfg.ttt.batch_seqs, num_devices):
        ones = put(np.ones((rows // process_count,), np.int32))
        copy = _copy(params)
        out = train_step(copy, tx.init(copy), zeros(rows, T), zeros(rows, T), ones, jnp.float32(0.0), aux)
        jax.block_until_ready(out)
        names.append(f"ttt train step {rows}x{T}")
        check()
    return names
