"""`BufferHandle`: one hand-out of a buffer, its views, its events, and its release."""

from __future__ import annotations

import copy
import pickle
import sys
from collections.abc import Callable, Iterator

import pytest
from _events import FlagEvent

from bucketpool import (
    BucketPool,
    BufferHandle,
    DescriptorBuffers,
    InFlightWriteError,
    LeakWarning,
    ReleaseError,
)


@pytest.fixture
def pool() -> Iterator[BucketPool]:
    pool = BucketPool()
    yield pool
    assert pool.outstanding() == []


# -- no second holder --------------------------------------------------------------------------

DUPLICATORS: dict[str, Callable[[object], object]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": pickle.dumps,
    "pickle-0": lambda obj: pickle.dumps(obj, protocol=0),
}


@pytest.mark.parametrize("how", sorted(DUPLICATORS))
def test_a_handle_cannot_be_copied_or_pickled(pool: BucketPool, how: str) -> None:
    handle = pool.acquire(8)
    before = pool.stats()
    with pytest.raises(TypeError, match="a BufferHandle cannot be copied or pickled") as caught:
        DUPLICATORS[how](handle)
    assert "the one holder of its buffer" in str(caught.value)
    assert "tensor.clone()" in str(caught.value)  # says what to do instead
    assert pool.stats() == before
    assert not handle.released
    handle.release()


def test_copying_a_request_that_holds_a_handle_is_refused(pool: BucketPool) -> None:
    class Request:
        def __init__(self, handle: BufferHandle) -> None:
            self.handle = handle

    request = Request(pool.acquire(8))
    with pytest.raises(TypeError, match="cannot be copied"):
        copy.deepcopy(request)
    request.handle.release()


@pytest.mark.parametrize("how", sorted(DUPLICATORS))
def test_a_pool_cannot_be_copied_or_pickled(how: str) -> None:
    with pytest.raises(TypeError, match="a BucketPool cannot be copied or pickled"):
        DUPLICATORS[how](BucketPool())


def test_handles_are_not_built_by_hand() -> None:
    with pytest.raises(TypeError, match=r"comes from BucketPool.acquire\(n\)"):
        BufferHandle()


def test_a_forged_handle_releases_nothing(pool: BucketPool) -> None:
    stale = pool.acquire(8)
    stale.release()
    holder = pool.acquire(8)  # the same buffer, a new hand-out
    forged = object.__new__(BufferHandle)
    for name in ("_pool", "_buffer", "_token", "_n"):
        setattr(forged, name, getattr(stale, name))
    before = pool.stats()
    with pytest.raises(ReleaseError, match="already released"):
        forged.release()
    assert forged.released
    assert pool.stats() == before
    assert not holder.released
    holder.release()


# -- state and repr ----------------------------------------------------------------------------


def test_released_follows_the_hand_out(pool: BucketPool) -> None:
    handle = pool.acquire(20)
    assert (handle.n, handle.capacity, handle.released) == (20, 32, False)
    handle.release()
    assert handle.released
    again = pool.acquire(20)  # the same buffer again: the old handle stays released
    assert handle.released
    assert not again.released
    again.release()


def test_released_while_parked(pool: BucketPool) -> None:
    event = FlagEvent()
    handle = pool.acquire(4)
    handle.record_event(event)
    handle.release()
    assert handle.released  # over for the holder, though the buffer is still parked
    assert pool.stats().parked == 1
    event.done = True
    assert pool.collect() == 1


