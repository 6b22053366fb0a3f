"""The pools under test, each driven the way its callers drive it.

* ``original``: `bench._original.OriginalDescriptorBufferPool`, called as vLLM's
  worker calls it: ``bufs = pool.acquire(n)``, three ``[:n]`` slices, ``pool.release(bufs)``;
* ``bucketpool``: `~bucketpool.BucketPool`, called as ``with pool.acquire(n) as bufs:``
  (the views already have ``n`` entries, so nothing is sliced);
* ``compat``: `bucketpool.compat.DescriptorBufferPool`, called exactly as ``original``.

Only the public API of bucketpool is used: memory figures come from ``pool.stats()``.
Each loop binds its methods to locals first, as a careful caller would, so the loops time
the pools and not attribute lookups.
"""

from __future__ import annotations

import functools
import threading
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

import attrs
import torch

from bench._original import OriginalDescriptorBufferPool, OriginalDescriptorBuffers
from bucketpool import BucketPool, BufferHandle, CompletionEvent
from bucketpool.compat import DescriptorBufferPool

__all__ = [
    "IMPLEMENTATIONS",
    "Implementation",
    "LockedOriginal",
    "Memory",
    "NeverDone",
    "handle_ops",
    "make_implementations",
    "memory_of",
    "park",
    "sliced_ops",
]

#: The implementations compared, in the order they run in each round.
IMPLEMENTATIONS = ("original", "bucketpool", "compat")

_T = TypeVar("_T")
_Triple = TypeVar("_Triple", bound="_Fields")


@typing.final
@attrs.frozen
class Memory:
    """An implementation's memory counters at one moment.

    Attributes:
        allocations: buffer triples allocated so far.
        bytes_held: bytes of the triples the pool and its callers hold now.
        peak_bytes: the highest ``bytes_held`` so far.
    """

    allocations: int
    bytes_held: int
    peak_bytes: int


@typing.final
@attrs.frozen
class Implementation:
    """One pool, driven the way its callers drive it.

    Attributes:
        name: one of `IMPLEMENTATIONS`.
        cycle: the timed loop for traces whose handles are released at once.
        replay: the timed loop for any trace's events.
        record: an untimed pass over events that returns bytes held after each release.
        memory: the pool's counters now.
    """

    name: str
    cycle: Callable[[Sequence[int]], None]
    replay: Callable[[Sequence[int]], None]
    record: Callable[[Sequence[int]], tuple[int, ...]]
    memory: Callable[[], Memory]


class _Fields(Protocol):
    @property
    def src_ptrs(self) -> torch.Tensor: ...
    @property
    def dst_ptrs(self) -> torch.Tensor: ...
    @property
    def sizes(self) -> torch.Tensor: ...


class _SlicingPool(Protocol[_Triple]):
    """The original pool's API, which the compat adapter also has."""

    def acquire(self, n: int, /) -> _Triple: ...
    def release(self, bufs: _Triple, /) -> None: ...


def _sliced_cycle(pool: _SlicingPool[_Triple], sizes: Sequence[int]) -> None:
    """The original's callers: acquire, cut three ``[:n]`` slices, release."""
    acquire = pool.acquire
    release = pool.release
    for n in sizes:
        bufs = acquire(n)
        _src, _dst, _sizes = bufs.src_ptrs[:n], bufs.dst_ptrs[:n], bufs.sizes[:n]
        release(bufs)


def _sliced_replay(pool: _SlicingPool[_Triple], events: Sequence[int]) -> None:
    acquire = pool.acquire
    release = pool.release
    live: dict[int, _Triple] = {}
    acquired = 0
    for event in events:
        if event >= 0:
            bufs = acquire(event)
            _src, _dst, _sizes = bufs.src_ptrs[:event], bufs.dst_ptrs[:event], bufs.sizes[:event]
            live[acquired] = bufs
            acquired += 1
        else:
            release(live.pop(~event))


def _sliced_acquire(pool: _SlicingPool[_Triple], n: int) -> _Triple:
    bufs = pool.acquire(n)
    _src, _dst, _sizes = bufs.src_ptrs[:n], bufs.dst_ptrs[:n], bufs.sizes[:n]
    return bufs


def _handle_cycle(pool: BucketPool, sizes: Sequence[int]) -> None:
    """The callers of a `BucketPool`: the views have exactly ``n`` entries, so nothing is sliced."""
    acquire = pool.acquire
    for n in sizes:
        with acquire(n) as bufs:
            _src, _dst, _sizes = bufs


def _handle_replay(pool: BucketPool, events: Sequence[int]) -> None:
    acquire = pool.acquire
    live: dict[int, BufferHandle] = {}
    acquired = 0
    for event in events:
        if event >= 0:
            handle = acquire(event)
            _src, _dst, _sizes = handle.buffers
            live[acquired] = handle
            acquired += 1
        else:
            live.pop(~event).release()


def _handle_acquire(pool: BucketPool, n: int) -> BufferHandle:
    handle = pool.acquire(n)
    _src, _dst, _sizes = handle.buffers
    return handle


def _record(
    acquire: Callable[[int], _T],
    release: Callable[[_T], None],
    memory: Callable[[], Memory],
    events: Sequence[int],
) -> tuple[int, ...]:
    live: dict[int, _T] = {}
    held: list[int] = []
    acquired = 0
    for event in events:
        if event >= 0:
            live[acquired] = acquire(event)
            acquired += 1
        else:
            release(live.pop(~event))
            held.append(memory().bytes_held)
    return tuple(held)


