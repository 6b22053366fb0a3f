"""Completion events and parking: a released buffer waits for its copies, then comes back."""

from __future__ import annotations

import collections
import gc
import typing
import warnings
import weakref

import numpy as np
import pytest
import torch
from _events import DeviceError, FlagEvent, RaisingEvent, ScriptedEvent, SyncEvent
from _helpers import TRIPLE_16, bucket_map, data_ptrs, has_pattern, make_pattern, write_pattern

from bucketpool import (
    BucketPool,
    BufferHandle,
    CompletionEvent,
    DebugLevel,
    LeakWarning,
    ReleaseError,
    _lock,
    orphaned_buffers,
)
from bucketpool._ledger import Ledger
from bucketpool._parking import AGE, POLL_BUDGET
from bucketpool.compat import DescriptorBufferPool

# -- record_event --------------------------------------------------------------------------


def test_record_event_needs_a_query_method(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    for bad in (object(), 3, "event"):
        with pytest.raises(TypeError, match=r"query\(\) -> bool method"):
            handle.record_event(bad)  # type: ignore[arg-type]
    handle.release()
    assert pool.stats().parked == 0  # nothing was recorded


def test_record_of_a_non_event_is_a_type_error(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    with pytest.raises(TypeError, match=r"query\(\) -> bool method"):
        handle.record_event(object())  # type: ignore[arg-type]
    handle.release()
    assert pool.stats().parked == 0


def test_record_event_after_release_is_refused(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    handle.release()
    with pytest.raises(ReleaseError, match=r"record_event: this handle \(n=5"):
        handle.record_event(FlagEvent())
    assert pool.stats().parked == 0


def test_record_after_release_raises(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    handle.release()
    with pytest.raises(ReleaseError, match="record_event: this handle"):
        handle.record_event(FlagEvent())


def test_record_event_does_not_query(pool: BucketPool) -> None:
    event = FlagEvent()
    handle = pool.acquire(5)
    handle.record_event(event)
    assert event.queries == 0  # not at debug "off": queried at release
    handle.release()
    assert event.queries == 1
    event.done = True
    pool.collect()


def test_record_event_keeps_the_new_event_when_an_earlier_answer_cannot_be_read(
    pool: BucketPool,
) -> None:
    # An earlier event's query() answers with something whose truth raises: that is the
    # earlier event's problem, asked again at release; this record takes effect.
    class Unreadable:
        def __bool__(self) -> bool:
            raise DeviceError("lost the device")

    class Odd:
        def query(self) -> Unreadable:
            return Unreadable()

    handle = pool.acquire(4)
    handle.record_event(Odd())  # type: ignore[arg-type]
    pending = FlagEvent()
    handle.record_event(pending)  # asks Odd first
    handle.record_event(FlagEvent())
    with pytest.raises(DeviceError):
        handle.release()  # the release asks Odd again: the error, after taking effect
    assert handle.released
    assert pool.stats().parked == 1  # with every event kept


# Issue 18 (the third hostile review), case 11.
def test_record_event_asks_a_bounded_number_of_earlier_events(
    pool_at_each_level: BucketPool,
) -> None:
    pool = pool_at_each_level
    handle = pool.acquire(4)
    events = [FlagEvent(done=True) for _ in range(500)]  # each copy done by the next
    for i, event in enumerate(events):
        handle.add_copies(0, [i], [i], [1])
        handle.record_event(event)
    assert sum(event.queries for event in events) <= 2 * len(events)  # was quadratic
    handle.release()


# Issue 18 (the third hostile review), case 11.
def test_done_events_are_dropped_while_the_handle_is_held() -> None:
    pool = BucketPool()
    handle = pool.acquire(4)
    refs = []
    for _ in range(10):
        event = FlagEvent(done=True)
        refs.append(weakref.ref(event))
        handle.record_event(event)
        del event
    handle.record_event(FlagEvent())
    handle.record_event(FlagEvent())
    gc.collect()
    assert sum(ref() is not None for ref in refs) <= 2
    handle.release()


# -- parking -------------------------------------------------------------------------------


def test_pending_event_parks_the_buffer_until_done(pool: BucketPool) -> None:
    first = pool.acquire(50)
    ptrs = data_ptrs(first.buffers)
    event = FlagEvent()
    first.record_event(event)
    first.release()
    assert pool.stats().parked == 1
    with pool.acquire(50) as other:  # the parked buffer is not handed out
        assert data_ptrs(other) != ptrs
    event.done = True
    # A cached buffer is served first; the parked one retires when the bucket runs dry.
    again = [pool.acquire(50) for _ in range(2)]
    assert {data_ptrs(h.buffers) for h in again} == {ptrs, data_ptrs(other)}
    assert pool.stats().parked == 0
    for handle in again:
        handle.release()


def test_done_event_does_not_park(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    handle.record_event(FlagEvent(done=True))
    handle.release()
    assert pool.stats().parked == 0
    assert pool.stats().cached_bytes == TRIPLE_16


def test_every_event_must_complete(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    events = [FlagEvent(), FlagEvent(), FlagEvent(done=True)]
    for event in events:
        handle.record_event(event)
    handle.release()
    events[0].done = True
    assert pool.collect() == 0
    events[1].done = True
    assert pool.collect() == 1
    assert pool.collect() == 0


@pytest.mark.parametrize("ending", ["release", "with"])
def test_an_event_recorded_by_a_query_during_release_parks_the_buffer(
    pool: BucketPool, ending: str
) -> None:
    # A query() asked by the release records another event on the handle: that one is
    # pending too, so the buffer parks instead of going back to the cache.
    handle = pool.acquire(5)
    late = FlagEvent()

    class Recording:
        def query(self) -> bool:
            handle.record_event(late)
            return True

    handle.record_event(Recording())
    if ending == "release":
        handle.release()
    else:
        with handle:
            pass
    assert pool.stats().parked == 1
    with pool.acquire(5) as other:  # not the parked buffer
        assert other.sizes.untyped_storage().data_ptr() != handle._buffer.address
    late.done = True
    assert pool.collect() == 1


def test_done_events_are_not_queried_again(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    done, pending = FlagEvent(done=True), FlagEvent()
    handle.record_event(done)
    handle.record_event(pending)
    handle.release()
    pool.collect()
    assert done.queries == 1
    pending.done = True
    pool.collect()


def test_released_while_parked(pool: BucketPool) -> None:
    event = FlagEvent()
    handle = pool.acquire(4)
    handle.record_event(event)
    handle.release()
    assert handle.released  # over for the holder, though the buffer is still parked
    assert pool.stats().parked == 1
    event.done = True
    assert pool.collect() == 1


def test_real_torch_event_on_cpu(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    handle.record_event(torch.Event(device="cpu"))  # never recorded: reports done
    ptr = handle.buffers.src_ptrs.data_ptr()
    handle.release()
    assert pool.stats().parked == 0
    with pool.acquire(5) as bufs:
        assert bufs.src_ptrs.data_ptr() == ptr


@pytest.mark.pool(min_capacity=4, max_capacity=1024, idle_trim_acquires=0)
def test_unrecorded_torch_event_does_not_park(pool: BucketPool) -> None:
    event = torch.Event(device="cpu")
    assert event.query()  # never recorded: reports done
    handle = pool.acquire(100)
    address = handle.buffers.src_ptrs.data_ptr()
    handle.record_event(event)
    pool.release(handle)
    stats = pool.stats()
    assert stats.parked == 0
    assert bucket_map(stats)[128].cached == 1
    again = pool.acquire(128)
    try:
        assert again.buffers.src_ptrs.data_ptr() == address
        assert pool.stats().hits == 1
    finally:
        again.release()
    assert pool.outstanding() == []


def test_release_takes_effect_when_the_event_raises(pool: BucketPool) -> None:
    """Issue 10, case 9: release() with a raising event left the handle unreleased, then lost."""
    event = ScriptedEvent(after=DeviceError("device lost"))
    handle = pool.acquire(8)
    handle.record_event(event)
    with pytest.raises(DeviceError):
        handle.release()
    assert handle.released
    del handle  # no leak warning (warnings are errors here): it was released
    stats = pool.stats()
    assert (stats.active_requests.current, stats.parked) == (0, 1)
    event.after = True
    assert pool.collect() == 1
    assert pool.stats().cached_bytes == TRIPLE_16


# -- parking order: out of order, and behind a stuck event ---------------------------------


# Issue 18 (the third hostile review), case 3.
def test_a_stuck_event_does_not_hold_back_later_parked_buffers() -> None:
    pool = BucketPool()
    stuck = pool.acquire(8)
    stuck.record_event(FlagEvent())  # never completes (another stream, or a hung copy)
    stuck.release()
    for _ in range(200):
        event = FlagEvent()
        handle = pool.acquire(8)
        handle.record_event(event)
        handle.release()
        event.done = True  # this stream completes; the stuck one never does
    stats = pool.stats()
    assert stats.parked <= 2  # the stuck one, and perhaps the last, not asked since
    assert stats.allocations.current <= 3  # was one new buffer per step


# Issue 18 (the third hostile review), case 3.
def test_events_completing_in_reverse_order_are_retired() -> None:
    pool = BucketPool()
    events = [FlagEvent() for _ in range(6)]
    for event in events:
        handle = pool.acquire(16)
        handle.record_event(event)
        handle.release()
    for event in events[1:]:  # the last ones complete, the first never
        event.done = True
    for _ in range(6):  # three at once: the cache runs dry, and each miss asks a few
        handles = [pool.acquire(16) for _ in range(3)]
        for handle in handles:
            handle.release()
    assert pool.stats().allocations.current == 6  # the retired ones served, none new
    pool.collect()
    assert pool.stats().parked == 1


# -- polling: never under the lock, errors to the right caller, bounded --------------------


@pytest.mark.pool(idle_trim_acquires=4)
def test_events_are_never_queried_under_the_pool_lock(pool: BucketPool) -> None:
    event = ScriptedEvent(False, False, False, after=True)
    handle = pool.acquire(8)
    handle.record_event(event)
    handle.release()  # queried by the release
    with pool.acquire(8):  # a miss: polls the parked buffer
        pass
    pool.collect()
    pool.synchronize()
    assert len(event.under_lock) >= 3
    assert not any(event.under_lock)


@pytest.mark.pool(idle_trim_acquires=0)
def test_a_miss_asks_each_parked_buffer_at_most_once(pool: BucketPool) -> None:
    events = [FlagEvent() for _ in range(2)]
    for event in events:
        handle = pool.acquire(8)
        handle.record_event(event)
        handle.release()  # asked once here
    before = [event.queries for event in events]
    with pool.acquire(8):  # a miss: polls the two parked buffers, once each
        pass
    assert [event.queries - asked for event, asked in zip(events, before, strict=True)] == [1, 1]
    for event in events:
        event.done = True
    assert pool.collect() == 2


@pytest.mark.pool(idle_trim_acquires=4)
def test_an_acquire_never_sees_another_buffers_query_error(pool: BucketPool) -> None:
    failing = ScriptedEvent(False, after=RuntimeError("device lost"))
    handle = pool.acquire(8)
    handle.record_event(failing)
    handle.release()
    handles = [pool.acquire(8) for _ in range(5)]  # misses and sweeps poll it
    assert len(failing.under_lock) > 1
    for other in handles:
        other.release()
    assert pool.stats().parked == 1


def test_an_event_raising_in_acquires_poll_does_not_fail_the_acquire() -> None:
    """Issue 10, case 7: an event raising once in acquire's sweep failed that acquire and lost a
    buffer."""
    pool = BucketPool(idle_trim_acquires=4)  # a sweep every acquire
    event = ScriptedEvent(False, DeviceError("once"), after=True)
    parked = pool.acquire(8)
    parked.record_event(event)
    parked.release()  # pending: parked
    assert pool.stats().parked == 1
    handles = [pool.acquire(8) for _ in range(6)]  # misses and sweeps poll the parked buffer
    assert event.queries >= 3  # the raise was seen by an acquire, and then "done"
    for handle in handles:
        handle.release()
    stats = pool.stats()
    assert stats.active_requests.current == 0
    assert stats.parked == 0
    assert stats.allocations.current == sum(b.cached for b in stats.buckets)


@pytest.mark.pool(idle_trim_acquires=8, max_cached_per_bucket=0)
def test_acquire_polls_a_bounded_number_of_parked_buffers(pool: BucketPool) -> None:
    """Issue 10, case 14: with 10,000 parked, every sweep and miss polled all of them."""
    event = ScriptedEvent(after=False)  # one stream, never done: every parked one waits
    for _ in range(10_000):
        handle = pool.acquire(8)
        handle.record_event(event)
        handle.release()
    assert pool.stats().parked == 10_000
    event.queries = 0
    acquires = 0
    for _ in range(50):  # misses of the same bucket, and sweeps
        with pool.acquire(8):
            acquires += 1
    held = [pool.acquire(8) for _ in range(50)]
    acquires += len(held)
    for handle in held:
        handle.release()
    # A miss asks at most POLL_BUDGET; the sweep (here every other acquire) asks at most
    # POLL_BUDGET of each parking queue.
    assert event.queries <= 2 * POLL_BUDGET * acquires + 10
    assert pool.stats().parked == 10_000


class Stop(BaseException):
    """Not an Exception: what a custom BaseException (or SystemExit) from query() is."""


# Issue 18 (the third hostile review), case 4.
def test_a_base_exception_from_a_parked_event_reaches_only_the_collector() -> None:
    pool = BucketPool(max_cached_per_bucket=1)
    raising = ScriptedEvent(after=False)
    handle = pool.acquire(8)
    handle.record_event(raising)  # pending at release: parked
    handle.release()
    raising.after = Stop()  # its query() now raises (a driver error, say)
    before = raising.queries
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (8, 300, 8, 5000):  # unrelated acquires that poll and allocate
            with pool.acquire(n):
                pass
    assert raising.queries > before  # the polls did ask it
    with pytest.raises(Stop):
        pool.collect()
    assert pool.stats().parked == 1


# Issue 18 (the third hostile review), case 4.
def test_release_re_raises_a_base_exception_after_taking_effect() -> None:
    pool = BucketPool()
    handle = pool.acquire(8)
    handle.record_event(ScriptedEvent(after=Stop()))
    with pytest.raises(Stop):
        handle.release()
    assert handle.released
    assert pool.stats().parked == 1


def _park(pool: BucketPool, event: CompletionEvent, n: int = 16) -> int:
    """Acquire *n*, record *event*, release; return the buffer's address."""
    handle = pool.acquire(n)
    address = handle.buffers[0].data_ptr()
    handle.record_event(event)
    handle.release()
    return address


def test_a_raising_event_is_reported_once_by_collect_naming_its_buffer() -> None:
    pool = BucketPool()
    failing = ScriptedEvent(False, after=DeviceError("device lost"))  # pending at release
    address = _park(pool, failing)
    later = FlagEvent()
    _park(pool, later)
    with pytest.raises(DeviceError) as raised:
        pool.collect()
    notes = "".join(getattr(raised.value, "__notes__", []))
    assert "parked buffer (capacity 16, n=16, acquired at " in notes
    assert f"{__file__}:" in notes
    later.done = True
    assert pool.collect() == 1  # not raised again; the others keep retiring
    pool.synchronize()  # neither raised nor waited for: its query() raises
    assert failing.queries >= 4  # asked each time all the same
    assert pool.stats().parked == 1
    with pool.acquire(16) as bufs:
        assert bufs[0].data_ptr() != address  # out of reuse
    failing.after = True  # the device recovered: done after all
    assert pool.collect() == 1
    assert pool.stats().parked == 0


@pytest.mark.parametrize("settle", ["collect", "synchronize"])
def test_an_error_the_release_raised_is_not_raised_again(settle: str) -> None:
    pool = BucketPool()
    failing = RaisingEvent(raises=-1)  # raises until finished
    handle = pool.acquire(16)
    address = handle.buffers[0].data_ptr()
    handle.record_event(failing)
    with pytest.raises(DeviceError):
        handle.release()  # reported here, to the releaser
    done = FlagEvent()
    _park(pool, done)
    done.done = True
    getattr(pool, settle)()  # no error, no wait: the other one retires
    getattr(pool, settle)()
    assert pool.stats().parked == 1
    with pool.acquire(16) as bufs:
        assert bufs[0].data_ptr() != address
    failing.finish()
    getattr(pool, settle)()
    assert pool.stats().parked == 0


def test_synchronize_reports_a_raising_event_once_and_never_waits_for_it() -> None:
    pool = BucketPool()
    failing = ScriptedEvent(False, after=DeviceError("device lost"))
    _park(pool, failing)
    with pytest.raises(DeviceError):
        pool.synchronize()
    pool.synchronize(timeout=3600)  # returns: its query() raises, so it is not waited for
    pool.synchronize()
    assert pool.stats().parked == 1


def test_of_two_collects_that_meet_one_raising_event_one_raises_it() -> None:
    pool = BucketPool()
    inner: list[BaseException | None] = []

    class RaisingWhileAnotherCollects:
        def query(self) -> bool:
            if not armed:
                return False
            if not inner:  # another thread's collect, between this one's question and report
                inner.append(None)
                try:
                    pool.collect()
                except DeviceError as error:
                    inner[0] = error
            raise DeviceError("device lost")

    armed = False
    _park(pool, RaisingWhileAnotherCollects())
    armed = True
    try:
        pool.collect()
    except DeviceError as error:
        outer: BaseException | None = error
    else:
        outer = None
    assert len(inner) == 1  # the interleaving happened
    assert (inner[0] is None) != (outer is None)  # reported once, by one of them
    pool.collect()  # and never again
    assert pool.stats().parked == 1


# -- collect and synchronize ---------------------------------------------------------------


def test_collect_returns_how_many_retired(pool: BucketPool) -> None:
    events = [FlagEvent() for _ in range(4)]
    for n, event in zip((5, 50, 500, 5000), events, strict=True):
        handle = pool.acquire(n)
        handle.record_event(event)
        handle.release()
    events[1].done = events[3].done = True
    assert pool.collect() == 2
    assert [b.parked for b in pool.stats().buckets] == [1, 0, 1, 0]
    events[0].done = events[2].done = True
    assert pool.collect() == 2


def test_collect_retires_the_done_and_raises_the_first_error(pool: BucketPool) -> None:
    failing = ScriptedEvent(False, after=RuntimeError("device lost"))
    done = FlagEvent()
    for event in (failing, done):
        handle = pool.acquire(8)
        handle.record_event(event)
        handle.release()
    done.done = True
    with pytest.raises(RuntimeError, match="device lost"):
        pool.collect()
    stats = pool.stats()  # an unrelated call: the error is not raised again here
    assert (stats.parked, stats.buckets[0].cached) == (1, 1)
    failing.after = True
    assert pool.collect() == 1


def test_synchronize_waits_for_every_parked_buffer(pool: BucketPool) -> None:
    waitable: list[SyncEvent] = [SyncEvent(), SyncEvent()]
    # No synchronize(): done only on its fourth question (the release asks the first), so
    # synchronize must keep polling it, however fast or slow the machine is.
    polled = ScriptedEvent(False, False, False, after=True)
    events: list[CompletionEvent] = [*waitable, polled]
    for event in events:
        handle = pool.acquire(20)
        handle.record_event(event)
        handle.release()
    assert pool.stats().parked == 3
    assert polled.queries == 1
    pool.synchronize()
    assert pool.stats().parked == 0
    assert all(event.done for event in waitable)
    assert polled.queries >= 4  # asked until it said done


def test_synchronize_calls_the_events_synchronize(pool: BucketPool) -> None:
    event = SyncEvent()
    handle = pool.acquire(8)
    handle.record_event(event)
    handle.release()
    pool.synchronize()
    assert event.done
    assert pool.stats().parked == 0


class _NeverWaited(FlagEvent):
    """Its ``synchronize()`` would wait for ever: with a timeout the pool must not call it."""

    def synchronize(self) -> None:
        raise AssertionError("synchronize(timeout=...) called the event's synchronize()")


def test_synchronize_with_a_timeout_reports_what_stays_parked(pool: BucketPool) -> None:
    stuck, finished = _NeverWaited(), FlagEvent()
    for event in (stuck, finished):
        handle = pool.acquire(8)
        handle.record_event(event)
        handle.release()
    finished.done = True
    with pytest.raises(TimeoutError, match=r"1 parked buffer\(s\) .* timeout=0 s; they stay"):
        pool.synchronize(timeout=0)
    stats = pool.stats()
    assert (stats.parked, stats.buckets[0].cached) == (1, 1)  # the done one retired; none lost
    with pytest.raises(TimeoutError, match=r"1 parked buffer\(s\) .* timeout=0.01 s"):
        pool.synchronize(timeout=0.01)  # polled until the deadline: it never completes
    assert stuck.queries > 2  # asked until the deadline
    assert pool.stats().parked == 1
    stuck.done = True
    pool.synchronize(timeout=0)
    stats = pool.stats()
    assert (stats.parked, stats.buckets[0].cached) == (0, 2)


def test_synchronize_with_a_timeout_waits_for_an_event_that_completes_late(
    pool: BucketPool,
) -> None:
    late = ScriptedEvent(*[False] * 20, after=True)  # the release asks the first
    handle = pool.acquire(8)
    handle.record_event(late)
    handle.release()
    pool.synchronize(timeout=3600)  # done on its 21st question, long before the deadline
    assert (pool.stats().parked, late.queries) == (0, 21)
    pool.synchronize(timeout=0)  # nothing parked: returns at once


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(-1, ValueError), (float("nan"), ValueError), (True, TypeError), ("1", TypeError)],
)
def test_synchronize_refuses_a_bad_timeout(
    pool: BucketPool, timeout: object, error: type[Exception]
) -> None:
    event = FlagEvent()
    handle = pool.acquire(8)
    handle.record_event(event)
    handle.release()
    with pytest.raises(error, match="synchronize: timeout must be"):
        pool.synchronize(timeout=timeout)  # type: ignore[arg-type]
    assert (event.queries, pool.stats().parked) == (1, 1)  # nothing asked, nothing changed


# -- a pool dropped while buffers are parked -----------------------------------------------


def _parked_memory(
    pool: BucketPool, event: CompletionEvent, n: int = 16
) -> weakref.ref[typing.Any]:
    """Park a buffer of *n* on *event*; return a weak reference to its memory (its tensor)."""
    handle = pool.acquire(n)
    buffer = handle._buffer
    handle.record_event(event)
    handle.release()
    return weakref.ref(buffer.base)


def _calls_until(memory: weakref.ref[typing.Any], call: typing.Callable[[], object]) -> int:
    """Make *call* until *memory* is freed; return how many it took (fails after 1,000)."""
    for calls in range(1_000):
        if memory() is None:
            return calls
        call()
    raise AssertionError("never freed")


@pytest.mark.parametrize("level", ["off", "strict"])
def test_a_dropped_pool_keeps_a_parked_buffer_until_its_event_is_done(
    level: DebugLevel, orphans: collections.deque[Ledger]
) -> None:
    gc.disable()  # nothing but reference counting frees anything here
    try:
        pool = BucketPool(debug=level)
        event = FlagEvent()
        memory = _parked_memory(pool, event)  # a copy may still read it
        with pool.acquire(100) as bufs:
            cached = weakref.ref([*pool._ledger.buffers().values()][-1].base)
        del bufs
        del pool
        assert cached() is None  # no copy reads a cached buffer: freed at once
        assert memory() is not None  # was freed with its pool
        assert orphaned_buffers() == 1
        BucketPool().collect()  # later pool calls ask it
        assert memory() is not None
        event.done = True
        assert memory() is not None  # nothing asked since
        assert _calls_until(memory, BucketPool) == 1  # a new pool asks every one
        assert orphaned_buffers() == 0
        BucketPool()
        assert not orphans  # and the dropped pool is let go
    finally:
        gc.enable()


def test_an_acquires_sweep_asks_the_dropped_pools_in_turn(
    orphans: collections.deque[Ledger],
) -> None:
    events = [FlagEvent() for _ in range(3)]
    memories = []
    for event in events:
        dropped = BucketPool()
        memories.append(_parked_memory(dropped, event))
    del dropped
    assert len(orphans) == 3
    pool = BucketPool(idle_trim_acquires=4)  # a sweep every acquire
    for event in events:
        event.done = True
    for _ in range(3):  # each sweep asks a few of the next dropped pool's
        with pool.acquire(16):
            pass
    assert [memory() for memory in memories] == [None] * 3
    assert orphaned_buffers() == 0


def test_what_a_pool_call_spends_on_a_dropped_pool_does_not_grow_with_its_buffers(
    orphans: collections.deque[Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    def moves_of_a_sweep(parked: int) -> int:
        pool = BucketPool(idle_trim_acquires=4)  # made first: it asks every one, once
        dropped = BucketPool(max_cached_per_bucket=parked, max_cached_bytes=1 << 30)
        handles = [dropped.acquire(16) for _ in range(parked)]
        for handle in handles:  # all young: parked in one hand-out
            handle.record_event(FlagEvent())
            handle.release()
        del handle, handles, dropped
        steps = [0]
        for name in ("retire", "young_front", "old_front", "settle", "serve"):
            move = getattr(Ledger, name)

            def counted(*args: typing.Any, _move: typing.Any = move) -> typing.Any:
                steps[0] += 1
                return _move(*args)

            monkeypatch.setattr(Ledger, name, counted)
        with pool.acquire(16):  # its sweep asks a few of the dropped pool's
            pass
        monkeypatch.undo()
        orphans.clear()
        return steps[0]

    walked = [moves_of_a_sweep(parked) for parked in (10, 2_000)]
    assert walked[0] == walked[1] <= 2 * POLL_BUDGET + 4


def test_a_dropped_pools_buffer_whose_event_raises_is_kept_and_counted(
    orphans: collections.deque[Ledger],
) -> None:
    pool = BucketPool()
    failing = RaisingEvent(raises=-1)  # a lost device: raises until finished
    later = FlagEvent()
    memory = _parked_memory(pool, later)
    handle = pool.acquire(16)
    lost = weakref.ref(handle._buffer.base)
    handle.record_event(failing)
    with pytest.raises(DeviceError):
        handle.release()
    del handle, pool
    later.done = True
    for _ in range(20):
        BucketPool().collect()  # errors of a dropped pool's events reach no one
    assert memory() is None
    assert lost() is not None  # kept for ever: its copy may still read it
    assert orphaned_buffers() == 1
    failing.finish()
    assert _calls_until(lost, BucketPool) == 1  # a new pool asks every one
    assert orphaned_buffers() == 0


def test_an_error_a_dropped_pools_event_keeps_keeps_nothing_of_those_who_ask(
    orphans: collections.deque[Ledger],
) -> None:
    kept = DeviceError("device lost")

    class RaisesItsError:  # raises the same error object each time (it keeps it)
        def query(self) -> bool:
            raise kept

    dropped = BucketPool()
    handle = dropped.acquire(16)
    handle.record_event(RaisesItsError())
    with pytest.raises(DeviceError):
        handle.release()
    kept.__traceback__ = None  # (the release's: it would keep the release's frames)
    del handle, dropped
    assert orphaned_buffers() == 1

    def made() -> weakref.ref[BucketPool]:
        return weakref.ref(BucketPool())  # its __init__ asks the dropped pool's event

    gc.collect()
    gc.disable()
    try:
        pool = made()
        assert kept.__traceback__ is None  # asked, and its traceback forgotten
        assert pool() is None  # no traceback keeps the frames of the pool's __init__
    finally:
        gc.enable()
    assert orphaned_buffers() == 1


# -- a real device -------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.pool(pin_memory=True, idle_trim_acquires=0, debug="off")
def test_pinned_buffer_parks_until_upload_completes(pool: BucketPool) -> None:
    n = 1_000
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    handles: list[BufferHandle] = []

    def acquire() -> BufferHandle:
        handle = pool.acquire(n)
        handles.append(handle)
        return handle

    def delayed_upload(
        handle: BufferHandle, cycles: int
    ) -> tuple[list[torch.Tensor], torch.cuda.Event]:
        """Upload the descriptors on a stream held back by a spin, as a busy device would."""
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
            uploaded = [t.to("cuda", non_blocking=True) for t in handle.buffers]
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        return uploaded, event

    try:
        first = acquire()
        assert all(t.is_pinned() for t in first.buffers)
        first_address = first.buffers.src_ptrs.data_ptr()
        first_pattern = make_pattern(1, n)
        write_pattern(first.arrays, first_pattern)
        in_flight = tuple(first.arrays)  # kept to prove that nobody writes the buffer
        uploaded, event = delayed_upload(first, 2_000_000_000)  # about a second
        first.record_event(event)
        first.release()
        assert not event.query()  # type: ignore[no-untyped-call]
        assert pool.stats().parked == 1

        second = acquire()  # the parked buffer must not come back while the upload runs
        assert second.buffers.src_ptrs.data_ptr() != first_address
        second_pattern = make_pattern(2, n)
        write_pattern(second.arrays, second_pattern)
        assert has_pattern(in_flight, first_pattern)
        assert not event.query()  # type: ignore[no-untyped-call]

        event.synchronize()
        assert pool.collect() == 1
        assert pool.stats().parked == 0
        for tensor, values in zip(uploaded, first_pattern, strict=True):
            assert np.array_equal(tensor.cpu().numpy().view(np.uint64), values)
        third = acquire()  # now the retired buffer comes back
        assert third.buffers.src_ptrs.data_ptr() == first_address
        assert has_pattern(third.arrays, first_pattern)
        assert has_pattern(second.arrays, second_pattern)
        second.release()

        _, later = delayed_upload(third, 1_000_000_000)
        third.record_event(later)
        third.release()
        assert pool.stats().parked == 1
        pool.synchronize()
        assert later.query()  # type: ignore[no-untyped-call]
        stats = pool.stats()
        assert stats.parked == 0
        assert stats.active_requests.current == 0
        assert pool.outstanding() == []
    finally:
        torch.cuda.synchronize()
        for handle in handles:
            if not handle.released:
                handle.release()
        pool.synchronize()


# -- a poll's answer is about one parking; every pass sees every parked buffer -------------


class _ReparkWhileAsked:
    """An event whose first ``query()`` -- a poll's -- lets another holder in first.

    Inside that question, as another thread would between the poll's question and its
    move: `collect` retires the buffer, an acquire takes it, records a copy that is still
    running and parks it again, at the same place.  Then the first question answers
    "done", about the parking that is over.
    """

    def __init__(self, pool: BucketPool) -> None:
        self.pool = pool
        self.asked = 0
        self.running = FlagEvent()  # the second holder's copy: not done
        self.second_address = 0
        self.armed = False  # set once parked: the release's own question is not the poll's

    def query(self) -> bool:
        if not self.armed:
            return False
        self.asked += 1
        if self.asked == 1:  # the poll's question
            assert self.pool.collect() == 1  # asks again (answered below): retired
            second = self.pool.acquire(16)  # the same buffer, the only one cached
            self.second_address = second.buffers[0].data_ptr()
            second.record_event(self.running)
            second.release()  # parked again, a new parking at the front
            self.pool.stats()  # (a pool that parks lazily parks it here)
        return True


def test_a_poll_never_retires_a_buffer_on_an_answer_about_an_earlier_parking() -> None:
    pool = BucketPool()
    first = pool.acquire(16)
    address = first.buffers[0].data_ptr()
    event = _ReparkWhileAsked(pool)
    first.record_event(event)
    first.release()  # parked on `event`
    event.armed = True
    # A miss polls: the question above retires, re-hands and re-parks the buffer.
    with pool.acquire(16) as bufs:
        assert event.second_address == address  # the interleaving happened
        assert bufs[0].data_ptr() != address  # and its copy may still read that buffer
    assert pool.stats().parked == 1
    event.running.done = True
    assert pool.collect() == 1


class _RetireOthersWhileWaited:
    """An event whose wait retires the other parked buffers, as another thread would."""

    def __init__(self, pool: BucketPool) -> None:
        self.pool = pool
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True
        self.pool.collect()  # another thread's collect, run while this one waits


def test_synchronize_waits_for_every_buffer_parked_before_it() -> None:
    pool = BucketPool()
    events: list[object] = []
    waiter = _RetireOthersWhileWaited(pool)
    late = [SyncEvent() for _ in range(5)]
    for event in [FlagEvent(done=False), waiter, *late]:
        handle = pool.acquire(16)
        handle.record_event(event)  # type: ignore[arg-type]
        handle.release()
        events.append(event)
    events[0].done = True  # type: ignore[attr-defined]  # retired by the collect in the wait
    pool.synchronize()
    assert pool.stats().parked == 0
    assert all(event.done for event in late)  # each one waited on, none skipped


def test_collect_asks_every_parked_buffer_while_others_retire() -> None:
    pool = BucketPool()
    events = [ScriptedEvent(after=True) for _ in range(8)]
    events[0] = ScriptedEvent(after=False)
    handles = [pool.acquire(16) for _ in events]
    for handle, event in zip(handles, events, strict=True):
        handle.record_event(event)
        handle.release()

    class RetiresTheNext(ScriptedEvent):
        def query(self) -> bool:
            pool.collect()  # another thread retires the rest while this one is asked
            return super().query()

    retired_inside = pool.acquire(16)  # the first one's, stuck: a new buffer
    retired_inside.record_event(RetiresTheNext(after=True))
    retired_inside.release()
    pool.collect()
    assert all(event.queries for event in events)  # each one asked, whatever moved
    assert pool.stats().parked == 1  # the stuck one


def test_stuck_parked_buffers_do_not_stop_completed_ones_coming_back() -> None:
    pool = BucketPool(max_cached_bytes=1 << 30)
    stuck = [pool.acquire(16) for _ in range(2_000)]
    for handle in stuck:
        handle.record_event(FlagEvent())  # never completes
        handle.release()
    events: list[FlagEvent] = []
    allocations = []
    for step in range(1_000):  # each step's copy completes four steps later
        if step >= 4:
            events[step - 4].done = True
        handle = pool.acquire(16)
        events.append(FlagEvent())
        handle.record_event(events[-1])
        handle.release()
        allocations.append(pool.stats().allocations.current)
    assert allocations[-1] == allocations[AGE + 8]  # nothing new after warm-up
    assert allocations[-1] <= 2_000 + AGE + 8


@pytest.mark.parametrize("settle", ["collect", "synchronize"])
def test_after_a_sweep_behind_a_stuck_copy_an_acquire_walks_no_spent_record(
    settle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the next acquire looks at does not grow with how many records the sweep spent
    behind a stuck copy at the young front (it walked every one, a move each)."""
    walked: list[int] = []

    def walk_after_sweeping(retired: int) -> int:
        pool = BucketPool(max_cached_per_bucket=4096, max_cached_bytes=1 << 30)
        stuck, *held = [pool.acquire(8) for _ in range(retired + 1)]
        stuck.record_event(RaisingEvent(raises=-1))  # a lost device: it stays at the front
        with pytest.raises(DeviceError):
            stuck.release()
        events = [SyncEvent() for _ in held]  # all parked in one hand-out: the front is young
        for handle, event in zip(held, events, strict=True):
            handle.record_event(event)
            handle.release()
        for event in events:
            event.done = True
        getattr(pool, settle)()  # (the release reported the error): those behind it retire
        assert pool.stats().parked == 1
        steps = [0]
        for name in ("retire", "young_front", "old_front", "serve"):
            move = getattr(Ledger, name)

            def counted(*args: typing.Any, _move: typing.Any = move) -> typing.Any:
                steps[0] += 1
                return _move(*args)

            monkeypatch.setattr(Ledger, name, counted)
        with pool.acquire(300):  # a miss: it polls the parked records
            pass
        monkeypatch.undo()
        return steps[0]

    walked = [walk_after_sweeping(retired) for retired in (10, 1_000)]
    assert walked[0] == walked[1] <= 2 * POLL_BUDGET + 4


def test_a_stuck_copy_is_asked_less_and_less_often() -> None:
    pool = BucketPool()  # the idle sweep every 256 acquires: it asks the old queue
    stuck = [FlagEvent() for _ in range(3)]  # never complete
    for event in stuck:
        _park(pool, event)
    before = [event.queries for event in stuck]
    for _ in range(100 * 256):  # hits: only the sweeps ask, four old turns each (or eight)
        with pool.acquire(16):
            pass
    turns = 2 * 100 * POLL_BUDGET // len(stuck)  # each one's turns in the old queue, at most
    asked = [event.queries - first for event, first in zip(stuck, before, strict=True)]
    assert min(asked) >= 2  # asked: in the old queue, on its turns
    # On its 1st, 2nd, 4th ... turn (and by a miss and a sweep while young): was every turn.
    assert max(asked) <= turns.bit_length() + 2


def test_a_stuck_copy_that_completes_later_comes_back_without_collect() -> None:
    pool = BucketPool()
    stuck = FlagEvent()
    handle = pool.acquire(16)
    stuck_address = handle.buffers[0].data_ptr()
    handle.record_event(stuck)
    handle.release()
    events: list[FlagEvent] = []
    handed: list[int] = []

    def step() -> None:  # a stream whose copies complete four steps later
        if len(events) >= 4:
            events[-4].done = True
        handle = pool.acquire(16)
        handed.append(handle.buffers[0].data_ptr())
        events.append(FlagEvent())
        handle.record_event(events[-1])
        handle.release()

    for _ in range(AGE + 8):  # the stuck one leaves the young queue
        step()
    assert stuck_address not in handed
    stuck.done = True  # ... and completes after all
    handed.clear()
    for _ in range(2 * AGE):  # the idle sweep asks the old queue in turn
        step()
    assert stuck_address in handed  # back, with no collect()


def test_a_system_exit_raised_by_query_is_not_swallowed_by_a_poll() -> None:
    pool = BucketPool()
    handle = pool.acquire(16)
    handle.record_event(ScriptedEvent(False, SystemExit(3)))  # a SIGTERM handler's exit
    handle.release()
    with pytest.raises(SystemExit):
        pool.acquire(16)  # a miss polls the parked buffer
    assert pool.stats().parked == 1  # still parked
    assert pool.outstanding() == []  # and the interrupted acquire took nothing


@pytest.mark.parametrize("level", ["off", "checks", "strict"])
def test_the_views_record_events_as_the_handle_does(level: DebugLevel) -> None:
    pool = BucketPool(debug=level)
    event = FlagEvent()
    with pool.acquire(16) as bufs:
        address = bufs[0].data_ptr()
        bufs.record_event(event)  # no handle needed
        with pytest.raises(TypeError, match="query"):
            bufs.record_event(object())  # type: ignore[arg-type]
    assert pool.stats().parked == 1  # parked at the block's end, as for handle.record_event
    with pool.acquire(16) as other:
        assert other[0].data_ptr() != address  # not reused while the copy may read it
    with pytest.raises(ReleaseError, match="record_event"):
        bufs.record_event(FlagEvent())  # the hand-out is over
    event.done = True
    assert pool.collect() == 1


def test_a_record_that_races_the_end_of_its_hand_out_records_nothing() -> None:
    pool = BucketPool()
    handle = pool.acquire(16)
    address = handle.buffers[0].data_ptr()
    mine = FlagEvent()
    theirs = FlagEvent()
    holders: list[BufferHandle] = []

    class EndsTheHandOut:  # an earlier event, asked by the next record_event
        def query(self) -> bool:
            if not holders and asking:  # once, from that record_event
                holders.append(handle)
                handle.release()  # as another thread would, between check and store
                holders.append(pool.acquire(16))  # the same buffer, another holder ...
                holders[1].record_event(theirs)  # ... with a copy of its own in flight
            return True

    asking = False

    handle.record_event(EndsTheHandOut())
    asking = True
    with pytest.raises(ReleaseError, match="record_event"):
        handle.record_event(mine)  # its hand-out ended while it asked: nothing stored
    assert holders[1].buffers[0].data_ptr() == address  # the interleaving happened
    holders[1].release()
    assert pool.stats().parked == 1  # parked on the other holder's event, not lost
    theirs.done = True
    assert pool.collect() == 1
    assert mine.queries == 0  # never recorded, so never asked


def test_events_a_query_records_during_release_keep_the_buffer_parked() -> None:
    pool = BucketPool()
    handle = pool.acquire(16)
    later = FlagEvent()  # a copy the query starts: pending

    class RecordsWhileAsked:
        asked = 0

        def query(self) -> bool:
            self.asked += 1
            if self.asked == 2:  # the release's question
                handle.record_event(later)
                handle.record_event(self)  # the same event object, recorded again
            return True

    first = RecordsWhileAsked()
    handle.record_event(first)
    first.query()  # (its first question: the test's own)
    handle.release()
    assert pool.stats().parked == 1  # later is pending: parked, not cached
    later.done = True
    assert pool.collect() == 1


@pytest.mark.parametrize("through", ["handle", "views"])
def test_an_event_recorded_while_the_release_takes_the_buffer_back_keeps_it_parked(
    through: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = BucketPool()
    handle = pool.acquire(16)
    bufs = handle.buffers
    late = FlagEvent()  # recorded by another thread after the release asked the events
    give_back = type(pool._ledger).give_back
    raced: list[bool] = []

    def racing_give_back(ledger: object, *args: typing.Any) -> bool | None:
        if not raced:  # the other thread, between the release's questions and its move
            raced.append(True)
            (handle if through == "handle" else bufs).record_event(late)
        return give_back(ledger, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(type(pool._ledger), "give_back", racing_give_back)
    address = bufs[0].data_ptr()
    handle.release()
    assert raced
    assert pool.stats().parked == 1  # parked on the late event, not cached
    with pool.acquire(16) as other:
        assert other[0].data_ptr() != address
    late.done = True
    assert pool.collect() == 1


def test_a_compat_triple_records_its_event_at_release() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(4)
    with pytest.raises(TypeError, match=r"pool\.release\(bufs, event=event\)"):
        bufs.record_event(FlagEvent())
    pool.release(bufs)


def test_synchronize_takes_any_number_of_seconds() -> None:
    # BucketPool.synchronize: "timeout: seconds to wait in all, or `None`"; "Raises: [...]
    # TypeError, ValueError: *timeout* is not a number of seconds >= 0".  An int timeout
    # beyond a float's range raises OverflowError from `time.monotonic() + timeout`, an
    # error the docstring does not name (and nothing was waited for).
    pool = BucketPool()
    handle = pool.acquire(8)
    handle.record_event(FlagEvent(done=True))
    handle.release()
    pool.synchronize(timeout=10**400)  # as long as it takes: the event is done now
    assert pool.stats().parked == 0


class Finalised:
    """An event whose finaliser notes whether this thread held the pool's lock as it went."""

    def __init__(self, seen: list[bool], done: bool) -> None:
        self.seen, self.done = seen, done

    def query(self) -> bool:
        return self.done

    def __del__(self) -> None:
        self.seen.append(_lock.owned())


def test_no_events_finaliser_runs_under_the_lock() -> None:
    seen: list[bool] = []
    gc.disable()  # reference counting lets each event go where the pool lets go of it
    try:
        pool = BucketPool(max_cached_per_bucket=1)
        tight = BucketPool(max_cached_per_bucket=0)  # its retiring buffers are freed
        for retire in ("collect", "acquire", "free"):  # a parked buffer retires (a move each)
            handle = (tight if retire == "free" else pool).acquire(64)
            event = Finalised(seen, done=False)
            handle.record_event(event)
            handle.release()
            event.done = True
            del event
            if retire == "acquire":
                pool.acquire(64).release()  # takes the parked buffer, its events done
            else:
                assert (tight if retire == "free" else pool).collect() == 1
        handle = pool.acquire(64)  # a hand-out's done event goes as the release caches it
        handle.record_event(Finalised(seen, done=True))
        handle.release()
        del handle
    finally:
        gc.enable()
    assert seen == [False] * 4


def test_a_pool_collected_with_a_holder_keeps_what_the_holder_parks(
    orphans: collections.deque[Ledger],
) -> None:
    # The collector may finalise the pool before the holder: the holder's release parks
    # after the pool's end, in a ledger that must be kept until the copy is done.
    class Worker:
        pass

    event = FlagEvent()
    gc.disable()
    try:
        worker = Worker()
        worker.pool = BucketPool()  # type: ignore[attr-defined]
        worker.handle = worker.pool.acquire(1024)  # type: ignore[attr-defined]
        worker.handle.record_event(event)  # type: ignore[attr-defined]
        worker.me = worker  # type: ignore[attr-defined]  # a cycle: both go together
        del worker
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeakWarning)  # the holder was dropped unreleased
            gc.collect()
    finally:
        gc.enable()
    (ledger,) = orphans
    (buffer,) = ledger.registry.values()
    assert buffer.token < 0  # parked, its memory kept while the copy may read it
    assert orphaned_buffers() == 1
    event.done = True
    BucketPool()  # a new pool asks every kept buffer
    assert orphaned_buffers() == 0
    BucketPool()
    assert not orphans
