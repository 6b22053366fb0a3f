"""Real CUDA events: a buffer parks on ``torch.cuda.Event`` until it is done, then comes back."""

from __future__ import annotations

import typing

import numpy as np
import pytest
import torch

from bucketpool import BucketPool
from bucketpool.compat import AliasedDescriptorBufferPool, DescriptorBufferPool

from ._cuda import STALLS_MS, stall

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

N = 4096


def fail_stall_too_short() -> typing.NoReturn:
    pytest.fail(f"the host never saw a copy's event pending: stalls of {STALLS_MS} ms too short")


@pytest.mark.pool(pin_memory=True)
def test_a_buffer_parks_on_a_cuda_event_until_collect_or_synchronize(
    pool: BucketPool, cycles_per_ms: float
) -> None:
    values = np.arange(1, N + 1, dtype=np.int64)
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    for ms in STALLS_MS:
        stall_end = stall(stream, round(ms * cycles_per_ms))
        with pool.acquire(N) as bufs:
            bufs.add_copies(0, values, values, values)
            first = bufs.src_ptrs.data_ptr()
            with torch.cuda.stream(stream):
                uploaded = [t.to("cuda", non_blocking=True) for t in bufs]
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(stream)
            bufs.record_event(done)
        retired, parked = pool.collect(), pool.stats().parked
        other = pool.acquire(N)  # held, so that the acquire after the retirement gets it
        if not stall_end.query():  # type: ignore[no-untyped-call]
            break
        other.release()
        pool.synchronize()
    else:
        fail_stall_too_short()
    assert (retired, parked) == (0, 1)
    assert other.buffers.src_ptrs.data_ptr() != first
    done.synchronize()
    assert pool.collect() == 1
    with pool.acquire(N) as again:
        assert again.src_ptrs.data_ptr() == first
    other.release()
    for tensor in uploaded:
        assert np.array_equal(tensor.cpu().numpy(), values)

    stall_end = stall(stream, round(ms * cycles_per_ms))
    with pool.acquire(N) as bufs:
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(stream)
        bufs.record_event(done)
    parked = pool.stats().parked
    pending = not stall_end.query()  # type: ignore[no-untyped-call]
    pool.synchronize()  # waits for the event, then retires the buffer
    assert done.query()  # type: ignore[no-untyped-call]
    assert pool.stats().parked == 0
    assert parked == 1 or not pending


Adapter = typing.TypeVar("Adapter", DescriptorBufferPool, AliasedDescriptorBufferPool)


def release_on_a_cuda_event(compat: Adapter, cycles_per_ms: float) -> None:
    """``compat.release(bufs, event=...)`` parks the (unpinned) triple until the event is done."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    for ms in STALLS_MS:
        stall_end = stall(stream, round(ms * cycles_per_ms))
        bufs = compat.acquire(N)
        first = bufs.src_ptrs.data_ptr()
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(stream)
        compat.release(bufs, event=done)
        parked = compat.pool.stats().parked
        other = compat.acquire(N)
        second = other.src_ptrs.data_ptr()
        if not stall_end.query():  # type: ignore[no-untyped-call]
            break
        compat.release(other)
        compat.pool.synchronize()
    else:
        fail_stall_too_short()
    assert parked == 1
    assert second != first
    compat.release(other)
    compat.pool.synchronize()  # waits for the event
    assert done.query()  # type: ignore[no-untyped-call]
    assert compat.pool.stats().parked == 0


def test_compat_release_parks_on_a_cuda_event(cycles_per_ms: float) -> None:
    release_on_a_cuda_event(DescriptorBufferPool(), cycles_per_ms)


def test_aliased_compat_release_parks_on_a_cuda_event(cycles_per_ms: float) -> None:
    release_on_a_cuda_event(AliasedDescriptorBufferPool(), cycles_per_ms)