def test_repr_live_and_released(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    assert repr(handle) == "<BufferHandle n=5 capacity=16 live>"
    handle.release()
    assert repr(handle) == "<BufferHandle n=5 capacity=16 released>"


def test_repr_names_the_acquire_site_when_tracing() -> None:
    pool = BucketPool(debug="checks")
    handle = pool.acquire(5)
    where = handle.acquired_at
    assert where is not None
    assert where.startswith(__file__)
    assert repr(handle) == f"<BufferHandle n=5 capacity=16 live acquired at {where}>"
    handle.release()
    assert handle.acquired_at is None  # the site belongs to the hand-out, which is over
    assert repr(handle) == "<BufferHandle n=5 capacity=16 released>"


def test_no_site_without_tracing(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    assert handle.acquired_at is None
    handle.release()


# -- record_event ------------------------------------------------------------------------------


def test_record_event_needs_a_query_method(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    for bad in (object(), 3, "event"):
        with pytest.raises(TypeError, match=r"query\(\) -> bool method"):
            handle.record_event(bad)  # type: ignore[arg-type]
    handle.release()
    assert pool.stats().parked == 0  # nothing was recorded


def test_record_event_after_release_is_refused(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    handle.release()
    with pytest.raises(ReleaseError, match=r"record_event: this handle \(n=5"):
        handle.record_event(FlagEvent())
    assert pool.stats().parked == 0


def test_record_event_does_not_query(pool: BucketPool) -> None:
    event = FlagEvent()
    handle = pool.acquire(5)
    handle.record_event(event)
    assert event.queries == 0  # not at debug "off": queried at release
    handle.release()
    assert event.queries == 1
    event.done = True
    pool.collect()


def test_record_event_catches_a_rewrite_while_in_flight_at_checks() -> None:
    pool = BucketPool(debug="checks")
    first, second = FlagEvent(), FlagEvent()
    handle = pool.acquire(4)
    handle.add_copies(0, [16], [32], 8)
    handle.record_event(first)
    handle.add_copies(0, [48], [64], 8)  # the first copy may still read these
    with pytest.raises(InFlightWriteError, match="the new event was recorded"):
        handle.record_event(second)
    handle.release()
    first.done = True
    assert pool.collect() == 0  # the second event, recorded all the same, holds it
    second.done = True
    assert pool.collect() == 1


def test_record_event_after_the_earlier_copy_finished_is_fine_at_checks() -> None:
    pool = BucketPool(debug="checks")
    first, second = FlagEvent(done=True), FlagEvent(done=True)
    handle = pool.acquire(4)
    handle.add_copies(0, [16], [32], 8)
    handle.record_event(first)
    handle.add_copies(0, [48], [64], 8)
    handle.record_event(second)
    handle.release()
    assert pool.stats().parked == 0


# -- release -----------------------------------------------------------------------------------


def test_release_after_release_raises_and_changes_nothing(pool: BucketPool) -> None:
    handle = pool.acquire(9)
    handle.release()
    before = pool.stats()
    with pytest.raises(ReleaseError, match=r"release: this handle \(n=9, capacity 16\)"):
        handle.release()
    assert pool.stats() == before


def test_views_after_release_are_refused(pool: BucketPool) -> None:
    handle = pool.acquire(9)
    handle.release()
    with pytest.raises(ReleaseError, match="buffers: "):
        _ = handle.buffers
    with pytest.raises(ReleaseError, match="arrays: "):
        _ = handle.arrays
    with pytest.raises(ReleaseError, match="add_copies: "):
        handle.add_copies(0, [1], [2], 3)
    with pytest.raises(ReleaseError, match="add_block_copies: "):
        handle.add_block_copies(0, 0, 0, [0], [1], 8)
    with pytest.raises(ReleaseError, match="shrink: "):
        handle.shrink(0)


def test_exit_after_a_release_inside_the_block_raises(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    with pytest.raises(ReleaseError, match="end of with block: this handle"):
        with handle:
            handle.release()
    assert pool.stats().active_requests.current == 0
    assert pool.stats().buckets[0].cached == 1  # released once, cached once


def release_inside_then_raise(handle: BufferHandle) -> None:
    with handle:
        handle.release()
        raise KeyError("mine")


def test_exit_after_a_release_inside_a_raising_block_keeps_its_exception(
    pool: BucketPool,
) -> None:
    handle = pool.acquire(3)
    with pytest.raises(KeyError, match="mine") as caught:
        release_inside_then_raise(handle)
    if sys.version_info >= (3, 11):
        notes: list[str] = getattr(caught.value, "__notes__", [])
        assert any("end of with block" in note for note in notes)
    assert pool.stats().active_requests.current == 0


def test_enter_after_release_is_refused(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    handle.release()
    with pytest.raises(ReleaseError, match="with: this handle"):
        with handle:
            pass


def test_with_binds_the_views(pool: BucketPool) -> None:
    handle = pool.acquire(6)
    with handle as bufs:
        assert isinstance(bufs, DescriptorBuffers)
        assert bufs is handle.buffers
        assert [view.numel() for view in bufs] == [6, 6, 6]
    assert handle.released


def test_shrink_resizes_the_bound_views(pool: BucketPool) -> None:
    handle = pool.acquire(6)
    with handle as bufs:
        written = handle.add_copies(0, [1, 2], [3, 4], 5)
        shrunk = handle.shrink(written)
        assert [view.numel() for view in bufs] == [2, 2, 2]
        assert shrunk.src_ptrs.tolist() == [1, 2]
        assert handle.n == 2
        with pytest.raises(ValueError, match="views can only shrink"):
            handle.shrink(3)


def leak_three(pool: BucketPool) -> None:
    for _ in range(3):
        pool.acquire(7)  # the same site each time, dropped at once


def test_a_dropped_handle_warns_once_per_site() -> None:
    pool = BucketPool(debug="checks")
    with pytest.warns(LeakWarning) as record:
        leak_three(pool)
    assert len(record) == 1
    assert pool.stats().leaks == 3
    assert pool.stats().active_requests.current == 0


def test_a_deferred_release_counts_as_released_at_once(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    with pool._lock:  # as a finaliser that interrupted this thread inside the pool
        handle.release()
    assert handle.released
    with pytest.raises(ReleaseError):
        handle.release()
    stats = pool.stats()  # drains the inbox
    assert stats.active_requests.current == 0
    assert [b.cached for b in stats.buckets] == [1]  # back in the cache, not lost
