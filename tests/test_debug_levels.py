"""Debug levels: checks (poisoned sizes, stale and in-flight writes), strict (guarded views)."""

from __future__ import annotations

import contextlib
import copy
import gc
import sys
import types
import typing
import warnings
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from _events import FlagEvent
from _helpers import TRIPLE_16, line_of

from bucketpool import (
    BucketPool,
    DebugLevel,
    DescriptorBuffers,
    InFlightWriteError,
    ReleaseError,
    UseAfterReleaseError,
    _debug,
)
from bucketpool.compat import DescriptorBufferPool
from bucketpool.testing import swap_blocks_batch

# -- checks: released buffers are poisoned, stale writes reported --------------------------


@pytest.mark.pool(debug="checks")
def test_released_buffers_are_poisoned_at_checks(pool: BucketPool) -> None:
    handle = pool.acquire(16)
    handle.buffers.sizes.fill_(8)
    src = handle.arrays[0]
    sizes = handle.arrays[2]
    src[:] = 7
    handle.release()
    assert not sizes.any()  # a stale batched copy moves nothing
    assert (src == 7).all()  # only the sizes are poisoned


def test_checks_zeroes_sizes_of_released_buffers(no_heap_scans: None) -> None:
    pool = BucketPool(debug="checks")
    with pool.acquire(8) as bufs:
        bufs.sizes.fill_(123)
        sizes = bufs.sizes
    assert not sizes.any()  # a stale batched copy would move nothing


@pytest.mark.pool(debug="checks")
def test_stale_write_is_caught_and_the_pool_stays_consistent(pool: BucketPool) -> None:
    with pool.acquire(16) as bufs:
        stale = bufs.sizes
    stale[3] = 4096  # a write through a view kept past release
    with pytest.warns(
        RuntimeWarning, match=r"written after its release.*acquired at .*released at"
    ):
        handle = pool.acquire(16)  # reported, not raised to the new holder
    assert not handle.released
    handle.release()
    stats = pool.stats()
    assert stats.active_requests.current == 0
    assert stats.allocations.current == 1  # nothing lost, nothing extra
    with pool.acquire(16) as bufs:
        assert not bufs.sizes.any()  # the release poisoned it again


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


@pytest.mark.parametrize("level", ["checks", "strict"])
def test_a_stale_write_during_the_next_hand_out_is_unreported_at_checks(
    level: DebugLevel, no_heap_scans: None
) -> None:
    # What the debugging guide says `checks` catches: a stale write of sizes made before the
    # buffer's next hand-out, reported there; not one made during it (no different from the
    # holder's own writes). `strict` refuses both.
    pool = BucketPool(debug=level)
    with pool.acquire(4) as bufs:
        kept = bufs.sizes
    if level == "checks":
        kept[0] = 7  # before the next hand-out
        with pytest.warns(RuntimeWarning, match="written after its release"):
            pool.acquire(4).release()
    else:
        with pytest.raises(UseAfterReleaseError):
            kept[0] = 7
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pool.acquire(4) as bufs:  # the same buffer, handed out again
            bufs.sizes.fill_(64)
            if level == "checks":
                kept[1] = 7  # during it: lands in the holder's sizes
            else:
                with pytest.raises(UseAfterReleaseError):
                    kept[1] = 7
            sizes = bufs.sizes.tolist()
        pool.acquire(4).release()
    assert sizes == ([64, 7, 64, 64] if level == "checks" else [64] * 4)
    assert not caught  # never reported


# -- checks: descriptors rewritten while a copy may read them ------------------------------


@pytest.mark.pool(debug="checks")
def test_rewrite_while_in_flight_raises_at_the_next_call(pool: BucketPool) -> None:
    event = FlagEvent()
    handle = pool.acquire(8)
    handle.buffers.sizes.fill_(64)
    handle.record_event(event)
    handle.buffers.sizes[0] = 1  # the copy may still read this
    handle.release()
    event.done = True
    with pytest.raises(InFlightWriteError, match=r"descriptors of a buffer \(n=8, acquired at"):
        pool.collect()
    assert pool.stats().parked == 0
    assert pool.stats().cached_bytes == TRIPLE_16
    with pool.acquire(8):  # reported once
        pass


