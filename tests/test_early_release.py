"""A release made while a copy still reads the descriptors (vllm-ascend #13894's bug).

A copy that begins through bucketpool's integration (`bucketpool.testing.HostDevice` here,
``bucketpool.vllm.install()``'s copy op in vLLM) has its end event recorded on the hand-out
its descriptors belong to.  A release before that copy ended parks the buffer until it does,
at every level, so the next holder cannot overwrite what the copy reads; ``checks`` warns
once per pair of lines, naming both; ``strict`` raises `ReleaseError` after parking.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import pathlib
import subprocess
import sys
import threading
import types
import warnings
import weakref
from typing import Any

import numpy
import pytest
import torch

from bench._original import OriginalDescriptorBufferPool
from bucketpool import BucketPool, DebugLevel, InFlightReleaseWarning, ReleaseError, _copies, _lend
from bucketpool.compat import AliasedDescriptorBufferPool, DescriptorBufferPool
from bucketpool.testing import HostDevice, swap_blocks_batch

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


# -- the seventh review's finds -------------------------------------------------------------


def queued_op(device: HostDevice) -> Any:
    """vLLM's op over *device*: it queues the copy; the copy reads the descriptors later."""

    def op(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        fields = [tensor.as_subclass(torch.Tensor) for tensor in (src, dst, sizes)]
        device._queue.append(lambda: swap_blocks_batch(*fields))

    return op


def test_a_copy_recorded_as_a_compat_release_begins_parks_it() -> None:
    # The release's fast path read the events, then what was recorded: a copy recorded
    # between the two (another thread's op) was dropped, and the buffer cached under it.
    adapter = DescriptorBufferPool()
    bufs = adapter.acquire(8)
    wrapped = _copies.recording(queued_op(HostDevice()), end=lambda: Pending())
    code = _lend.give_back.__code__
    line = next(
        number
        for number, text in enumerate(inspect.getsource(_lend).splitlines(), 1)
        if text.strip().startswith("views = (len(buffer.views)")
    )

    def tracer(frame: types.FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not code:
            return None

        def local(frame: types.FrameType, event: str, arg: object) -> Any:
            if event == "line" and frame.f_lineno == line and not recorded:
                recorded.append(wrapped(*bufs))  # "another thread" copies now
            return local

        return local

    recorded: list[None] = []
    sys.settrace(tracer)
    try:
        adapter.release(bufs)
    finally:
        sys.settrace(None)
    assert recorded == [None]  # the copy began inside the release
    assert adapter.pool.stats().parked == 1  # out of reuse while the copy may read it


class Pending:
    def query(self) -> bool:
        return False


def test_a_release_racing_the_op_in_another_thread_parks_and_blames_the_release() -> None:
    pool, device = BucketPool(debug="checks"), HostDevice()
    queued, go = threading.Event(), threading.Event()
    op = queued_op(device)

    def slow(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        op(src, dst, sizes)
        queued.set()  # the copy is queued; the driver call returns a while later
        go.wait(10)

    wrapped = _copies.recording(slow, end=device.event)
    src, dst = pages(1), torch.zeros(PAGE, dtype=torch.uint8)
    early = pool.acquire(1)
    early.add_copies(0, [src.data_ptr()], [dst.data_ptr()], PAGE)
    thread = threading.Thread(target=wrapped, args=tuple(early.buffers))
    thread.start()
    queued.wait(10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        early.release()  # RACE: the copy began; its op has not returned
        assert pool.stats().parked == 1
        with pool.acquire(1) as bufs:  # the next step: another buffer
            bufs.add_copies(0, [1], [1], 0)
        go.set()
        thread.join()
    device.drain()
    assert torch.equal(dst, src)
    (warning,) = [w for w in caught if issubclass(w.category, InFlightReleaseWarning)]
    lines = pathlib.Path(__file__).read_text(encoding="utf-8").splitlines()
    assert warning.lineno == next(i for i, text in enumerate(lines, 1) if "# RACE:" in text)


def test_a_signal_out_of_the_op_still_parks_what_it_queued() -> None:
    pool, device = BucketPool(), HostDevice()
    op = queued_op(device)

    def interrupted(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        op(src, dst, sizes)
        raise KeyboardInterrupt  # Ctrl-C once the copy was queued

    wrapped = _copies.recording(interrupted, end=device.event)
    src, dst = pages(1), torch.zeros(PAGE, dtype=torch.uint8)

    def step() -> None:
        with pool.acquire(1) as bufs:
            end = bufs.add_copies(0, [src.data_ptr()], [dst.data_ptr()], PAGE)
            wrapped(*bufs.shrink(end))

    with pytest.raises(KeyboardInterrupt):
        step()
    assert pool.stats().parked == 1
    overwrite_next(pool)
    device.drain()
    assert torch.equal(dst, src)
    assert pool.collect() == 1  # its end event was recorded all the same: back once done


def test_a_with_blocks_error_keeps_precedence_over_an_error_filters_warning() -> None:
    pool, device = BucketPool(debug="checks"), HostDevice()
    src, dst = pages(1), torch.zeros(PAGE, dtype=torch.uint8)

    def step() -> None:
        with pool.acquire(1) as bufs:
            end = bufs.add_copies(0, [src.data_ptr()], [dst.data_ptr()], PAGE)
            device.swap_blocks_batch(*bufs.shrink(end))
            raise ValueError("the block's own error")

    with warnings.catch_warnings():
        warnings.simplefilter("error", InFlightReleaseWarning)
        with pytest.raises(ValueError, match="the block's own") as raised:
            step()
    assert "InFlightReleaseWarning" in "".join(getattr(raised.value, "__notes__", ()))
    assert pool.stats().parked == 1
    device.drain()


@pytest.mark.parametrize("level", ["off", "checks", "strict"])
def test_a_buffer_whose_memory_a_holder_moved_is_still_found(level: DebugLevel) -> None:
    pool, device = BucketPool(debug=level), HostDevice()
    with pool.acquire(4) as bufs:
        bufs.src_ptrs.share_memory_()  # type: ignore[no-untyped-call]  # the memory moves (the pool's arrays follow it)
    release_early = contextlib.nullcontext() if level != "strict" else pytest.raises(ReleaseError)
    src, dst = pages(4), torch.zeros(4 * PAGE, dtype=torch.uint8)
    with warnings.catch_warnings(), release_early:
        warnings.simplefilter("ignore", InFlightReleaseWarning)
        release_at_once(pool, device, src, dst)
    assert pool.stats().parked == 1
    overwrite_next(pool)
    device.drain()
    assert torch.equal(dst, src)
    assert pool.collect() == 1
    assert pool.outstanding() == []


def test_the_index_of_buffers_by_address_keeps_none_alive_and_forgets_the_freed() -> None:
    pool = BucketPool(max_cached_bytes=0)  # every release frees its buffer
    handle = pool.acquire(4)
    key = handle.buffers.src_ptrs.data_ptr()
    assert _copies.INDEX[key]() is handle._buffer  # filed while it lives
    handle.release()
    assert key not in _copies.INDEX  # freed by the release's move: forgotten with it
    kept = BucketPool()
    handle = kept.acquire(4)
    buffer = weakref.ref(handle._buffer)
    handle.release()
    del handle, kept  # a dropped pool frees its cached buffers: the index holds them weakly
    assert buffer() is None


@pytest.mark.parametrize("level", ["checks", "strict"])
def test_a_release_with_the_holders_own_pending_event_is_not_reported(
    level: DebugLevel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The guide's pattern: the copy's end event recorded on the hand-out (or passed to a
    # compat release), then the release at once: the buffer waits, and nothing is reported.
    pool, device = BucketPool(debug=level), HostDevice()
    monkeypatch.setenv("BUCKETPOOL_DEBUG", level)
    adapter = DescriptorBufferPool()
    src, dst = pages(2), torch.zeros(2 * PAGE, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InFlightReleaseWarning)
        with pool.acquire(1) as bufs:
            end = bufs.add_copies(0, [src.data_ptr()], [dst.data_ptr()], PAGE)
            bufs.record_event(device.swap_blocks_batch(*bufs.shrink(end)))
        triple = adapter.acquire(1)
        triple.add_copies(0, [src.data_ptr() + PAGE], [dst.data_ptr() + PAGE], PAGE)
        copied = device.swap_blocks_batch(
            triple.src_ptrs[:1], triple.dst_ptrs[:1], triple.sizes[:1]
        )
        adapter.release(triple, event=copied)
    assert pool.stats().parked == adapter.pool.stats().parked == 1
    device.drain()
    assert torch.equal(dst, src)
    assert pool.collect() == adapter.pool.collect() == 1


def test_a_holders_event_done_before_the_copy_ended_does_not_cover_it() -> None:
    # An event of the holder's own that is over while the copy is not (another stream's):
    # the release is as early as with no event, and reported.
    pool, device = BucketPool(debug="checks"), HostDevice()
    src, dst = pages(1), torch.zeros(PAGE, dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pool.acquire(1) as bufs:
            end = bufs.add_copies(0, [src.data_ptr()], [dst.data_ptr()], PAGE)
            device.swap_blocks_batch(*bufs.shrink(end))
            bufs.record_event(_copies.DONE)
    assert [w.category for w in caught] == [InFlightReleaseWarning]
    assert pool.stats().parked == 1
    device.drain()
    assert pool.collect() == 1


def interrupt_in(code: types.CodeType) -> Any:
    """A tracer raising KeyboardInterrupt as *code* is called: a signal handler's, there."""

    def tracer(frame: types.FrameType, event: str, arg: object) -> Any:
        if event == "call" and frame.f_code is code:
            raise KeyboardInterrupt
        return None

    return tracer


@pytest.mark.parametrize("where", ["HostDevice", "the accelerator"])
def test_a_signal_while_the_end_event_is_recorded_ends_the_copy_with_the_device(where: str) -> None:
    # No end event: the copy is over once the device ran all its work, which the release
    # waits for (on a CPU-only host the op's return was the end).  Never parked for good.
    pool, device = BucketPool(), HostDevice()
    if where == "HostDevice":
        wrapped, end_event = (
            _copies.recording(queued_op(device), device.event, device.drain),
            device.event,
        )
    else:
        wrapped, end_event = _copies.recording(lambda *tensors: None), _copies._end_event
    src, dst = pages(1), torch.zeros(PAGE, dtype=torch.uint8)
    handle = pool.acquire(1)
    bufs = handle.__enter__()
    end = bufs.add_copies(0, [src.data_ptr()], [dst.data_ptr()], PAGE)
    sys.settrace(interrupt_in(end_event.__code__))
    try:
        with pytest.raises(KeyboardInterrupt):
            wrapped(*bufs.shrink(end))
    finally:
        sys.settrace(None)
    assert device.done == 0  # (queued, for HostDevice)
    handle.__exit__(None, None, None)
    assert pool.stats().parked == 0  # the release asked, and the device's work was over
    assert torch.equal(dst, src) == (where == "HostDevice")


def test_a_foreign_tensor_at_a_moved_buffers_old_address_is_not_that_buffers_copy() -> None:
    # A holder moved its memory (share_memory_); the index still files the buffer under the
    # old address until the pool sees the move.  Another tensor at that address (another
    # pool's or vLLM's own descriptors) is not this hand-out's copy.
    pool = BucketPool(debug="checks")
    handle = pool.acquire(4)
    bufs = handle.__enter__()
    old = bufs.src_ptrs.data_ptr()
    bufs.src_ptrs.share_memory_()  # type: ignore[no-untyped-call]
    assert bufs.src_ptrs.data_ptr() != old
    assert _copies.INDEX[old]() is handle._buffer
    block = (ctypes.c_int64 * 4).from_address(old)  # a tensor at the old address (not read)
    foreign = torch.from_numpy(numpy.ctypeslib.as_array(block))
    _copies.recording(lambda *tensors: None, end=lambda: Pending())(foreign, foreign, foreign)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InFlightReleaseWarning)
        handle.__exit__(None, None, None)
    assert pool.stats().parked == 0


MOVED_AND_REUSED = """
from bucketpool import BucketPool
pool = BucketPool()
moved = pool.acquire(2**21)
old = moved.buffers.src_ptrs.data_ptr()
moved.buffers.src_ptrs.share_memory_()
other = pool.acquire(2**21)
print(other._buffer.address == old, len(pool.outstanding()))
other.release()
moved.release()
print(len(pool.outstanding()))
"""


def test_a_held_buffer_whose_memory_moved_stays_outstanding_whoever_takes_its_address() -> None:
    # The ledger files its buffers by identity: a new buffer at a moved one's old address
    # does not hide the moved one from outstanding().  In a fresh process, where glibc maps
    # 48 MiB and the kernel maps the next such block where the last was unmapped.
    ran = subprocess.run(
        [sys.executable, "-c", MOVED_AND_REUSED], capture_output=True, text=True, check=True
    )
    assert ran.stdout.split() == ["True", "2", "0"], ran.stdout + ran.stderr
