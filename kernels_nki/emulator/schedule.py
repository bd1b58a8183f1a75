"""An instruction schedule of one kernel call on a NeuronCore: the trace (`trace.py`) priced at AWS's documented
costs and ordered as the compiler may order it. `cost.py`'s busiest-engine figure stays beside it as the lower bound.

Order. Each compute engine has its own sequencer and issues its own instruction stream, one instruction at a
time; the engines synchronise through semaphores the compiler inserts for the data dependencies (aws-neuron-sdk
`nki/guides/architecture/trainium_inferentia2_arch.rst`, "NeuronCore-v2 Compute Engines"). The order of each
stream is the compiler's: "The compiler may reorder operations that have no data dependencies" after unrolling
every loop (`nki/get-started/nki-language-guide.rst`); "Without this directive, the compiler scheduler is free to
reorder independent operations" (`nki/api/nki/language/__init__.py`, `no_reorder`); `nki/guides/
how-to-scheduling-apis.rst` adds dependency edges "before scheduling" to "constrain the reordering that the
automatic scheduler will do". None of them limits the freedom to one engine or excludes DMAs; DMA transfers
"within a queue on the same DMA engine are executed in order", queues served round robin on NeuronCore-v2
(`nki/get-started/about/nki-dma-overview.rst`, "DMA Queues"), so the queue order is the order the compiler
triggers them in. The documents agree on this; they differ only on what `no_reorder` guarantees ("execute in
program order", API page; "dependency edges between every pair of instructions", how-to page), and
`scheduling.py` builds the chain that is valid under both. How the scheduler chooses is not published.

Two orders are scheduled (`order=`):
- "list": a list scheduler over the unrolled instruction graph. An instruction waits for its
  data dependencies (read-after-write, write-after-read, write-after-write through overlapping tile regions)
  and its scheduling edges (`trace.edges`: no_reorder, with_schedule, depends_on); whenever a stream can issue,
  the first instruction in program order among its ready ones whose resources are free issues. An engine thus
  runs program order except where an instruction waits, and a later independent one then takes its slot: where
  an independent statement is written no longer decides whether an engine stalls behind a waiting one
  (tests/test_emulator_schedule.py). Among ready instructions the rule still follows program order.
  Two other priorities were tried on the project's kernels and rejected: the longest path to the end
  (critical path) and the earliest unconstrained start both run the loads or first stages of every loop
  iteration ahead of the rest, and schedule most of the step's kernels slower than program order does.
- "source" (the in-order reading): every stream in program order (topological where an explicit edge
  reorders), an instruction starting when its engine is free and its inputs are ready. Reported beside the
  estimate as the in-order bound.
The estimate (`estimate`) is the shorter of the two under each reading: a scheduler free to reorder may keep
program order, and the list scheduler's greedy choices (run-ahead that holds memory program order needs later,
DMA engines taken by loads ahead of a store) sometimes schedule a kernel slower than program order does.
Both hold the same resources: DMA: 16 engines, each processing one transfer at a time (arch guide, "Data
movement between HBM and SBUF using DMAs"; a dma_copy is one transfer per DMA engine it spans, same section:
"16 DMA transfers (one per DMA engine)" for a [128, 512] load). Shared ports: VectorE and GpSimdE cannot access
SBUF in parallel, VectorE and ScalarE cannot access PSUM in parallel (arch guide, "Data Movement" and
"Accessing SBUF/PSUM ... Performance Consideration"): such instructions hold the port for their duration.
Memory: an on-chip allocation holds its bytes (SBUF per partition) or banks (PSUM) from its first instruction's
start to its last one's end, within the target's capacity (`_Memory`: how run-ahead is bounded so that program
order stays possible).

What each instruction costs and holds: `timing.py`; the instruction graph and memory plan: `depgraph.py`.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math

from kernels_nki.emulator import cost, depgraph, timing
from kernels_nki.emulator.trace import DMA_ENGINES, Trace


@dataclasses.dataclass
class Schedule:
    instrs: list
    start: list
    end: list
    wait: list  # idle time on its stream before it started (inputs or a shared resource)
    makespan_s: float
    assumptions: str
    target: str
    order: str = "list"
    over_capacity: int = 0  # allocations the list scheduler opened beyond the room (_Memory)

    def busy_s(self) -> dict:
        """Busy seconds per lane: compute engines, and `dma` (any DMA engine busy: the union)."""
        out = {e: 0.0 for e in timing.LANES}
        spans = []
        for ins, s, e in zip(self.instrs, self.start, self.end):
            if ins.engine == "dma":
                spans.append((s, e))
            elif ins.engine in out:
                out[ins.engine] += e - s
        out["dma"] = _union(spans)
        return out

    def active_share(self) -> dict:
        return {k: v / self.makespan_s if self.makespan_s else 0.0 for k, v in self.busy_s().items()}


def _union(spans) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            total += (cur_e - cur_s) if cur_e is not None else 0.0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


ORDERS = ("list", "source")  # the compiler's reordering (the estimate) / program order (the in-order reading)
SCAN = 8  # candidates a stream tries per issue slot when the first one's resources are busy


def schedule(trace: Trace | list, assumptions: str = "central", target: str | None = None,
             order: str = "list") -> Schedule:
    """Schedule a trace (or a list of Instr) on `target` (default: the trace's) under timing.ASSUMPTIONS[assumptions]:
    `order="list"` lets the compiler order each engine's stream (the list scheduler), `"source"` keeps
    program order (the in-order reading)."""
    a = timing.ASSUMPTIONS[assumptions]
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}: expected one of {', '.join(ORDERS)}")
    target = target or getattr(trace, "target", cost.DEFAULT_TARGET)
    t = cost.target(target)
    instrs = trace.instrs if isinstance(trace, Trace) else trace
    g = depgraph.graph(trace)
    run = _list if order == "list" else _in_order
    start, end, wait, over = run(instrs, g, t, a)
    return Schedule(instrs, start, end, wait, max(end, default=0.0), assumptions, target, order, over)


def _hold(is_dma: bool, s, i: int, start: float, end: float, res, free, ready, dge: float, avail: dict) -> None:
    """An issued instruction holds its resources until its end (a DMA's descriptors first hold GpSimd, swdge);
    its stream `s`'s next instruction may start at its start (a DMA queue) or its end (an engine)."""
    for r in res:
        free[r] = end
    if dge and is_dma:
        free[timing.GPSIMD] = max(ready[i], free[timing.GPSIMD]) + dge
    avail[s] = start if is_dma else end


def _in_order(instrs, g, t, a):
    """Each stream in program order (topological where an explicit edge reorders): of the streams' next
    instructions whose inputs are scheduled, the one that can start first runs first."""
    n = len(instrs)
    raws, topo, stream, is_dma, res = g.raws, g.topo, g.stream, g.dma, g.res
    streams, pos, prev = {}, [0] * n, [None] * n
    for i in topo:
        lst = streams.setdefault(stream[i], [])
        prev[i] = lst[-1] if lst else None
        pos[i] = len(lst)
        lst.append(i)
    dur = [0.0] * n
    last_stat = None
    for i in topo:
        ins = instrs[i]
        dur[i] = timing.seconds(ins, prev[i] is not None and prev[i] in raws[i], t, a, last_stat)
        if ins.engine == "tensor":
            last_stat = ins.stationary
    users = g.succ
    remaining = list(g.npreds)
    ready = [0.0] * n
    free = [0.0] * (timing.DMA0 + DMA_ENGINES)
    avail = {s: 0.0 for s in streams}  # a stream's next instruction may start from here
    head = {s: 0 for s in streams}
    start, end, wait = [0.0] * n, [0.0] * n, [0.0] * n
    heap = []
    push, pop = heapq.heappush, heapq.heappop
    dge = a.swdge_s
    lat = timing.DMA_FIXED_S if not a.dma_fixed_on_engine else 0.0  # a DMA's fixed cost as latency
    mem = _Memory(g.plan)
    tpos, issued, parked = g.tpos, [False] * n, []
    front = 0

    def earliest(i):
        r0 = ready[i]
        if is_dma[i]:
            if dge:  # its descriptors first, on GpSimd (swdge)
                r0 = max(r0, free[timing.GPSIMD]) + dge
            r0 += lat
        m = avail[stream[i]]
        if r0 > m:
            m = r0
        for r in res[i]:
            if free[r] > m:
                m = free[r]
        return m

    for s, lst in streams.items():
        if remaining[lst[0]] == 0:
            push(heap, (earliest(lst[0]), lst[0]))
    done = 0
    while heap or parked:
        if not heap:  # every stream head waits for room that nothing will release: the frontier opens beyond it
            push(heap, (earliest(topo[front]), topo[front]))
            parked = [p for p in parked if p != topo[front]]
            forced = topo[front]
        else:
            forced = None
        key, i = pop(heap)
        s0 = earliest(i)
        if key > s0:  # key: not before a release it waited for
            s0 = key
        if s0 > key + 1e-15:
            push(heap, (s0, i))
            continue
        mem.release_until(s0)
        if i != forced and not mem.fits(i, tpos, issued):
            nxt = mem.releases[0][0] if mem.releases else None
            if nxt is not None:
                push(heap, (max(nxt, s0), i))
            else:
                parked.append(i)
            continue
        s = stream[i]
        issued[i] = True
        while front < n and issued[topo[front]]:
            front += 1
        mem.advance(front)
        e = s0 + dur[i]
        if mem.touch[i]:
            for _ in mem.issue(i, e):
                for p in parked:
                    push(heap, (earliest(p), p))
                parked = []
        start[i], end[i] = s0, e
        wait[i] = s0 - avail[s]
        _hold(is_dma[i], s, i, s0, e, res[i], free, ready, dge, avail)
        done += 1
        for j in users[i]:
            if e > ready[j]:
                ready[j] = e
            remaining[j] -= 1
            if remaining[j] == 0 and head[stream[j]] == pos[j]:
                push(heap, (earliest(j), j))
        head[s] += 1
        lst = streams[s]
        if head[s] < len(lst) and remaining[lst[head[s]]] == 0:
            push(heap, (earliest(lst[head[s]]), lst[head[s]]))
    if done != n:
        raise RuntimeError(f"schedule: {n - done} of {n} instructions never became ready (a dependency cycle)")
    return start, end, wait, 0


class _Memory:
    """The capacity constraint of the schedule. An on-chip allocation is live from the start of the first
    instruction that touches it to the end of the last; an instruction that opens allocations issues only if
    the live ones of their memory leave room (SBUF bytes per partition, PSUM banks: `trace.capacity`,
    rules.TARGET_SPECS). The room is at least program order's peak, which the emulator lets through (rule
    sbuf.capacity's reading: the compiler spills beyond it), so program order always fits.

    Run-ahead keeps program order possible: with f the frontier (the first unissued instruction in program
    order), an allocation opened ahead (first touched in program order at p > f) must leave room, at every
    position k of [f, p), for program order's live allocations at k plus every allocation opened ahead of k.
    The frontier can then always issue once what runs has ended: the scheduler cannot deadlock on memory
    (should it, the first unissued instruction in program order opens beyond the room: `over_capacity`).
    Among instructions waiting for room the oldest goes first: a younger one opens only if room remains for
    the oldest one denied room and for the oldest unissued opener of its own stream."""

    def __init__(self, plan: depgraph.Plan):
        self.buf, self.amount, self.touch, self.first, self.room = plan.buf, plan.amount, plan.touch, plan.first, plan.room
        self.left = list(plan.left)
        # per memory and position k: program order's live at k + what was opened ahead of k
        self.need_ahead = {b: live.copy() for b, live in plan.live.items()}
        self.live = {"sbuf": 0, "psum": 0}
        self.opened, self.until, self.releases = [False] * len(plan.buf), [0.0] * len(plan.buf), []
        self.frontier = 0
        self.stream = plan.stream
        self.openers, self.opener_at = plan.openers, {}
        self.blocked, self.waiting = [], set()  # (program position, i): instructions denied room, the oldest first
        self.relief, self.memo = 0, {}  # fits() refusals, kept until a release or the frontier moves

    def advance(self, frontier: int) -> None:
        self.frontier = frontier
        self.relief += 1

    def fits(self, i, tpos, issued) -> bool:
        """Room for what `i` opens (see the class); the answer is kept until the memory's state changes."""
        blocked = self.blocked
        while blocked and issued[blocked[0][1]]:
            self.waiting.discard(heapq.heappop(blocked)[1])
        touch = self.touch[i]
        if not touch:
            return True
        if self.memo.get(i) == self.relief:  # refused, and nothing released since nor the frontier moved
            return False
        opened = self.opened
        for a in touch:
            if not opened[a]:
                break
        else:  # opens nothing
            return True
        ok = self._fits(i, tpos, issued)
        if not ok:
            self.memo[i] = self.relief
            if i not in self.waiting:
                self.waiting.add(i)
                heapq.heappush(blocked, (tpos[i], i))
        return ok

    def _fits(self, i, tpos, issued) -> bool:
        need, ahead = self._need(i)
        reserve = {}
        older = {b for b in (self.blocked[0][1] if self.blocked else None, self._oldest_opener(i, issued))
                 if b is not None and tpos[b] < tpos[i]}
        for b in older:
            for buf, v in self._need(b)[0].items():
                reserve[buf] = reserve.get(buf, 0) + v
        room, live = self.room, self.live
        for b, v in need.items():
            if live[b] + v + reserve.get(b, 0) > room[b]:
                return False
        f = self.frontier
        for b, (v, p) in ahead.items():  # p > f: the range is never empty
            if int(self.need_ahead[b][f:p].max()) + v + reserve.get(b, 0) > room[b]:
                return False
        return True

    def opens(self, i) -> bool:
        opened = self.opened
        for a in self.touch[i]:
            if not opened[a]:
                return True
        return False

    def _oldest_opener(self, i, issued):
        """The oldest unissued instruction of i's stream that opens an allocation in program order."""
        s = self.stream[i]
        lst, k = self.openers.get(s, ()), self.opener_at.get(s, 0)
        while k < len(lst) and issued[lst[k]]:
            k += 1
        self.opener_at[s] = k
        return lst[k] if k < len(lst) else None

    def _need(self, i) -> tuple[dict, dict]:
        """What `i` would open per memory; of it, what opens ahead of the frontier (amount, furthest first use)."""
        need, ahead = {}, {}
        opened, buf, amount, first, frontier = self.opened, self.buf, self.amount, self.first, self.frontier
        for a in self.touch[i]:
            if not opened[a]:
                b, amt = buf[a], amount[a]
                need[b] = need.get(b, 0) + amt
                fs = first[a]
                if fs > frontier:
                    v, p = ahead.get(b, (0, 0))
                    ahead[b] = (v + amt, max(p, fs))
        return need, ahead

    def issue(self, i, end) -> list:
        """Open what `i` opens; the release times its end makes known."""
        known = []
        opened, until, left = self.opened, self.until, self.left
        for a in self.touch[i]:
            if not opened[a]:
                opened[a] = True
                b, amt = self.buf[a], self.amount[a]
                self.live[b] += amt
                fs = self.first[a]
                if fs > self.frontier:
                    self.need_ahead[b][self.frontier:fs] += amt
            if end > until[a]:
                until[a] = end
            left[a] -= 1
            if left[a] == 0:
                heapq.heappush(self.releases, (until[a], a))
                known.append(until[a])
        return known

    def release_until(self, now) -> None:
        releases = self.releases
        while releases and releases[0][0] <= now:
            self.relief += 1
            _, a = heapq.heappop(releases)
            self.live[self.buf[a]] -= self.amount[a]


def _list(instrs, g, t, a):
    """The list scheduler. Decisions are taken in time order: whenever a stream (an engine, a DMA queue) can
    issue, of its instructions whose inputs are complete (data dependencies and scheduling edges) and whose
    resources are free (its DMA engines, a shared port, room for the allocations it opens: _Memory), the first
    in program order issues. Streams deciding at the same time go in the program order of their choices. So an
    engine runs its instructions in program order except where one waits: a later independent instruction
    then issues in its place (the compiler's freedom to reorder independent instructions, used to fill stalls)."""
    n = len(instrs)
    raws, topo, tpos, succ, stream, is_dma, res = g.raws, g.topo, g.tpos, g.succ, g.stream, g.dma, g.res
    dma_lat = timing.DMA_FIXED_S if not a.dma_fixed_on_engine else 0.0  # a DMA's fixed cost as latency
    lat = [dma_lat if d else 0.0 for d in is_dma]
    remaining = list(g.npreds)
    dge = a.swdge_s
    mem = _Memory(g.plan)
    streams = set(stream)
    ready = [0.0] * n
    free = [0.0] * (timing.DMA0 + DMA_ENGINES)
    avail = dict.fromkeys(streams, 0.0)
    last_on = dict.fromkeys(streams)
    waiting = {s: [] for s in streams}  # (data-ready time + latency, i)
    cands = {s: [] for s in streams}  # (program position, i): inputs complete by the stream's clock
    next_key = dict.fromkeys(streams, math.inf)
    events, seq = [], itertools.count()
    start, end, wait = [0.0] * n, [0.0] * n, [0.0] * n
    state = {"last_stat": None, "force": False, "over": 0}
    clock = {"now": 0.0}
    cap_wait = set()
    eps = 1e-13
    push, pop = heapq.heappush, heapq.heappop

    def wake(s, when):
        if when < next_key[s]:
            next_key[s] = when
            push(events, (when, next(seq), s))

    def pend(i):
        s = stream[i]
        r = ready[i] + lat[i]
        push(waiting[s], (r, i))
        wake(s, max(r, avail[s]))

    def earliest(i, now):
        m = now
        if dge and is_dma[i]:  # its descriptors first, on GpSimd (swdge)
            m = max(m, max(ready[i], free[timing.GPSIMD]) + dge + lat[i])
        for r in res[i]:
            if free[r] > m:
                m = free[r]
        return m

    issued, in_cands = [False] * n, [False] * n
    front = {"k": 0}

    def issue(i, now):
        ins, s = instrs[i], stream[i]
        issued[i] = True
        k = front["k"]
        while k < n and issued[topo[k]]:
            k += 1
        if k != front["k"]:
            front["k"] = k
            mem.advance(k)
        dependent = last_on[s] is not None and last_on[s] in raws[i]
        e = now + timing.seconds(ins, dependent, t, a, state["last_stat"])
        start[i], end[i] = now, e
        wait[i] = now - avail[s]
        _hold(is_dma[i], s, i, now, e, res[i], free, ready, dge, avail)
        last_on[s] = i
        if ins.engine == "tensor":
            state["last_stat"] = ins.stationary
        if mem.touch[i]:
            for rt in mem.issue(i, e):
                for w in cap_wait:
                    wake(w, max(rt, now))
                cap_wait.clear()
        for j in succ[i]:
            if e > ready[j]:
                ready[j] = e
            remaining[j] -= 1
            if remaining[j] == 0:
                pend(j)

    def _decide(s) -> int:
        """Stream `s` issues its best candidate that can start now (1), or sleeps until one may (0)."""
        W, C = waiting[s], cands[s]
        if not C:
            return 0
        tried, best, retry, full = [], None, math.inf, False
        when = clock["now"]
        if state["force"]:
            tried = [pop(C) for _ in range(len(C))]
            best = min(tried)[1]
            tried = [it for it in tried if it[1] != best]
            state["force"] = False
            state["over"] += 1
            when = earliest(best, when)
        else:
            while C and len(tried) < SCAN:
                item = pop(C)
                i = item[1]
                if issued[i]:
                    continue
                st = earliest(i, when)
                if st > when + eps:
                    retry = min(retry, st)
                    tried.append(item)
                elif (full and mem.opens(i)) or not mem.fits(i, tpos, issued):  # room goes oldest first
                    full = True
                    tried.append(item)
                else:
                    best = i
                    break
        for it in tried:
            push(C, it)
        if best is None and full:  # the frontier (first unissued in program order) always has room eventually
            f = topo[front["k"]]
            if stream[f] == s and in_cands[f] and mem.fits(f, tpos, issued):
                st = earliest(f, when)
                if st <= when + eps:
                    best = f
                else:
                    retry = min(retry, st)
        if best is None:
            nxt = min(retry, W[0][0] if W else math.inf)
            if full:  # until an allocation is released (a known release, or one made known later)
                cap_wait.add(s)
                if mem.releases:
                    nxt = min(nxt, mem.releases[0][0])
            if nxt < math.inf:
                wake(s, nxt)
            return 0
        issue(best, when)
        if C or W:
            wake(s, avail[s])
        return 1

    for i in range(n):
        if remaining[i] == 0:
            pend(i)
    done = 0
    while done < n:
        if not events:
            if not cap_wait:
                raise RuntimeError(f"schedule: {n - done} of {n} instructions never became ready (a dependency cycle)")
            state["force"] = True  # no choice left can open its allocations: the first in program order does
            for w in sorted(cap_wait):
                wake(w, clock["now"])
            cap_wait.clear()
            continue
        key = events[0][0]
        batch = []  # the streams deciding at this time
        while events and events[0][0] <= key + eps:
            when, _, s = pop(events)
            if when == next_key[s]:
                next_key[s] = math.inf
                batch.append(s)
        clock["now"] = now = key
        mem.release_until(now)
        order = []
        for s in batch:
            if avail[s] > now + eps:
                wake(s, avail[s])
                continue
            W, C = waiting[s], cands[s]
            while W and W[0][0] <= now + eps:
                _, i = pop(W)
                push(C, (tpos[i], i))
                in_cands[i] = True
            if not C:
                if W:
                    wake(s, W[0][0])
                continue
            order.append((C[0], s))
        for _, s in sorted(order):
            done += _decide(s)
    return start, end, wait, state["over"]


def best(trace: Trace, assumptions: str = "central") -> tuple[Schedule, Schedule, Schedule]:
    """(the estimate's schedule: the shorter of the list schedule and program order; the list schedule;
    program order's)."""
    listed, src = schedule(trace, assumptions), schedule(trace, assumptions, order="source")
    return (listed if listed.makespan_s <= src.makespan_s else src), listed, src


def combined(by_order: dict) -> dict:
    """The estimate from the makespans of both orders per reading ({"list": {reading: s}, "source": {...}}):
    the shorter per reading, and the in-order reading (program order, central assumptions: `in_order`).
    Extrapolations (the step estimate's per-sequence one) extrapolate each order first, then combine."""
    out = {a: min(by_order["list"][a], by_order["source"][a]) for a in timing.ASSUMPTIONS}
    out["in_order"] = by_order["source"]["central"]
    return out


def estimate(trace: Trace) -> dict:
    """Per bracket of timing.ASSUMPTIONS the estimate: the shorter of the list schedule's makespan and program order's (a
    scheduler free to reorder may keep program order); the in-order reading (`in_order`); both orders'
    makespans (`by_order`); the busiest-engine lower bound; the central estimate's active shares (`shares`)."""
    by = {"list": {}, "source": {}}
    for name in timing.ASSUMPTIONS:
        chosen, listed, src = best(trace, name)
        by["list"][name], by["source"][name] = listed.makespan_s, src.makespan_s
        if name == "central":
            shares = chosen.active_share()
    out = combined(by)
    out.update(by_order=by, shares=shares, busiest_engine=cost.estimate(trace.counters, trace.target).total_s)
    return out