@pytest.mark.pool(debug="checks")
def test_checks_raises_a_rewrite_while_in_flight_from_collect_once_the_copy_ends(
    pool: BucketPool,
) -> None:
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


@pytest.mark.pool(debug="checks")
def test_unchanged_descriptors_pass_the_in_flight_check(pool: BucketPool) -> None:
    event = FlagEvent()
    handle = pool.acquire(8)
    handle.buffers.sizes.fill_(64)
    handle.record_event(event)
    handle.release()
    event.done = True
    assert pool.collect() == 1


@pytest.mark.pool(debug="checks")
def test_checks_a_rewrite_after_the_copy_reported_done_is_no_in_flight_write(
    pool: BucketPool,
) -> None:
    """Issue 18 case 10: descriptors rewritten once the recorded copy's event reported
    done are the holder's to change; the release must not say a copy may have read them."""
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


@pytest.mark.pool(debug="checks")
def test_rewrite_between_two_recorded_events_is_caught(pool: BucketPool) -> None:
    first, second = FlagEvent(), FlagEvent()
    handle = pool.acquire(8)
    handle.buffers.sizes.fill_(64)
    handle.record_event(first)
    handle.add_copies(0, [16], [32], 8)  # while the first copy may still read it
    with pytest.raises(InFlightWriteError, match="changed while an earlier recorded copy"):
        handle.record_event(second)  # finds the change; the event is recorded all the same
    handle.release()
    assert handle.released
    assert pool.stats().parked == 1  # parked on both events
    first.done = second.done = True
    assert pool.collect() == 1


@pytest.mark.pool(debug="checks")
def test_checks_in_flight_rewrite_between_records_raises_from_record_event(
    pool: BucketPool,
) -> None:
    handle = pool.acquire(4)
    handle.buffers.sizes.fill_(1)
    handle.record_event(FlagEvent())
    handle.buffers.sizes[0] = 2
    with pytest.raises(InFlightWriteError, match="record_event"):
        handle.record_event(FlagEvent(done=True))
    handle.release()  # parked on the first event; nothing lost
    assert pool.stats().parked == 1


@pytest.mark.pool(debug="checks")
def test_record_event_catches_a_rewrite_while_in_flight_at_checks(pool: BucketPool) -> None:
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


@pytest.mark.pool(debug="checks")
def test_refilling_after_the_first_copy_finished_is_fine(pool: BucketPool) -> None:
    first, second = FlagEvent(), FlagEvent()
    handle = pool.acquire(8)
    handle.record_event(first)
    first.done = True
    handle.add_copies(0, [16], [32], 8)  # the first copy is done: a new step may refill
    handle.record_event(second)
    handle.release()
    second.done = True
    assert pool.collect() == 1


@pytest.mark.pool(debug="checks")
def test_record_event_after_the_earlier_copy_finished_is_fine_at_checks(pool: BucketPool) -> None:
    first, second = FlagEvent(done=True), FlagEvent(done=True)
    handle = pool.acquire(4)
    handle.add_copies(0, [16], [32], 8)
    handle.record_event(first)
    handle.add_copies(0, [48], [64], 8)
    handle.record_event(second)
    handle.release()
    assert pool.stats().parked == 0


@pytest.mark.pool(debug="checks")
def test_checks_in_flight_rewrite_found_by_an_unrelated_acquire_is_only_warned(
    pool: BucketPool,
) -> None:
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


@pytest.mark.pool(debug="checks")
def test_a_rewrite_past_the_shrunk_views_is_still_an_in_flight_write(pool: BucketPool) -> None:
    handle = pool.acquire(10)
    handle.add_copies(0, [16, 32, 48], [48, 64, 80], 8)
    arrays = handle.arrays  # all 10 entries, kept from before the shrink
    handle.shrink(2)
    handle.record_event(FlagEvent())
    arrays[2][5] ^= 1  # a change whatever the entry held (its memory is not cleared)
    with pytest.raises(InFlightWriteError, match="changed while an earlier recorded copy"):
        handle.record_event(FlagEvent())
    handle.release()