def _original_memory(pool: OriginalDescriptorBufferPool) -> Memory:
    return Memory(pool.allocations, pool.bytes_held, pool.peak_bytes_held)


def _pool_memory(pool: BucketPool) -> Memory:
    stats = pool.stats()
    allocated = stats.allocated_bytes
    return Memory(stats.allocations.allocated, allocated.current, allocated.peak)


def _sliced(
    name: str,
    pool: _SlicingPool[_Triple],
    memory: Callable[[], Memory],
) -> Implementation:
    """Drive a pool with the original's API as the original's callers do."""

    def record(events: Sequence[int]) -> tuple[int, ...]:
        return _record(functools.partial(_sliced_acquire, pool), pool.release, memory, events)

    return Implementation(
        name=name,
        cycle=functools.partial(_sliced_cycle, pool),
        replay=functools.partial(_sliced_replay, pool),
        record=record,
        memory=memory,
    )


def _original() -> Implementation:
    pool = OriginalDescriptorBufferPool()
    return _sliced("original", pool, functools.partial(_original_memory, pool))


def _compat() -> Implementation:
    pool = DescriptorBufferPool()
    memory = functools.partial(_pool_memory, pool.pool)
    return _sliced("compat", pool, memory)


def _bucketpool() -> Implementation:
    pool = BucketPool()
    memory = functools.partial(_pool_memory, pool)

    def record(events: Sequence[int]) -> tuple[int, ...]:
        acquire = functools.partial(_handle_acquire, pool)
        return _record(acquire, BufferHandle.release, memory, events)

    return Implementation(
        name="bucketpool",
        cycle=functools.partial(_handle_cycle, pool),
        replay=functools.partial(_handle_replay, pool),
        record=record,
        memory=memory,
    )


_FACTORIES: Mapping[str, Callable[[], Implementation]] = {
    "original": _original,
    "bucketpool": _bucketpool,
    "compat": _compat,
}


def make_implementations(names: Sequence[str] = IMPLEMENTATIONS) -> tuple[Implementation, ...]:
    """Return an `Implementation` of each of *names*, each with a fresh pool of defaults.

    They come in `IMPLEMENTATIONS` order, the order they run in each round.
    """
    return tuple(factory() for name, factory in _FACTORIES.items() if name in names)


@typing.final
class NeverDone:
    """An event whose copy never finishes: what it guards stays parked."""

    def query(self) -> bool:
        """Return `False`: the copy is still running."""
        return False


def park(
    pool: BucketPool, n: int, count: int, event: Callable[[], CompletionEvent] = NeverDone
) -> None:
    """Acquire *count* handles of *n* entries, record a new *event()* on each, release.

    With `NeverDone` events, the handles stay parked (pending) for the life of *pool*.
    """
    handles = [pool.acquire(n) for _ in range(count)]
    for handle in handles:
        handle.record_event(event())
        handle.release()


def memory_of(pool: BucketPool) -> Memory:
    """Return *pool*'s allocations and bytes held, from its public stats."""
    return _pool_memory(pool)


@typing.final
class LockedOriginal:
    """The original pool behind one lock: what sharing it between threads takes.

    The original is not thread-safe (``if self._pool: self._pool.pop()`` can pop an empty
    list when another thread runs in between), so threaded callers must serialize it.
    """

    def __init__(self) -> None:
        self._pool = OriginalDescriptorBufferPool()
        self._lock = threading.Lock()

    def acquire(self, n: int) -> OriginalDescriptorBuffers:
        """Acquire under the lock (see the original's `acquire`)."""
        with self._lock:
            return self._pool.acquire(n)

    def release(self, bufs: OriginalDescriptorBuffers) -> None:
        """Release under the lock."""
        with self._lock:
            self._pool.release(bufs)


def sliced_ops(
    pool: LockedOriginal, n: int, ops: int, latencies: list[int] | None, *, bare: bool = False
) -> None:
    """Run *ops* ops of the original's callers on *pool*, appending each op's ns if asked.

    With *bare*, the op is acquire and release only (no slices).
    """
    acquire, release, clock = pool.acquire, pool.release, time.perf_counter_ns
    for _ in range(ops):
        start = clock()
        bufs = acquire(n)
        if not bare:
            _src, _dst, _sizes = bufs.src_ptrs[:n], bufs.dst_ptrs[:n], bufs.sizes[:n]
        release(bufs)
        if latencies is not None:
            latencies.append(clock() - start)


def handle_ops(
    pool: BucketPool, n: int, ops: int, latencies: list[int] | None, *, bare: bool = False
) -> None:
    """Run *ops* ops of a `BucketPool`'s callers on *pool*, appending each op's ns if asked.

    The op is ``with pool.acquire(n) as bufs:``; with *bare*, ``acquire(n).release()``.
    """
    acquire, clock = pool.acquire, time.perf_counter_ns
    for _ in range(ops):
        start = clock()
        if bare:
            acquire(n).release()
        else:
            with acquire(n) as bufs:
                _src, _dst, _sizes = bufs
        if latencies is not None:
            latencies.append(clock() - start)
