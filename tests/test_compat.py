"""The drop-in adapters of `bucketpool.compat`: vLLM's tuples, with the pool's rules."""

from __future__ import annotations

import copy
import gc
import inspect
import pickle
import sys
import types
import typing
import weakref
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from _events import DeviceError, FlagEvent, ScriptedEvent

import bucketpool
from bucketpool import DebugLevel, ReleaseError
from bucketpool.compat import (
    AliasedDescriptorBufferPool,
    AliasedDescriptorBuffers,
    DescriptorBufferPool,
    DescriptorBuffers,
)


def test_reexports_the_same_descriptor_buffers() -> None:
    assert DescriptorBuffers is bucketpool.DescriptorBuffers


def test_acquire_returns_the_whole_bucket_capacity() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(5)
    assert isinstance(bufs, DescriptorBuffers)
    assert [t.numel() for t in bufs] == [16, 16, 16]  # the smallest bucket
    assert all(t.dtype == torch.int64 for t in bufs)
    pool.release(bufs)
    big = pool.acquire(1000)
    assert [t.numel() for t in big] == [1024, 1024, 1024]
    pool.release(big)


@pytest.mark.parametrize("n", [0, 1, 16, 17, 1000, 1024, 1025])
def test_capacity_is_a_power_of_two_at_least_n(n: int) -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(n)
    capacity = bufs.src_ptrs.numel()
    assert capacity >= max(n, 16)
    assert capacity & (capacity - 1) == 0
    assert capacity == pool.pool.bucket_capacity(n)
    pool.release(bufs)


def test_same_n_after_release_is_the_same_memory_in_a_new_tuple() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(7)
    pool.release(bufs)
    again = pool.acquire(7)
    assert again is not bufs  # one tuple per hand-out: a late release of bufs is refused
    assert all(a is b for a, b in zip(again, bufs, strict=True))  # the very same tensors
    pool.release(again)


def test_any_n_of_the_bucket_gets_the_same_tensors() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(20)
    pool.release(bufs)
    again = pool.acquire(32)  # the same bucket (capacity 32)
    assert again.src_ptrs is bufs.src_ptrs
    pool.release(again)
    other = pool.acquire(33)  # the next bucket: another buffer
    assert other.src_ptrs.data_ptr() != bufs.src_ptrs.data_ptr()
    assert other.src_ptrs.numel() == 64
    pool.release(other)


def test_callers_slices_share_the_pool_memory() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(9)
    src, _dst, sizes = bufs
    assert src[:9].data_ptr() == bufs.src_ptrs.data_ptr()
    sizes[:9] = 3
    assert bufs.sizes[:9].tolist() == [3] * 9
    pool.release(bufs)


def test_double_release_raises_and_changes_nothing() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(4)
    pool.release(bufs)
    before = pool.pool.stats()
    with pytest.raises(ReleaseError, match="was already released"):
        pool.release(bufs)
    assert pool.pool.stats() == before
    first, second = pool.acquire(4), pool.acquire(4)
    assert first.src_ptrs.data_ptr() != second.src_ptrs.data_ptr()
    pool.release(first)
    pool.release(second)


def test_a_stale_release_after_the_buffer_was_handed_out_again_is_refused() -> None:
    """Issue 16: a late second release by the previous holder must not end the new
    holder's hand-out, whose own release must still work."""
    pool = DescriptorBufferPool()
    bufs = pool.acquire(4)
    pool.release(bufs)
    again = pool.acquire(4)  # the same buffer, a new hand-out, a new tuple
    before = pool.pool.stats()
    with pytest.raises(ReleaseError, match="was already released"):
        pool.release(bufs)
    assert pool.pool.stats() == before  # changed nothing
    assert pool.pool.stats().active_requests.current == 1
    pool.release(again)  # the new holder's release
    assert pool.pool.stats().active_requests.current == 0
    with pytest.raises(ReleaseError, match="was already released"):
        pool.release(again)


def test_foreign_triple_raises() -> None:
    pool = DescriptorBufferPool()
    foreign = DescriptorBuffers(*(torch.empty(4, dtype=torch.int64) for _ in range(3)))
    with pytest.raises(ReleaseError, match="was not acquired from this pool"):
        pool.release(foreign)
    other = DescriptorBufferPool()
    theirs = other.acquire(4)
    with pytest.raises(ReleaseError, match="was not acquired from this pool"):
        pool.release(theirs)
    other.release(theirs)  # still theirs to release