# Issue 18 (the third hostile review), case 10.
@pytest.mark.parametrize("level", ["checks", "strict"])
def test_a_rewrite_after_the_copy_completed_is_not_an_in_flight_write(level: DebugLevel) -> None:
    pool = BucketPool(debug=level)
    handle = pool.acquire(4)
    handle.add_copies(0, [1], [2], [3])
    event = FlagEvent()
    handle.record_event(event)
    event.done = True
    handle.add_copies(0, [9], [9], [9])  # the copy has read the old values: no harm
    handle.release()
    assert pool.collect() == 0  # nothing was parked, and nothing raised


# -- checks: unrelated odd objects ---------------------------------------------------------


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


@pytest.mark.pool(debug="checks")
def test_a_sparse_tensor_in_a_frame_does_not_break_with_exit_at_checks(pool: BucketPool) -> None:
    """Issue 10, case 11: at debug=checks a sparse tensor in a frame made the with exit raise."""
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,), check_invariants=True
    )
    with pool.acquire(8) as bufs:
        bufs.sizes.fill_(1)
        local_sparse = sparse * 2
    assert local_sparse.is_sparse
    stats = pool.stats()
    assert stats.active_requests.current == 0
    assert stats.leaks == 0


# -- strict: views kept past release raise -------------------------------------------------


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


#: Ops that return several views of their input, each to be guarded like a slice.
MANY_VIEWS: dict[str, typing.Callable[[torch.Tensor], torch.Tensor]] = {
    "split": lambda view: view.split(2)[0],  # type: ignore[no-untyped-call]
    "chunk": lambda view: view.chunk(2)[1],
    "unbind": lambda view: view.unbind()[0],
    "tensor_split": lambda view: torch.tensor_split(view, 2)[1],
    "broadcast_tensors": lambda view: torch.broadcast_tensors(view)[0],  # type: ignore[no-untyped-call]
}


@pytest.mark.parametrize("cut", MANY_VIEWS.values(), ids=MANY_VIEWS.keys())
def test_strict_catches_views_that_ops_return_several_of(
    cut: typing.Callable[[torch.Tensor], torch.Tensor], no_heap_scans: None
) -> None:
    pool = BucketPool(debug="strict")
    with pool.acquire(4) as bufs:
        kept = cut(bufs.sizes)
        kept.fill_(3)  # fine while the hand-out lasts
    with pytest.raises(UseAfterReleaseError):
        kept.fill_(7)
    with pool.acquire(4) as again:
        assert again.sizes.tolist() == [0, 0, 0, 0]  # the poison, untouched


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
    # Printing a stale view in a debugger or a log still works: it shows the poisoned sizes.
    assert "[0, 0, 0, 0]" in repr(kept[0])


@pytest.mark.pool(debug="strict")
def test_strict_numpy_arrays_become_read_only_at_release(pool: BucketPool) -> None:
    handle = pool.acquire(4)
    src, _, _ = handle.arrays
    src[0] = 1
    handle.release()
    with pytest.raises(ValueError, match="read-only"):
        src[0] = 2


# Issue 18 (the third hostile review), cases 8 and 9.
def test_strict_refuses_writes_through_kept_numpy_slices_and_view_numpy() -> None:
    pool = BucketPool(debug="strict")
    handle = pool.acquire(8)
    kept_slice = handle.arrays[0][2:5]
    kept_numpy = handle.buffers.dst_ptrs.numpy()
    handle.release()
    with pool.acquire(8) as fresh:
        with pytest.raises(ValueError, match="read-only"):
            kept_slice[0] = 99
        with pytest.raises(ValueError, match="read-only"):
            kept_numpy[0] = 99
        assert 99 not in fresh.src_ptrs.tolist()
        assert 99 not in fresh.dst_ptrs.tolist()


def test_a_freed_strict_buffer_needs_no_cyclic_collection() -> None:
    """The arrays a strict hand-out gave (and ones derived from them) are no cycle: once
    dropped and the buffer freed, its memory goes at once, with the collector off."""
    pool = BucketPool(debug="strict")
    gc.disable()
    try:
        handle = pool.acquire(8)
        owner: object = handle._buffer.arrays[0]
        while isinstance(owner, np.ndarray):  # the tensor that owns the arrays' memory
            owner = owner.base
        memory = weakref.ref(owner)
        del owner
        src, dst, sizes = handle.arrays
        derived = src[2:5]
        handle.buffers.dst_ptrs.numpy()[0] = 1
        handle.release()
        del src, dst, sizes, derived, handle
        assert pool.trim(0) > 0
        assert memory() is None
    finally:
        gc.enable()


