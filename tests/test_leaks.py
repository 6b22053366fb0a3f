"""Leaks and what is out: a dropped handle warns once per site and its buffer comes back."""

from __future__ import annotations

import gc
import sys
import textwrap
import typing
import warnings

import attrs
import pytest
from _events import DeviceError, FlagEvent, ScriptedEvent
from _helpers import TRIPLE_16, abandon_in_cycle, line_of, run_script

from bucketpool import (
    BucketPool,
    DebugLevel,
    LeakWarning,
    OutstandingBuffer,
)
from bucketpool.compat import AliasedDescriptorBufferPool, DescriptorBufferPool
from bucketpool.testing import assert_no_outstanding


def leak(pool: BucketPool, n: int, event: ScriptedEvent | None = None) -> None:
    """Acquire a buffer, perhaps record *event*, and drop the handle: never released."""
    handle = pool.acquire(n)  # dropped at once: never released
    if event is not None:
        handle.record_event(event)


# -- leak warnings -------------------------------------------------------------------------


def test_leak_warning_is_a_visible_user_warning() -> None:
    assert issubclass(LeakWarning, UserWarning)
    pool = BucketPool()
    with pytest.warns(LeakWarning, match="reported once per acquire site"):
        leak(pool, 3)


@pytest.mark.pool(debug="checks")
def test_leaked_handle_warns_with_its_site_and_buffer_comes_back(pool: BucketPool) -> None:
    with pytest.warns(
        LeakWarning, match=r"n=33 was never released; acquired at .*test_leaks.py:\d+"
    ):
        leak(pool, 33)
    assert pool.stats().leaks == 1
    assert pool.stats().active_requests.current == 0
    assert pool.stats().cached_bytes == 64 * 24
    assert pool.outstanding() == []


def test_a_leak_names_the_line_that_acquired_without_tracing(pool: BucketPool) -> None:
    site = r"n=3 was never released; acquired at .*test_leaks.py:\d+"
    with pytest.warns(LeakWarning, match=site) as caught:
        leak(pool, 3)
    assert caught[0].filename == __file__  # the warning itself points at that line
    assert caught[0].lineno == line_of(
        __file__, "pool.acquire(n)  # dropped at once: never released"
    )
    assert pool.stats().cached_bytes == TRIPLE_16


def test_a_leak_is_reported_without_any_warning_flag() -> None:
    script = textwrap.dedent(
        """
        from bucketpool import BucketPool
        pool = BucketPool(debug="checks")
        def leak():
            pool.acquire(5)
        for _ in range(3):
            leak()
        assert pool.stats().leaks == 3
        assert pool.stats().active_requests.current == 0
        """
    )
    result = run_script(script)
    assert result.returncode == 0, result.stderr
    # Shown by Python's default filters, once for the one acquire site of the loop.
    assert result.stderr.count("LeakWarning") == 1, result.stderr
    assert "n=5" in result.stderr
    assert "<string>:5" in result.stderr  # where it was acquired


@pytest.mark.pool(trace=True)
def test_leaks_are_reported_once_per_site_and_buffers_come_back(pool: BucketPool) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            pool.acquire(7)  # dropped at once
        pool.acquire(9)  # another site
    leaks = [w for w in caught if issubclass(w.category, LeakWarning)]
    assert len(leaks) == 2
    assert "n=7" in str(leaks[0].message)
    assert "n=9" in str(leaks[1].message)
    stats = pool.stats()
    assert stats.leaks == 6
    assert stats.active_requests.current == 0
    assert stats.allocations.current == 1  # one bucket: reused, never lost and reallocated


@pytest.mark.parametrize("level", typing.get_args(DebugLevel))
def test_two_sites_leaking_the_same_n_warn_once_each_at_their_own_line(level: DebugLevel) -> None:
    pool = BucketPool(debug=level)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (7, 7, 300, 5000):  # one site, several sizes: one warning
            pool.acquire(n)  # the first leaking site
        for _ in range(3):
            pool.acquire(7)  # the second leaking site
    leaks = [w for w in caught if issubclass(w.category, LeakWarning)]
    assert [(w.filename, w.lineno) for w in leaks] == [
        (__file__, line_of(__file__, "# the first leaking site")),
        (__file__, line_of(__file__, "# the second leaking site")),
    ]
    assert pool.stats().leaks == 7


def leak_three(pool: BucketPool) -> None:
    for _ in range(3):
        pool.acquire(7)  # the same site each time, dropped at once


@pytest.mark.pool(debug="checks")
def test_a_dropped_handle_warns_once_per_site(pool: BucketPool) -> None:
    with pytest.warns(LeakWarning) as record:
        leak_three(pool)
    assert len(record) == 1
    assert pool.stats().leaks == 3
    assert pool.stats().active_requests.current == 0


