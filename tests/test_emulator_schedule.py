"""The instruction trace and schedule (kernels_nki/emulator/trace.py, depgraph.py, schedule.py): probes written the way AWS's
guides describe them (bench/probe_kernels.py), priced as the documents say."""

from __future__ import annotations

import pytest

from kernels_nki import emulator
from kernels_nki.emulator import depgraph, loader, schedule, timing, trace

STALL_X = ((128, 8192), "float32")  # stall_probe's input (bench/probe_kernels.py)


@pytest.fixture(scope="module")
def probes():
    return emulator.load_kernel_module("bench.probe_kernels")


def test_trace_records_every_instruction_with_its_counters(probes):
    tr = loader.record(probes.copy_in_chunks, ((128, 2048), "bfloat16"), chunk=512)
    assert tr.counters == emulator.count(probes.copy_in_chunks, ((128, 2048), "bfloat16"), chunk=512)
    assert len(tr) == tr.counters.dma_transfers == 8
    loads, stores = tr.instrs[0::2], tr.instrs[1::2]
    assert {i.queue for i in loads} == {"load"} and {i.queue for i in stores} == {"store"}
    assert all(i.engines == (0, 16) and i.buffer == 1024 and i.nbytes == 128 * 1024 for i in tr.instrs)
    # each store reads the tile its load wrote; chunks touch disjoint columns of the HBM tensors
    deps, raws = depgraph.dependencies(tr.instrs)
    assert [sorted(d) for d in deps] == [[], [0], [], [2], [], [4], [], [6]]


def test_dma_engines_follow_the_partitions(probes):
    tr = loader.record(probes.dma_example_1, ((4, 4096), "bfloat16"), target="trn2")
    assert tr.instrs[0].engines == (0, 1) and tr.instrs[0].buffer == 8192  # 4 partitions: one DMA engine


def test_narrow_dma_copy_is_several_times_the_wide_one(probes):
    x = ((128, 16384), "bfloat16")
    wide = schedule.estimate(loader.record(probes.copy_in_chunks, x, chunk=4096))  # 8 KiB per partition
    narrow = schedule.estimate(loader.record(probes.copy_in_chunks, x, chunk=64))  # 128 B per partition
    assert wide["busiest_engine"] == narrow["busiest_engine"]  # the same bytes: the peak-rate model cannot tell
    assert narrow["central"] > 5 * wide["central"] and narrow["high"] > 5 * wide["high"]
    assert narrow["low"] == pytest.approx(wide["low"], rel=0.1)  # the low end: every buffer at peak, latency hidden
    for est in (wide, narrow):
        assert est["busiest_engine"] <= est["low"] <= est["central"] <= est["high"]


def test_dependent_vector_chain_is_dearer_than_independent(probes):
    x = ((128, 512), "float32")
    dep = schedule.schedule(loader.record(probes.vector_chain, x, steps=32, dependent=True))
    ind = schedule.schedule(loader.record(probes.vector_chain, x, steps=32, dependent=False))
    vec = lambda s: [(a, b) for a, b, i in zip(s.start, s.end, s.instrs) if i.engine == "vector"]
    # 512 cycles each, +100 static overhead when it reads the previous instruction's output (arch guide)
    assert all((b - a) * 1.12e9 == pytest.approx(512 + 100) for a, b in vec(dep)[1:])
    assert all((b - a) * 1.12e9 == pytest.approx(512) for a, b in vec(ind))
    assert dep.makespan_s > ind.makespan_s + 31 * 100 / 1.12e9 * 0.99


def test_dma_bound_and_compute_bound_phases_overlap(probes):
    x = ((128, 4096), "bfloat16")
    dma = schedule.schedule(loader.record(probes.load_and_compute, x, loads=32, computes=0))
    comp = schedule.schedule(loader.record(probes.load_and_compute, x, loads=0, computes=32))
    both = schedule.schedule(loader.record(probes.load_and_compute, x, loads=32, computes=32))
    assert dma.active_share()["dma"] > 0.9 and comp.active_share()["vector"] > 0.9
    assert both.makespan_s < 0.8 * (dma.makespan_s + comp.makespan_s)  # the two run side by side
    assert both.makespan_s >= max(dma.makespan_s, comp.makespan_s)