# -- strict: views work while held ---------------------------------------------------------


@pytest.mark.pool(debug="strict")
def test_strict_views_work_while_held_and_with_the_op(pool: BucketPool) -> None:
    src = np.arange(32, dtype=np.uint8)
    dst = np.zeros(32, dtype=np.uint8)
    handle = pool.acquire(4)
    with handle as bufs:
        end = handle.add_copies(0, [src.ctypes.data], [dst.ctypes.data], [32])
        views = handle.shrink(end)
        assert views.sizes.tolist() == [32]
        swap_blocks_batch(*views)
        assert bufs.sizes.numel() == 4  # the views bound by with keep n
    assert (dst == src).all()


@pytest.mark.pool(debug="strict")
def test_local_views_work_at_strict(pool: BucketPool) -> None:
    for n in (3, 3, 40):
        with pool.acquire(n) as (src, dst, sizes):
            src.fill_(1)
            dst.fill_(2)
            sizes.fill_(3)
            assert (src.tolist(), dst.tolist(), sizes.tolist()) == ([1] * n, [2] * n, [3] * n)
        with pool.acquire(n) as bufs:
            assert bufs.src_ptrs.tolist() == [1] * n  # the same buffer, written above
            bufs.sizes.fill_(0)
            array = bufs.src_ptrs.numpy()
            array[:] = 7
            assert bufs.src_ptrs.tolist() == [7] * n  # the array is the view's memory
            del array
        with pytest.raises(UseAfterReleaseError):
            src.sum()  # the views bound by unpacking were guarded all along
    stats = pool.stats()
    assert stats.active_requests.current == 0
    assert stats.allocations.current == 2  # one buffer per bucket, every time
    assert stats.leaks == 0


@contextlib.contextmanager
def descriptors(pool: BucketPool, n: int) -> Iterator[DescriptorBuffers]:
    with pool.acquire(n) as bufs:
        yield bufs


@pytest.mark.pool(debug="strict")
def test_wrapped_and_stacked_acquires_work_at_strict(pool: BucketPool) -> None:
    with descriptors(pool, 8) as bufs:
        bufs.sizes.fill_(1)
    with contextlib.ExitStack() as stack:
        src, _dst, _sizes = stack.enter_context(pool.acquire(8))
        src.fill_(2)
    with pool.acquire(8) as bufs:
        first_four = bufs.src_ptrs[:4]  # a local slice, as vLLM's worker writes
        first_four.fill_(3)
    del first_four
    assert pool.stats().active_requests.current == 0


def test_strict_ignores_unrelated_odd_tensors(no_heap_scans: None) -> None:
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0]]), torch.tensor([1.0]), (3,), check_invariants=True
    )
    pool = BucketPool(debug="strict")
    with pool.acquire(4) as bufs:
        total = bufs.sizes.fill_(2).sum() + sparse.to_dense().sum()
    assert float(total) == 9.0
    assert pool.stats().active_requests.current == 0


# -- copies of live views -------------------------------------------------------------------


# Issue 18 (the third hostile review), case 9.
def test_deepcopy_of_live_views_works_at_every_level(pool_at_each_level: BucketPool) -> None:
    pool = pool_at_each_level
    handle = pool.acquire(4)
    with handle as bufs:
        handle.add_copies(0, [1, 2, 3, 4], [5, 6, 7, 8], 16)
        state = {"bufs": bufs, "views": [bufs.src_ptrs]}
        copied = copy.deepcopy(state)
        view = copy.deepcopy(bufs.sizes)
    copied_bufs = typing.cast("DescriptorBuffers", copied["bufs"])
    assert copied_bufs.src_ptrs.tolist() == [1, 2, 3, 4]
    assert typing.cast("list[torch.Tensor]", copied["views"])[0].tolist() == [1, 2, 3, 4]
    assert view.tolist() == [16] * 4
    with pool.acquire(4) as again:
        again.src_ptrs.fill_(0)
    assert copied_bufs.src_ptrs.tolist() == [1, 2, 3, 4]  # a copy, not the pool's memory


