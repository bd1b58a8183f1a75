"""NKI's scheduling APIs under the emulator (kernels_nki/emulator/scheduling.py: nl.no_reorder,
kernel.with_schedule, NkiInstruction.depends_on) and how the schedule (schedule.py) honours them, on
bench/probe_kernels.py's stall_probe."""

from __future__ import annotations

import numpy as np
import pytest

from kernels_nki import emulator
from kernels_nki.emulator import loader, schedule, scheduling

X = ((128, 8192), "float32")


@pytest.fixture(scope="module")
def probes():
    return emulator.load_kernel_module("bench.probe_kernels")


def _starts(s, ops):
    return [s.start[i] for i, ins in enumerate(s.instrs) if ins.op in ops]


def test_no_reorder_block_is_costed_in_program_order(probes):
    tr = loader.record(probes.stall_probe, X, order="ab", block=True)
    ops = ("tensor_scalar.multiply", "tensor_scalar.add", "dma_copy")
    block = [i for i, ins in enumerate(tr.instrs) if i >= 2]  # every instruction after the load and the memset
    assert tr.edges == [(j, i) for i, j in zip(block, block[1:])]  # a chain: each on the one before it
    for order in schedule.ORDERS:
        s = schedule.schedule(tr, order=order)
        assert all(s.start[j] >= s.end[i] for i, j in zip(block, block[1:]))  # program order, one at a time
    free = schedule.estimate(loader.record(probes.stall_probe, X, order="ab"))
    assert schedule.schedule(tr).makespan_s > free["in_order"] > free["central"]
    assert _starts(schedule.schedule(tr), ops) == sorted(_starts(schedule.schedule(tr), ops))


def test_depends_on_adds_an_edge(probes):
    plain = loader.record(probes.stall_probe, X, order="ba")
    tied = loader.record(probes.stall_probe, X, order="ba", edge=True)
    a = next(i for i, ins in enumerate(tied.instrs) if ins.op == "tensor_scalar.multiply")
    b0 = next(i for i, ins in enumerate(tied.instrs) if ins.op == "tensor_scalar.add")
    assert plain.edges == [] and tied.edges == [(b0, a)]  # b0 precedes a in program order: the edge reorders
    s0, s1 = schedule.schedule(plain), schedule.schedule(tied)
    assert s0.start[b0] < s0.end[a] and s1.start[b0] >= s1.end[a]
    assert s1.makespan_s > s0.makespan_s
    src = schedule.schedule(tied, order="source")  # the in-order reading follows the edge too
    assert src.start[b0] >= src.end[a]


def test_with_schedule_edges_between_named_instructions(probes):
    named = probes.stall_probe.with_schedule([("b0", "a"), ("b1", ["b0"])])
    tr = loader.record(named, X, order="ba")
    a = next(i for i, ins in enumerate(tr.instrs) if ins.op == "tensor_scalar.multiply")
    b0, b1 = [i for i, ins in enumerate(tr.instrs) if ins.op == "tensor_scalar.add"][:2]
    assert sorted(tr.edges) == sorted([(b0, a), (b1, b0)])
    s = schedule.schedule(tr)
    assert s.start[b0] >= s.end[a]
    assert named[1].schedule == named.schedule  # a launch grid keeps the schedule
    with pytest.raises(emulator.NkiEmulatorError, match="no instructions of this call are named 'c'"):
        loader.record(probes.stall_probe.with_schedule([("c", "a")]), X)
    with pytest.raises(emulator.NkiEmulatorError, match="not a .consumer name"):
        probes.stall_probe.with_schedule([("b0",)])
    cyclic = probes.stall_probe.with_schedule([("a", "b0")])
    with pytest.raises(ValueError, match="cycle"):
        schedule.schedule(loader.record(cyclic, X, order="ab", edge=True))


def test_scheduling_apis_leave_the_results_unchanged(probes):
    x = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)
    ref, _ = emulator.run(probes.stall_probe, x)
    for kernel, kw in ((probes.stall_probe, {"block": True}), (probes.stall_probe, {"edge": True}),
                       (probes.stall_probe.with_schedule([("b0", "a")]), {"order": "ba"})):
        out, _ = emulator.run(kernel, x, **kw)
        np.testing.assert_array_equal(out, ref)


def test_isa_calls_return_their_instruction():
    from kernels_nki.emulator import isa, machine

    m = machine.Machine(compute=False, trace=True)
    with machine.running(m):
        t = m.allocate((128, 64), np.float32, machine.Buffer("sbuf"))
        u = m.allocate((128, 64), np.float32, machine.Buffer("sbuf"))
        first = isa.memset(dst=t, value=0.0, name="zero")
        second = isa.tensor_copy(dst=u, src=t)
        assert isinstance(first, scheduling.NkiInstruction) and (first.first, first.stop, first.name) == (0, 1, "zero")
        assert second.depends_on(first) is second and m.order.edges == [(1, 0)]
        with pytest.raises(emulator.NkiEmulatorError, match="not an NkiInstruction"):
            second.depends_on(t)
        with pytest.raises(emulator.NkiEmulatorError, match="cannot depend on itself"):
            first.depends_on(first)