def test_a_leak_under_an_error_filter_reaches_the_unraisable_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """simplefilter("error", LeakWarning) must not hide a leak: the error cannot be raised in
    a finaliser or another caller's call, so it goes where Python reports those."""
    reported: list[BaseException | None] = []

    def hook(unraisable: typing.Any) -> None:
        reported.append(unraisable.exc_value)

    monkeypatch.setattr(sys, "unraisablehook", hook)
    pool = BucketPool(debug="checks")
    gc.collect()  # other tests' garbage first
    with warnings.catch_warnings():
        warnings.simplefilter("error", LeakWarning)
        leak_one(pool)
        gc.collect()
        pool.stats()  # no error here: this call did not leak anything
    ours = [error for error in reported if "n=77 was never released" in str(error)]
    assert [type(error) for error in ours] == [LeakWarning]
    assert pool.stats().leaks == 1
    assert pool.stats().active_requests.current == 0


def leak_one(pool: BucketPool) -> None:
    pool.acquire(77)  # dropped at once


# -- what a leaked buffer does -------------------------------------------------------------


def test_leaked_handle_with_pending_event_is_parked(pool: BucketPool) -> None:
    event = FlagEvent()
    handle = pool.acquire(3)
    handle.record_event(event)
    with pytest.warns(LeakWarning):
        del handle  # reference counting finalises it here, not at some later collection
    assert pool.stats().parked == 1
    event.done = True
    assert pool.collect() == 1


def test_a_leak_with_pending_events_parks_its_buffer(pool: BucketPool) -> None:
    event = FlagEvent()
    handle = pool.acquire(4)
    handle.record_event(event)
    with pytest.warns(LeakWarning):
        del handle
    assert pool.stats().parked == 1
    event.done = True
    assert pool.collect() == 1
    assert pool.stats().cached_bytes > 0


def test_a_leaked_handle_whose_event_raises_stays_parked_and_owned(pool: BucketPool) -> None:
    """Issue 10, case 8: a leaked handle whose event raised on adoption was lost, the error in
    stats()."""
    event = ScriptedEvent(after=DeviceError("device lost"))
    with pytest.warns(LeakWarning):
        leak(pool, 8, event)
    stats = pool.stats()  # an unrelated call: no error here
    assert stats.active_requests.current == 0
    assert stats.parked == 1
    with pytest.raises(DeviceError):
        pool.collect()  # the call that asks about parked buffers gets the error
    assert pool.stats().parked == 1  # still owned by the pool
    event.after = True
    assert pool.collect() == 1
    assert pool.stats().cached_bytes == TRIPLE_16


class _Lost:
    """An event whose device is gone: every query() raises."""

    def query(self) -> bool:
        raise DeviceError("device lost")


