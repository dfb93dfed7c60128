"""DelayQueue against a simple model, driven by Hypothesis with a FakeClock.

Properties: an item never comes out before its deadline; due items come out
in (deadline, put order) order; nothing is lost or duplicated.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from delayq import DelayedItem, DelayQueue, QueueClosed
from delayq.testing import FakeClock

# Delays on a coarse grid so equal deadlines (ties) are common.
delays = st.integers(min_value=-4, max_value=20).map(lambda n: n / 4)


class DelayQueueMachine(RuleBasedStateMachine):
    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.queue: DelayQueue[DelayedItem[int]] = DelayQueue(clock=self.clock)
        self.model: list[tuple[float, int]] = []  # (deadline, put number), in put order
        self.next_id = 0
        self.put_ids: set[int] = set()
        self.out_ids: list[int] = []  # taken, polled, drained or removed
        self.closed = False

    # -- model helpers --------------------------------------------------------
    def due(self) -> list[tuple[float, int]]:
        now = self.clock.monotonic()
        return sorted(e for e in self.model if e[0] <= now)

    def came_out(self, item: DelayedItem[int] | None) -> None:
        due = self.due()
        if item is None:
            assert due == [], f"nothing came out although {due} is due"
            return
        assert item.deadline <= self.clock.monotonic(), "an item came out early"
        assert due, "an item came out although none is due in the model"
        assert (item.deadline, item.value) == due[0], "due items out of order"
        self.model.remove(due[0])
        self.out_ids.append(item.value)

    # -- rules ------------------------------------------------------------------------
    @precondition(lambda self: not self.closed)
    @rule(target=handles, delay=delays)
    def put(self, delay: float) -> DelayedItem[int]:
        item = self.queue.put_after(self.next_id, delay)
        self.model.append((item.deadline, self.next_id))
        self.put_ids.add(self.next_id)
        self.next_id += 1
        return item

    @rule(seconds=st.sampled_from([0, 0.25, 0.5, 1, 3]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def poll(self) -> None:
        try:
            item = self.queue.poll()
        except QueueClosed:
            assert self.closed and not self.due()
            return
        self.came_out(item)

    @precondition(lambda self: bool(self.due()))
    @rule()
    def take_a_due_item(self) -> None:
        self.came_out(self.queue.take())

    @rule(max_items=st.none() | st.integers(min_value=0, max_value=3))
    def drain(self, max_items: int | None) -> None:
        sink: list[DelayedItem[int]] = []
        count = self.queue.drain_to(sink, max_items=max_items)
        assert count == len(sink)
        expected = self.due() if max_items is None else self.due()[:max_items]
        assert [(i.deadline, i.value) for i in sink] == expected
        for e in expected:
            self.model.remove(e)
        self.out_ids.extend(i.value for i in sink)

    @rule(handle=consumes(handles))
    def remove(self, handle: DelayedItem[int]) -> None:
        entry = (handle.deadline, handle.value)
        present = entry in self.model
        assert self.queue.remove(handle) is present
        if present:
            self.model.remove(entry)
            self.out_ids.append(handle.value)

    @rule()
    def close(self) -> None:
        self.queue.close()
        self.closed = True

    # -- invariants ---------------------------------------------------------------------
    @invariant()
    def size_and_head_match_the_model(self) -> None:
        assert len(self.queue) == len(self.model)
        head = min(self.model, default=None)
        assert self.queue.next_deadline() == (None if head is None else head[0])
        peeked = self.queue.peek()
        assert (None if peeked is None else (peeked.deadline, peeked.value)) == head

    def teardown(self) -> None:
        # Nothing lost or duplicated: everything put comes out exactly once.
        self.clock.advance(100)
        rest: list[DelayedItem[int]] = []
        self.queue.drain_to(rest)
        out = self.out_ids + [i.value for i in rest]
        assert len(out) == len(set(out)), "an item came out twice"
        assert set(out) == self.put_ids, "an item was lost"


DelayQueueMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestDelayQueueAgainstModel = DelayQueueMachine.TestCase
