from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Callable, Iterator

import attrs
import numpy as np
import pytest
import torch
from _events import FlagEvent

from bucketpool import (
    BucketPool,
    BucketStats,
    BufferHandle,
    DescriptorBuffers,
    InFlightWriteError,
    LeakWarning,
    OutstandingBuffer,
    PoolError,
    PoolStats,
    ReleaseError,
    Stat,
    UseAfterReleaseError,
    _pool,
)

KIB = 1024
TRIPLE_16 = 16 * 8 * 3  # bytes of one buffer of the smallest default bucket


class SyncEvent(FlagEvent):
    def synchronize(self) -> None:
        self.done = True


@pytest.fixture
def pool() -> Iterator[BucketPool]:
    pool = BucketPool(debug="off", trace=False)
    yield pool
    assert pool.outstanding() == []


def data_ptrs(bufs: DescriptorBuffers) -> tuple[int, int, int]:
    return (bufs.src_ptrs.data_ptr(), bufs.dst_ptrs.data_ptr(), bufs.sizes.data_ptr())


# -- views ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1196, 4096])
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_views_have_exactly_n_entries(n: int, dtype: torch.dtype) -> None:
    pool = BucketPool(dtype=dtype)
    with pool.acquire(n) as bufs:
        assert isinstance(bufs, DescriptorBuffers)
        for view in bufs:
            assert view.shape == (n,)
            assert view.dtype == dtype
            assert view.is_contiguous()
            assert view.device == torch.device("cpu")


def test_capacity_and_n(pool: BucketPool) -> None:
    handle = pool.acquire(np.int64(1196))
    assert handle.n == 1196
    assert type(handle.n) is int
    assert handle.capacity == 2048
    handle.release()


def test_views_are_zero_copy_at_offset_zero_and_reused(pool: BucketPool) -> None:
    with pool.acquire(100) as first:
        ptrs = data_ptrs(first)
        first.src_ptrs[:] = torch.arange(100)
    # Another n of the same bucket gets the same buffer, and sees what was written.
    with pool.acquire(120) as second:
        assert data_ptrs(second) == ptrs
        assert torch.equal(second.src_ptrs[:100], torch.arange(100))


def test_same_n_returns_the_same_views(pool: BucketPool) -> None:
    with pool.acquire(77) as first:
        pass
    with pool.acquire(77) as second:
        assert second is first


def test_fields_never_alias(pool: BucketPool) -> None:
    with pool.acquire(64) as bufs:
        bufs.src_ptrs.fill_(1)
        bufs.dst_ptrs.fill_(2)
        bufs.sizes.fill_(3)
        assert bufs.src_ptrs.tolist() == [1] * 64
        assert bufs.dst_ptrs.tolist() == [2] * 64
        assert len(set(data_ptrs(bufs))) == 3


def test_live_handles_never_share_storage(pool: BucketPool) -> None:
    handles = [pool.acquire(n) for n in (5, 5, 16, 3, 40, 33)]
    ptrs = [p for handle in handles for p in data_ptrs(handle.buffers)]
    assert len(set(ptrs)) == len(ptrs)
    for handle in handles:
        handle.release()


def test_arrays_share_memory_with_views(pool: BucketPool) -> None:
    handle = pool.acquire(10)
    src, dst, sizes = handle.arrays
    assert src.shape == (10,)
    src[:] = np.arange(10)
    sizes[3] = 99
    assert handle.buffers.src_ptrs.tolist() == list(range(10))
    assert int(handle.buffers.sizes[3]) == 99
    assert dst.ctypes.data == handle.buffers.dst_ptrs.data_ptr()
    handle.release()


def test_add_copies_through_the_handle(pool: BucketPool) -> None:
    handle = pool.acquire(4)
    end = handle.add_copies(0, [16, 32], [48, 64], 8)
    end = handle.add_copies(end, np.array([1 << 12]), np.array([1 << 13]), [24])
    assert end == 3
    assert handle.buffers.src_ptrs[:3].tolist() == [16, 32, 1 << 12]
    assert handle.buffers.sizes[:3].tolist() == [8, 8, 24]
    handle.release()


def test_add_block_copies_through_the_handle(pool: BucketPool) -> None:
    handle = pool.acquire(4)
    end = handle.add_block_copies(0, 1000, 5000, [0, 1, 2, 7], [3, 4, 5, 0], 10)
    assert end == 2
    assert handle.buffers.src_ptrs[:2].tolist() == [1000, 1070]
    assert handle.buffers.dst_ptrs[:2].tolist() == [5030, 5000]
    assert handle.buffers.sizes[:2].tolist() == [30, 10]
    handle.release()


# -- with blocks and release ------------------------------------------------------------


def test_with_releases_on_exit(pool: BucketPool) -> None:
    handle = pool.acquire(8)
    with handle as bufs:
        assert bufs is handle.buffers
        assert not handle.released
    assert handle.released
    assert pool.stats().active_requests.current == 0


def test_with_releases_when_the_block_raises(pool: BucketPool) -> None:
    handle = pool.acquire(8)
    with pytest.raises(KeyError, match="boom"), handle:
        raise KeyError("boom")
    assert handle.released
    assert pool.stats().cached_bytes == TRIPLE_16


