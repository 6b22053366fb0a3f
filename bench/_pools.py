"""The pools under test, each driven through a trace's steps as its callers drive it.

* ``original`` (`bench._original`) and ``compat`` (`bucketpool.compat.DescriptorBufferPool`):
  ``bufs = pool.acquire(n)``, three ``[:end]`` slices, ``pool.release(bufs)``;
* ``bucketpool``: the README's step without its fill, ``with pool.acquire(n) as bufs:
  views = bufs.shrink(end)``; with handles in flight, ``handle = pool.acquire(n); views =
  handle.shrink(end)`` and ``handle.release()`` later.

Only the returned views are used, so the loops hold whether ``shrink`` narrows the bound
views in place or returns new ones.  Methods are bound to locals first, as a careful caller
does, and memory figures come from ``pool.stats()``.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import attrs
import numpy as np
import numpy.typing as npt
import torch

from bench._original import OriginalDescriptorBufferPool
from bench._traces import Trace
from bucketpool import BucketPool, BufferHandle
from bucketpool.compat import DescriptorBufferPool

__all__ = [
    "IMPLEMENTATIONS",
    "Copies",
    "Driver",
    "Memory",
    "drivers",
    "handle_ops",
    "memory_of",
    "numpy_fill_steps",
    "random_copies",
    "setitem_fill_steps",
    "with_fill_steps",
]

#: The pools compared on the traces, in the order they run in each round.
IMPLEMENTATIONS = ("original", "bucketpool", "compat")
#: One step's copies: sources, destinations and byte counts, each of the step's end.
Copies = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
_Triple = TypeVar("_Triple", bound="_Fields")


@typing.final
@attrs.frozen
class Memory:
    """A pool's counters: triples allocated, bytes held (cached and handed out), the peak."""

    allocations: int
    bytes_held: int
    peak_bytes: int


def memory_of(pool: BucketPool | OriginalDescriptorBufferPool) -> Memory:
    """Return *pool*'s counters (a `BucketPool`'s from its public stats)."""
    if isinstance(pool, OriginalDescriptorBufferPool):
        return Memory(pool.allocations, pool.bytes_held, pool.peak_bytes_held)
    stats = pool.stats()
    return Memory(
        stats.allocations.allocated, stats.allocated_bytes.current, stats.allocated_bytes.peak
    )


@typing.final
@attrs.frozen
class Driver:
    """One pool on one trace: a timed pass over its steps, and the pool's counters."""

    name: str
    run: Callable[[], None]
    memory: Callable[[], Memory]


class _Fields(Protocol):
    @property
    def src_ptrs(self) -> torch.Tensor: ...
    @property
    def dst_ptrs(self) -> torch.Tensor: ...
    @property
    def sizes(self) -> torch.Tensor: ...


class _SlicingPool(Protocol[_Triple]):
    def acquire(self, n: int, /) -> _Triple: ...
    def release(self, bufs: _Triple, /) -> None: ...


def _sliced_steps(pool: _SlicingPool[_Triple], steps: Sequence[tuple[int, int]]) -> None:
    acquire, release = pool.acquire, pool.release
    for n, end in steps:
        bufs = acquire(n)
        _views = bufs.src_ptrs[:end], bufs.dst_ptrs[:end], bufs.sizes[:end]
        release(bufs)


def _sliced_events(pool: _SlicingPool[_Triple], events: Sequence[int], ends: Sequence[int]) -> None:
    acquire, release = pool.acquire, pool.release
    live: dict[int, _Triple] = {}
    acquired = 0
    for event in events:
        if event >= 0:
            end = ends[acquired]
            bufs = live[acquired] = acquire(event)
            _views = bufs.src_ptrs[:end], bufs.dst_ptrs[:end], bufs.sizes[:end]
            acquired += 1
        else:
            release(live.pop(~event))


def _with_steps(pool: BucketPool, steps: Sequence[tuple[int, int]]) -> None:
    acquire = pool.acquire
    for n, end in steps:
        with acquire(n) as bufs:
            _views = bufs.shrink(end)