@pytest.mark.parametrize("level", ["checks", "strict"])
def test_stale_views_refuse_to_fill_or_shrink_the_next_hand_out(level: DebugLevel) -> None:
    # At the debug levels every hand-out has view sets of its own, so sets kept from the
    # last hand-out of the same n refuse (at "off" they are the next holder's: below).
    pool = BucketPool(debug=level)
    with pool.acquire(4) as old:
        old_shrunk = old.shrink(2)
    with pool.acquire(4) as new:
        new_shrunk = new.shrink(2)
        new.add_copies(0, [10, 11, 12, 13], [20, 21, 22, 23], 8)
        for stale in (old, old_shrunk):
            with pytest.raises(ReleaseError, match=r"add_copies: .* hand-out that is over"):
                stale.add_copies(0, [666], [666], 666)
            with pytest.raises(ReleaseError, match=r"add_block_copies: .* hand-out that is over"):
                stale.add_block_copies(0, 0, 0, [0], [1], 666)
            with pytest.raises(ReleaseError, match=r"shrink: .* hand-out that is over"):
                stale.shrink(1)
            with pytest.raises(ReleaseError, match=r"record_event: .* hand-out that is over"):
                stale.record_event(FlagEvent())
        assert new.src_ptrs.tolist() == [10, 11, 12, 13]
        assert new.sizes.tolist() == [8] * 4
        assert new_shrunk.shrink(1).sizes.tolist() == [8]  # the live sets still work
    assert pool.stats().parked == 0  # no stale event was recorded


def test_at_off_a_kept_set_refuses_until_its_n_is_handed_out_again() -> None:
    # The limit the debugging guide states for "off": view sets are cached per n, and the
    # next hand-out of the same n (or shrink count) is given the very same object.
    pool = BucketPool(debug="off")  # (a buffer of 4,096 entries caches 32 sets)
    with pool.acquire(4000) as kept:
        kept_shrunk = kept.shrink(2)
    with pool.acquire(3000):  # the same buffer, another n: the kept sets still refuse
        for stale in (kept, kept_shrunk):
            with pytest.raises(ReleaseError, match=r"add_copies: .* hand-out that is over"):
                stale.add_copies(0, [666], [666], 666)
    with pool.acquire(4000) as bufs:
        assert bufs is kept  # the new holder's own views: kept.add_copies would fill them
        assert bufs.shrink(2) is kept_shrunk


def _with_block_in_a_function(pool: BucketPool) -> torch.Tensor:
    with pool.acquire(4) as bufs:  # the releasing line
        return bufs.sizes


def _compat_release_in_a_function(compat: DescriptorBufferPool) -> torch.Tensor:
    bufs = compat.acquire(4)
    compat.release(bufs)  # the compat releasing line
    return bufs.sizes


def test_a_stale_write_names_the_line_that_released_below_user_code() -> None:
    # A with block's exit and a compat release are one call below the user's line, a
    # handle's release() two: the site is the first frame outside the package either way.
    pool = BucketPool(debug="checks")
    kept = _with_block_in_a_function(pool)
    kept[0] = 99
    with pytest.warns(RuntimeWarning) as caught:
        pool.acquire(4).release()
    line = line_of(__file__, "# the releasing line")
    assert f"released at {__file__}:{line})" in str(caught[0].message)


def test_a_compat_release_site_is_the_release_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUCKETPOOL_DEBUG", "checks")
    compat = DescriptorBufferPool()
    kept = _compat_release_in_a_function(compat)
    kept[0] = 99
    with pytest.warns(RuntimeWarning) as caught:
        compat.release(compat.acquire(4))
    line = line_of(__file__, "# the compat releasing line")
    assert f"released at {__file__}:{line})" in str(caught[0].message)