def test_example_1_and_the_scalar_dependent_interval(probes):
    tr = loader.record(probes.dma_example_1, ((4, 4096), "bfloat16"), target="trn2")
    s = schedule.schedule(tr)
    # 32 KiB at 23 B/ns x the curve's 8 KiB point; the fixed cost before the transfer, not in it
    assert s.end[0] - s.start[0] == pytest.approx(32768 / 23e9 / timing.payload_share(8192))
    assert s.start[0] == pytest.approx(timing.DMA_FIXED_S)
    high = schedule.schedule(tr, "high")
    assert high.end[0] - high.start[0] == pytest.approx(s.end[0] - s.start[0] + timing.DMA_FIXED_S)
    chain = schedule.schedule(loader.record(probes.scalar_tiny_chain, ((128, 1), "float32"), steps=16))
    st = [a for a, i in zip(chain.start, chain.instrs) if i.engine == "scalar"]
    assert (st[-1] - st[1]) / (len(st) - 2) == pytest.approx(264 / 1.4e9)  # the first reads a DMA's output


def test_shared_ports_serialise_vector_with_gpsimd_and_scalar():
    def ins(engine, free, psum=False):
        i = trace.Instr(engine, "probe", (), ())
        i.cycles, i.free, i.sbuf, i.psum = free, free, not psum, psum
        return i
    alone = schedule.schedule([ins("vector", 1024)], target="trn1").makespan_s
    sbuf = schedule.schedule([ins("vector", 1024), ins("gpsimd", 1024)], target="trn1")
    assert sbuf.start[1] == pytest.approx(alone)  # GpSimd waits for VectorE's SBUF access
    psum = schedule.schedule([ins("vector", 1024, psum=True), ins("scalar", 1024, psum=True)], target="trn1")
    assert psum.start[1] == pytest.approx(alone)
    free = schedule.schedule([ins("vector", 1024), ins("scalar", 1024)], target="trn1")
    assert free.start[1] == 0.0  # different ports: in parallel


def test_independent_statements_permuted_cost_the_same(probes):
    ab, ba = (schedule.estimate(loader.record(probes.stall_probe, STALL_X, order=o)) for o in ("ab", "ba"))
    for reading in timing.ASSUMPTIONS:
        assert ab[reading] == pytest.approx(ba[reading], rel=0.01), reading
    # program order is what the in-order reading runs: there the order written first stalls VectorE
    assert ab["in_order"] > 1.05 * ba["in_order"]
    assert ab["central"] <= ab["in_order"] and ab["busiest_engine"] <= ab["low"]


def test_list_schedule_fills_the_stall_with_later_independent_work(probes):
    tr = loader.record(probes.stall_probe, STALL_X, order="ab")
    listed, src = schedule.schedule(tr), schedule.schedule(tr, order="source")
    a = next(i for i, ins in enumerate(tr.instrs) if ins.op == "tensor_scalar.multiply")
    b0 = next(i for i, ins in enumerate(tr.instrs) if ins.op == "tensor_scalar.add")
    assert a < b0  # A first in program order
    assert src.start[b0] >= src.end[a]  # in order: B waits behind A, which waits for its load
    assert listed.start[b0] < listed.start[a]  # the list scheduler issues B while A's input loads
    assert listed.order == "list" and src.order == "source"
    with pytest.raises(ValueError, match="unknown order"):
        schedule.schedule(tr, order="any")


def test_run_ahead_stays_within_the_memory(probes):
    """32 loads of 8 KiB per partition (256 KiB in all, beyond trn1's 192 KiB SBUF partition) may run ahead of
    their stores only as far as the SBUF holds them."""
    tr = loader.record(probes.copy_in_chunks, ((128, 131072), "bfloat16"), chunk=4096)
    room = tr.capacity["sbuf"]
    for order in schedule.ORDERS:
        s = schedule.schedule(tr, order=order)
        spans = {}
        for ins, a, b in zip(s.instrs, s.start, s.end):
            for r in ins.reads + ins.writes:
                if r[0] in tr.allocations:
                    lo, hi = spans.get(r[0], (a, b))
                    spans[r[0]] = (min(lo, a), max(hi, b))
        events = sorted([(lo, tr.allocations[k][1]) for k, (lo, _) in spans.items()]
                        + [(hi, -tr.allocations[k][1]) for k, (_, hi) in spans.items()], key=lambda e: (e[0], e[1]))
        live = peak = 0
        for _, amount in events:
            live += amount
            peak = max(peak, live)
        assert s.over_capacity == 0 and 8192 < peak <= room, order