def test_pool_release_is_handle_release(pool: BucketPool) -> None:
    handle = pool.acquire(8)
    pool.release(handle)
    assert handle.released
    assert pool.stats().active_requests.current == 0


def test_double_release_raises_and_changes_nothing(pool: BucketPool) -> None:
    handle = pool.acquire(8)
    handle.release()
    before = pool.stats()
    with pytest.raises(
        ReleaseError, match=r"this handle \(n=8, capacity 16\) was already released"
    ):
        handle.release()
    with pytest.raises(ReleaseError, match="already released"):
        pool.release(handle)
    assert pool.stats() == before
    # The buffer is in the pool once: two live handles get two buffers.
    first, second = pool.acquire(8), pool.acquire(8)
    assert first.buffers.src_ptrs.data_ptr() != second.buffers.src_ptrs.data_ptr()
    first.release()
    second.release()


def test_double_release_through_with_raises() -> None:
    pool = BucketPool()
    handle = pool.acquire(3)
    with pytest.raises(ReleaseError), handle:
        handle.release()
    assert pool.stats().cached_bytes == TRIPLE_16


def test_foreign_release_raises_and_changes_nothing(pool: BucketPool) -> None:
    other = BucketPool()
    handle = other.acquire(8)
    before = pool.stats()
    with pytest.raises(ReleaseError, match="handed out by another pool"):
        pool.release(handle)
    assert pool.stats() == before
    assert not handle.released
    other.release(handle)


def test_release_of_something_else_is_a_type_error(pool: BucketPool) -> None:
    with pool.acquire(3) as bufs:
        with pytest.raises(TypeError, match="release takes a BufferHandle"):
            pool.release(bufs)  # type: ignore[arg-type]


@pytest.mark.parametrize("attribute", ["buffers", "arrays"])
def test_views_after_release_raise(pool: BucketPool, attribute: str) -> None:
    handle = pool.acquire(8)
    handle.release()
    with pytest.raises(ReleaseError, match=f"{attribute}: this handle"):
        getattr(handle, attribute)
    with pytest.raises(ReleaseError), handle:
        pass
    with pytest.raises(ReleaseError):
        handle.add_copies(0, [1], [2], 3)


def test_repr_of_a_released_handle() -> None:
    handle = BucketPool().acquire(1)
    assert isinstance(handle, BufferHandle)
    handle.release()
    assert repr(handle) == "<BufferHandle n=1 capacity=16 released>"


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [True, 1.0, "3", None, [3]])
def test_non_integer_n_is_type_error_and_pool_keeps_working(pool: BucketPool, bad: object) -> None:
    with pytest.raises(
        TypeError,
        match=r"^acquire: n must be an integer count of descriptors, not .*; pass len\(\.\.\.\)",
    ):
        pool.acquire(bad)  # type: ignore[arg-type]
    with pool.acquire(3) as bufs:
        assert bufs.sizes.numel() == 3
    assert pool.stats().active_requests.current == 0


def test_negative_n_is_value_error(pool: BucketPool) -> None:
    with pytest.raises(ValueError, match=r"^acquire: n must be >= 0, got -1"):
        pool.acquire(-1)
    assert pool.stats().misses == 0


@pytest.mark.parametrize(
    ("call", "operation"),
    [
        (lambda pool: pool.reserve(-3), "reserve"),
        (lambda pool: pool.bucket_capacity(-3), "bucket_capacity"),
        (lambda pool: pool.acquire(-3), "acquire"),
    ],
)
def test_count_errors_name_the_operation(
    pool: BucketPool, call: Callable[[BucketPool], object], operation: str
) -> None:
    with pytest.raises(ValueError, match=f"^{operation}: n must be >= 0, got -3"):
        call(pool)


def test_n_above_max_capacity_names_the_limit() -> None:
    pool = BucketPool(max_capacity=1024)
    with pytest.raises(ValueError, match=r"n=1025 is above the pool's max_capacity=1024"):
        pool.acquire(1025)
    with pool.acquire(1024) as bufs:
        assert bufs.src_ptrs.numel() == 1024
    assert pool.bucket_capacity(1024) == 1024


def test_default_max_capacity_refuses_a_huge_request(pool: BucketPool) -> None:
    with pytest.raises(ValueError, match="max_capacity=16777216"):
        pool.acquire(10**10)


# -- options ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.uint8])
def test_bad_dtype(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=r"dtype must be torch.int64 or torch.uint64 \(XPU"):
        BucketPool(dtype=dtype)


@pytest.mark.parametrize("device", ["cuda", "meta", torch.device("cuda:1")])
def test_non_host_device(device: str | torch.device) -> None:
    with pytest.raises(ValueError, match=r"device must be the CPU.*use device='cpu'"):
        BucketPool(device=device)


def test_unknown_device() -> None:
    with pytest.raises(ValueError, match="is not a torch device"):
        BucketPool(device="floppy")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without an accelerator")
