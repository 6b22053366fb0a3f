"""Debug levels and leak reports: what users see, and that it comes from the right place."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import typing
import warnings

import numpy as np
import pytest
import torch
from _events import FlagEvent

from bucketpool import (
    BucketPool,
    DescriptorBuffers,
    InFlightWriteError,
    LeakWarning,
    ReleaseError,
    UseAfterReleaseError,
)
from bucketpool.testing import swap_blocks_batch


@pytest.fixture
def no_heap_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any scan of the garbage collector's heap fail the test."""

    def refuse(*args: object) -> list[object]:
        raise AssertionError("the pool scanned the heap")

    monkeypatch.setattr(gc, "get_referrers", refuse)
    monkeypatch.setattr(gc, "get_objects", refuse)


# -- leaks ---------------------------------------------------------------------------------


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
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    # Shown by Python's default filters, once for the one acquire site of the loop.
    assert result.stderr.count("LeakWarning") == 1, result.stderr
    assert "n=5" in result.stderr
    assert "<string>:5" in result.stderr  # where it was acquired


def test_leaks_are_reported_once_per_site_and_buffers_come_back() -> None:
    pool = BucketPool(trace=True)
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


def test_a_leak_with_pending_events_parks_its_buffer() -> None:
    pool = BucketPool()
    event = FlagEvent()
    handle = pool.acquire(4)
    handle.record_event(event)
    with pytest.warns(LeakWarning):
        del handle
    assert pool.stats().parked == 1
    event.done = True
    assert pool.collect() == 1
    assert pool.stats().cached_bytes > 0


# -- checks --------------------------------------------------------------------------------


def test_checks_zeroes_sizes_of_released_buffers(no_heap_scans: None) -> None:
    pool = BucketPool(debug="checks")
    with pool.acquire(8) as bufs:
        bufs.sizes.fill_(123)
        sizes = bufs.sizes
    assert not sizes.any()  # a stale batched copy would move nothing


def test_checks_reports_a_stale_write_as_a_warning_naming_the_stale_holder(
    no_heap_scans: None,
) -> None:
    pool = BucketPool(debug="checks")
    with pool.acquire(8) as bufs:
        stale = bufs.sizes
    stale[3] = 99  # after release
    with pytest.warns(RuntimeWarning, match="written after its release") as caught:
        handle = pool.acquire(8)  # the new holder is warned about, not blamed
    message = str(caught[0].message)
    assert "acquired at" in message
    assert "released at" in message
    assert __file__ in message
    handle.release()


def test_checks_raises_a_rewrite_while_in_flight_from_collect_once_the_copy_ends() -> None:
    pool = BucketPool(debug="checks")
    event = FlagEvent()
    handle = pool.acquire(4)
    with handle as bufs:
        bufs.sizes.fill_(1)
        handle.record_event(event)
        bufs.sizes[0] = 2  # rewritten while the copy may read it
    assert handle.released  # parked: the copy is still running
    event.done = True
    with pytest.raises(InFlightWriteError, match="changed between record_event"):
        pool.collect()
    assert pool.stats().parked == 0  # retired all the same


def test_checks_a_rewrite_after_the_copy_reported_done_is_no_in_flight_write() -> None:
    """Issue 18 case 10: descriptors rewritten once the recorded copy's event reported
    done are the holder's to change; the release must not say a copy may have read them."""
    pool = BucketPool(debug="checks")
    event = FlagEvent()
    handle = pool.acquire(4)
    with handle as bufs:
        bufs.sizes.fill_(1)
        handle.record_event(event)
        event.done = True  # the copy is over
        bufs.sizes[0] = 2  # a new step's descriptors
    assert handle.released
    assert pool.stats().parked == 0
    assert pool.collect() == 0


def test_checks_in_flight_rewrite_between_records_raises_from_record_event() -> None:
    pool = BucketPool(debug="checks")
    handle = pool.acquire(4)
    handle.buffers.sizes.fill_(1)
    handle.record_event(FlagEvent())
    handle.buffers.sizes[0] = 2
    with pytest.raises(InFlightWriteError, match="record_event"):
        handle.record_event(FlagEvent(done=True))
    handle.release()  # parked on the first event; nothing lost
    assert pool.stats().parked == 1


def test_checks_in_flight_rewrite_found_by_an_unrelated_acquire_is_only_warned() -> None:
    pool = BucketPool(debug="checks")
    event = FlagEvent()
    handle = pool.acquire(4)
    handle.buffers.sizes.fill_(1)
    handle.record_event(event)
    sizes = handle.buffers.sizes  # kept past the release: a stale view
    handle.release()  # parked
    sizes[0] = 2
    event.done = True
    with pytest.warns(RuntimeWarning, match="changed between record_event"):
        other = pool.acquire(4)  # the miss polls the parked buffer and retires it
    other.release()


def test_checks_costs_no_heap_scan_with_unrelated_odd_objects(no_heap_scans: None) -> None:
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0]]), torch.tensor([1.0]), (3,), check_invariants=True
    )
    meta = torch.empty(3, device="meta")
    pool = BucketPool(debug="checks")
    for _ in range(3):
        with pool.acquire(16) as bufs:
            bufs.sizes.fill_(0)
    assert sparse.is_sparse
    assert meta.is_meta
    assert pool.stats().active_requests.current == 0


