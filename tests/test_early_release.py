"""A release made while a copy still reads the descriptors (vllm-ascend #13894's bug).

A copy that begins through bucketpool's integration (`bucketpool.testing.HostDevice` here,
``bucketpool.vllm.install()``'s copy op in vLLM) has its end event recorded on the hand-out
its descriptors belong to.  A release before that copy ended parks the buffer until it does,
at every level, so the next holder cannot overwrite what the copy reads; ``checks`` warns
once per pair of lines, naming both; ``strict`` raises `ReleaseError` after parking.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from bench._original import OriginalDescriptorBufferPool
from bucketpool import BucketPool, DebugLevel, InFlightReleaseWarning, ReleaseError
from bucketpool.compat import AliasedDescriptorBufferPool
from bucketpool.testing import HostDevice

PAGE = 64


def pages(count: int) -> torch.Tensor:
    return torch.arange(count * PAGE, dtype=torch.int64).to(torch.uint8)


def release_at_once(
    pool: BucketPool, device: HostDevice, src: torch.Tensor, dst: torch.Tensor
) -> None:
    """The bug: release right after the (asynchronous) copy was queued."""
    with pool.acquire(4) as bufs:
        addresses = [src.data_ptr() + i * PAGE for i in range(4)]
        targets = [dst.data_ptr() + i * PAGE for i in range(4)]
        end = bufs.add_copies(0, addresses, targets, PAGE)
        device.swap_blocks_batch(*bufs.shrink(end))


def overwrite_next(pool: BucketPool) -> None:
    """The next step: its descriptors would point the queued copy elsewhere."""
    with pool.acquire(4) as bufs:
        bufs.add_copies(0, [1] * 4, [1] * 4, 0)  # zero bytes from address 1: copies nothing


@pytest.mark.parametrize("level", ["off", "checks", "strict"])
def test_an_early_release_parks_until_the_copy_ran(level: DebugLevel) -> None:
    pool, device = BucketPool(debug=level), HostDevice()
    src, dst = pages(4), torch.zeros(4 * PAGE, dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if level == "strict":
            with pytest.raises(ReleaseError, match="could still read its descriptors"):
                release_at_once(pool, device, src, dst)
        else:
            release_at_once(pool, device, src, dst)
    early = [w for w in caught if issubclass(w.category, InFlightReleaseWarning)]
    assert len(early) == (level == "checks")
    assert pool.stats().parked == 1  # at every level: out of reuse while the copy may read
    overwrite_next(pool)  # a new buffer: the queued copy's descriptors are untouched
    device.drain()
    assert torch.equal(dst, src)
    assert pool.collect() == 1
    assert pool.outstanding() == []


def test_without_bucketpools_parking_the_same_steps_copy_the_wrong_bytes() -> None:
    # The check above can fail: the original pool hands the triple out again at once, the
    # next step rewrites it, and the queued copy reads the new descriptors.
    pool, device = OriginalDescriptorBufferPool(), HostDevice()
    src, dst = pages(4), torch.zeros(4 * PAGE, dtype=torch.uint8)
    bufs = pool.acquire(4)
    bufs.src_ptrs[:4] = torch.tensor([src.data_ptr() + i * PAGE for i in range(4)])
    bufs.dst_ptrs[:4] = torch.tensor([dst.data_ptr() + i * PAGE for i in range(4)])
    bufs.sizes[:4] = PAGE
    device.swap_blocks_batch(bufs.src_ptrs[:4], bufs.dst_ptrs[:4], bufs.sizes[:4])
    pool.release(bufs)  # too early
    again = pool.acquire(4)
    assert again is bufs  # the same triple
    again.sizes[:4] = 0  # the next step's descriptors
    device.drain()
    assert not torch.equal(dst, src)  # the copy read them: nothing was copied


def test_a_release_after_the_copy_ran_is_not_reported() -> None:
    pool, device = BucketPool(debug="checks"), HostDevice()
    src, dst = pages(4), torch.zeros(4 * PAGE, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InFlightReleaseWarning)
        with pool.acquire(4) as bufs:
            addresses = [src.data_ptr() + i * PAGE for i in range(4)]
            targets = [dst.data_ptr() + i * PAGE for i in range(4)]
            end = bufs.add_copies(0, addresses, targets, PAGE)
            copy_done = device.swap_blocks_batch(*bufs.shrink(end))
            copy_done.synchronize()  # the correct order: wait for the end event, then release
    assert pool.stats().parked == 0
    assert torch.equal(dst, src)


def test_a_compat_release_before_the_copy_ran_parks_and_is_reported() -> None:
    adapter, device = AliasedDescriptorBufferPool(), HostDevice()
    src, dst = pages(2), torch.zeros(2 * PAGE, dtype=torch.uint8)
    bufs = adapter.acquire(2)
    end = bufs.add_copies(
        0, [src.data_ptr(), src.data_ptr() + PAGE], [dst.data_ptr(), dst.data_ptr() + PAGE], PAGE
    )
    device.swap_blocks_batch(bufs.src_ptrs[:end], bufs.dst_ptrs[:end], bufs.sizes[:end])
    adapter.release(bufs)  # too early: parked (at off, silently)
    assert adapter.pool.stats().parked == 1
    again = adapter.acquire(2)
    assert again.src_ptrs.data_ptr() != bufs.src_ptrs.data_ptr()
    adapter.release(again)
    device.drain()
    assert torch.equal(dst, src)
    assert adapter.pool.collect() == 1


def test_a_strict_compat_release_too_early_is_released_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BUCKETPOOL_DEBUG", "strict")
    adapter, device = AliasedDescriptorBufferPool(), HostDevice()
    src, dst = pages(1), torch.zeros(PAGE, dtype=torch.uint8)
    bufs = adapter.acquire(1)
    end = bufs.add_copies(0, [src.data_ptr()], [dst.data_ptr()], PAGE)
    device.swap_blocks_batch(bufs.src_ptrs[:end], bufs.dst_ptrs[:end], bufs.sizes[:end])
    with pytest.raises(ReleaseError, match="could still read its descriptors") as raised:
        adapter.release(bufs)
    assert isinstance(raised.value.__cause__, InFlightReleaseWarning)
    with pytest.raises(ReleaseError, match="already released"):
        adapter.release(bufs)  # the first release took effect
    device.drain()
    assert torch.equal(dst, src)
    assert adapter.pool.collect() == 1
    assert adapter.pool.outstanding() == []