def test_pinning_without_accelerator_fails_at_construction() -> None:
    with pytest.raises(RuntimeError, match="pin_memory=True needs an accelerator"):
        BucketPool(pin_memory=True)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"min_capacity": 3}, ValueError, "min_capacity must be a power of two"),
        ({"max_capacity": 1000}, ValueError, "max_capacity must be a power of two"),
        (
            {"min_capacity": 64, "max_capacity": 32},
            ValueError,
            "min_capacity=64 is above max_capacity=32",
        ),
        ({"max_cached_bytes": -1}, ValueError, "max_cached_bytes must be >= 0"),
        ({"max_cached_per_bucket": -2}, ValueError, "max_cached_per_bucket must be >= 0"),
        ({"idle_trim_acquires": 1.5}, TypeError, "idle_trim_acquires must be an int"),
        ({"debug": "loud"}, ValueError, "is not a debug level; use one of off, checks, strict"),
        ({"pin_memory": 1}, TypeError, "pin_memory must be True or False"),
    ],
)
def test_bad_options(options: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        BucketPool(**options)  # type: ignore[arg-type]


def test_min_capacity_sets_the_smallest_bucket() -> None:
    pool = BucketPool(min_capacity=256)
    handle = pool.acquire(0)
    assert handle.capacity == 256
    assert handle.buffers.src_ptrs.numel() == 0
    handle.release()
    assert pool.bucket_capacity(300) == 512


def test_positional_options_are_refused() -> None:
    with pytest.raises(TypeError):
        BucketPool(torch.int64)  # type: ignore[call-arg]


# -- memory: caps, trim, idle trimming, reserve -----------------------------------------


def test_per_bucket_cap_frees_the_extra_buffer() -> None:
    pool = BucketPool(max_cached_per_bucket=2)
    handles = [pool.acquire(16) for _ in range(3)]
    for handle in handles:
        handle.release()
    stats = pool.stats()
    assert stats.cached_bytes == 2 * TRIPLE_16
    assert stats.allocations == Stat(current=2, peak=3, allocated=3, freed=1)


def test_byte_cap_evicts_least_recently_used_bucket_first() -> None:
    pool = BucketPool(max_cached_bytes=6 * KIB, idle_trim_acquires=0)
    with pool.acquire(64):  # 1.5 KiB, used first
        pass
    with pool.acquire(128):  # 3 KiB
        pass
    # Releasing a 1.5 KiB buffer of a third bucket would pass the cap: the LRU bucket goes.
    with pool.acquire(33):
        pass
    assert [(b.capacity, b.cached) for b in pool.stats().buckets] == [(64, 1), (128, 1)]
    with pool.acquire(64):
        pass
    assert [(b.capacity, b.cached) for b in pool.stats().buckets] == [(64, 1), (128, 1)]
    assert pool.stats().cached_bytes == 4608


def test_a_buffer_larger_than_the_cap_is_freed_on_release() -> None:
    pool = BucketPool(max_cached_bytes=1 * KIB)
    with pool.acquire(1024):
        pass
    stats = pool.stats()
    assert stats.cached_bytes == 0
    assert stats.allocated_bytes.current == 0
    assert stats.allocated_bytes.freed == 24 * KIB


def test_trim_frees_down_to_a_target_lru_first(pool: BucketPool) -> None:
    for n in (16, 32, 64):
        with pool.acquire(n):
            pass
    assert pool.stats().cached_bytes == 384 + 768 + 1536
    assert pool.trim(2000) == 384 + 768
    assert [b.cached for b in pool.stats().buckets] == [0, 0, 1]
    assert pool.empty_cache() == 1536
    assert pool.stats().cached_bytes == 0
    assert pool.stats().allocations.current == 0


def test_trim_never_frees_active_or_parked_buffers(pool: BucketPool) -> None:
    active = pool.acquire(16)
    parked = pool.acquire(32)
    event = FlagEvent()
    parked.record_event(event)
    parked.release()
    assert pool.empty_cache() == 0
    assert pool.stats().allocations.current == 2
    event.done = True
    assert pool.collect() == 1
    active.release()


def test_trim_rejects_a_negative_target(pool: BucketPool) -> None:
    with pytest.raises(ValueError, match="trim: max_bytes must be >= 0, got -1"):
        pool.trim(-1)


@pytest.mark.parametrize("bad", [1.0, True, None])
def test_trim_rejects_non_integer_targets(pool: BucketPool, bad: object) -> None:
    with pytest.raises(TypeError, match="trim: max_bytes must be an integer"):
        pool.trim(bad)  # type: ignore[arg-type]


def test_spike_memory_comes_back_after_idle_acquires() -> None:
    idle = 64
    pool = BucketPool(idle_trim_acquires=idle)
    with pool.acquire(1_048_576):
        pass
    spike_bytes = 1_048_576 * 24
    assert pool.stats().cached_bytes == spike_bytes
    small_need = 0
    for step in range(1, 2 * idle):
        with pool.acquire(100 + step % 50):
            small_need = max(small_need, pool.stats().active_bytes.current)
        if step >= idle + idle // 4:
            # The documented bound: idle_trim_acquires * 5 / 4 acquires after the last use.
            assert pool.stats().cached_bytes <= small_need + 256 * 24
    assert pool.stats().allocated_bytes.current < spike_bytes


def test_idle_trimming_can_be_disabled() -> None:
    pool = BucketPool(idle_trim_acquires=0)
    with pool.acquire(4096):
        pass
    for _ in range(5000):
        with pool.acquire(16):
            pass
    assert pool.stats().cached_bytes == 4096 * 24 + TRIPLE_16


def test_reserve_prefills_the_bucket(pool: BucketPool) -> None:
    pool.reserve(1000, count=3)
    stats = pool.stats()
    assert stats.allocations.current == 3
    assert stats.cached_bytes == 3 * 1024 * 24
    assert stats.misses == 0
    handles = [pool.acquire(900 + i) for i in range(3)]
    assert pool.stats().misses == 0
    assert pool.stats().hits == 3
    for handle in handles:
        handle.release()


def test_reserve_beyond_the_caps_is_refused_and_allocates_nothing() -> None:
    pool = BucketPool(max_cached_per_bucket=2, max_cached_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"would cache 3 buffers .* max_cached_per_bucket=2"):
        pool.reserve(16, count=3)
    with pytest.raises(ValueError, match="max_cached_bytes=1,048,576"):
        pool.reserve(1 << 16)
    with pytest.raises(ValueError, match="reserve: count must be >= 0, got -1"):
        pool.reserve(16, count=-1)
    assert pool.stats().allocations.allocated == 0


# -- stats ------------------------------------------------------------------------------


def record(
    allocations: Stat,
    allocated_bytes: Stat,
    active_requests: Stat,
    active_bytes: Stat,
    cached_bytes: int,
    parked: tuple[int, int],
    hits_misses: tuple[int, int],
    entries: tuple[int, int],
    buckets: tuple[BucketStats, ...],
) -> PoolStats:
    """A whole expected PoolStats, written out (parked as (count, bytes))."""
    return PoolStats(
        allocations=allocations,
        allocated_bytes=allocated_bytes,
        active_requests=active_requests,
        active_bytes=active_bytes,
        cached_bytes=cached_bytes,
        parked=parked[0],
        parked_bytes=parked[1],
        hits=hits_misses[0],
        misses=hits_misses[1],
        leaks=0,
        requested_entries=entries[0],
        rounded_entries=entries[1],
        buckets=buckets,
    )


def test_exact_accounting_after_every_step() -> None:
    pool = BucketPool(max_cached_per_bucket=1)
    zero = Stat(0, 0, 0, 0)
    assert pool.stats() == record(zero, zero, zero, zero, 0, (0, 0), (0, 0), (0, 0), ())

    a = pool.acquire(10)  # miss in bucket 16 (384 bytes a buffer)
    assert pool.stats() == record(
        Stat(1, 1, 1, 0),
        Stat(384, 384, 384, 0),
        Stat(1, 1, 1, 0),
        Stat(384, 384, 384, 0),
        0,
        (0, 0),
        (0, 1),
        (10, 16),
        (BucketStats(16, 0, 1, 0, 1, 0),),
    )

    b = pool.acquire(100)  # miss in bucket 128 (3,072 bytes)
    assert pool.stats() == record(
        Stat(2, 2, 2, 0),
        Stat(3456, 3456, 3456, 0),
        Stat(2, 2, 2, 0),
        Stat(3456, 3456, 3456, 0),
        0,
        (0, 0),
        (0, 2),
        (110, 144),
        (BucketStats(16, 0, 1, 0, 1, 0), BucketStats(128, 0, 1, 0, 1, 0)),
    )

    a.release()
    assert pool.stats() == record(
        Stat(2, 2, 2, 0),
        Stat(3456, 3456, 3456, 0),
        Stat(1, 2, 2, 1),
        Stat(3072, 3456, 3456, 384),
        384,
        (0, 0),
        (0, 2),
        (110, 144),
        (BucketStats(16, 0, 1, 1, 0, 0), BucketStats(128, 0, 1, 0, 1, 0)),
    )

    c = pool.acquire(16)  # hit
    d = pool.acquire(1)  # miss: the only cached 16 is out
    assert pool.stats() == record(
        Stat(3, 3, 3, 0),
        Stat(3840, 3840, 3840, 0),
        Stat(3, 3, 4, 1),
        Stat(3840, 3840, 4224, 384),
        0,
        (0, 0),
        (1, 3),
        (127, 176),
        (BucketStats(16, 1, 2, 0, 2, 0), BucketStats(128, 0, 1, 0, 1, 0)),
    )

    event = FlagEvent()
    d.record_event(event)
    d.release()  # parked
    c.release()  # cached
    assert pool.stats() == record(
        Stat(3, 3, 3, 0),
        Stat(3840, 3840, 3840, 0),
        Stat(1, 3, 4, 3),
        Stat(3072, 3840, 4224, 1152),
        384,
        (1, 384),
        (1, 3),
        (127, 176),
        (BucketStats(16, 1, 2, 1, 0, 1), BucketStats(128, 0, 1, 0, 1, 0)),
    )

    event.done = True
    assert pool.collect() == 1  # over max_cached_per_bucket=1: freed
    after_collect = record(
        Stat(2, 3, 3, 1),
        Stat(3456, 3840, 3840, 384),
        Stat(1, 3, 4, 3),
        Stat(3072, 3840, 4224, 1152),
        384,
        (0, 0),
        (1, 3),
        (127, 176),
        (BucketStats(16, 1, 2, 1, 0, 0), BucketStats(128, 0, 1, 0, 1, 0)),
    )
    assert pool.stats() == after_collect

    pool.reset_peak_stats()
    assert pool.stats() == attrs.evolve(
        after_collect,
        allocations=Stat(2, 2, 3, 1),
        allocated_bytes=Stat(3456, 3456, 3840, 384),
        active_requests=Stat(1, 1, 4, 3),
        active_bytes=Stat(3072, 3072, 4224, 1152),
    )

    b.release()
    assert pool.empty_cache() == 3456
    assert pool.stats() == record(
        Stat(0, 2, 3, 3),
        Stat(0, 3456, 3840, 3840),
        Stat(0, 1, 4, 4),
        Stat(0, 3072, 4224, 4224),
        0,
        (0, 0),
        (1, 3),
        (127, 176),
        (BucketStats(16, 1, 2, 0, 0, 0), BucketStats(128, 0, 1, 0, 0, 0)),
    )


def test_stats_table_is_readable() -> None:
    pool = BucketPool()
    with pool.acquire(1196):
        pass
    with pool.acquire(1500):
        pass
    table = str(pool.stats())
    assert "allocations" in table
    assert "hit rate 50.0%" in table
    assert "rounding waste 1,400 entries" in table
    assert table.splitlines()[-1].split() == ["2,048", "1", "1", "1", "0", "0"]


# -- deferred reuse ---------------------------------------------------------------------


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


def test_real_torch_event_on_cpu(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    handle.record_event(torch.Event(device="cpu"))  # never recorded: reports done
    ptr = handle.buffers.src_ptrs.data_ptr()
    handle.release()
    assert pool.stats().parked == 0
    with pool.acquire(5) as bufs:
        assert bufs.src_ptrs.data_ptr() == ptr


def test_record_after_release_raises(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    handle.release()
    with pytest.raises(ReleaseError, match="record_event: this handle"):
        handle.record_event(FlagEvent())


def test_record_of_a_non_event_is_a_type_error(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    with pytest.raises(TypeError, match=r"query\(\) -> bool method"):
        handle.record_event(object())  # type: ignore[arg-type]
    handle.release()
    assert pool.stats().parked == 0


def test_synchronize_waits_for_every_parked_buffer(pool: BucketPool) -> None:
    events: list[FlagEvent] = [SyncEvent(), SyncEvent()]
    polled = FlagEvent()
    timer = threading.Timer(0.05, lambda: setattr(polled, "done", True))
    events.append(polled)
    for event in events:
        handle = pool.acquire(20)
        handle.record_event(event)
        handle.release()
    assert pool.stats().parked == 3
    timer.start()
    pool.synchronize()
    assert pool.stats().parked == 0
    assert all(event.done for event in events)


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


# -- leaks and outstanding handles ------------------------------------------------------


def leak(pool: BucketPool, n: int) -> None:
    pool.acquire(n)  # dropped at once: never released


def test_leaked_handle_warns_with_its_site_and_buffer_comes_back() -> None:
    pool = BucketPool(debug="checks")
    with pytest.warns(
        LeakWarning, match=r"n=33 was never released; acquired at .*test_pool.py:\d+"
    ):
        leak(pool, 33)
    assert pool.stats().leaks == 1
    assert pool.stats().active_requests.current == 0
    assert pool.stats().cached_bytes == 64 * 24
    assert pool.outstanding() == []


def test_a_leak_names_the_line_that_acquired_without_tracing() -> None:
    pool = BucketPool()
    site = r"n=3 was never released; acquired at .*test_pool.py:\d+"
    with pytest.warns(LeakWarning, match=site) as caught:
        leak(pool, 3)
    assert caught[0].filename == __file__  # the warning itself points at that line
    assert caught[0].lineno == _line_of("pool.acquire(n)  # dropped at once: never released")
    assert pool.stats().cached_bytes == TRIPLE_16


def test_leaked_handle_with_pending_event_is_parked() -> None:
    pool = BucketPool()
    event = FlagEvent()
    handle = pool.acquire(3)
    handle.record_event(event)
    with pytest.warns(LeakWarning):
        del handle  # reference counting finalises it here, not at some later collection
    assert pool.stats().parked == 1
    event.done = True
    assert pool.collect() == 1


def test_outstanding_lists_live_handles_with_sites() -> None:
    pool = BucketPool(trace=True)
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


def test_sites_are_file_and_line_at_debug_checks() -> None:
    pool = BucketPool(debug="checks")
    handle = pool.acquire(3)  # the site
    assert handle.acquired_at is not None
    assert handle.acquired_at.endswith(f"test_pool.py:{_line_of('# the site')}")
    handle.release()


def _line_of(text: str) -> int:
    with open(__file__, encoding="utf-8") as source:
        lines = source.read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(text))


# -- debug checks -----------------------------------------------------------------------


def test_released_buffers_are_poisoned_at_checks() -> None:
    pool = BucketPool(debug="checks")
    handle = pool.acquire(16)
    handle.buffers.sizes.fill_(8)
    src = handle.arrays[0]
    sizes = handle.arrays[2]
    src[:] = 7
    handle.release()
    assert not sizes.any()  # a stale batched copy moves nothing
    assert (src == 7).all()  # only the sizes are poisoned


def test_stale_write_is_caught_and_the_pool_stays_consistent() -> None:
    pool = BucketPool(debug="checks")
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


def test_rewrite_while_in_flight_raises_at_the_next_call() -> None:
    pool = BucketPool(debug="checks")
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


def test_unchanged_descriptors_pass_the_in_flight_check() -> None:
    pool = BucketPool(debug="checks")
    event = FlagEvent()
    handle = pool.acquire(8)
    handle.buffers.sizes.fill_(64)
    handle.record_event(event)
    handle.release()
    event.done = True
    assert pool.collect() == 1


def test_local_views_work_at_strict() -> None:
    pool = BucketPool(debug="strict")
    for n in (3, 3, 40):
        with pool.acquire(n) as (src, dst, sizes):
            src.fill_(1)
            dst.fill_(2)
            sizes.fill_(3)
        with pool.acquire(n) as bufs:
            bufs.sizes.fill_(0)
            array = bufs.src_ptrs.numpy()
            array[:] = 7
            del array


def test_debug_errors_share_one_base() -> None:
    for error in (ReleaseError, UseAfterReleaseError, InFlightWriteError):
        assert issubclass(error, PoolError)
    assert issubclass(PoolError, RuntimeError)


# -- threads ----------------------------------------------------------------------------


def test_threads_share_a_pool() -> None:
    pool = BucketPool()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(500):
                n = (seed * 7919 + i * 31) % 3000
                with pool.acquire(n) as bufs:
                    bufs.src_ptrs.fill_(seed)
                    assert bool((bufs.src_ptrs == seed).all())
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = pool.stats()
    assert stats.active_requests == Stat(0, stats.active_requests.peak, 2000, 2000)
    assert stats.hits + stats.misses == 2000


# -- one handle per hand-out ----------------------------------------------------------------


def test_a_handle_someone_holds_is_never_reused(pool: BucketPool) -> None:
    kept = pool.acquire(5)
    with kept as bufs:
        ptr = bufs.src_ptrs.data_ptr()
    fresh = pool.acquire(5)
    assert fresh is not kept
    assert fresh.buffers.src_ptrs.data_ptr() == ptr
    with pytest.raises(ReleaseError):
        kept.release()  # still the old, released handle: fresh is untouched
    with pytest.raises(ReleaseError):
        _ = kept.buffers
    assert not fresh.released
    fresh.release()


def test_every_acquire_makes_a_new_handle(
    pool: BucketPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[type] = []
    real = _pool._new

    def counting(cls: type[BufferHandle]) -> BufferHandle:
        made.append(cls)
        return real(cls)

    monkeypatch.setattr(_pool, "_new", counting)
    for _ in range(3):
        with pool.acquire(5):
            pass
    assert len(made) == 3  # no handle is recycled, whatever refers to it
    handle = pool.acquire(5)
    handle.release()
    with pool.acquire(5):
        pass
    assert len(made) == 5
    assert handle.released


def test_outstanding_is_a_record_not_a_handle(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    with handle:
        (live,) = pool.outstanding()
        assert live == OutstandingBuffer(n=5, capacity=16, acquired_at=None)
    assert pool.outstanding() == []
    assert handle.released
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        live.n = 6  # type: ignore[misc]


def test_a_handle_whose_exit_is_called_by_hand_is_not_reused(pool: BucketPool) -> None:
    held = pool.acquire(5)
    held.__enter__()
    held.__exit__(None, None, None)  # as a fixture or a hand-written manager would
    other = pool.acquire(5)
    assert other is not held
    with pytest.raises(ReleaseError):
        held.release()
    assert not other.released
    other.release()
    assert pool.stats().active_requests.current == 0


def release_inside_then_raise(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    with handle:
        handle.release()
        raise KeyError("mine")


def test_release_inside_a_raising_block_keeps_the_blocks_exception(pool: BucketPool) -> None:
    with pytest.raises(KeyError, match="mine") as caught:
        release_inside_then_raise(pool)
    if sys.version_info >= (3, 11):  # exception notes are new in 3.11
        notes: list[str] = getattr(caught.value, "__notes__", [])
        assert any("already released" in note for note in notes)
    assert pool.stats().cached_bytes == TRIPLE_16


def test_handles_cannot_be_built_by_hand() -> None:
    with pytest.raises(TypeError, match=r"comes from BucketPool.acquire\(n\)"):
        BufferHandle()


def test_a_miss_never_shows_cached_bytes_over_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = BucketPool(max_cached_bytes=0, max_cached_per_bucket=0)
    snapshots: list[PoolStats] = []
    real = BucketPool._new_buffer

    def allocate_then_look(self: BucketPool, *args: object) -> object:
        fresh = real(self, *args)  # type: ignore[arg-type]
        snapshots.append(self.stats())  # as another thread's stats() may, at this moment
        return fresh

    monkeypatch.setattr(BucketPool, "_new_buffer", allocate_then_look)
    with pool.acquire(8):
        pass
    assert len(snapshots) == 1
    assert snapshots[0].cached_bytes <= 0
    assert all(bucket.cached == 0 for bucket in snapshots[0].buckets)


def test_a_buffer_above_the_byte_cap_does_not_flush_the_cache() -> None:
    pool = BucketPool(max_cached_bytes=64 * KIB, idle_trim_acquires=0)
    for n in (16, 32, 64):
        with pool.acquire(n):
            pass
    cached = pool.stats().cached_bytes
    with pool.acquire(4096):  # 96 KiB: can never be cached
        pass
    assert pool.stats().cached_bytes == cached
    assert pool.stats().allocations.current == 3


def test_rewrite_between_two_recorded_events_is_caught() -> None:
    pool = BucketPool(debug="checks")
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


def test_refilling_after_the_first_copy_finished_is_fine() -> None:
    pool = BucketPool(debug="checks")
    first, second = FlagEvent(), FlagEvent()
    handle = pool.acquire(8)
    handle.record_event(first)
    first.done = True
    handle.add_copies(0, [16], [32], 8)  # the first copy is done: a new step may refill
    handle.record_event(second)
    handle.release()
    second.done = True
    assert pool.collect() == 1


@contextlib.contextmanager
def descriptors(pool: BucketPool, n: int) -> Iterator[DescriptorBuffers]:
    with pool.acquire(n) as bufs:
        yield bufs


def test_wrapped_and_stacked_acquires_work_at_strict() -> None:
    pool = BucketPool(debug="strict")
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


def test_trimmed_memory_is_freed_at_once_after_a_with_block() -> None:
    pool = BucketPool(idle_trim_acquires=0)
    with pool.acquire(100) as bufs:
        tensor = weakref.ref(bufs.src_ptrs)
    del bufs
    gc.disable()  # no collector: only reference counting may free it
    try:
        assert pool.trim(0) == 128 * 24
        assert tensor() is None
    finally:
        gc.enable()


def test_eviction_happens_only_when_the_released_buffer_then_fits() -> None:
    pool = BucketPool(max_cached_bytes=3500, idle_trim_acquires=0)
    small, a, b, c = (pool.acquire(n) for n in (16, 64, 64, 64))
    for handle in (small, a, b):
        handle.release()  # cached: 384 + 2 * 1536 = 3456
    c.release()  # three 1,536-byte buffers can never fit: c is freed, the rest stays
    assert [(s.capacity, s.cached) for s in pool.stats().buckets] == [(16, 1), (64, 2)]
    assert pool.stats().cached_bytes == 3456


# -- the rebuilt core: ownership, the lock, events, fork ---------------------------------------


class LockWatchingEvent:
    """An event that records whether the pool's lock was held while it was queried."""

    def __init__(self, pool: BucketPool, answers: list[bool | Exception]) -> None:
        self.pool = pool
        self.answers = answers
        self.under_lock: list[bool] = []

    def query(self) -> bool:
        self.under_lock.append(bool(self.pool._lock._is_owned()))  # type: ignore[attr-defined]
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_events_are_never_queried_under_the_pool_lock() -> None:
    pool = BucketPool(idle_trim_acquires=4)
    event = LockWatchingEvent(pool, [False, False, False, True])
    handle = pool.acquire(8)
    handle.record_event(event)
    handle.release()  # queried by the release
    with pool.acquire(8):  # a miss: polls the parked buffer
        pass
    pool.collect()
    pool.synchronize()
    assert len(event.under_lock) >= 3
    assert not any(event.under_lock)


def test_collect_retires_the_done_and_raises_the_first_error() -> None:
    pool = BucketPool()
    failing = LockWatchingEvent(pool, [False, RuntimeError("device lost")])
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
    failing.answers = [True]
    assert pool.collect() == 1


def test_an_acquire_never_sees_another_buffers_query_error() -> None:
    pool = BucketPool(idle_trim_acquires=4)
    failing = LockWatchingEvent(pool, [False, RuntimeError("device lost")])
    handle = pool.acquire(8)
    handle.record_event(failing)
    handle.release()
    handles = [pool.acquire(8) for _ in range(5)]  # misses and sweeps poll it
    assert len(failing.under_lock) > 1
    for other in handles:
        other.release()
    assert pool.stats().parked == 1


def test_synchronize_calls_the_events_synchronize() -> None:
    pool = BucketPool()
    event = SyncEvent()
    handle = pool.acquire(8)
    handle.record_event(event)
    handle.release()
    pool.synchronize()
    assert event.done
    assert pool.stats().parked == 0


def test_acquire_from_inside_the_pool_raises_instead_of_deadlocking() -> None:
    pool = BucketPool()
    with pool._lock, pytest.raises(PoolError, match="finaliser or signal handler"):
        pool.acquire(3)  # what a finaliser run under the lock would do
    with pool.acquire(3):
        pass
    assert pool.stats().active_requests.current == 0


@pytest.mark.parametrize(
    ("operation", "call"),
    [
        ("trim", lambda pool: pool.trim(0)),
        ("trim", lambda pool: pool.empty_cache()),
        ("reserve", lambda pool: pool.reserve(3)),
        ("collect", lambda pool: pool.collect()),
        ("synchronize", lambda pool: pool.synchronize()),
        ("stats", lambda pool: pool.stats()),
        ("outstanding", lambda pool: pool.outstanding()),
        ("reset_peak_stats", lambda pool: pool.reset_peak_stats()),
    ],
)
def test_every_operation_from_inside_the_pool_raises_and_changes_nothing(
    operation: str, call: Callable[[BucketPool], object]
) -> None:
    """A finaliser or signal handler that interrupted this thread inside the pool finds its
    records half-way through a change: trimming or reserving there corrupted them."""
    pool = BucketPool()
    for n in (3, 40, 3):
        with pool.acquire(n):
            pass
    handle = pool.acquire(3)
    before = pool.stats()
    with pool._lock, pytest.raises(PoolError, match=f"^{operation} was called from a finaliser"):
        call(pool)
    assert pool.stats() == before
    handle.release()
    stats = pool.stats()
    assert stats.allocations.current == sum(b.cached + b.active + b.parked for b in stats.buckets)


def test_a_release_from_inside_the_pool_waits_in_the_inbox() -> None:
    pool = BucketPool()
    handle = pool.acquire(3)
    with pool._lock:  # as a finaliser that interrupted this thread inside the pool
        handle.release()
        # queued: the lock is never waited for here
        assert sum(len(b.inbox) for b in pool._buckets) == 1
    assert pool.stats().active_requests.current == 0  # drained by the next operation
    assert handle.released
    assert pool.stats().cached_bytes == TRIPLE_16
    assert not any(b.inbox for b in pool._buckets)


def test_leak_warning_is_a_visible_user_warning() -> None:
    assert issubclass(LeakWarning, UserWarning)
    pool = BucketPool()
    with pytest.warns(LeakWarning, match="reported once per acquire site"):
        leak(pool, 3)


def test_patching_torch_empty_does_not_reach_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []

    def watched(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(args)
        raise AssertionError("the pool used the patched torch.empty")

    monkeypatch.setattr(torch, "empty", watched)
    pool = BucketPool()
    with pool.acquire(100) as bufs:
        assert bufs.src_ptrs.numel() == 100
    assert calls == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_a_working_pool_with_the_parents_records() -> None:
    pool = BucketPool(trace=True)
    held = pool.acquire(40)
    with pool.acquire(8):
        pass
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(10)
            records = pool.outstanding()
            with pool.acquire(40) as bufs:
                fresh = bufs.src_ptrs.data_ptr() != held.buffers.src_ptrs.data_ptr()
            code = 0 if fresh and [(r.n, r.capacity) for r in records] == [(40, 64)] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    held.release()


def test_settings_are_read_only_and_resolved() -> None:
    pool = BucketPool(max_capacity=1024, debug="checks")
    settings = pool.settings
    assert (settings.max_capacity, settings.debug, settings.dtype) == (
        1024,
        "checks",
        torch.int64,
    )
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        settings.max_capacity = 2048  # type: ignore[misc]
    with pytest.raises(AttributeError):
        pool.settings = settings  # type: ignore[misc]
    assert not hasattr(pool, "max_capacity")


def test_releasing_a_handle_never_handed_out_is_a_release_error(pool: BucketPool) -> None:
    forged = object.__new__(BufferHandle)
    assert repr(forged) == "<BufferHandle never handed out>"
    with pytest.raises(ReleaseError, match="never handed out"):
        pool.release(forged)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_a_thread_inside_one_pool_drops_a_leaked_handle_of_another() -> None:
    """The fork handler holds pool A's lock and waits for B's; a thread inside B drops a
    leaked handle of A, whose finaliser used to wait for A's lock: both hung."""
    script = textwrap.dedent(
        """
        import gc, os, threading, time, warnings
        from bucketpool import BucketPool
        warnings.simplefilter("ignore")
        a, b = BucketPool(), BucketPool()
        leaked = [a.acquire(3)]
        inside = threading.Event()

        def inside_b():
            with b._lock:  # as in a pool call of B, where a collection runs A's finaliser
                inside.set()
                time.sleep(0.3)  # the fork handler is waiting for B now
                leaked.clear()  # A's handle is finalised here
            b.stats()

        thread = threading.Thread(target=inside_b)
        thread.start()
        inside.wait()
        time.sleep(0.05)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if a.stats().active_requests.current == 0 else 3)
        _, status = os.waitpid(pid, 0)
        thread.join()
        assert os.waitstatus_to_exitcode(status) == 0
        assert a.stats().active_requests.current == 0  # drained by this call
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
