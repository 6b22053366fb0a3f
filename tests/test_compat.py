from __future__ import annotations

import numpy as np
import pytest
import torch

import bucketpool
from bucketpool import ReleaseError
from bucketpool.compat import (
    AliasedDescriptorBufferPool,
    AliasedDescriptorBuffers,
    DescriptorBufferPool,
    DescriptorBuffers,
)


class FlagEvent:
    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def test_reexports_the_same_descriptor_buffers() -> None:
    assert DescriptorBuffers is bucketpool.DescriptorBuffers


def test_capacity_is_exactly_n_on_a_fresh_pool() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(5)
    assert isinstance(bufs, DescriptorBuffers)
    assert [t.numel() for t in bufs] == [5, 5, 5]
    assert all(t.dtype == torch.int64 for t in bufs)
    pool.release(bufs)


def test_same_n_after_release_is_the_very_same_object() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(7)
    pool.release(bufs)
    assert pool.acquire(7) is bufs
    pool.release(bufs)


def test_callers_slices_share_the_pool_memory() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(9)
    src, _dst, sizes = bufs
    assert src[:9].data_ptr() == bufs.src_ptrs.data_ptr()
    sizes[:9] = 3
    assert bufs.sizes.tolist() == [3] * 9
    pool.release(bufs)


def test_double_release_raises_and_changes_nothing() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(4)
    pool.release(bufs)
    before = pool.pool.stats()
    with pytest.raises(ReleaseError, match="already released or were not acquired from this pool"):
        pool.release(bufs)
    assert pool.pool.stats() == before
    first, second = pool.acquire(4), pool.acquire(4)
    assert first.src_ptrs.data_ptr() != second.src_ptrs.data_ptr()
    pool.release(first)
    pool.release(second)


def test_foreign_triple_raises() -> None:
    pool = DescriptorBufferPool()
    foreign = DescriptorBuffers(*(torch.empty(4, dtype=torch.int64) for _ in range(3)))
    with pytest.raises(ReleaseError):
        pool.release(foreign)
    other = DescriptorBufferPool()
    theirs = other.acquire(4)
    with pytest.raises(ReleaseError):
        pool.release(theirs)
    other.release(theirs)  # still theirs to release


def test_a_rebuilt_tuple_is_not_the_acquired_one() -> None:
    pool = DescriptorBufferPool()
    bufs = pool.acquire(4)
    with pytest.raises(ReleaseError):
        pool.release(DescriptorBuffers(*bufs))
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
        assert tensor.numel() == array.size == 6
        assert tensor.data_ptr() == array.ctypes.data
    bufs.src_np[:] = 5
    assert bufs.src_ptrs.tolist() == [5] * 6
    pool.release(bufs)


def test_aliased_add_copies_has_the_upstream_meaning() -> None:
    pool = AliasedDescriptorBufferPool()
    bufs = pool.acquire(4)
    assert bufs.add_copies(1, [100, 200], np.array([300, 400]), 64) is None
    assert bufs.src_ptrs[1:3].tolist() == [100, 200]
    assert bufs.dst_np[1:3].tolist() == [300, 400]
    assert bufs.sizes_np[1:3].tolist() == [64, 64]
    with pytest.raises(IndexError):
        bufs.add_copies(3, [1, 2], [3, 4], 8)
    pool.release(bufs)


def test_aliased_same_n_is_the_same_object_and_dtype_follows() -> None:
    pool = AliasedDescriptorBufferPool(dtype=torch.uint64)
    bufs = pool.acquire(11)
    assert bufs.dst_ptrs.dtype == torch.uint64
    assert bufs.dst_np.dtype == np.uint64
    pool.release(bufs)
    assert pool.acquire(11) is bufs
    pool.release(bufs)
    other = pool.acquire(12)  # same buffer, new n: new tuple of 12
    assert other is not bufs
    assert other.src_np.size == 12
    assert other.src_ptrs.data_ptr() == bufs.src_ptrs.data_ptr()
    pool.release(other)


def test_aliased_release_rules() -> None:
    pool = AliasedDescriptorBufferPool()
    bufs = pool.acquire(2)
    pool.release(bufs, event=FlagEvent())
    with pytest.raises(ReleaseError):
        pool.release(bufs)
    assert pool.pool.stats().parked == 1
