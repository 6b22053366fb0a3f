"""A stateful model of the pool (hypothesis): random lifecycles, checked after every step."""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import functools
import gc
import itertools
import os
import pickle
import typing
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import pytest
import torch
from _events import EVENT_ERRORS, FlipEvent, NoQuery, RaisingEvent, WaitableFlipEvent
from _helpers import (
    ENTRY_BYTES,
    FIELDS,
    Pattern,
    bucket_map,
    check_stats_consistent,
    exit_child,
    field_addresses,
    fork,
    has_pattern,
    make_pattern,
    suspended_in_with,
    wait_for_child,
    write_pattern,
)
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from bucketpool import (
    BucketPool,
    BucketStats,
    BufferHandle,
    DebugLevel,
    DescriptorBuffers,
    PoolStats,
    ReleaseError,
)
from bucketpool._buffer import VIEW_SET_BYTES, VIEW_SETS

DEBUG_LEVELS: tuple[DebugLevel, ...] = typing.get_args(DebugLevel)


_keys = itertools.count(1)


@attrs.define(eq=False)
class Tracked:
    """What the model knows about one handle of the pool under test."""

    handle: BufferHandle = attrs.field(repr=False)
    key: int
    n: int
    capacity: int
    # Captured at acquire: kept after release so that a parked buffer can be re-checked.
    arrays: tuple[npt.NDArray[Any], ...] = attrs.field(repr=False)
    pattern: Pattern = attrs.field(repr=False)
    addresses: tuple[int, int, int]
    events: list[FlipEvent] = attrs.field(factory=list, repr=False)

    @property
    def pending(self) -> bool:
        return not all(event.settled for event in self.events)

    @property
    def raising(self) -> bool:
        return any(event.raising for event in self.events)

    def intervals(self) -> list[tuple[int, int]]:
        size = self.capacity * ENTRY_BYTES
        return [(address, address + size) for address in self.addresses]


BAD_COUNTS: list[object] = [
    -1,
    -(1 << 70),
    1 << 70,
    True,
    False,
    1.0,
    2.5,
    "4",
    None,
    b"1",
    [3],
    np.float64(2),
]


def _boundary_counts(max_n: int) -> list[int]:
    values = {0, 1, 2, 3}
    for k in range(1, max_n.bit_length()):
        values.update({(1 << k) - 1, 1 << k, (1 << k) + 1})
    return sorted(v for v in values if v <= max_n)


def count_strategy(max_n: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(_boundary_counts(max_n)), st.integers(0, max_n))