def test_an_array_derived_as_the_release_ends_is_made_read_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/guide/debugging.md, strict: "`handle.arrays`, `view.numpy()` and every array numpy
    # derives from them (slices, `.view()`, reshapes) are made read-only at release".  The
    # move hands the guards' list of arrays over as a copy (`ended += handed`) and makes
    # them read-only after it, outside the lock: a slice another thread cuts from a stale
    # array in between joins only the old list, is never marked, and writes into the next
    # holder's buffer.  Forced: the slice is cut just before the pool marks the arrays.
    pool = BucketPool(debug="strict")
    end_arrays = _debug.end_arrays
    cut: list[typing.Any] = []

    def slice_then_end(buffer: typing.Any) -> None:
        cut.append(stale[1:])  # what another thread does at this moment
        end_arrays(buffer)

    monkeypatch.setattr(_debug, "end_arrays", slice_then_end)
    handle = pool.acquire(8)
    stale = handle.arrays[0]
    handle.release()
    monkeypatch.undo()
    assert len(cut) == 1
    assert not stale.flags.writeable
    assert not cut[0].flags.writeable  # else a stale write lands in the next holder's buffer


def test_an_array_derived_while_another_thread_releases_is_made_read_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As above, one step earlier: numpy makes the slice (writable, as its source still is)
    # and only then calls `__array_finalize__`, which adds it to the hand-out's list.  A
    # release that ends in between marks the list and drops it: the slice joins a list no
    # one reads again and stays writable over the next holder's buffer.  Forced: the release
    # (another thread's) runs as the slice's `__array_finalize__` begins.
    pool = BucketPool(debug="strict")
    handle = pool.acquire(8)
    live = handle.arrays[0]
    finalize = _debug.GuardedArray.__array_finalize__

    def release_meanwhile(self: typing.Any, obj: object) -> None:
        if not handle.released:
            handle.release()  # what another thread does at this moment
        finalize(self, obj)

    monkeypatch.setattr(_debug.GuardedArray, "__array_finalize__", release_meanwhile)
    cut = live[1:]
    monkeypatch.undo()
    assert handle.released
    assert not live.flags.writeable
    assert not cut.flags.writeable  # else a stale write lands in the next holder's buffer


def _release_while_another_holder_ends(
    line: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[int], list[typing.Any]]:
    """Release a strict hand-out; at *line* of its `end_arrays`, another holder takes the
    buffer and ends its own hand-out, its marking held back until the release is over.

    Returns the address of each hand-out's buffer (one: `end_arrays` ran fewer lines) and
    every array of both.
    """
    code, end_arrays = _debug.end_arrays.__code__, _debug.end_arrays
    pool = BucketPool(debug="strict")
    first = pool.acquire(8)
    arrays: list[typing.Any] = [*first.arrays]
    held_back: list[typing.Any] = []
    lines = [0]
    taken = [first.buffers[0].data_ptr()]

    def other_holder() -> None:  # another thread, at this line of the release's marking
        second = pool.acquire(8)
        taken.append(second.buffers[0].data_ptr())
        arrays.extend(second.arrays)
        monkeypatch.setattr(_debug, "end_arrays", held_back.append)
        second.release()  # its move ends the hand-out; its marking waits
        monkeypatch.setattr(_debug, "end_arrays", end_arrays)

    def local(frame: types.FrameType, event: str, arg: object) -> typing.Any:
        if event == "line":
            if lines[0] == line:
                other_holder()  # (nothing is traced inside a trace function)
            lines[0] += 1
        return local

    def calls(frame: types.FrameType, event: str, arg: object) -> typing.Any:
        return local if frame.f_code is code and not lines[0] else None

    before = sys.gettrace()
    sys.settrace(calls)
    try:
        first.release()
    finally:
        sys.settrace(before)
    for buffer in held_back:  # the other thread runs on
        end_arrays(buffer)
    return taken, arrays


def test_no_strict_hand_out_keeps_writable_arrays_whatever_the_interleaving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A release makes its hand-out's arrays read-only after its move, outside the lock.
    # Another thread may take the same buffer and end a hand-out of its own at any point of
    # that: each line of `end_arrays` is tried in turn.  Checking, then storing,
    # `buffer.ended` outside the lock dropped the other hand-out's list unmarked there: its
    # arrays stayed writable, and a stale write landed in the next holder's buffer.
    line = 0
    while True:
        taken, arrays = _release_while_another_holder_ends(line, monkeypatch)
        if len(taken) == 1:  # every line was tried
            break
        assert taken[0] == taken[1]  # the other holder had the same buffer
        assert not [array for array in arrays if array.flags.writeable], f"at line {line}"
        line += 1
    assert line >= 6  # the interleavings were tried