def _park_on_a_lost_device(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    handle.record_event(_Lost())
    with pytest.raises(DeviceError):
        handle.release()


def _acquire_after_a_poll_that_raised() -> BucketPool:
    pool = BucketPool()
    _park_on_a_lost_device(pool)
    pool.acquire(5)  # asks the parked buffer (its error is not ours); the handle is dropped
    return pool


def _compat_acquire_after_a_poll_that_raised() -> BucketPool:
    compat = DescriptorBufferPool()
    _park_on_a_lost_device(compat.pool)
    compat.acquire(5)  # ... and the tuple is dropped
    return compat.pool


def _release_whose_event_raised() -> BucketPool:
    pool = BucketPool()
    kept = pool.acquire(5)
    dropped = pool.acquire(5)  # never released: dropped as this function returns
    kept.record_event(_Lost())
    with pytest.raises(DeviceError):
        kept.release()
    assert dropped is not kept
    return pool


def _compat_release_whose_event_raised() -> BucketPool:
    compat = DescriptorBufferPool()
    kept = compat.acquire(5)
    dropped = compat.acquire(5)  # never released: dropped as this function returns
    with pytest.raises(DeviceError):
        compat.release(kept, event=_Lost())
    assert dropped is not kept
    return compat.pool


@pytest.mark.parametrize(
    "drop",
    [
        _acquire_after_a_poll_that_raised,
        _compat_acquire_after_a_poll_that_raised,
        _release_whose_event_raised,
        _compat_release_whose_event_raised,
    ],
)
def test_a_holder_dropped_after_a_query_raised_is_taken_back_at_once(
    drop: typing.Callable[[], BucketPool],
) -> None:
    # An error that a query() raised holds the frames it went through; no frame of the pool
    # may keep it, or only the collector could take back what the callers dropped.
    gc.disable()
    try:
        with pytest.warns(LeakWarning):
            pool = drop()
        stats = pool.stats()
        assert stats.active_requests.current == 0  # the dropped holder's buffer is back
        assert stats.leaks == 1
    finally:
        gc.enable()


# Found by test_signals_fork's interrupt at each point: an interrupt at the start of a with
# block's exit drops the handle, as a leak does; at strict its guarded views stayed bound.
def test_the_next_holder_of_a_leaked_buffer_gets_live_views(pool_at_each_level: BucketPool) -> None:
    pool = pool_at_each_level
    handle = pool.acquire(20)
    bufs = handle.__enter__()  # a with block whose end never comes
    bufs.sizes.fill_(1)
    with pytest.warns(LeakWarning):
        del handle, bufs
    with pool.acquire(20) as again:
        again.sizes.fill_(2)  # the new holder's views: live
        assert again.sizes.tolist() == [2] * 20
    assert pool.stats().active_requests.current == 0


def test_a_handle_after_a_gc_closed_with_block_still_reports_its_leak(pool: BucketPool) -> None:
    """Issue 10, case 6: after a GC-closed with block, a recycled handle that leaked was never
    returned."""
    abandon_in_cycle(pool, 8)
    with warnings.catch_warnings():
        # The collector may finalise the handle before the generator's exit (its order):
        # then that hand-out is reported as a leak. Either way the buffer comes back once.
        warnings.simplefilter("ignore", LeakWarning)
        gc.collect()  # closes the with block
    before = pool.stats()
    assert before.active_requests.current == 0
    assert before.cached_bytes == TRIPLE_16
    with pytest.warns(LeakWarning, match="n=8 was never released"):
        leak(pool, 8)  # gets that buffer again, and drops the handle
    stats = pool.stats()
    assert stats.active_requests.current == 0
    assert stats.cached_bytes == TRIPLE_16
    assert stats.leaks == before.leaks + 1


# -- outstanding and acquire sites ---------------------------------------------------------


@pytest.mark.pool(trace=True)
def test_outstanding_lists_live_handles_with_sites(pool: BucketPool) -> None:
    live = [pool.acquire(n) for n in (3, 300)]
    done = pool.acquire(4)
    done.release()
    out = pool.outstanding()
    assert all(isinstance(record, OutstandingBuffer) for record in out)
    assert [(r.n, r.capacity) for r in out] == [(3, 16), (300, 512)]  # oldest first
    assert [r.acquired_at for r in out] == [h.acquired_at for h in live]
    site = live[0].acquired_at
    assert site is not None
    assert "test_outstanding_lists_live_handles_with_sites" in site  # a full stack
    for handle in live:
        handle.release()
    assert pool.outstanding() == []


def test_outstanding_is_a_record_not_a_handle(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    with handle:
        (live,) = pool.outstanding()
        assert live == OutstandingBuffer(n=5, capacity=16, acquired_at=None)
    assert pool.outstanding() == []
    assert handle.released
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        live.n = 6  # type: ignore[misc]


def test_outstanding_sees_handles_after_gc_freeze(pool: BucketPool) -> None:
    """Issue 10, case 12: outstanding() and assert_no_outstanding missed handles after
    gc.freeze()."""
    handle = pool.acquire(5)
    gc.freeze()
    try:
        assert [record.n for record in pool.outstanding()] == [5]
        with pytest.raises(AssertionError, match="n=5"):
            assert_no_outstanding(pool)
    finally:
        gc.unfreeze()
    handle.release()
    assert pool.outstanding() == []


@pytest.mark.pool(debug="checks")
def test_sites_are_file_and_line_at_debug_checks(pool: BucketPool) -> None:
    handle = pool.acquire(3)  # the site
    assert handle.acquired_at is not None
    assert handle.acquired_at.endswith(f"test_leaks.py:{line_of(__file__, '# the site')}")
    handle.release()


@pytest.mark.pool(debug="checks")
def test_repr_names_the_acquire_site_when_tracing(pool: BucketPool) -> None:
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


@pytest.mark.parametrize("adapter", [DescriptorBufferPool, AliasedDescriptorBufferPool])
def test_a_leaked_compat_tuple_is_told_to_release_through_the_pool(
    adapter: type[DescriptorBufferPool | AliasedDescriptorBufferPool],
) -> None:
    pool = adapter()
    with pytest.warns(LeakWarning, match=r"Call pool\.release\(bufs\)") as caught:
        pool.acquire(8)  # dropped at once: reported right here (no collector needed)
    assert "with pool.acquire" not in str(caught[0].message)  # no advice it cannot follow
    assert caught[0].filename == __file__
    assert pool.pool.outstanding() == []


def test_a_leaked_handle_is_told_to_use_with_or_release(pool: BucketPool) -> None:
    with pytest.warns(LeakWarning, match=r"with pool\.acquire\(n\) as bufs:.*handle\.release"):
        pool.acquire(8)
