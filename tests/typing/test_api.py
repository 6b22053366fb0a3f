"""Static tests of bucketpool's public types: checked by mypy, never run by pytest.

Each ``assert_type`` pins what a public call returns.  Each line ending in
``# type: ignore[<code>]`` must be rejected by the type checker: with ``warn_unused_ignores``
an accepted line fails the check, so these lines prove that misuse is caught.  All code sits
inside ``check_*`` functions, so importing this file does nothing and pytest (which skips
``tests/typing`` anyway) would collect nothing from it.
"""

from __future__ import annotations

import sys
import typing

import numpy as np
import numpy.typing as npt
import torch

import bucketpool
import bucketpool.testing
import bucketpool.vllm
from bucketpool import (
    BucketPool,
    BucketStats,
    BufferHandle,
    DescriptorBuffers,
    OutstandingBuffer,
    PoolError,
    PoolStats,
    ReleaseError,
    Stat,
    bucket_capacity,
    orphaned_buffers,
)
from bucketpool.compat import (
    AliasedDescriptorBufferPool,
    AliasedDescriptorBuffers,
    DescriptorBufferPool,
)

if typing.TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import assert_type
    else:
        from typing_extensions import assert_type

#: What every numpy alias of a descriptor field is typed as.
NDArray = npt.NDArray[np.integer[typing.Any]]


class Event:
    """Something `record_event` accepts: it only needs ``query() -> bool``."""

    def query(self) -> bool:
        return True


class NotAnEvent:
    def synchronize(self) -> None: ...


def check_pool(pool: BucketPool, n: int) -> None:
    handle = pool.acquire(n)
    assert_type(handle, BufferHandle)
    assert_type(pool.acquire(np.int64(3)), BufferHandle)  # numpy integers are counts too
    assert_type(handle.n, int)
    assert_type(handle.capacity, int)
    assert_type(handle.released, bool)
    assert_type(handle.acquired_at, str | None)
    assert_type(handle.buffers, DescriptorBuffers)
    assert_type(handle.arrays, tuple[NDArray, NDArray, NDArray])
    assert_type(handle.add_copies(0, [1, 2], np.array([3, 4]), 8), int)
    assert_type(handle.add_copies(0, torch.tensor([1]), [2], torch.tensor([8])), int)
    assert_type(handle.add_block_copies(0, 4096, 8192, [0, 1], [5, 6], 64), int)
    assert_type(handle.record_event(Event()), None)
    assert_type(handle.record_event(torch.Event()), None)
    assert_type(handle.shrink(np.int64(1)), DescriptorBuffers)
    assert_type(handle.release(), None)
    assert_type(pool.release(pool.acquire(1)), None)
    assert_type(bucketpool.__version__, str)

    with pool.acquire(n) as bufs:
        assert_type(bufs, DescriptorBuffers)
        assert_type(bufs.src_ptrs, torch.Tensor)
        assert_type(bufs.dst_ptrs, torch.Tensor)
        assert_type(bufs.sizes, torch.Tensor)
        src, _dst, sizes = bufs
        assert_type(src, torch.Tensor)
        assert_type(sizes[:n], torch.Tensor)

    assert_type(pool.trim(), int)
    assert_type(pool.trim(1 << 20), int)
    assert_type(pool.empty_cache(), int)
    assert_type(pool.collect(), int)
    assert_type(pool.synchronize(), None)
    assert_type(pool.synchronize(timeout=0.5), None)
    assert_type(pool.synchronize(timeout=None), None)
    pool.synchronize(timeout="1")  # type: ignore[arg-type]  # seconds, not a string
    assert_type(pool.reserve(64, count=2), None)
    assert_type(pool.outstanding(), list[OutstandingBuffer])
    assert_type(pool.outstanding()[0].acquired_at, str | None)
    assert_type(pool.bucket_capacity(n), int)
    assert_type(pool.reset_peak_stats(), None)
    assert_type(pool.settings.dtype, torch.dtype)
    assert_type(pool.settings.max_capacity, int)
    assert_type(pool.settings.debug, typing.Literal["off", "checks", "strict"])
    pool.settings = pool.settings  # type: ignore[misc]  # read-only
    assert_type(bucket_capacity(n), int)
    assert_type(bucket_capacity(np.int32(n)), int)
    assert_type(orphaned_buffers(), int)