def test_a_rebuilt_tuple_is_not_the_acquired_one() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(4)
    with pytest.raises(ReleaseError, match="not acquired from this pool"):
        pool.release(DescriptorBuffers(*bufs))
    assert pool.pool.stats().active_requests.current == 1
    pool.release(bufs)


def test_release_with_event_defers_reuse() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(30)
    event = FlagEvent()
    pool.release(bufs, event=event)
    assert pool.pool.stats().parked == 1
    other = pool.acquire(30)
    assert other.src_ptrs.data_ptr() != bufs.src_ptrs.data_ptr()
    event.done = True
    assert pool.pool.collect() == 1
    pool.release(other)


def test_release_with_a_raising_event_loses_nothing() -> None:
    """Issue 10, case 10: compat release(bufs, event=ev) with a raising query lost the buffer."""
    adapter = DescriptorBufferPool()
    bufs = adapter.acquire(8)
    event = ScriptedEvent(DeviceError("once"), after=True)
    with pytest.raises(DeviceError):
        adapter.release(bufs, event=event)
    stats = adapter.pool.stats()
    assert (stats.active_requests.current, stats.parked) == (0, 1)
    with pytest.raises(ReleaseError, match="already released"):
        adapter.release(bufs)  # the release took effect: a retry is a double release
    assert adapter.pool.collect() == 1
    again = adapter.acquire(8)  # back, and handed out again, as a new tuple
    assert again.src_ptrs.data_ptr() == bufs.src_ptrs.data_ptr()
    adapter.release(again)


def test_bad_event_keeps_the_buffers_acquired() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(3)
    with pytest.raises(TypeError, match="the buffers stay acquired"):
        pool.release(bufs, event=object())  # type: ignore[arg-type]
    pool.release(bufs)


def test_uint64_pool() -> None:
    pool = DescriptorBufferPool(dtype=torch.uint64)
    bufs = pool.acquire(3)
    assert bufs.src_ptrs.dtype == torch.uint64
    pool.release(bufs)


