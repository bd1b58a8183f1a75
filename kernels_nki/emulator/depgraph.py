"""The instruction graph of one trace, shared by every schedule of it whatever its reading and order: data
dependencies through overlapping tile regions (read-after-write, write-after-read, write-after-write), the explicit
scheduling edges (`trace.edges`: no_reorder, with_schedule, depends_on), program order (topological where an edge
reorders), each instruction's stream and resources, and the memory plan (each allocation's uses, program order's
live amount per memory)."""

from __future__ import annotations

import heapq
import math

import numpy as np

from kernels_nki.emulator import timing
from kernels_nki.emulator.trace import Trace


def _overlap(e, r) -> bool:
    if e[5] != r[5]:
        return e[6] < r[7] and r[6] < e[7]
    return e[1] < r[2] and r[1] < e[2] and e[3] < r[4] and r[3] < e[4]


def _contains(r, e) -> bool:
    if e[5] != r[5]:  # a bounding box in other rows: kept (pruning is safe only within one row size)
        return False
    return r[1] <= e[1] and e[2] <= r[2] and r[3] <= e[3] and e[4] <= r[4]


def dependencies(instrs) -> tuple[list, list]:
    """(deps, raw) per instruction: indices of the earlier instructions it must wait for (RAW, WAR, WAW through
    overlapping regions), and its RAW producers."""
    writes, reads = {}, {}  # serial -> [(region, index)]
    deps, raws = [], []
    for i, ins in enumerate(instrs):
        raw, war = set(), set()
        for r in ins.reads:
            for e, j in writes.get(r[0], ()):
                if _overlap(e, r):
                    raw.add(j)
        for r in ins.writes:
            for table in (writes, reads):
                for e, j in table.get(r[0], ()):
                    if _overlap(e, r):
                        war.add(j)
        war.discard(i)
        for r in ins.reads:
            reads.setdefault(r[0], []).append((r, i))
        for r in ins.writes:
            for table in (writes, reads):
                lst = table.get(r[0])
                if lst:
                    table[r[0]] = [(e, j) for e, j in lst if not _contains(r, e)]  # superseded: i waits for them
            writes.setdefault(r[0], []).append((r, i))
        deps.append(raw | war)
        raws.append(raw)
    return deps, raws


def predecessors(trace, instrs) -> tuple[list, list]:
    """(preds, raws): per instruction the instructions it waits for (data dependencies and the explicit
    scheduling edges of `trace.edges`), and its RAW producers."""
    deps, raws = dependencies(instrs)
    edges = getattr(trace, "edges", None)
    if not edges:
        return deps, raws
    preds = [set(d) for d in deps]
    for c, p in edges:
        preds[c].add(p)
    return preds, raws


def topological(preds) -> list:
    """Program order, except where an explicit edge needs a later instruction first (Kahn's algorithm, the
    lowest index first); a cycle (edges against the data dependencies) raises."""
    n = len(preds)
    if all(not p or max(p) < i for i, p in enumerate(preds)):
        return list(range(n))
    succ = [[] for _ in range(n)]
    remaining = [len(p) for p in preds]
    for i, p in enumerate(preds):
        for j in p:
            succ[j].append(i)
    heap = [i for i in range(n) if remaining[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        i = heapq.heappop(heap)
        out.append(i)
        for j in succ[i]:
            remaining[j] -= 1
            if remaining[j] == 0:
                heapq.heappush(heap, j)
    if len(out) != n:
        raise ValueError(f"schedule: the scheduling edges form a cycle with the data dependencies ({n - len(out)} "
                         "instructions on it or after it): no order satisfies them")
    return out


class Graph:
    """What every schedule of one trace shares, whatever its reading and order: the instruction graph
    (predecessors, RAW producers, successors), program order (`topo`, each instruction's place in it: `tpos`),
    each instruction's stream and resources, and the memory plan (Plan). Computed once per Trace (kept on it:
    `graph`), so the six schedules of `estimate` trace the graph once."""

    def __init__(self, trace, instrs):
        self.preds, self.raws = predecessors(trace, instrs)
        self.topo = topological(self.preds)
        n = len(instrs)
        self.tpos = [0] * n
        for k, i in enumerate(self.topo):
            self.tpos[i] = k
        self.succ = [[] for _ in range(n)]
        for i, p in enumerate(self.preds):
            for j in p:
                self.succ[j].append(i)
        self.npreds = [len(p) for p in self.preds]
        self.stream = [ins.stream for ins in instrs]
        self.dma = [ins.engine == "dma" for ins in instrs]
        self.res = [timing.resources(ins) for ins in instrs]
        self.plan = Plan(trace, instrs, self.topo, self.stream)


def graph(trace) -> Graph:
    """The trace's Graph (a Trace keeps it; a list of Instr is analysed on every call)."""
    instrs = trace.instrs if isinstance(trace, Trace) else trace
    if not isinstance(trace, Trace):
        return Graph(trace, instrs)
    if trace._graph is None:
        trace._graph = Graph(trace, instrs)
    return trace._graph


class Plan:
    """The memory constraint's part that depends on the trace only (schedule._Memory's docstring): each allocation the
    trace touches numbered in the order of its serial (`buf`, `amount`: its memory and size), the allocations
    each instruction touches, each allocation's first use and number of uses in program order, program order's
    live amount at every position per memory, the room, and per stream its instructions that open an
    allocation."""

    def __init__(self, trace, instrs, topo, stream):
        allocs = getattr(trace, "allocations", None) or {}
        number = {ser: k for k, ser in enumerate(sorted(allocs))}
        self.buf = [allocs[ser][0] for ser in sorted(allocs)]
        self.amount = [allocs[ser][1] for ser in sorted(allocs)]
        self.touch = [sorted({number[r[0]] for r in ins.reads + ins.writes if r[0] in number}) if number else []
                      for ins in instrs]
        m = len(number)
        self.left, self.first = [0] * m, [-1] * m
        last = [0] * m
        for k, i in enumerate(topo):
            for a in self.touch[i]:
                self.left[a] += 1
                if self.first[a] < 0:
                    self.first[a] = k
                last[a] = k
        n = len(topo)
        delta = {b: np.zeros(n + 1, np.int64) for b in ("sbuf", "psum")}
        for a in range(m):
            if self.first[a] >= 0:
                delta[self.buf[a]][self.first[a]] += self.amount[a]
                delta[self.buf[a]][last[a] + 1] -= self.amount[a]
        cap = getattr(trace, "capacity", None) or {}
        self.live, self.room = {}, {}
        for b, d in delta.items():
            live = np.cumsum(d[:n])
            self.live[b] = live  # program order's live at k
            self.room[b] = max(cap.get(b, math.inf), int(live.max()) if n else 0)
        self.openers = {}  # per stream, its instructions that open an allocation, in program order
        for k, i in enumerate(topo):
            if any(self.first[a] == k for a in self.touch[i]):
                self.openers.setdefault(stream[i], []).append(i)
        self.stream = stream