class PoolMachine(RuleBasedStateMachine):
    """Drives one pool through random lifecycles and checks it against a model."""

    def __init__(self) -> None:
        super().__init__()
        self.live: list[Tracked] = []
        self.pending: list[Tracked] = []  # released with an event not yet done: parked
        self.done: list[Tracked] = []  # parked, events done, maybe not retired yet
        self.released: list[BufferHandle] = []
        self.known: set[int] = set()  # ids of every handle referenced here (all kept alive)
        self.tick = 0  # successful acquires of the pool under test
        self.acquires = 0
        self.reserved = 0
        self.forks = 0
        self.requested = 0
        self.rounded = 0
        self.active_peak = 0
        self.last_acquire: dict[int, int] = {}
        self.last_added: dict[int, int] = {}
        # Each bucket's idle buffers, most recently cached last: a source-field address,
        # or None where the order is not known (buffers retired from parking).
        self.free: dict[int, list[int | None]] = {}

    # -- set-up ------------------------------------------------------------------------

    @initialize(
        # The first value of each is the simplest set-up, which shrinking goes to.
        min_capacity=st.sampled_from([4, 1, 16]),
        max_capacity=st.sampled_from([1024, 64]),
        max_cached_bytes=st.sampled_from([200_000, 30_000, 3_000, 400, 0]),
        per_bucket=st.sampled_from([2, 1, 0, 4, 32]),
        idle=st.sampled_from([0, 8, 3, 1, 1024]),
        debug=st.sampled_from(DEBUG_LEVELS),
        dtype=st.sampled_from([torch.int64, torch.uint64]),
    )
    def make_pool(
        self,
        min_capacity: int,
        max_capacity: int,
        max_cached_bytes: int,
        per_bucket: int,
        idle: int,
        debug: DebugLevel,
        dtype: torch.dtype,
    ) -> None:
        self.pool = BucketPool(
            dtype=dtype,
            min_capacity=min_capacity,
            max_capacity=max_capacity,
            max_cached_bytes=max_cached_bytes,
            max_cached_per_bucket=per_bucket,
            idle_trim_acquires=idle,
            debug=debug,
            trace=False,
        )
        self.other = BucketPool(min_capacity=4, max_capacity=1024, idle_trim_acquires=0)

    # -- helpers -----------------------------------------------------------------------

    def capacity_of(self, n: int) -> int:
        floor = self.pool.settings.min_capacity
        return floor if n <= floor else 1 << (n - 1).bit_length()

    def nbytes(self, capacity: int) -> int:
        return capacity * ENTRY_BYTES * FIELDS

    def count_acquire(self, n: int, capacity: int) -> None:
        self.tick += 1
        self.acquires += 1
        self.requested += n
        self.rounded += capacity
        self.last_acquire[capacity] = self.tick

    def settle_done(self) -> None:
        """Move parked-and-done handles whose buffers certainly retired out of `done`."""
        buckets = bucket_map(self.pool.stats())
        still: list[Tracked] = []
        for tracked in self.done:
            bucket = buckets.get(tracked.capacity)
            parked = 0 if bucket is None else bucket.parked
            pending = sum(1 for t in self.pending if t.capacity == tracked.capacity)
            if parked > pending:
                still.append(tracked)
            else:
                self.released.append(tracked.handle)
        self.done = still

    def refresh_pending(self) -> None:
        for tracked in [t for t in self.pending if not t.pending]:
            self.pending.remove(tracked)
            # Its buffer may be handed out again: hold no views of it from here on.
            tracked.arrays = ()
            self.done.append(tracked)

    def take_top(self, capacity: int, old_cached: int, address: int) -> None:
        """Check that an acquire reused the most recently cached buffer of its bucket."""
        stack = self.free.setdefault(capacity, [])
        assert len(stack) == old_cached
        if stack:
            top = stack.pop()
            assert top is None or address == top, "the last buffer cached was not reused first"
        if self.done:
            # The acquire may have retired parked buffers, reordering idle lists.
            self.forget_free_order()

    def take_top_unknown(self, capacity: int, old_cached: int) -> None:
        stack = self.free.setdefault(capacity, [])
        assert len(stack) == old_cached
        if stack:
            stack.pop()
        if self.done:
            self.forget_free_order()

    def forget_free_order(self) -> None:
        for stack in self.free.values():
            stack[:] = [None] * len(stack)

    def reconcile_free(self, buckets: dict[int, BucketStats]) -> None:
        """Follow what a step did to idle lists: trims take the oldest, retirements add."""
        for capacity in set(self.free) | set(buckets):
            stack = self.free.setdefault(capacity, [])
            cached = buckets[capacity].cached if capacity in buckets else 0
            if cached < len(stack):
                del stack[: len(stack) - cached]
            else:
                stack.extend([None] * (cached - len(stack)))

    def expect_unchanged(self, before: PoolStats) -> None:
        assert self.pool.stats() == before

    # -- acquire -----------------------------------------------------------------------

    @rule(data=st.data())
    def acquire(self, data: st.DataObject) -> None:
        self.do_acquire(data, as_numpy=data.draw(st.booleans(), label="as_numpy"))

    @rule(data=st.data())
    def acquire_another(self, data: st.DataObject) -> None:
        # A second rule doubles how often acquires are drawn against the cheaper rules.
        self.do_acquire(data, as_numpy=False)

    def do_acquire(self, data: st.DataObject, as_numpy: bool) -> None:
        n = data.draw(count_strategy(self.pool.settings.max_capacity), label="n")
        capacity = self.capacity_of(n)
        before = bucket_map(self.pool.stats()).get(capacity)
        handle = self.pool.acquire(np.int64(n) if as_numpy else n)
        self.refresh_pending()  # its poll may have made a failing event report done
        assert type(handle.n) is int
        assert handle.n == n
        assert not handle.released
        assert handle.capacity == capacity == self.pool.bucket_capacity(n)
        # A handle object the test still references is never handed out again.
        assert id(handle) not in self.known
        self.known.add(id(handle))
        views = handle.buffers
        arrays = handle.arrays
        for view, array in zip(views, arrays, strict=True):
            assert view.shape == (n,)
            assert view.dtype == self.pool.settings.dtype
            assert view.device.type == "cpu"
            assert view.is_contiguous()
            assert array.shape == (n,)
            if n:
                assert view.data_ptr() == array.ctypes.data
        addresses = field_addresses(arrays)
        # A buffer parked behind a pending event is never handed out.
        assert addresses[0] not in {t.addresses[0] for t in self.pending}, "parked buffer reused"
        assert len(set(addresses)) == FIELDS
        if self.pool.settings.debug == "off":
            assert handle.acquired_at is None
        else:
            assert handle.acquired_at is not None
            assert __file__.rsplit("/", 1)[-1] in handle.acquired_at
        after = bucket_map(self.pool.stats())[capacity]
        old_hits, old_misses = (0, 0) if before is None else (before.hits, before.misses)
        old_cached, old_parked = (0, 0) if before is None else (before.cached, before.parked)
        hit = after.hits == old_hits + 1
        assert (after.hits, after.misses) == (
            (old_hits + 1, old_misses) if hit else (old_hits, old_misses + 1)
        )
        if old_cached:
            assert hit, "a cached buffer was there, yet the pool allocated"
        self.take_top(capacity, old_cached, addresses[0])
        if hit and not old_cached:
            # Served by retiring a parked buffer: it must be one whose events are done.
            assert old_parked > sum(1 for t in self.pending if t.capacity == capacity)
            assert addresses[0] in {t.addresses[0] for t in self.done if t.capacity == capacity}
        key = next(_keys)
        pattern = make_pattern(key, n)
        write_pattern(arrays, pattern)
        tracked = Tracked(handle, key, n, capacity, tuple(arrays), pattern, addresses)
        self.live.append(tracked)
        self.count_acquire(n, capacity)
        self.active_peak = max(self.active_peak, len(self.live))

    @rule(data=st.data())
    def acquire_in_with_block(self, data: st.DataObject) -> None:
        n = data.draw(count_strategy(self.pool.settings.max_capacity), label="n")
        keep_handle = data.draw(st.booleans(), label="keep_handle")
        capacity = self.capacity_of(n)
        pattern = make_pattern(next(_keys), n)
        old = bucket_map(self.pool.stats()).get(capacity)
        old_cached = 0 if old is None else old.cached
        address: int | None
        if keep_handle:
            handle = self.pool.acquire(n)
            assert id(handle) not in self.known
            self.known.add(id(handle))
            address = field_addresses(handle.arrays)[0]
            self.take_top(capacity, old_cached, address)
            with handle as bufs:
                self.fill_and_check(bufs, pattern)
            assert handle.released
            self.released.append(handle)
        else:
            # Nothing but the with statement holds the handle.
            with self.pool.acquire(n) as bufs:
                address = bufs.src_ptrs.data_ptr() if n else None
                if address is not None:
                    self.take_top(capacity, old_cached, address)
                else:
                    self.take_top_unknown(capacity, old_cached)
                self.fill_and_check(bufs, pattern)
        self.count_acquire(n, capacity)
        self.active_peak = max(self.active_peak, len(self.live) + 1)
        self.last_added[capacity] = self.tick
        stack = self.free[capacity]
        after = bucket_map(self.pool.stats())[capacity]
        if after.cached == len(stack) + 1:
            # The acquire's idle sweep may have retired a parked buffer into the cache
            # first; then the cap may have freed this one instead: which one is cached
            # is not known.
            retired = after.parked < (0 if old is None else old.parked)
            stack.append(None if retired else address)

    def fill_and_check(self, bufs: DescriptorBuffers, pattern: Pattern) -> None:
        assert len(bufs) == FIELDS
        assert self.pool.stats().active_requests.current == len(self.live) + 1
        for tensor, values in zip(bufs, pattern, strict=True):
            assert tensor.shape == values.shape
            tensor.numpy().view(np.uint64)[:] = values
        for tensor, values in zip(bufs, pattern, strict=True):
            assert np.array_equal(tensor.numpy().view(np.uint64), values)

    def acquire_bad_count(self, bad: object) -> None:
        before = self.pool.stats()
        expected = ValueError if type(bad) is int else TypeError
        with pytest.raises(expected):
            self.pool.acquire(bad)  # type: ignore[arg-type]
        self.expect_unchanged(before)

    def acquire_above_max_capacity(self) -> None:
        before = self.pool.stats()
        with pytest.raises(ValueError, match="max_capacity"):
            self.pool.acquire(self.pool.settings.max_capacity + 1)
        self.expect_unchanged(before)

    @rule(
        data=st.data(),
        kind=st.sampled_from(
            ["bad count", "above max", "non-event", "double release", "foreign", "bad trim"]
        ),
    )
    def misuse(self, data: st.DataObject, kind: str) -> None:
        """Each misuse raises its documented error and changes nothing."""
        if kind == "bad count":
            self.acquire_bad_count(data.draw(st.sampled_from(BAD_COUNTS), label="bad"))
        elif kind == "above max":
            self.acquire_above_max_capacity()
        elif kind == "non-event" and self.live:
            self.record_non_event(data.draw(st.sampled_from(self.live), label="handle"))
        elif kind == "double release" and (self.released or self.pending or self.done):
            handles = self.released + [t.handle for t in self.pending + self.done]
            self.double_release(
                data.draw(st.sampled_from(handles), label="handle"),
                data.draw(st.booleans(), label="through_pool"),
            )
        elif kind == "foreign":
            self.foreign_release(
                data.draw(count_strategy(self.other.settings.max_capacity), label="n")
            )
        elif kind == "bad trim":
            self.trim_bad(data.draw(st.sampled_from([-1, True, 1.5, "0", None]), label="bad"))

    # -- events ------------------------------------------------------------------------

    @precondition(lambda self: self.live)
    @rule(data=st.data(), done=st.booleans(), waitable=st.booleans())
    def record_event(self, data: st.DataObject, done: bool, waitable: bool) -> None:
        tracked = data.draw(st.sampled_from(self.live), label="handle")
        event = WaitableFlipEvent(done) if waitable else FlipEvent(done)
        before = self.pool.stats()
        tracked.handle.record_event(event)
        tracked.events.append(event)
        self.expect_unchanged(before)

    def record_non_event(self, tracked: Tracked) -> None:
        before = self.pool.stats()
        with pytest.raises(TypeError, match="query"):
            tracked.handle.record_event(NoQuery())  # type: ignore[arg-type]
        self.expect_unchanged(before)

    @precondition(lambda self: any(t.pending for t in self.live + self.pending))
    @rule(data=st.data())
    def complete_event(self, data: st.DataObject) -> None:
        waiting = [e for t in self.live + self.pending for e in t.events if not e.settled]
        before = self.pool.stats()
        data.draw(st.sampled_from(waiting), label="event").finish()
        # Completion alone changes nothing: a parked buffer retires at the next pool call.
        self.expect_unchanged(before)
        self.refresh_pending()

    # -- release -----------------------------------------------------------------------

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        tracked = data.draw(st.sampled_from(self.live), label="handle")
        self.do_release(tracked, through_pool=data.draw(st.booleans(), label="through_pool"))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release_in_flight(self, data: st.DataObject) -> None:
        """The worker's pattern: fill, record the copy's end event, release at once."""
        tracked = data.draw(st.sampled_from(self.live), label="handle")
        waitable = data.draw(st.booleans(), label="waitable")
        event = WaitableFlipEvent() if waitable else FlipEvent()
        tracked.handle.record_event(event)
        tracked.events.append(event)
        self.do_release(tracked, through_pool=False)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), streams=st.integers(2, 4))
    def release_on_streams(self, data: st.DataObject, streams: int) -> None:
        """Copies on several streams, one event each: they complete in any order."""
        tracked = data.draw(st.sampled_from(self.live), label="handle")
        for _ in range(streams):
            event = FlipEvent()
            tracked.handle.record_event(event)
            tracked.events.append(event)
        self.do_release(tracked, through_pool=False)

    @precondition(lambda self: any(t.pending for t in self.pending))
    @rule(data=st.data())
    def complete_newest_first(self, data: st.DataObject) -> None:
        """The streams of the most recently parked buffers finish first."""
        waiting = [e for t in reversed(self.pending) for e in reversed(t.events) if not e.settled]
        count = data.draw(st.integers(1, len(waiting)), label="count")
        before = self.pool.stats()
        for event in waiting[:count]:
            event.finish()
        self.expect_unchanged(before)
        self.refresh_pending()

    @precondition(lambda self: self.live)
    @rule(data=st.data(), always=st.booleans(), done=st.booleans(), halt=st.booleans())
    def release_with_failing_event(
        self, data: st.DataObject, always: bool, done: bool, halt: bool
    ) -> None:
        """An event whose query() raises once (then reports *done*) or until finished.

        With *halt* it raises a `BaseException` that is not an `Exception`.
        """
        tracked = data.draw(st.sampled_from(self.live), label="handle")
        event = RaisingEvent(done, raises=-1 if always else 1, halt=halt)
        tracked.handle.record_event(event)
        tracked.events.append(event)
        self.do_release(tracked, through_pool=data.draw(st.booleans(), label="through_pool"))

    # -- fills whose inputs call back ----------------------------------------------------

    @precondition(lambda self: any(t.n and not t.events for t in self.live))
    @rule(data=st.data(), where=st.sampled_from(["first", "sources", "byte_counts", "shrink"]))
    def fill_whose_input_releases(self, data: st.DataObject, where: str) -> None:
        """Reading an input releases the handle: the fill raises and writes nothing."""
        tracked = data.draw(
            st.sampled_from([t for t in self.live if t.n and not t.events]), label="handle"
        )
        calling_back = _ReleasingInput(lambda: self.do_release(tracked, through_pool=False))
        handle = tracked.handle
        fills: dict[str, Callable[[], object]] = {
            "first": lambda: handle.add_copies(calling_back, [4096], [8192], 8),
            "sources": lambda: handle.add_copies(0, calling_back, [8192], 8),
            "byte_counts": lambda: handle.add_copies(0, [4096], [8192], calling_back),
            "shrink": lambda: handle.shrink(calling_back),
        }
        with pytest.raises(ReleaseError):
            fills[where]()
        assert calling_back.released
        assert handle.released
        if self.pool.settings.debug == "off":  # the debug levels poison a released buffer
            assert has_pattern(tracked.arrays, tracked.pattern), "the fill wrote after release"

    # -- a second holder, the garbage collector, fork ----------------------------------------

    @precondition(lambda self: self.live)
    @rule(data=st.data(), how=st.sampled_from(["copy", "deepcopy", "pickle", "pool"]))
    def copy_handle(self, data: st.DataObject, how: str) -> None:
        """A copy would be a second holder: refused, and nothing changes."""
        tracked = data.draw(st.sampled_from(self.live), label="handle")
        copies: dict[str, Callable[[], object]] = {
            "copy": functools.partial(copy.copy, tracked.handle),
            "deepcopy": functools.partial(copy.deepcopy, tracked.handle),
            "pickle": functools.partial(pickle.dumps, tracked.handle),
            "pool": functools.partial(copy.copy, self.pool),
        }
        before = self.pool.stats()
        with pytest.raises(TypeError, match="cannot be copied or pickled"):
            copies[how]()
        self.expect_unchanged(before)
        assert not tracked.handle.released
        assert has_pattern(tracked.handle.arrays, tracked.pattern)

    @rule(data=st.data())
    def with_block_closed_by_gc(self, data: st.DataObject) -> None:
        """A generator suspended inside a with block, abandoned in a cycle, then collected."""
        n = data.draw(count_strategy(self.pool.settings.max_capacity), label="n")
        capacity = self.capacity_of(n)
        old = bucket_map(self.pool.stats()).get(capacity)
        cycle: list[object] = []
        gc.disable()  # nothing collects (or promotes) the cycle before the collection below
        try:
            suspended = suspended_in_with(self.pool, n, cycle)
            next(suspended)
            cycle.append(suspended)  # generator -> frame -> cycle -> generator
            del suspended, cycle  # only the cycle holds it now
            assert self.pool.stats().active_requests.current == len(self.live) + 1
            gc.collect(0)  # the youngest generation holds the cycle: closing it exits the block
        finally:
            gc.enable()
        assert self.pool.stats().active_requests.current == len(self.live)
        self.refresh_pending()
        self.take_top_unknown(capacity, 0 if old is None else old.cached)
        self.count_acquire(n, capacity)
        self.active_peak = max(self.active_peak, len(self.live) + 1)
        self.last_added[capacity] = self.tick

    # A fork costs milliseconds: a few per example.
    @precondition(lambda self: hasattr(os, "fork") and self.forks < 2)
    @rule()
    def fork(self) -> None:
        """A child process gets a working pool with the parent's records."""
        self.forks += 1
        before = self.pool.stats()
        live = [(t.n, t.capacity) for t in self.live]
        taken = {t.addresses[0] for t in self.live + self.pending}
        pid = fork()
        if pid == 0:  # the child: report by exit code only, never return into pytest
            exit_child(lambda: _check_forked_pool(self.pool, live, taken), alarm=20)
        assert wait_for_child(pid) == 0, "the forked child's pool failed"
        self.expect_unchanged(before)

    def do_release(self, tracked: Tracked, through_pool: bool) -> None:
        handle = tracked.handle
        assert has_pattern(handle.arrays, tracked.pattern), "canary overwritten while live"
        assert has_pattern(tracked.arrays, tracked.pattern)
        before = self.pool.stats()
        old = bucket_map(before)[tracked.capacity]
        raising = tracked.raising
        release = functools.partial(self.pool.release, handle) if through_pool else handle.release
        if raising:
            # The error is the releasing caller's; the release took effect all the same.
            with pytest.raises(EVENT_ERRORS):
                release()
        else:
            release()
        assert handle.released
        self.live.remove(tracked)
        self.last_added[tracked.capacity] = self.tick
        after = self.pool.stats()
        new = bucket_map(after)[tracked.capacity]
        assert new.active == old.active - 1
        if raising or tracked.pending:
            assert (new.parked, new.cached) == (old.parked + 1, old.cached)
            assert after.allocations.current == before.allocations.current
            self.pending.append(tracked)
        else:
            assert new.parked == old.parked
            if new.cached == old.cached + 1:
                self.free[tracked.capacity].append(tracked.addresses[0])
            else:
                # Not kept: a cap said so, and the buffer was freed.
                assert after.allocations.freed > before.allocations.freed
            self.released.append(handle)
        if self.pool.settings.debug == "off":
            # Nothing is poisoned at debug "off": a release leaves the contents alone.
            assert has_pattern(tracked.arrays, tracked.pattern)

    def double_release(self, handle: BufferHandle, through_pool: bool) -> None:
        before = self.pool.stats()
        release = functools.partial(self.pool.release, handle) if through_pool else handle.release
        with pytest.raises(ReleaseError, match="already released"):
            release()
        self.expect_unchanged(before)
        with pytest.raises(ReleaseError):
            handle.record_event(FlipEvent(True))
        with pytest.raises(ReleaseError):
            _ = handle.buffers
        with pytest.raises(ReleaseError):
            _ = handle.arrays
        self.expect_unchanged(before)

    def foreign_release(self, n: int) -> None:
        foreign = self.other.acquire(n)
        before, other_before = self.pool.stats(), self.other.stats()
        try:
            with pytest.raises(ReleaseError, match="another pool"):
                self.pool.release(foreign)
            with pytest.raises(TypeError, match="BufferHandle"):
                self.pool.release(foreign.buffers)  # type: ignore[arg-type]
            self.expect_unchanged(before)
            assert self.other.stats() == other_before
            assert not foreign.released
        finally:
            self.other.release(foreign)
        assert self.other.stats().active_requests.current == 0

    # -- explicit memory control -------------------------------------------------------

    @precondition(lambda self: self.pending or self.done)
    @rule()
    def collect(self) -> None:
        self.refresh_pending()
        before = self.pool.stats()
        pending = Counter(t.capacity for t in self.pending)
        raising = any(t.raising for t in self.pending)
        retired = self.pool.collect()  # each event's error reached its release: not again
        if not raising:
            assert retired == before.parked - len(self.pending)
            after = self.pool.stats()
            assert after.parked == len(self.pending)
            for bucket in after.buckets:
                assert bucket.parked == pending[bucket.capacity]
        # Every buffer whose events all reported done was retired, whatever else raised.
        for capacity in {t.capacity for t in self.done}:
            self.last_added[capacity] = self.tick
        self.released.extend(t.handle for t in self.done)
        self.done = []
        self.refresh_pending()
        parked = self.pool.stats().parked
        assert len(self.pending) <= parked <= len(self.pending) + len(self.done)
        self.forget_free_order()

    @precondition(lambda self: self.pending or self.done)
    @rule(polls=st.integers(1, 3))
    def synchronize(self, polls: int) -> None:
        # Waitable events are completed by the pool's call to their synchronize(); plain
        # ones by the "device" only once the pool has asked them *polls* more times, so
        # that the pool must keep polling them, however fast or slow the machine is.
        events = [e for t in self.pending for e in t.events if not e.done]
        polled = [e for e in events if type(e) is not WaitableFlipEvent]
        for event in polled:
            event.finish_after(polls)
        self.refresh_pending()
        failing = [t for t in self.pending if t.raising]
        # Each failing event's error reached its release: synchronize neither raises it
        # again nor waits for it (its query() raises), and those buffers stay parked.
        self.pool.synchronize()
        # Every event of a buffer that did not fail was waited for to the end.
        assert all(e.done for t in self.pending if t not in failing for e in t.events)
        for event in polled:
            event.done = True  # the failing buffers' copies end on the device all the same
        assert all(event.done for event in events)
        retired = [t for t in self.done + self.pending if t not in failing]
        for capacity in {t.capacity for t in retired}:
            self.last_added[capacity] = self.tick
        self.released.extend(t.handle for t in retired)
        self.done = []
        self.pending = failing
        self.refresh_pending()  # a failing event that raised once now reports done
        after = self.pool.stats()
        assert len(self.pending) <= after.parked <= len(self.pending) + len(self.done)
        if not failing:
            assert after.parked == after.parked_bytes == 0
        self.forget_free_order()

    @precondition(lambda self: self.pool.stats().cached_bytes)
    @rule(max_bytes=st.sampled_from([0, 1, 384, 1_000, 5_000, 50_000, 1 << 40]))
    def trim(self, max_bytes: int) -> None:
        before = self.pool.stats()
        # The view sets idle buffers keep count as cached (parked ones' cannot be trimmed).
        views_before = before.view_bytes - self.pool._ledger.parked_views
        freed = self.pool.trim(max_bytes)
        after = self.pool.stats()
        cached_views = after.view_bytes - self.pool._ledger.parked_views
        assert after.cached_bytes + cached_views <= max_bytes or not after.cached_bytes
        assert freed == before.cached_bytes - after.cached_bytes
        if before.cached_bytes + views_before <= max_bytes:
            assert freed == 0
            assert after == before
        else:
            # No more than needed: without the last buffer freed, the target was missed.
            remaining = {b.capacity: b.cached for b in after.buckets}
            shrunk = [
                self.nbytes(b.capacity)
                for b in before.buckets
                if b.cached > remaining.get(b.capacity, 0)
            ]
            most = max(shrunk) + VIEW_SETS * VIEW_SET_BYTES  # the last one freed, views too
            assert after.cached_bytes + after.view_bytes + most > max_bytes
        assert after.allocated_bytes.current == before.allocated_bytes.current - freed
        assert after.active_requests == before.active_requests
        assert after.parked == before.parked
        for new in after.buckets:
            old = bucket_map(before).get(new.capacity)
            assert old is not None
            assert (new.active, new.parked) == (old.active, old.parked)
            assert new.cached <= old.cached

    def trim_bad(self, bad: object) -> None:
        before = self.pool.stats()
        expected = ValueError if type(bad) is int else TypeError
        with pytest.raises(expected, match="max_bytes"):
            self.pool.trim(bad)  # type: ignore[arg-type]
        self.expect_unchanged(before)

    @rule(data=st.data(), count=st.integers(0, 3))
    def reserve(self, data: st.DataObject, count: int) -> None:
        n = data.draw(count_strategy(self.pool.settings.max_capacity), label="n")
        capacity = self.capacity_of(n)
        nbytes = self.nbytes(capacity)
        before = self.pool.stats()
        old = bucket_map(before).get(capacity)
        cached = (0 if old is None else old.cached) + count
        # Parked buffers count against the byte cap, as cached ones do.
        idle_bytes = before.cached_bytes + before.parked_bytes + before.view_bytes
        if count and (
            cached > self.pool.settings.max_cached_per_bucket
            or idle_bytes + count * nbytes > self.pool.settings.max_cached_bytes
        ):
            with pytest.raises(ValueError, match="reserve"):
                self.pool.reserve(n, count)
            self.expect_unchanged(before)
            return
        self.pool.reserve(n, count)
        after = self.pool.stats()
        if count:
            assert bucket_map(after)[capacity].cached == cached
        assert after.cached_bytes == before.cached_bytes + count * nbytes
        assert after.allocations.allocated == before.allocations.allocated + count
        assert (after.hits, after.misses) == (before.hits, before.misses)
        self.reserved += count
        self.last_acquire[capacity] = self.tick
        self.last_added[capacity] = self.tick

    @rule(outstanding=st.booleans())
    def inspect(self, outstanding: bool) -> None:
        if outstanding:
            self.check_outstanding()
        else:
            self.reset_peak_stats()

    def reset_peak_stats(self) -> None:
        self.pool.reset_peak_stats()
        stats = self.pool.stats()
        for stat in (stats.allocations, stats.allocated_bytes):
            assert stat.peak == stat.current
        assert stats.active_requests.peak == stats.active_requests.current
        assert stats.active_bytes.peak == stats.active_bytes.current
        self.active_peak = len(self.live)

    def check_outstanding(self) -> None:
        before = self.pool.stats()
        found = self.pool.outstanding()
        # Oldest first: the model's live list is in acquire order too.
        assert [(r.n, r.capacity) for r in found] == [(t.n, t.capacity) for t in self.live]
        assert [r.acquired_at for r in found] == [t.handle.acquired_at for t in self.live]
        self.expect_unchanged(before)

    # -- checked after every step ------------------------------------------------------

    @invariant()
    def stats_match_model(self) -> None:
        if not hasattr(self, "pool"):
            return
        self.refresh_pending()
        self.settle_done()
        stats = self.pool.stats()
        check_stats_consistent(
            stats,
            max_cached_bytes=self.pool.settings.max_cached_bytes,
            per_bucket=self.pool.settings.max_cached_per_bucket,
        )
        buckets = bucket_map(stats)
        live = Counter(t.capacity for t in self.live)
        pending = Counter(t.capacity for t in self.pending)
        done = Counter(t.capacity for t in self.done)
        for capacity in set(live) | set(pending) | set(done):
            assert capacity in buckets
        for capacity, bucket in buckets.items():
            assert bucket.active == live[capacity]
            assert pending[capacity] <= bucket.parked <= pending[capacity] + done[capacity]
        assert stats.active_requests.current == len(self.live)
        assert stats.active_requests.peak == self.active_peak
        assert stats.active_bytes.current == sum(self.nbytes(t.capacity) for t in self.live)
        assert stats.hits + stats.misses == self.acquires
        assert stats.allocations.allocated == stats.misses + self.reserved
        assert stats.requested_entries == self.requested
        assert stats.rounded_entries == self.rounded
        self.reconcile_free(buckets)
        idle = self.pool.settings.idle_trim_acquires
        if idle:
            # An unused bucket gives its cache back within 5/4 of idle_trim_acquires.
            bound = idle + max(1, idle // 4)
            for capacity, bucket in buckets.items():
                last_use = max(self.last_acquire.get(capacity, 0), self.last_added.get(capacity, 0))
                if self.tick - last_use >= bound:
                    assert bucket.cached == 0, (capacity, self.tick, last_use)

    @invariant()
    def buffers_disjoint_and_intact(self) -> None:
        self.refresh_pending()
        held = self.live + self.pending
        for tracked in held:
            assert has_pattern(tracked.arrays, tracked.pattern), f"canary of {tracked} changed"
        spans = sorted(span for tracked in held for span in tracked.intervals())
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, "two held buffers share memory"
        views = [t.handle.buffers.src_ptrs.data_ptr() for t in self.live if t.n]
        assert len(views) == len(set(views))

    @rule(through_pool=st.booleans())
    def drain(self, through_pool: bool) -> None:
        """Release everything, let every copy finish: nothing is out, nothing parked."""
        for tracked in list(self.live):
            self.do_release(tracked, through_pool)
        for tracked in self.pending:
            for event in tracked.events:
                event.finish()
        self.refresh_pending()
        self.pool.synchronize()
        for capacity in {t.capacity for t in self.done}:
            self.last_added[capacity] = self.tick  # retired into the cache just now
        stats = self.pool.stats()
        assert stats.active_requests.current == stats.active_bytes.current == 0
        assert stats.parked == stats.parked_bytes == 0
        assert stats.allocations.current == sum(b.cached for b in stats.buckets)
        assert self.pool.outstanding() == []
        assert self.other.outstanding() == []
        self.released.extend(t.handle for t in self.done)
        self.done = []
        self.forget_free_order()

    def teardown(self) -> None:
        # Clean-up only, so that a failing step is reported alone: every handle is
        # released (an unreleased one warns, and warnings are errors here).
        for tracked in self.live:
            with contextlib.suppress(Exception):
                tracked.handle.release()
        self.live = []


class _ReleasingInput(collections.abc.Sequence[int]):
    """One copy's worth of an input (the value 0) whose first reading runs *release*."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release
        self.released = False

    def _read(self) -> None:
        if not self.released:
            self.released = True
            self._release()

    def __len__(self) -> int:
        self._read()
        return 1

    @typing.overload
    def __getitem__(self, index: int) -> int: ...
    @typing.overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        self._read()
        if isinstance(index, slice):
            return [0][index]
        if index != 0:
            raise IndexError(index)
        return 0

    def __index__(self) -> int:
        self._read()
        return 0


def _check_forked_pool(pool: BucketPool, live: list[tuple[int, int]], taken: set[int]) -> int:
    """(in a forked child) Return 0 if *pool* is consistent and works, else a failure code."""
    try:
        stats = pool.stats()
        check_stats_consistent(
            stats,
            max_cached_bytes=pool.settings.max_cached_bytes,
            per_bucket=pool.settings.max_cached_per_bucket,
        )
        if stats.active_requests.current != len(live):
            return 4
        if [(r.n, r.capacity) for r in pool.outstanding()] != live:
            return 5
        with pool.acquire(3) as bufs:
            if bufs.src_ptrs.numpy().ctypes.data in taken:
                return 6  # a buffer still held or parked in the parent was handed out
        if pool.stats().active_requests.current != len(live):
            return 7
    except BaseException:
        return 8
    return 0


PoolMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPoolMachine = PoolMachine.TestCase
