"""What a run directory records about its eval-time state: the test-time-training log and the n-gram tables.

The TTT log contract (a trainer with test-time training writes it; the check reads it):
`<run>/ttt.jsonl`, one JSON object per event, in the order the events happened:

    {"chunk": int, "event": "score" | "train", "first_target": int, "last_target": int}

`first_target`..`last_target` (inclusive) number the validation split's targets in the order the evaluation
scores them (target i is val token i + 1): a "score" event is a chunk's targets scored with the weights of
that moment, a "train" event is a TTT update on that range. Score before update holds when every chunk is
scored before it is trained on and every trained target was scored before (no range is trained on and
scored later); one left-to-right pass when the scored ranges are disjoint and in increasing order. A run
without TTT has no ttt.jsonl.

The n-gram tables: `<run>/ngram-p0/runtime.json` (frontier_jax.ngram.runtime) names the shards the builder
read (`builder_shards`, `built_from`), the tables' bytes in memory (`table_bytes`) and the snapshot the final
evaluation used (`final`).
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path

from frontier_jax.data.shards import DataError, atomic_write_text
from frontier_jax.ngram.runtime import RECORD_FILE, ngram_dir

TTT_LOG = "ttt.jsonl"
TTT_KEYS = ("chunk", "event", "first_target", "last_target")
SCORE, TRAIN = "score", "train"
NGRAM_RECORD = ngram_dir("", 0) / RECORD_FILE  # process 0's record, relative to the run directory


class TTTLogError(DataError):
    """A ttt.jsonl that does not follow the contract (one line naming the file, the line and the problem)."""


@dataclass(frozen=True)
class TTTEvent:
    line: int
    chunk: int
    event: str
    first: int
    last: int


def write_ttt_log(run_dir, events: list[dict]) -> None:
    """<run>/ttt.jsonl from a TTT pass's events (dicts with exactly TTT_KEYS, in the order they happened), written
    to a temporary name and renamed."""
    bad = next((e for e in events if sorted(e) != sorted(TTT_KEYS) or e["event"] not in (SCORE, TRAIN)), None)
    if bad is not None:
        raise ValueError(f"a TTT event must have exactly the keys {', '.join(TTT_KEYS)}: {bad}")
    atomic_write_text(Path(run_dir) / TTT_LOG, "".join(json.dumps({k: e[k] for k in TTT_KEYS}) + "\n" for e in events))


def read_ttt_log(run_dir) -> list[TTTEvent] | None:
    """The events of `<run>/ttt.jsonl` in file order (None: the run has no TTT log); TTTLogError if malformed."""
    path = Path(run_dir) / TTT_LOG
    if not path.is_file():
        return None
    events = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TTTLogError(f"{path}:{i}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or sorted(obj) != sorted(TTT_KEYS):
            raise TTTLogError(f"{path}:{i}: expected an object with exactly the keys {', '.join(TTT_KEYS)}")
        if obj["event"] not in (SCORE, TRAIN):
            raise TTTLogError(f"{path}:{i}: event must be {SCORE!r} or {TRAIN!r}, got {obj['event']!r}")
        nums = [obj[k] for k in ("chunk", "first_target", "last_target")]
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in nums) or nums[1] > nums[2]:
            raise TTTLogError(f"{path}:{i}: chunk, first_target, last_target must be integers >= 0 with "
                              "first_target <= last_target")
        events.append(TTTEvent(i, obj["chunk"], obj["event"], obj["first_target"], obj["last_target"]))
    return events


@dataclass
class _Ranges:
    """A set of target indices as sorted, disjoint, inclusive ranges."""

    spans: list[tuple[int, int]] = field(default_factory=list)

    def add(self, a: int, b: int) -> None:
        merged = []
        for lo, hi in sorted(self.spans + [(a, b)]):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        self.spans = merged

    def overlap(self, a: int, b: int) -> tuple[int, int] | None:
        for lo, hi in self.spans:
            if lo <= b and a <= hi:
                return max(lo, a), min(hi, b)
        return None

    def covers(self, a: int, b: int) -> bool:
        return any(lo <= a and b <= hi for lo, hi in self.spans)


@dataclass(frozen=True)
class TTTOrder:
    events: int
    chunks: int
    order_violations: list[str]  # score before update (parameter-golf condition 3)
    pass_violations: list[str]  # one left-to-right pass (condition 4)


def ttt_order(events: list[TTTEvent], source: str = TTT_LOG) -> TTTOrder:
    scored, trained = _Ranges(), _Ranges()
    scored_chunks: set[int] = set()
    order, single = [], []
    last_scored = -1
    for e in events:
        where = f"{source}:{e.line}: chunk {e.chunk}"
        if e.event == SCORE:
            hit = trained.overlap(e.first, e.last)
            if hit:
                order.append(f"{where} scores targets {e.first}..{e.last} after training on {hit[0]}..{hit[1]}")
            again = scored.overlap(e.first, e.last)
            if again:
                single.append(f"{where} scores targets {again[0]}..{again[1]} a second time")
            elif e.first <= last_scored:
                single.append(f"{where} scores targets {e.first}..{e.last} left of ones already scored "
                              f"(up to {last_scored})")
            scored.add(e.first, e.last)
            scored_chunks.add(e.chunk)
            last_scored = max(last_scored, e.last)
        else:
            if e.chunk not in scored_chunks:
                order.append(f"{where} is trained on before it is scored")
            elif not scored.covers(e.first, e.last):
                order.append(f"{where} trains on targets {e.first}..{e.last}, not all scored before")
            trained.add(e.first, e.last)
    return TTTOrder(len(events), len({e.chunk for e in events}), order, single)


# ----------------------------------------------------------------------------- n-gram tables


def read_ngram_record(run_dir) -> dict | None:
    path = Path(run_dir) / NGRAM_RECORD
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable n-gram record ({e})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: unreadable n-gram record (not a JSON object)")
    return obj


def shard_split(path: str, train_pattern: str, val_pattern: str) -> str:
    """"train" / "val" / "unknown": which split a shard file belongs to, by the run's data patterns."""
    name = Path(path).name
    if fnmatch.fnmatch(name, val_pattern):
        return "val"
    if fnmatch.fnmatch(name, train_pattern):
        return "train"
    return "unknown"


def dir_bytes(path) -> int:
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0
