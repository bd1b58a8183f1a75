"""NKI's scheduling APIs under the emulator: `nl.no_reorder()`, `kernel.with_schedule(edges)` and
`NkiInstruction.depends_on(*producers)`, named and specified as aws-neuron-sdk documents them.

The compiler's scheduler may reorder instructions that have no data dependencies (`nki/get-started/
nki-language-guide.rst`: "The compiler may reorder operations that have no data dependencies";
`nki/api/nki/language/__init__.py`, `no_reorder`: "Without this directive, the compiler scheduler is free to
reorder independent operations"). These APIs add dependency edges before it runs (`nki/guides/
how-to-scheduling-apis.rst`: "The extra dependency edges constrain the reordering that the automatic scheduler
will do"):

- `with nl.no_reorder():` "insert[s] dependency edges between every instruction" of the block, "dynamically
  scoped" (everything that executes under it, functions it calls included; how-to page). A chain (each
  instruction on the one before it) carries every pair's order. The API page reads the block as
  "operations inside the block execute in program order"; the how-to page's edges also make each instruction
  wait for the previous one to complete, which is in program order too: the chain is valid under both.
  Register-based dynamic loops are not supported inside the block (API page); the emulator runs no dynamic
  loop at all (`nl.dynamic_range`, `nl.fori_loop`, `nl.while_loop` raise).
- `kernel.with_schedule([(consumer, producer_or_list), ...])`: instructions named by the `name=` argument
  every `nki.isa` call takes; "plus1" depends on "recip" for `("plus1", "recip")` (how-to page). The compiler
  "check[s] that it makes sense": here a name no instruction of the call carries, or one that several carry,
  is an NkiEmulatorError (which instruction it means is not defined).
- `nki.isa` calls return an `NkiInstruction` (`nki/api/nki/isa/__init__.py`: "Returned by nki.isa operations
  during tracing"); `c.depends_on(b, a)` adds the edges "self (consumer) runs after each producer" and returns
  self. It "lowers to a hardware semaphore wait"; its cost beyond the wait is not published and not charged.

Every edge goes into the call's `trace.Order` (the trace's `edges` when recorded); the schedule (`schedule.py`)
holds them like data dependencies. In compute mode they change nothing: the emulator executes in program
order, which every schedule's result equals (the language guide: reordering "is functionally transparent").
"""

from __future__ import annotations

import functools
import types

from kernels_nki.emulator import machine as _m


class NkiInstruction:
    """Handle of one `nki.isa` call: its instructions' indices [first, stop) in the call's program order."""

    __slots__ = ("machine", "first", "stop", "name")

    def __init__(self, machine, first: int, stop: int, name):
        self.machine, self.first, self.stop, self.name = machine, first, stop, name

    def __repr__(self):
        return f"NkiInstruction({self.name or 'unnamed'}, {self.first}:{self.stop})"

    def depends_on(self, *producers: NkiInstruction) -> NkiInstruction:
        """Scheduling edges: this instruction runs after every producer completes; returns self."""
        for p in producers:
            if not isinstance(p, NkiInstruction):
                _m.fail(f"depends_on: {p!r} is not an NkiInstruction (the value an nki.isa call returns)",
                        _m.NkiEmulatorError)
            if p.machine is not self.machine:
                _m.fail("depends_on: the producer was issued by another kernel call", _m.NkiEmulatorError)
            if p is self:
                _m.fail("depends_on: an instruction cannot depend on itself", _m.NkiEmulatorError)
            _edges(self.machine.order, (self.first, self.stop), (p.first, p.stop))
        return self


def _edges(order, consumer: tuple, producer: tuple):
    for c in range(*consumer):
        for p in range(*producer):
            order.edges.append((c, p))


class no_reorder:
    """`with nl.no_reorder():` every instruction issued inside (dynamically) depends on the one before it."""

    def __enter__(self):
        order = _m.current().order
        if order.depth == 0:
            order.last_in_block = None
        order.depth += 1
        return self

    def __exit__(self, *exc):
        _m.current().order.depth -= 1
        return False


def instruction(fn):
    """An `nki.isa` call that returns its NkiInstruction (and records its `name=`)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        machine = getattr(_m._local, "machine", None)
        if machine is None:
            return fn(*args, **kwargs)
        order = machine.order
        first = order.issued
        order.nesting += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            order.nesting -= 1
        if result is not None or order.nesting:
            return result
        name = kwargs.get("name")
        if name is not None:
            order.names.setdefault(name, []).append((first, order.issued))
        return NkiInstruction(machine, first, order.issued, name)

    return call


NOT_INSTRUCTIONS = {"get_nc_version"}


def wrap_instructions(namespace: dict) -> None:
    """Make every public nki.isa function of `namespace` return its NkiInstruction."""
    for key, value in list(namespace.items()):
        if isinstance(value, types.FunctionType) and not key.startswith("_") and key not in NOT_INSTRUCTIONS:
            namespace[key] = instruction(value)


def check_schedule(pairs) -> tuple:
    """`with_schedule`'s argument as ((consumer, (producer, ...)), ...); a malformed one raises."""
    out = []
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)):
            _m.fail(f"with_schedule: {pair!r} is not a (consumer name, producer name or list of names) pair",
                    _m.NkiEmulatorError)
        producers = (pair[1],) if isinstance(pair[1], str) else tuple(pair[1])
        if not producers or not all(isinstance(p, str) for p in producers):
            _m.fail(f"with_schedule: producers {pair[1]!r} of {pair[0]!r} are not instruction names",
                    _m.NkiEmulatorError)
        out.append((pair[0], producers))
    return tuple(out)


def apply_schedule(machine, schedule: tuple, where: str) -> None:
    """The kernel's `with_schedule` edges between the instructions its call issued under those names."""
    names = machine.order.names

    def one(name):
        calls = names.get(name, [])
        if len(calls) != 1:
            raise _m.NkiEmulatorError(f"{where}: with_schedule: {len(calls) or 'no'} instructions of this call "
                                      f"are named {name!r} (each name in a schedule must name exactly one)")
        return calls[0]

    for consumer, producers in schedule:
        c = one(consumer)
        for p in producers:
            _edges(machine.order, c, one(p))