def check_stats(pool: BucketPool) -> None:
    stats = pool.stats()
    assert_type(stats, PoolStats)
    assert_type(stats.allocations, Stat)
    assert_type(stats.allocated_bytes, Stat)
    assert_type(stats.active_requests, Stat)
    assert_type(stats.active_bytes, Stat)
    assert_type(stats.allocations.current, int)
    assert_type(stats.allocations.peak, int)
    assert_type(stats.allocations.allocated, int)
    assert_type(stats.allocations.freed, int)
    assert_type(stats.cached_bytes, int)
    assert_type(stats.parked_bytes, int)
    assert_type(stats.parked, int)
    assert_type(stats.hits, int)
    assert_type(stats.misses, int)
    assert_type(stats.leaks, int)
    assert_type(stats.requested_entries, int)
    assert_type(stats.rounded_entries, int)
    assert_type(stats.buckets, tuple[BucketStats, ...])
    bucket = stats.buckets[0]
    assert_type(bucket.capacity, int)
    assert_type(bucket.hits, int)
    assert_type(bucket.misses, int)
    assert_type(bucket.cached, int)
    assert_type(bucket.active, int)
    assert_type(bucket.parked, int)


def check_construction() -> None:
    assert_type(BucketPool(), BucketPool)
    assert_type(
        BucketPool(dtype=torch.uint64, max_cached_bytes=1 << 20, debug="checks"), BucketPool
    )
    BucketPool(torch.int64)  # type: ignore[call-arg]  # keyword-only
    BucketPool(dtype="int64")  # type: ignore[arg-type]
    BucketPool(device=0)  # type: ignore[arg-type]
    BucketPool(debug="verbose")  # type: ignore[arg-type]
    BucketPool(min_capacity="16")  # type: ignore[arg-type]
    BucketPool(pin_memory=None)  # type: ignore[arg-type]


def check_misuse(pool: BucketPool, bufs: DescriptorBuffers, tensor: torch.Tensor) -> None:
    handle = pool.acquire(4)
    pool.acquire("3")  # type: ignore[arg-type]
    pool.acquire(3.0)  # type: ignore[arg-type]
    pool.acquire()  # type: ignore[call-arg]
    pool.release(bufs)  # type: ignore[arg-type]
    pool.trim("all")  # type: ignore[arg-type]
    handle.record_event(NotAnEvent())  # type: ignore[arg-type]
    handle.record_event(object())  # type: ignore[arg-type]
    handle.add_copies(0, "1", [2], 8)  # type: ignore[arg-type]
    handle.n = 5  # type: ignore[misc]
    bufs.nope  # type: ignore[attr-defined]  # noqa: B018
    bufs.src_ptrs = tensor  # type: ignore[misc]
    _src, _dst = bufs  # type: ignore[misc]
    bufs.src_np  # type: ignore[attr-defined]  # noqa: B018  # only the aliased tuple has it
    stats = pool.stats()
    stats.hits = 0  # type: ignore[misc]
    stats.buckets[0].capacity = 1  # type: ignore[misc]
    stats.allocations.current += 1  # type: ignore[misc]