# -- strict --------------------------------------------------------------------------------


def _use_after(pool: BucketPool) -> tuple[torch.Tensor, DescriptorBuffers, torch.Tensor]:
    """Return what a careless caller keeps: a view, the tuple, a slice of a view."""
    with pool.acquire(8) as bufs:
        sizes = bufs.sizes
        bufs.sizes.fill_(1)
        piece = bufs.src_ptrs[:4]
    return sizes, bufs, piece


def test_strict_catches_a_view_kept_in_a_local(no_heap_scans: None) -> None:
    sizes, _, _ = _use_after(BucketPool(debug="strict"))
    with pytest.raises(UseAfterReleaseError, match=r"sum: a view of a buffer \(n=8"):
        sizes.sum()


def test_strict_catches_the_tuple_and_slices_of_views(no_heap_scans: None) -> None:
    _, bufs, piece = _use_after(BucketPool(debug="strict"))
    with pytest.raises(UseAfterReleaseError):
        bufs.dst_ptrs[0] = 5
    with pytest.raises(UseAfterReleaseError):
        swap_blocks_batch(*bufs)
    with pytest.raises(UseAfterReleaseError):
        piece.tolist()


def test_strict_catches_views_in_attributes_and_containers(no_heap_scans: None) -> None:
    pool = BucketPool(debug="strict")

    class Holder:
        views: DescriptorBuffers | None = None

    holder, kept = Holder(), []
    with pool.acquire(4) as bufs:
        holder.views = bufs
        kept.append(bufs.sizes)
    assert holder.views is not None
    with pytest.raises(UseAfterReleaseError):
        holder.views.src_ptrs.add_(1)
    with pytest.raises(UseAfterReleaseError):
        kept[0].clone()
    repr(kept[0])  # printing a stale view in a debugger or a log still works


def test_strict_views_work_while_held_and_with_the_op() -> None:
    pool = BucketPool(debug="strict")
    src = np.arange(32, dtype=np.uint8)
    dst = np.zeros(32, dtype=np.uint8)
    handle = pool.acquire(4)
    with handle as bufs:
        end = handle.add_copies(0, [src.ctypes.data], [dst.ctypes.data], [32])
        views = handle.shrink(end)
        assert views.sizes.tolist() == [32]
        swap_blocks_batch(*views)
        assert bufs.sizes.numel() == 1  # the views bound by with were shrunk in place
    assert (dst == src).all()


def test_strict_numpy_arrays_become_read_only_at_release() -> None:
    pool = BucketPool(debug="strict")
    handle = pool.acquire(4)
    src, _, _ = handle.arrays
    src[0] = 1
    handle.release()
    with pytest.raises(ValueError, match="read-only"):
        src[0] = 2


def test_strict_ignores_unrelated_odd_tensors(no_heap_scans: None) -> None:
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0]]), torch.tensor([1.0]), (3,), check_invariants=True
    )
    pool = BucketPool(debug="strict")
    with pool.acquire(4) as bufs:
        total = bufs.sizes.fill_(2).sum() + sparse.to_dense().sum()
    assert float(total) == 9.0
    assert pool.stats().active_requests.current == 0


# -- shrink --------------------------------------------------------------------------------


def test_shrink_resizes_the_with_views_in_place_and_checks_count() -> None:
    pool = BucketPool()
    handle = pool.acquire(10)
    with handle as bufs:
        pointer = bufs.src_ptrs.data_ptr()
        views = handle.shrink(np.int64(3))
        assert views is bufs
        assert bufs.src_ptrs.numel() == 3
        assert bufs.src_ptrs.data_ptr() == pointer
        assert handle.n == 3
        with pytest.raises(ValueError, match=r"count=4 is outside 0..n=3"):
            handle.shrink(4)
        with pytest.raises(TypeError, match="not bool"):
            handle.shrink(True)
    with pytest.raises(ReleaseError, match="shrink"):
        handle.shrink(1)


@pytest.mark.parametrize("level", ["checks", "strict"])
def test_shrinking_before_recording_the_event_is_no_in_flight_write(
    level: typing.Literal["checks", "strict"],
) -> None:
    """The README's asynchronous example: fill, shrink to what was written, record."""
    pool = BucketPool(debug=level)
    event = FlagEvent()
    handle = pool.acquire(10)
    with handle:
        end = handle.add_copies(0, [16, 32], [48, 64], 8)
        handle.shrink(end)
        handle.record_event(event)
    event.done = True
    assert pool.collect() == 1  # no InFlightWriteError: nothing changed


def test_a_rewrite_past_the_shrunk_views_is_still_an_in_flight_write() -> None:
    pool = BucketPool(debug="checks")
    handle = pool.acquire(10)
    handle.add_copies(0, [16, 32, 48], [48, 64, 80], 8)
    arrays = handle.arrays  # all 10 entries, kept from before the shrink
    handle.shrink(2)
    handle.record_event(FlagEvent())
    arrays[2][5] = 99
    with pytest.raises(InFlightWriteError, match="changed while an earlier recorded copy"):
        handle.record_event(FlagEvent())
    handle.release()


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