def test_bad_n_keeps_the_original_errors_clear() -> None:
    pool = DescriptorBufferPool()
    with pytest.raises(ValueError, match="n must be >= 0"):
        pool.acquire(-3)
    with pytest.raises(TypeError, match="not float"):
        pool.acquire(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^acquire: n=1099511627776 is above .*max_capacity"):
        pool.acquire(2**40)  # (it blamed bucket_capacity:)
    assert pool.pool.stats().active_requests.current == 0


# -- `_pool`: what vLLM's tests read ------------------------------------------------------

ADAPTERS = [DescriptorBufferPool, AliasedDescriptorBufferPool]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_pool_lists_the_cached_buffers_tensors_as_vllms_list_does(adapter: type[Any]) -> None:
    pool = adapter()
    bufs = pool.acquire(5)
    assert pool._pool == []
    pool.release(bufs)
    assert len(pool._pool) == 1
    assert pool._pool == [bufs]  # every field is the very object the caller released
    assert type(pool._pool[0]) is adapter._held._public  # a public tuple: it holds nothing
    tensor = bufs.src_ptrs
    del bufs
    again = pool.acquire(5)  # vLLM's tests: the next step's triple has the same tensors
    assert pool._pool == []
    assert again.src_ptrs is tensor
    pool.release(again)
    assert pool._pool == [again]
    assert pool._pool[0].src_ptrs is tensor
    with pytest.raises(ReleaseError, match="not acquired from this pool"):
        pool.release(pool._pool[0])  # a listed tuple is no holder


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_pool_lists_buckets_least_recently_used_first_and_is_read_only(
    adapter: type[Any],
) -> None:
    pool = adapter()
    small, large, other = pool.acquire(3), pool.acquire(300), pool.acquire(4)
    for bufs in (large, small, other):
        pool.release(bufs)
    listed = [bufs.src_ptrs for bufs in pool._pool]  # bucket 512, then 16's in release order
    assert listed == [large.src_ptrs, small.src_ptrs, other.src_ptrs]
    pool._pool.clear()  # a copy
    assert len(pool._pool) == 3
    with pytest.raises(AttributeError):
        pool._pool = []
    pool.release(pool.acquire(300))
    assert pool._pool[-1].src_ptrs is large.src_ptrs


def test_pool_lists_the_buffers_a_next_acquire_may_return() -> None:
    pool = DescriptorBufferPool()
    event = FlagEvent()
    bufs = pool.acquire(3)
    pool.release(bufs, event=event)
    assert pool._pool == []  # parked: the next acquire cannot have it
    event.done = True
    pool.pool.collect()
    assert pool._pool == [bufs]
    with pytest.warns(bucketpool.LeakWarning):
        drop(pool, 3)  # the same buffer, dropped unreleased: it comes back
    assert pool._pool == [bufs]  # cached again, with its tensors
    kept = pool.acquire(3)
    pool.release(kept)
    view = weakref.ref(kept.src_ptrs)
    del kept, bufs
    assert view() is not None  # cached, and its tensors with it
    pool.pool.trim(0)
    assert pool._pool == []
    assert view() is None  # `_pool` keeps nothing of a freed buffer


# -- the six-field shape ----------------------------------------------------------------


def test_aliased_fields_in_order_and_shared_memory() -> None:
    assert AliasedDescriptorBuffers._fields == (
        "src_ptrs",
        "dst_ptrs",
        "sizes",
        "src_np",
        "dst_np",
        "sizes_np",
    )
    pool = AliasedDescriptorBufferPool()
    bufs = pool.acquire(6)
    for tensor, array in zip(bufs[:3], bufs[3:], strict=True):
        assert isinstance(tensor, torch.Tensor)
        assert isinstance(array, np.ndarray)
        assert tensor.numel() == array.size == 16
        assert tensor.data_ptr() == array.ctypes.data
    bufs.src_np[:6] = 5
    assert bufs.src_ptrs[:6].tolist() == [5] * 6
    pool.release(bufs)


def test_aliased_add_copies_has_the_upstream_meaning() -> None:
    pool = AliasedDescriptorBufferPool()
    bufs = pool.acquire(4)
    assert bufs.add_copies(1, [100, 200], np.array([300, 400]), 64) == 3  # the next entry
    assert bufs.src_ptrs[1:3].tolist() == [100, 200]
    assert bufs.dst_np[1:3].tolist() == [300, 400]
    assert bufs.sizes_np[1:3].tolist() == [64, 64]
    with pytest.raises(IndexError):
        bufs.add_copies(15, [1, 2], [3, 4], 8)  # past the capacity of 16
    pool.release(bufs)


def test_a_public_aliased_tuple_fills_every_step_entries_as_the_held_one() -> None:
    """``copy.copy`` of a held tuple is the public class: its add_copies takes ``step`` too."""
    assert inspect.signature(AliasedDescriptorBuffers.add_copies) == inspect.signature(
        DescriptorBuffers.add_copies
    )
    pool = AliasedDescriptorBufferPool()
    held = pool.acquire(8)
    public = copy.copy(held)  # the same memory, in the public class
    assert type(public) is AliasedDescriptorBuffers
    for layer, bufs in enumerate((held, public)):
        assert bufs.add_copies(layer, [100, 200, 300], [400, 500, 600], 8, step=2) == 5 + layer
    assert held.src_np[:6].tolist() == [100, 100, 200, 200, 300, 300]
    with pytest.raises(ValueError, match="step must be >= 1"):
        public.add_copies(0, [1], [2], 3, step=0)
    pool.release(held)


def test_aliased_same_n_is_the_same_memory_and_dtype_follows() -> None:
    pool = AliasedDescriptorBufferPool(dtype=torch.uint64)
    bufs = pool.acquire(11)
    assert bufs.dst_ptrs.dtype == torch.uint64
    assert bufs.dst_np.dtype == np.uint64
    pool.release(bufs)
    again = pool.acquire(11)
    assert again.src_ptrs is bufs.src_ptrs
    assert again.src_np.ctypes.data == bufs.src_np.ctypes.data  # new aliases, same memory
    pool.release(again)
    other = pool.acquire(12)  # same bucket, another n: the same memory
    assert other.src_ptrs is bufs.src_ptrs
    assert other.src_np.size == 16
    pool.release(other)


def test_aliased_release_rules() -> None:
    pool = AliasedDescriptorBufferPool()
    bufs = pool.acquire(2)
    pool.release(bufs, event=FlagEvent())
    with pytest.raises(ReleaseError):
        pool.release(bufs)
    assert pool.pool.stats().parked == 1
    with pytest.raises(ReleaseError, match="already released"):
        pool.release(bufs)


def test_tuples_are_instances_of_the_public_classes() -> None:
    plain, aliased = DescriptorBufferPool(), AliasedDescriptorBufferPool()
    a, b = plain.acquire(3), aliased.acquire(3)
    assert isinstance(a, DescriptorBuffers)
    assert isinstance(b, AliasedDescriptorBuffers)
    assert type(a).__name__ == "DescriptorBuffers"
    assert repr(a).startswith("DescriptorBuffers(src_ptrs=tensor(")
    plain.release(a)
    aliased.release(b)


def drop(pool: DescriptorBufferPool, n: int) -> None:
    pool.acquire(n)  # never released


def test_a_dropped_tuple_warns_and_its_buffer_comes_back() -> None:
    pool = DescriptorBufferPool()
    with pytest.warns(bucketpool.LeakWarning, match="n=16 was never released"):
        drop(pool, 9)
    stats = pool.pool.stats()
    assert stats.leaks == 1
    assert stats.active_requests.current == 0
    assert stats.buckets[0].cached == 1


def test_the_adapter_keeps_no_reference_to_what_it_handed_out() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(4)
    pool.release(bufs)
    held = pool.acquire(4)  # the same buffer, now held through a new tuple
    del bufs
    gc.disable()
    try:
        with pytest.warns(bucketpool.LeakWarning):
            del held  # only the caller held it: finalised at once, without the collector
    finally:
        gc.enable()
    assert pool.pool.stats().active_requests.current == 0


@pytest.mark.parametrize("level", ["off", "checks", "strict"])
def test_a_handle_that_shrinks_the_whole_views_leaves_compat_tuples_whole(
    level: DebugLevel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A handle of n == capacity may get the views a compat tuple holds; its shrink must not
    # reach the adapter's next triple, which has the whole capacity.
    monkeypatch.setenv("BUCKETPOOL_DEBUG", level)
    compat = DescriptorBufferPool()
    compat.release(compat.acquire(5))
    with compat.pool.acquire(16) as views:
        views.shrink(2)
    again = compat.acquire(5)
    assert [len(tensor) for tensor in again] == [16, 16, 16]
    compat.release(again)


@pytest.mark.parametrize("level", ["off", "checks", "strict"])
def test_no_handle_ever_resizes_the_tensors_compat_tuples_hold(
    level: DebugLevel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tensors of the adapter's next triple are its own: neither a handle's shrink nor
    # the cache reusing its oldest set for another n resizes them, whatever repairs follow.
    monkeypatch.setenv("BUCKETPOOL_DEBUG", level)
    compat = DescriptorBufferPool()
    compat.release(compat.acquire(1024))
    with compat.pool.acquire(1024) as views:
        views.shrink(3)
    with compat.pool.acquire(600) as views:
        views.sizes.fill_(1)  # a plain write: counted, so the next acquire repairs
    for n in range(513, 533):  # more n than the cache keeps: the oldest sets are reused
        with compat.pool.acquire(n):
            pass
    again = compat.acquire(1024)
    assert [len(tensor) for tensor in again] == [1024, 1024, 1024]
    compat.release(again)


def test_a_double_release_at_strict_says_released(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUCKETPOOL_DEBUG", "strict")
    compat = DescriptorBufferPool()
    bufs = compat.acquire(5)
    compat.release(bufs)
    with pytest.raises(ReleaseError, match="already released"):
        compat.release(bufs)


def test_instances_can_be_patched() -> None:
    pool = DescriptorBufferPool()
    calls: list[int] = []
    real = pool.acquire

    def counting(n: int) -> DescriptorBuffers:
        calls.append(n)
        return real(n)

    with mock.patch.object(pool, "acquire", counting):
        bufs = pool.acquire(5)
    assert calls == [5]
    pool.release(bufs)


def test_the_backing_pool_is_a_bucket_pool() -> None:
    pool = DescriptorBufferPool(dtype=torch.uint64)
    assert isinstance(pool.pool, bucketpool.BucketPool)
    assert pool.pool.settings.dtype == torch.uint64


@pytest.mark.parametrize("adapter", [DescriptorBufferPool, AliasedDescriptorBufferPool])
@pytest.mark.parametrize(
    "duplicate",
    [copy.copy, copy.deepcopy, lambda bufs: pickle.loads(pickle.dumps(bufs))],
    ids=["copy", "deepcopy", "pickle"],
)
@pytest.mark.parametrize("level", ["off", "checks", "strict"])
def test_a_copy_of_a_tuple_is_its_data_never_a_second_holder(
    adapter: type[DescriptorBufferPool | AliasedDescriptorBufferPool],
    duplicate: Callable[[object], object],
    level: DebugLevel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 33: at strict, pickling a tuple raised "cannot pickle code objects" (the guarded
    # views' records of the hand-out); they pickle as plain tensors.
    monkeypatch.setenv("BUCKETPOOL_DEBUG", level)
    pool = adapter()
    release = typing.cast("Callable[[object], None]", pool.release)
    bufs = pool.acquire(5)
    bufs[2][:5] = torch.arange(5)
    dup = typing.cast("DescriptorBuffers", duplicate(bufs))
    assert type(dup) in (DescriptorBuffers, AliasedDescriptorBuffers)  # the public class
    assert torch.equal(dup[2], bufs[2])
    with pytest.raises(ReleaseError, match="not acquired from this pool"):
        release(dup)
    release(bufs)  # the holder's release still works, once
    with pytest.raises(ReleaseError, match="already released"):
        release(bufs)
    stats = pool.pool.stats()
    assert (stats.active_requests.current, stats.leaks) == (0, 0)


def test_a_deep_copy_of_the_six_fields_keeps_its_aliases() -> None:
    pool = AliasedDescriptorBufferPool()
    bufs = pool.acquire(4)
    dup = copy.deepcopy(bufs)
    dup.src_np[0] = 7
    assert int(dup.src_ptrs[0]) == 7  # its numpy fields alias its own tensors
    assert dup.src_ptrs.data_ptr() != bufs.src_ptrs.data_ptr()
    pool.release(bufs)


# Issue 18 (the third hostile review), case 6.
def test_a_compat_release_that_loses_to_a_second_release_changes_nothing() -> None:
    compat = DescriptorBufferPool()
    bufs = compat.acquire(8)
    taken: list[DescriptorBuffers] = []

    class Racing:
        """An event whose first look lets a second release of the same tuple win."""

        @property
        def query(self) -> Callable[[], bool]:
            if not taken:
                compat.release(bufs)
                taken.append(compat.acquire(8))  # the same buffer, handed out again
            return lambda: False

    with pytest.raises(ReleaseError):
        compat.release(bufs, event=Racing())
    (new,) = taken
    assert new[0].data_ptr() == bufs[0].data_ptr()
    compat.release(new)  # still the new holder's: no foreign event parked it
    assert compat.pool.stats().parked == 0
    assert compat.pool.stats().active_requests.current == 0


def _race_at_line(line: int) -> bool:
    """Release a compat tuple while, before its *line*th line, a second release wins.

    The second release of the same tuple (and an acquire of the freed buffer) runs where
    another thread could have run it.  Returns False once the release has fewer lines.
    """
    release_code = bucketpool._lend.release.__code__  # the adapter's release
    compat = DescriptorBufferPool()
    bufs = compat.acquire(8)
    event = FlagEvent()
    outcome: list[str] = []
    acquired: list[DescriptorBuffers] = []
    seen = [0]

    def at_line(frame: types.FrameType, what: str, arg: object) -> Any:
        if what == "line":
            seen[0] += 1
            if seen[0] == line and not outcome:
                sys.settrace(None)
                try:
                    compat.release(bufs)
                    outcome.append("second won")
                except ReleaseError:
                    outcome.append("second refused")
                acquired.append(compat.acquire(8))
        return at_line

    def tracer(frame: types.FrameType, what: str, arg: object) -> Any:
        return at_line if frame.f_code is release_code else None

    sys.settrace(tracer)
    try:
        compat.release(bufs, event=event)
        first = "first won"
    except ReleaseError:
        first = "first refused"
    finally:
        sys.settrace(None)
    if not outcome:
        return False
    (second,), (new,) = outcome, acquired
    assert sorted([first, second]) in (
        ["first won", "second refused"],
        ["first refused", "second won"],
    ), line
    event.done = True  # the first's event, if it parked the buffer, completes
    compat.release(new)  # the new holder's own release works
    assert compat.pool.stats().active_requests.current == 0, line
    return True


# Issue 18 (the third hostile review), case 6.
@pytest.mark.parametrize("level", ["off", "checks"])
def test_a_second_compat_release_winning_at_any_line_leaves_one_holder(
    level: DebugLevel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Exactly one of two releases of one tuple takes effect, wherever the second lands, and
    # the buffer's next hand-out is its new holder's alone.
    monkeypatch.setenv("BUCKETPOOL_DEBUG", level)
    line = 1
    while _race_at_line(line):
        line += 1
    assert line > 5  # the release's lines were stepped through


@pytest.mark.parametrize("adapter", [DescriptorBufferPool, AliasedDescriptorBufferPool])
def test_both_tuples_add_copies_and_return_the_next_free_entry(
    adapter: type[DescriptorBufferPool | AliasedDescriptorBufferPool],
) -> None:
    pool: typing.Any = adapter()
    bufs = pool.acquire(5)
    bufs.sizes.fill_(99)  # what a previous holder left
    end = bufs.add_copies(0, [4096, 8192], np.array([12288, 16384]), 64)
    assert end == 2
    assert bufs.src_ptrs[:end].tolist() == [4096, 8192]
    assert bufs.sizes[:end].tolist() == [64, 64]
    assert bufs.sizes[end:5].tolist() == [99] * 3  # untouched: pass [:end] only
    pool.release(bufs)
    with pytest.raises(ReleaseError, match="released"):
        bufs.add_copies(0, [1], [2], 3)  # the buffer may be another's now
    again = pool.acquire(5)
    assert again.src_ptrs[:2].tolist() == [4096, 8192]  # the refused write wrote nothing
    pool.release(again)


def test_compat_add_copies_reads_its_inputs_before_it_checks_the_triple() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(4)
    holders = []

    class ReleasesFirst:  # user code run while the inputs are read
        def __index__(self) -> int:
            pool.release(bufs)
            holders.append(pool.acquire(4))  # the same buffer, another holder
            holders[0].src_ptrs[:3] = torch.tensor([1, 2, 3])
            return 0

    with pytest.raises(ReleaseError, match="released"):
        bufs.add_copies(ReleasesFirst(), [111, 222], [333, 444], 8)
    assert holders[0].src_ptrs.data_ptr() == bufs.src_ptrs.data_ptr()
    assert holders[0].src_ptrs[:3].tolist() == [1, 2, 3]  # the new holder's, untouched
    pool.release(holders[0])


def test_the_three_field_tuple_shrinks_and_fills_blocks_as_views_do() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(5)
    end = bufs.add_block_copies(0, 0x10000, 0x20000, [1, 2, 4], [0, 1, 3], 64)
    assert end == 2  # blocks 1-2 coalesced
    shrunk = bufs.shrink(end)  # it raised TypeError: "built some other way"
    assert [tensor.numel() for tensor in shrunk] == [2, 2, 2]
    assert shrunk.src_ptrs.data_ptr() == bufs.src_ptrs.data_ptr()
    assert shrunk.sizes.tolist() == [128, 64]
    pool.release(bufs)
    with pytest.raises(ReleaseError, match=r"^shrink: this DescriptorBuffers .* \(released\)"):
        bufs.shrink(1)
    with pytest.raises(ReleaseError, match="add_block_copies: this DescriptorBuffers"):
        bufs.add_block_copies(0, 0, 0, [0], [0], 8)
    with pytest.raises(ReleaseError, match="over"):
        shrunk.add_copies(0, [1], [2], 3)  # the shrunk views end with the hand-out


def test_pool_is_refused_inside_a_move() -> None:
    pool = DescriptorBufferPool()
    pool.release(pool.acquire(3))
    with bucketpool._lock.LOCK, pytest.raises(bucketpool.PoolError, match="_pool"):
        pool._pool  # noqa: B018  # a finaliser's inside a move: waiting for the lock would hang
    assert len(pool._pool) == 1


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("level", ["off", "checks", "strict"])
def test_a_release_the_caps_free_gives_the_memory_back_without_the_collector(
    adapter: type[Any], level: DebugLevel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 33: at strict the compat `_pool` note kept the released tuple on a buffer the
    # caps had freed, and its guarded views kept the buffer: a cycle, so the memory waited
    # for the cyclic collector.  Nothing of a released tuple is kept now.
    monkeypatch.setenv("BUCKETPOOL_DEBUG", level)
    monkeypatch.setenv("BUCKETPOOL_CONF", "max_cached_bytes=0")
    gc.collect()
    gc.disable()
    try:
        pool = adapter()
        bufs = pool.acquire(1 << 12)
        (buffer,) = pool.pool._ledger.registry.values()
        memory = weakref.ref(buffer.base)  # the buffer's own tensor
        del buffer
        pool.release(bufs)  # over the cap: freed at once
        assert pool.pool.stats().allocations.current == 0
        del bufs
        assert memory() is None
    finally:
        gc.enable()