def check_compat(n: int, handle: BufferHandle, event: Event) -> None:
    pool = DescriptorBufferPool()
    assert_type(DescriptorBufferPool(dtype=torch.uint64), DescriptorBufferPool)
    bufs = pool.acquire(n)
    assert_type(bufs, DescriptorBuffers)
    assert_type(bufs.src_ptrs, torch.Tensor)
    assert_type(pool.release(bufs), None)
    assert_type(pool.release(bufs, event=event), None)
    assert_type(pool.pool, BucketPool)
    pool.release(handle)  # type: ignore[arg-type]
    pool.release(bufs, event=object())  # type: ignore[arg-type]
    pool.release(bufs, event)  # type: ignore[call-arg]  # event is keyword-only
    DescriptorBufferPool(torch.int64)  # type: ignore[call-arg]

    aliased_pool = AliasedDescriptorBufferPool()
    assert_type(AliasedDescriptorBufferPool(dtype=torch.uint64), AliasedDescriptorBufferPool)
    aliased = aliased_pool.acquire(n)
    assert_type(aliased, AliasedDescriptorBuffers)
    assert_type(aliased.src_ptrs, torch.Tensor)
    assert_type(aliased.dst_ptrs, torch.Tensor)
    assert_type(aliased.sizes, torch.Tensor)
    assert_type(aliased.src_np, NDArray)
    assert_type(aliased.dst_np, NDArray)
    assert_type(aliased.sizes_np, NDArray)
    assert_type(aliased.add_copies(0, np.array([1], np.uint64), np.array([2]), np.array([8])), int)
    assert_type(aliased_pool.release(aliased, event=event), None)
    assert_type(aliased_pool.pool, BucketPool)
    aliased_pool.release(bufs)  # type: ignore[arg-type]  # a three-field tuple
    pool.release(aliased)  # type: ignore[arg-type]
    aliased.sizes_np = np.zeros(1, np.int64)  # type: ignore[misc]


def check_vllm() -> None:
    result = bucketpool.vllm.install()
    assert_type(result, bucketpool.vllm.InstallResult)
    assert_type(
        bucketpool.vllm.install(kv_offload=True, untested=True), bucketpool.vllm.InstallResult
    )
    assert_type(result.installed, bool)
    assert_type(result.vllm_version, str)
    assert_type(result.tested, bool)
    assert_type(bucketpool.vllm.uninstall(), None)
    assert_type(bucketpool.vllm.installed(), bool)
    bucketpool.vllm.install(True)  # type: ignore[call-arg]
    result.installed = False  # type: ignore[misc]  # a frozen record


def check_vllm_hook(spec: bucketpool.vllm.DescriptorSpec, event: torch.Event) -> None:
    pool = bucketpool.vllm.descriptor_pool_factory(spec)
    assert_type(pool, bucketpool.vllm.DescriptorPool)
    assert_type(pool.pool, BucketPool)
    bufs = pool.acquire(5)
    assert_type(pool.release(bufs, end_event=event), None)
    assert_type(pool.release(bufs), None)
    assert_type(pool.collect(), None)
    assert_type(pool.shutdown(), None)
    assert_type(spec.dtype, torch.dtype)
    bucketpool.vllm.descriptor_pool_factory(object())  # type: ignore[arg-type]  # not a spec
    pool.release()  # type: ignore[call-arg]
    pool.pool = BucketPool()  # type: ignore[misc]  # read-only


def check_testing(pool: BucketPool, tensor: torch.Tensor) -> None:
    assert_type(bucketpool.testing.assert_no_outstanding(pool), None)
    assert_type(bucketpool.testing.swap_blocks_batch(tensor, tensor, tensor), None)
    bucketpool.testing.assert_no_outstanding(DescriptorBufferPool())  # type: ignore[arg-type]
    bucketpool.testing.swap_blocks_batch([1], [2], [3])  # type: ignore[arg-type]


def check_errors(error: Exception) -> None:
    if isinstance(error, PoolError):
        assert_type(error, PoolError)
    assert_type(bucketpool.ReleaseError("message"), ReleaseError)


def check_final_classes() -> None:
    """Every public class that is final refuses subclasses; the error base stays open."""

    class MyPool(BucketPool):  # type: ignore[misc]
        pass

    class MyHandle(BufferHandle):  # type: ignore[misc]
        pass

    class MyCompatPool(DescriptorBufferPool):  # type: ignore[misc]
        pass

    class MyAliasedPool(AliasedDescriptorBufferPool):  # type: ignore[misc]
        pass

    class MyStats(PoolStats):  # type: ignore[misc]
        pass

    class MyStat(Stat):  # type: ignore[misc]
        pass

    class MyBucketStats(BucketStats):  # type: ignore[misc]
        pass

    class MyReleaseError(ReleaseError):  # type: ignore[misc]
        pass

    class MyPoolError(PoolError):
        """Allowed: PoolError is the base to catch, and may be extended."""