def _handle_events(pool: BucketPool, events: Sequence[int], ends: Sequence[int]) -> None:
    acquire = pool.acquire
    live: dict[int, BufferHandle] = {}
    acquired = 0
    for event in events:
        if event >= 0:
            handle = live[acquired] = acquire(event)
            _views = handle.shrink(ends[acquired])
            acquired += 1
        else:
            live.pop(~event).release()


def _sliced_run(pool: _SlicingPool[_Triple], trace: Trace) -> Callable[[], None]:
    if trace.steps is None:
        return functools.partial(_sliced_events, pool, trace.events, trace.ends)
    return functools.partial(_sliced_steps, pool, trace.steps)


def drivers(trace: Trace, names: Sequence[str] = IMPLEMENTATIONS) -> tuple[Driver, ...]:
    """Return a `Driver` of each of *names* on *trace*, each with a fresh pool of defaults."""
    original, pool, compat = OriginalDescriptorBufferPool(), BucketPool(), DescriptorBufferPool()
    if trace.steps is None:
        ours = functools.partial(_handle_events, pool, trace.events, trace.ends)
    else:
        ours = functools.partial(_with_steps, pool, trace.steps)
    made = (
        Driver("original", _sliced_run(original, trace), functools.partial(memory_of, original)),
        Driver("bucketpool", ours, functools.partial(memory_of, pool)),
        Driver("compat", _sliced_run(compat, trace), functools.partial(memory_of, compat.pool)),
    )
    return tuple(driver for driver in made if driver.name in names)


def random_copies(rng: np.random.Generator, count: int) -> Copies:
    """Return *count* random copies: 8-byte aligned addresses, byte counts up to 64 KiB."""
    return (
        rng.integers(1 << 12, 1 << 44, count, dtype=np.int64) * 8,
        rng.integers(1 << 12, 1 << 44, count, dtype=np.int64) * 8,
        rng.integers(1, 1 << 13, count, dtype=np.int64) * 8,
    )


def with_fill_steps(
    pool: BucketPool, steps: Sequence[tuple[int, int]], copies: Sequence[Copies]
) -> None:
    """The README's whole step: ``end = bufs.add_copies(0, ...)``, ``bufs.shrink(end)``."""
    acquire = pool.acquire
    for (n, _), (sources, destinations, sizes) in zip(steps, copies, strict=True):
        with acquire(n) as bufs:
            _views = bufs.shrink(bufs.add_copies(0, sources, destinations, sizes))


def setitem_fill_steps(
    pool: OriginalDescriptorBufferPool,
    steps: Sequence[tuple[int, int]],
    copies: Sequence[tuple[list[int], list[int], list[int]]],
) -> None:
    """The original's callers without numpy: ``t[i] = v`` per entry, then ``[:end]`` slices."""
    acquire, release = pool.acquire, pool.release
    for (n, end), (sources, destinations, sizes) in zip(steps, copies, strict=True):
        bufs = acquire(n)
        src, dst, size = bufs
        for i in range(end):
            src[i] = sources[i]
            dst[i] = destinations[i]
            size[i] = sizes[i]
        _views = src[:end], dst[:end], size[:end]
        release(bufs)


def numpy_fill_steps(
    pool: OriginalDescriptorBufferPool, steps: Sequence[tuple[int, int]], copies: Sequence[Copies]
) -> None:
    """The original's callers with numpy: ``[:end]`` slices, written through numpy aliases."""
    acquire, release = pool.acquire, pool.release
    for (n, end), (sources, destinations, sizes) in zip(steps, copies, strict=True):
        bufs = acquire(n)
        src, dst, size = bufs.src_ptrs[:end], bufs.dst_ptrs[:end], bufs.sizes[:end]
        src.numpy()[:] = sources
        dst.numpy()[:] = destinations
        size.numpy()[:] = sizes
        release(bufs)


def handle_ops(pool: BucketPool, n: int, ops: int) -> None:
    """Run *ops* bare steps ``with pool.acquire(n) as bufs: pass`` (the cases' hot loop)."""
    acquire = pool.acquire
    for _ in range(ops):
        with acquire(n) as _bufs:
            pass
