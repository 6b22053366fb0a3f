"""The life of a descriptor buffer: acquired, filled, in flight, parked, cached, trimmed.

Everything that moves a buffer between those states lives in this module, under one lock
per pool, so that the accounting (`BucketPool.stats`) can be read in one place.
"""

from __future__ import annotations

import collections
import gc
import os
import queue
import sys
import time
import traceback
import typing
import warnings
import zlib
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Final, NamedTuple, Protocol, SupportsIndex

import numpy as np
import torch

from bucketpool import _fill
from bucketpool._buckets import check_count
from bucketpool._config import DebugLevel, Settings, resolve_settings
from bucketpool._errors import (
    EscapedViewError,
    InFlightWriteError,
    PoolError,
    ReleaseError,
    UseAfterReleaseError,
)
from bucketpool._stats import BucketStats, PoolStats, Stat

__all__ = ["BucketPool", "BufferHandle", "CompletionEvent", "DescriptorBuffers"]

_ENTRY_BYTES = 8
_FIELDS = 3
#: Pointer fields of a cached buffer hold this pattern at debug level ``checks``.
POISON = 0xDEADBEEF_DEADBEEF
_POLL_SECONDS = 0.0005
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep

_new_handle = object.__new__


class _ExitProbe:
    """Measures how many references a ``with`` statement holds on its manager in __exit__."""

    refs = 0

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc_info: object) -> None:
        _ExitProbe.refs = sys.getrefcount(self)


with _ExitProbe():
    pass
#: sys.getrefcount(self) inside __exit__ when only the with statement holds the manager
#: (3 on CPython 3.11: the bound __exit__, `self`, and getrefcount's argument).
_WITH_EXIT_REFS = _ExitProbe.refs


class _SpareProbe:
    __slots__ = ("spare",)

    spare: object


def _spare_refs() -> int:
    """sys.getrefcount of a slot's value read into a local, as `acquire` reads a spare."""
    probe = _SpareProbe()
    probe.spare = _SpareProbe()
    spare = probe.spare
    return sys.getrefcount(spare)


#: 3 on CPython 3.11: the block's spare slot, the local, and getrefcount's argument.
_SPARE_REFS = _spare_refs()
_storage_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


class DescriptorBuffers(NamedTuple):
    """The three descriptor tensors one `swap_blocks_batch` call takes.

    Each is a 1-D contiguous CPU tensor of the pool's dtype and exactly ``n`` entries, a
    zero-copy view at offset 0 of one of the pool's buffers.  Unpack it as
    ``src, dst, sizes = bufs`` or use the fields.
    """

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor


class CompletionEvent(Protocol):
    """What `BufferHandle.record_event` accepts: `torch.Event`, `torch.cuda.Event`, ...

    Only ``query()`` is required; ``synchronize()``, where present, lets
    `BucketPool.synchronize` block instead of polling.
    """

    def query(self) -> bool:
        """Return whether the work recorded before the event has finished."""
        ...


#: The pool's lock: a binary semaphore.  `Lock.acquire()` parses keyword arguments on
#: every call; `SimpleQueue.get()`/`put()` take the fast-call path: ~41 ns a pair here
#: against ~63 ns, and the hot path takes the lock twice an op.  `get()` acquires,
#: `put(None)` releases; it is not reentrant, like `threading.Lock`.
_Mutex = queue.SimpleQueue[None]


def _new_mutex() -> _Mutex:
    mutex: _Mutex = queue.SimpleQueue()
    mutex.put(None)
    return mutex


class _Holding:
    """``with _Holding(mutex):`` for the paths off the hot one."""

    __slots__ = ("_mutex",)

    def __init__(self, mutex: _Mutex) -> None:
        self._mutex = mutex

    def __enter__(self) -> None:
        self._mutex.get()

    def __exit__(self, *exc_info: object) -> None:
        self._mutex.put(None)


class _Bucket:
    """The buffers of one capacity, with their counters."""

    __slots__ = ("allocated", "capacity", "free", "hits", "last_tick", "misses", "nbytes", "parked")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.nbytes = capacity * _ENTRY_BYTES * _FIELDS
        # LIFO: the most recently released buffer is reused first.  A deque, because a list
        # that empties and refills reallocates its array twice an op on the hot path.
        self.free: collections.deque[_Block] = collections.deque()
        self.parked: list[BufferHandle] = []  # oldest first
        self.hits = 0
        self.misses = 0
        self.allocated = 0
        self.last_tick = 0


class _Block:
    """One buffer: three full-capacity tensors and one set of views resized to each ``n``."""

    __slots__ = (
        "acquired_at",
        "alias",
        "arrays",
        "arrays_n",
        "bucket",
        "checksum",
        "released_at",
        "spare",
        "tensors",
        "view_arrays",
        "view_n",
        "views",
    )

    def __init__(self, bucket: _Bucket, tensors: tuple[torch.Tensor, ...]) -> None:
        self.bucket = bucket
        self.tensors = tensors
        arrays = tuple(t.numpy() for t in tensors)
        self.arrays: _fill.DescriptorArrays = (arrays[0], arrays[1], arrays[2])
        # One view per field for the buffer's whole life, resized in place to each n: a
        # resize_ costs ~0.35 us where cutting a new view costs ~0.5 us (from_numpy) to
        # ~0.9 us (t[:n]), and the DescriptorBuffers tuple is never rebuilt.  Views of the
        # tensors (not from_numpy) keep a pinned buffer recognisable to PyTorch's host
        # allocator when a non-blocking copy records an event on it.
        self.views = DescriptorBuffers(tensors[0][:], tensors[1][:], tensors[2][:])
        self.view_n = bucket.capacity
        self.view_arrays = self.arrays
        self.arrays_n = bucket.capacity
        self.alias: object = None  # the six-field compat adapter caches its tuple here
        self.acquired_at: _Site = None
        self.released_at: _Site = None
        self.checksum: int | None = None  # of the first n entries, at debug level checks
        self.spare: BufferHandle | None = None  # a released handle nobody references

    def narrow(self, n: int) -> DescriptorBuffers:
        """Resize the views to *n* entries (within the capacity: nothing is reallocated)."""
        views = self.views
        views[0].resize_(n)
        views[1].resize_(n)
        views[2].resize_(n)
        self.view_n = n
        self.alias = None
        return views

    def narrow_arrays(self, n: int) -> _fill.DescriptorArrays:
        """Return (and cache) numpy arrays of the first *n* entries."""
        if self.arrays_n != n:
            src, dst, sizes = self.arrays
            self.view_arrays = (src[:n], dst[:n], sizes[:n])
            self.arrays_n = n
        return self.view_arrays


_Site = tuple[str, int] | traceback.StackSummary | None


@typing.final
class BufferHandle:
    """One acquired buffer: its views, its events, and the duty to release it.

    Use it as a context manager (``with pool.acquire(n) as bufs:``), which binds the
    `DescriptorBuffers` and releases on exit, or call `release` yourself.  A handle that is
    garbage-collected unreleased emits a `ResourceWarning` and its buffer goes back to the
    pool at the pool's next call.

    A handle is not itself thread-safe: use it from one thread at a time.  Handing it to
    another thread to release it is fine.
    """

    # A plain __slots__ class, not attrs: handles are made on the hot path (by
    # `BucketPool.acquire`, without calling __init__) and their __del__ runs there too.
    # No __weakref__: a weak reference would survive the recycling described in `__exit__`.
    __slots__ = ("_block", "_events", "_n", "_pool", "_released", "_site")

    _pool: BucketPool
    _block: _Block
    _n: int
    _released: bool
    _events: list[CompletionEvent] | None
    _site: _Site

    def __init__(self) -> None:
        """Refuse: handles come from `BucketPool.acquire`."""
        raise TypeError("a BufferHandle comes from BucketPool.acquire(n); do not build one")

    def __del__(self) -> None:
        if getattr(self, "_released", True) or sys.is_finalizing():
            return
        try:
            warnings.warn(
                f"a bucketpool buffer of n={self._n} was never released; "
                f"acquired at {_format_site(self._site)}. Use 'with pool.acquire(n) as bufs:' "
                "or call handle.release(); the buffer goes back to the pool",
                ResourceWarning,
                stacklevel=2,
            )
        finally:
            # Resurrect the handle into the pool's orphan list; the pool releases it at its
            # next call, outside any lock this thread might be holding right now.
            self._pool._orphans.append(self)

    @property
    def n(self) -> int:
        """The number of entries the views have."""
        return self._n

    @property
    def capacity(self) -> int:
        """The capacity of the bucket this buffer came from (a power of two)."""
        return self._block.bucket.capacity

    @property
    def released(self) -> bool:
        """Whether `release` has been called (the buffer may still be parked)."""
        return self._released

    @property
    def acquired_at(self) -> str | None:
        """Where the handle was acquired, when tracing is on (debug level or ``trace``)."""
        return None if self._site is None else _format_site(self._site)

    @property
    def buffers(self) -> DescriptorBuffers:
        """The three length-``n`` views.

        Raises:
            ReleaseError: the handle has been released.
        """
        if self._released:
            raise self._released_error("buffers")
        block = self._block
        if block.view_n == self._n:
            return block.views
        return block.narrow(self._n)

    @property
    def arrays(self) -> _fill.DescriptorArrays:
        """The three fields as length-``n`` numpy arrays sharing memory with the views.

        Raises:
            ReleaseError: the handle has been released.
        """
        if self._released:
            raise self._released_error("arrays")
        return self._block.narrow_arrays(self._n)

    def __enter__(self) -> DescriptorBuffers:
        """Return the views; the ``with`` block releases the handle when it ends."""
        if self._released:
            raise self._released_error("buffers")
        block = self._block
        if block.view_n == self._n:
            return block.views
        return block.narrow(self._n)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the handle, also when the block raised (the exception propagates)."""
        pool = self._pool
        if self._events is None and not pool._tracing:
            # `release` specialised inline for its common case (nothing recorded, no debug
            # level, under both caps): the call it saves is ~5% of the with-path cost.
            lock = pool._lock
            lock.get()
            try:
                if not self._released:
                    block = self._block
                    bucket = block.bucket
                    nbytes = bucket.nbytes
                    if (
                        len(bucket.free) < pool.max_cached_per_bucket
                        and pool._cached_bytes + nbytes <= pool.max_cached_bytes
                    ):
                        self._released = True
                        pool._active -= 1
                        pool._active_bytes -= nbytes
                        bucket.free.append(block)
                        pool._cached_bytes += nbytes
                        if sys.getrefcount(self) == _WITH_EXIT_REFS:
                            # Likely only the with statement holds this handle (an
                            # __exit__ called by hand looks the same; `acquire` proves it
                            # before reuse): keep it for the next acquire of this buffer
                            # instead of finalising and freeing it (~90 ns an op).
                            block.spare = self
                        return
            finally:
                lock.put(None)
        if self._released and exc is not None:
            # Released inside a block that is raising anyway: keep the block's exception.
            add_note = getattr(exc, "add_note", None)  # Python 3.11+
            if add_note is not None:
                add_note(f"bucketpool: {self._released_error('end of with block')}")
            return
        if pool._level:
            pool._check_escapes(self, sys._getframe(1), raising=exc_type is None)
        else:
            self.release()

    def release(self) -> None:
        """Give the buffer back to the pool.

        If an event recorded with `record_event` has not completed, the buffer is parked:
        it is not handed out again until every recorded event reports done.

        Raises:
            ReleaseError: the handle was already released; nothing changes.
            InFlightWriteError: (debug ``checks``) an earlier copy's descriptors were
                rewritten while it could read them; this release still took effect.
        """
        pool = self._pool
        events = self._events
        if events is not None:
            # Query outside the lock: an event is user code.
            events = [event for event in events if not event.query()]
        lock = pool._lock
        lock.get()
        try:
            if self._released:
                raise self._released_error("release")
            self._released = True
            block = self._block
            pool._active -= 1
            pool._active_bytes -= block.bucket.nbytes
            if pool._tracing:
                block.released_at = pool._site()
            if events:
                self._events = events
                block.bucket.parked.append(self)
            else:
                pool._retire(self)
        finally:
            lock.put(None)
        if pool._deferred:
            pool._raise_deferred()

    def record_event(self, event: CompletionEvent) -> None:
        """Keep the buffer out of reuse until *event* reports done.

        Record the event after the `swap_blocks_batch` call (or upload) that reads the
        descriptors.  Several events may be recorded; all must complete.  At debug level
        ``checks`` a checksum of the first ``n`` entries is taken here and verified when the
        events retire.

        Raises:
            ReleaseError: the handle has been released.
            TypeError: *event* has no ``query()`` method.
        """
        if self._released:
            raise self._released_error("record_event")
        if not callable(getattr(event, "query", None)):
            raise TypeError(
                f"record_event needs an object with a query() -> bool method "
                f"(torch.Event, torch.cuda.Event), got {type(event).__name__}"
            )
        pool = self._pool
        block = self._block
        if pool._level and block.checksum is not None and self._events:
            # Descriptors may change between copies, but not while an earlier one is in
            # flight: check the last checksum before this record replaces it.
            self._events = [earlier for earlier in self._events if not earlier.query()]
            if self._events and block.checksum != _checksum(block, self._n):
                pool._deferred.append(self._in_flight_error())
        if self._events is None:
            self._events = [event]
        else:
            self._events.append(event)
        if pool._level:
            block.checksum = _checksum(block, self._n)

    def add_copies(
        self,
        first: int,
        sources: _fill.IntegerInput,
        destinations: _fill.IntegerInput,
        byte_counts: _fill.IntegerInput | int,
    ) -> int:
        """Write copies into entries ``[first, first + k)`` and return ``first + k``.

        *sources* and *destinations* are numpy integer arrays, CPU integer tensors or
        sequences of ints of one length ``k``; *byte_counts* is the same or one int for every
        copy.  Addresses up to 2**64 - 1 are stored exactly (as their bit pattern in an int64
        pool).  A failed call writes nothing.

        Raises:
            ReleaseError: the handle has been released.
            IndexError: ``first + k > n``.
            ValueError: lengths differ, or a byte count is negative.
            TypeError: an input is not integer.
        """
        return _fill.add_copies(self.arrays, first, sources, destinations, byte_counts)

    def add_block_copies(
        self,
        first: int,
        src_base: int,
        dst_base: int,
        src_blocks: _fill.IntegerInput,
        dst_blocks: _fill.IntegerInput,
        block_bytes: int,
        *,
        total_bytes: int | None = None,
        coalesce: bool = True,
    ) -> int:
        """Write copies of whole blocks between two block-structured regions.

        Copy ``i`` moves *block_bytes* from ``src_base + src_blocks[i] * block_bytes`` to
        ``dst_base + dst_blocks[i] * block_bytes``.  With *coalesce*, runs where both block
        indices are consecutive become one descriptor.  *total_bytes* trims the last copy so
        that exactly that many bytes move.  Returns the next free entry.

        Raises:
            ReleaseError: the handle has been released.
            IndexError: the descriptors do not fit in ``[first, n)``.
            ValueError: bad lengths, block indices, block size or *total_bytes*.
            TypeError: an input is not integer.
        """
        return _fill.add_block_copies(
            self.arrays,
            first,
            src_base,
            dst_base,
            src_blocks,
            dst_blocks,
            block_bytes,
            total_bytes=total_bytes,
            coalesce=coalesce,
        )

    def __repr__(self) -> str:
        state = "released" if self._released else "live"
        where = "" if self._site is None else f" acquired at {_format_site(self._site)}"
        return f"<BufferHandle n={self._n} capacity={self.capacity} {state}{where}>"

    def _in_flight_error(self) -> InFlightWriteError:
        block = self._block
        released_at = block.released_at if self._released else None
        return InFlightWriteError(
            f"descriptors of {_describe(self._n, self._site, released_at)} changed between "
            "record_event() and the completion of its events: a copy in flight may have read "
            "the new values. Fill descriptors only before recording the event, or acquire "
            "another handle"
        )

    def _released_error(self, what: str) -> ReleaseError:
        block = self._block
        # The buffer's release site is this handle's unless a later acquire took it.
        mine = self._site is not None and block.acquired_at is self._site
        return ReleaseError(
            f"{what}: {_describe(self._n, self._site, block.released_at if mine else None)} "
            "was already released; acquire a new handle instead"
        )


@typing.final
class BucketPool:
    """A thread-safe pool of descriptor buffers in power-of-two capacity buckets.

    A request for ``n`` entries is served from the bucket of capacity
    ``bucket_capacity(n)``: the most recently released buffer of that bucket is reused,
    else one is allocated.  Released buffers are cached up to *max_cached_bytes* and
    *max_cached_per_bucket*; a bucket unused for *idle_trim_acquires* acquires gives its
    cached buffers back.

    Options left as `None` come from ``BUCKETPOOL_CONF`` (and ``BUCKETPOOL_DEBUG``) or the
    built-in defaults; explicit arguments win.

    Args:
        dtype: `torch.int64` (default) or `torch.uint64` (XPU's batched copy).
        device: where the buffers live; descriptors are read by the host, so only a CPU
            device is accepted.
        pin_memory: page-locked buffers, for non-blocking uploads of the descriptors.
        min_capacity: the smallest bucket, a power of two (default 16).
        max_capacity: the largest ``n`` accepted, a power of two (default 2**24).
        max_cached_bytes: bytes of idle buffers kept for reuse (default 64 MiB).
        max_cached_per_bucket: idle buffers kept per bucket (default 32).
        idle_trim_acquires: acquires after which an unused bucket is trimmed; 0 disables
            (default 1024).
        debug: ``"off"`` (default), ``"checks"`` or ``"strict"``; see the README.
        trace: record the full stack of every acquire, not only the file and line.

    Raises:
        TypeError: *dtype* is neither int64 nor uint64.
        ValueError: any other bad option, here or in the environment.
        RuntimeError: *pin_memory* without an accelerator.
    """

    # A plain __slots__ class rather than attrs: the settings are Final (read-only for
    # type checkers; the buckets are sized from them), and attrs' setattr hooks for frozen
    # fields would slow every counter update on the hot path.
    __slots__ = (
        "_active",
        "_active_bytes",
        "_active_bytes_peak",
        "_active_peak",
        "_allocated_bytes_peak",
        "_allocated_bytes_total",
        "_allocations_peak",
        "_allocations_total",
        "_blocks",
        "_buckets",
        "_cached_bytes",
        "_deferred",
        "_freed_bytes_total",
        "_freed_total",
        "_level",
        "_lock",
        "_min_k",
        "_next_sweep",
        "_orphans",
        "_requested_entries",
        "_tick",
        "_tracing",
        "debug",
        "device",
        "dtype",
        "idle_trim_acquires",
        "max_cached_bytes",
        "max_cached_per_bucket",
        "max_capacity",
        "min_capacity",
        "pin_memory",
        "trace",
    )

    dtype: Final[torch.dtype]
    device: Final[torch.device]
    pin_memory: Final[bool]
    min_capacity: Final[int]
    max_capacity: Final[int]
    max_cached_bytes: Final[int]
    max_cached_per_bucket: Final[int]
    idle_trim_acquires: Final[int]
    debug: Final[DebugLevel]
    trace: Final[bool]

    def __init__(
        self,
        *,
        dtype: torch.dtype = torch.int64,
        device: str | torch.device = "cpu",
        pin_memory: bool = False,
        min_capacity: int | None = None,
        max_capacity: int | None = None,
        max_cached_bytes: int | None = None,
        max_cached_per_bucket: int | None = None,
        idle_trim_acquires: int | None = None,
        debug: DebugLevel | None = None,
        trace: bool | None = None,
    ) -> None:
        if dtype not in (torch.int64, torch.uint64):
            raise TypeError(f"dtype must be torch.int64 or torch.uint64 (XPU), got {dtype!r}")
        self.dtype = dtype
        self.device = _host_device(device)
        if not isinstance(pin_memory, bool):
            raise ValueError(f"pin_memory must be a bool, got {pin_memory!r}")
        if pin_memory:
            _check_pinning()
        self.pin_memory = pin_memory
        settings: Settings = resolve_settings(
            {
                "min_capacity": min_capacity,
                "max_capacity": max_capacity,
                "max_cached_bytes": max_cached_bytes,
                "max_cached_per_bucket": max_cached_per_bucket,
                "idle_trim_acquires": idle_trim_acquires,
                "debug": debug,
                "trace": trace,
            }
        )
        self.min_capacity = settings.min_capacity
        self.max_capacity = settings.max_capacity
        self.max_cached_bytes = settings.max_cached_bytes
        self.max_cached_per_bucket = settings.max_cached_per_bucket
        self.idle_trim_acquires = settings.idle_trim_acquires
        self.debug = settings.debug
        self.trace = settings.trace
        self._level = ("off", "checks", "strict").index(settings.debug)
        self._tracing = self._level > 0 or settings.trace
        self._lock = _new_mutex()
        self._min_k = settings.min_capacity.bit_length() - 1
        self._buckets = [_Bucket(1 << k) for k in range(settings.max_capacity.bit_length())]
        self._blocks: set[_Block] = set()
        self._orphans: list[BufferHandle] = []
        self._deferred: list[PoolError] = []
        self._tick = 0
        self._next_sweep = self._sweep_interval()
        self._active = self._active_peak = 0
        self._active_bytes = self._active_bytes_peak = 0
        self._cached_bytes = 0
        self._allocations_peak = self._allocated_bytes_peak = 0
        self._allocations_total = self._allocated_bytes_total = 0
        self._freed_total = self._freed_bytes_total = 0
        self._requested_entries = 0

    def __repr__(self) -> str:
        settings = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in (
                "dtype",
                "pin_memory",
                "min_capacity",
                "max_capacity",
                "max_cached_bytes",
                "max_cached_per_bucket",
                "idle_trim_acquires",
                "debug",
                "trace",
            )
        )
        return f"BucketPool({settings})"

    # -- the hot path ---------------------------------------------------------------------

    def acquire(self, n: SupportsIndex) -> BufferHandle:
        """Return a handle on a buffer of at least *n* entries; its views have exactly *n*.

        Thread-safe.

        Args:
            n: the number of descriptors, an int (or numpy integer) from 0 to
                `max_capacity`.

        Raises:
            TypeError: *n* is a bool or not an integer.
            ValueError: *n* is negative or above `max_capacity`.
            UseAfterReleaseError: (debug ``checks``) the buffer about to be handed out was
                written after its release; it stays cached, re-poisoned.
            InFlightWriteError: (debug ``checks``) reported from an earlier retirement.
        """
        if type(n) is not int or n < 0 or n > self.max_capacity:
            n = check_count(n, self.max_capacity)
        bucket = self._buckets[(n - 1).bit_length() if n > self.min_capacity else self._min_k]
        if self._orphans or self._deferred:
            self._adopt_orphans()
            self._raise_deferred()
        lock = self._lock
        lock.get()
        try:
            self._tick = tick = self._tick + 1
            bucket.last_tick = tick
            free = bucket.free
            if free or (bucket.parked and self._retire_ready(bucket) and free):
                block = free.pop()
                if self._level:
                    self._check_poison(block, free)
                bucket.hits += 1
                nbytes = bucket.nbytes
                self._cached_bytes -= nbytes
                self._active = active = self._active + 1
                if active > self._active_peak:
                    self._active_peak = active
                self._active_bytes = active_bytes = self._active_bytes + nbytes
                if active_bytes > self._active_bytes_peak:
                    self._active_bytes_peak = active_bytes
                self._requested_entries += n
            else:
                block = None
            if tick >= self._next_sweep:
                self._sweep(tick)
        finally:
            lock.put(None)
        if block is None:
            block = self._allocate_active(bucket, n)
        handle = block.spare
        if handle is not None and sys.getrefcount(handle) == _SPARE_REFS:
            # Only the spare slot holds it (the check in __exit__ cannot tell the with
            # statement's reference from a caller's): nobody can observe the reuse.
            block.spare = None
        else:
            block.spare = None
            # Built without calling __init__: that Python call costs ~60 ns here.
            handle = _new_handle(BufferHandle)
            handle._pool = self
            handle._block = block
        handle._n = n
        handle._released = False
        handle._events = None
        handle._site = None
        if self._tracing:
            handle._site = block.acquired_at = self._site()
        return handle

    def release(self, handle: BufferHandle) -> None:
        """Release *handle*; the same as ``handle.release()``.

        Raises:
            ReleaseError: *handle* was not handed out by this pool, or was released already.
        """
        if not isinstance(handle, BufferHandle):
            raise TypeError(
                f"release takes a BufferHandle from acquire(), got {type(handle).__name__}"
            )
        if handle._pool is not self:
            raise ReleaseError(
                f"release: this handle (n={handle.n}) was handed out by another pool, "
                f"{handle._pool!r}; release it there"
            )
        handle.release()

    # -- explicit memory control ----------------------------------------------------------

    def reserve(self, n: SupportsIndex, count: int = 1) -> None:
        """Pre-allocate *count* cached buffers of *n*'s bucket, so first steps allocate nothing.

        Raises:
            TypeError, ValueError: a bad *n* (as for `acquire`) or *count*, or a reservation
                that the caps (`max_cached_bytes`, `max_cached_per_bucket`) would not keep.
        """
        size = check_count(n, self.max_capacity)
        _check_non_negative("count", count)
        bucket = self._bucket_for(size)
        with _Holding(self._lock):
            cached = len(bucket.free) + count
            cached_bytes = self._cached_bytes + count * bucket.nbytes
        if cached > self.max_cached_per_bucket or cached_bytes > self.max_cached_bytes:
            raise ValueError(
                f"reserve({size}, count={count}) would cache {cached} buffers "
                f"({cached_bytes:,} bytes) but max_cached_per_bucket="
                f"{self.max_cached_per_bucket} and max_cached_bytes={self.max_cached_bytes:,}; "
                "reserve fewer or raise the caps"
            )
        blocks = [self._new_block(bucket) for _ in range(count)]
        with _Holding(self._lock):
            bucket.last_tick = self._tick
            for block in blocks:
                self._count_allocation(block)
                self._cache(block)

    def trim(self, max_bytes: int = 0) -> int:
        """Free cached buffers until at most *max_bytes* stay cached; return bytes freed.

        Least recently used buckets are trimmed first.  Parked and active buffers are never
        freed.  Thread-safe.

        Raises:
            ValueError: *max_bytes* is negative or not an int.
        """
        _check_non_negative("max_bytes", max_bytes)
        with _Holding(self._lock):
            return self._trim_to(max_bytes, keep=None)

    def empty_cache(self) -> int:
        """Free every cached buffer (``trim(0)``); return bytes freed."""
        return self.trim(0)

    # -- deferred reuse -------------------------------------------------------------------

    def collect(self) -> int:
        """Retire every parked buffer whose events are all done; return how many.

        Raises:
            InFlightWriteError: (debug ``checks``) a retired buffer's descriptors changed
                while in flight; every done buffer was still retired.
        """
        self._adopt_orphans()
        with _Holding(self._lock):
            retired = sum(self._retire_ready(bucket) for bucket in self._buckets if bucket.parked)
        if self._deferred:
            self._raise_deferred()
        return retired

    def synchronize(self) -> None:
        """Wait for every parked buffer's events, then retire them all (for shutdown).

        Calls ``event.synchronize()`` where the event has it, else polls ``query()``.

        Raises:
            InFlightWriteError: (debug ``checks``), as for `collect`.
        """
        self._adopt_orphans()
        with _Holding(self._lock):
            parked = [handle for bucket in self._buckets for handle in bucket.parked]
        for handle in parked:
            for event in handle._events or ():
                wait = getattr(event, "synchronize", None)
                if callable(wait):
                    wait()
                while not event.query():
                    time.sleep(_POLL_SECONDS)
        with _Holding(self._lock):
            for bucket in self._buckets:
                if bucket.parked:
                    self._retire_ready(bucket)
        if self._deferred:
            self._raise_deferred()

    # -- knowing what is out --------------------------------------------------------------

    def outstanding(self) -> list[BufferHandle]:
        """Return the live handles (acquired, not released).

        With tracing on (a debug level, or ``trace=True``) each knows where it was acquired
        (`BufferHandle.acquired_at`).  The handles are found through the garbage collector's
        list of objects, so the hot path keeps no registry: this costs time in proportion
        to the objects in the process, and is meant for diagnostics and tests.
        """
        self._adopt_orphans()
        # Under the lock: a handle this returns must not be recycled by a concurrent
        # with-block exit (see BufferHandle.__exit__), and the list's reference prevents it.
        with _Holding(self._lock):
            idle = {id(block) for bucket in self._buckets for block in bucket.free}
            idle.update(id(handle._block) for bucket in self._buckets for handle in bucket.parked)
            active = [block for block in self._blocks if id(block) not in idle]
            if not active:
                return []
            return [
                referrer
                for referrer in gc.get_referrers(*active)
                if type(referrer) is BufferHandle
                and referrer._pool is self
                and not referrer._released
            ]

    def stats(self) -> PoolStats:
        """Return a consistent snapshot of the counters (see `PoolStats`)."""
        self._adopt_orphans()
        with _Holding(self._lock):
            buckets = [b for b in self._buckets if b.hits or b.misses or b.allocated]
            allocations = sum(b.allocated for b in buckets)
            allocated_bytes = sum(b.allocated * b.nbytes for b in buckets)
            acquires = sum(b.hits + b.misses for b in buckets)
            acquired_bytes = sum((b.hits + b.misses) * b.nbytes for b in buckets)
            parked = sum(len(b.parked) for b in buckets)
            return PoolStats(
                allocations=Stat(
                    allocations,
                    self._allocations_peak,
                    self._allocations_total,
                    self._freed_total,
                ),
                allocated_bytes=Stat(
                    allocated_bytes,
                    self._allocated_bytes_peak,
                    self._allocated_bytes_total,
                    self._freed_bytes_total,
                ),
                active_requests=Stat(
                    self._active, self._active_peak, acquires, acquires - self._active
                ),
                active_bytes=Stat(
                    self._active_bytes,
                    self._active_bytes_peak,
                    acquired_bytes,
                    acquired_bytes - self._active_bytes,
                ),
                cached_bytes=self._cached_bytes,
                parked_bytes=sum(len(b.parked) * b.nbytes for b in buckets),
                parked=parked,
                hits=sum(b.hits for b in buckets),
                misses=sum(b.misses for b in buckets),
                requested_entries=self._requested_entries,
                rounded_entries=sum((b.hits + b.misses) * b.capacity for b in buckets),
                buckets=tuple(
                    BucketStats(
                        capacity=b.capacity,
                        hits=b.hits,
                        misses=b.misses,
                        cached=len(b.free),
                        active=b.allocated - len(b.free) - len(b.parked),
                        parked=len(b.parked),
                    )
                    for b in buckets
                ),
            )

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value."""
        with _Holding(self._lock):
            self._active_peak = self._active
            self._active_bytes_peak = self._active_bytes
            self._allocations_peak = sum(b.allocated for b in self._buckets)
            self._allocated_bytes_peak = sum(b.allocated * b.nbytes for b in self._buckets)

    def bucket_capacity(self, n: SupportsIndex) -> int:
        """Return the capacity of the bucket that serves *n* in this pool.

        Raises:
            TypeError, ValueError: as for `acquire`.
        """
        return self._bucket_for(check_count(n, self.max_capacity)).capacity

    # -- internals (the lock is held where a name says so) --------------------------------

    def _bucket_for(self, n: int) -> _Bucket:
        return self._buckets[(n - 1).bit_length() if n > self.min_capacity else self._min_k]

    def _new_block(self, bucket: _Bucket) -> _Block:
        # Allocated outside the lock: pinning can take milliseconds.  One tensor per field,
        # so that the pinned allocator's power-of-two rounding adds no waste.
        tensors = tuple(
            torch.empty(bucket.capacity, dtype=self.dtype, pin_memory=self.pin_memory)
            for _ in range(_FIELDS)
        )
        return _Block(bucket, tensors)

    def _allocate_active(self, bucket: _Bucket, n: int) -> _Block:
        """The miss path of `acquire`: allocate, then count the miss and the new buffer."""
        block = self._new_block(bucket)
        with _Holding(self._lock):
            bucket.misses += 1
            self._count_allocation(block)
            self._active += 1
            self._active_peak = max(self._active_peak, self._active)
            self._active_bytes += bucket.nbytes
            self._active_bytes_peak = max(self._active_bytes_peak, self._active_bytes)
            self._requested_entries += n
        return block

    def _count_allocation(self, block: _Block) -> None:
        """(lock held) Account a buffer that was just allocated."""
        bucket = block.bucket
        self._blocks.add(block)
        bucket.allocated += 1
        self._allocations_total += 1
        self._allocated_bytes_total += bucket.nbytes
        allocations = sum(b.allocated for b in self._buckets)
        allocated_bytes = self._allocated_bytes_total - self._freed_bytes_total
        self._allocations_peak = max(self._allocations_peak, allocations)
        self._allocated_bytes_peak = max(self._allocated_bytes_peak, allocated_bytes)

    def _retire(self, handle: BufferHandle) -> None:
        """(lock held) A released handle's events are done: verify, then cache its buffer."""
        block = handle._block
        if block.checksum is not None and block.checksum != _checksum(block, handle._n):
            self._deferred.append(handle._in_flight_error())
        handle._events = None
        block.checksum = None
        self._cache(block)

    def _cache(self, block: _Block) -> None:
        """(lock held) Keep an idle buffer for reuse, or free it if a cap says so."""
        bucket = block.bucket
        if self._level:
            _poison(block)
        if (
            len(bucket.free) < self.max_cached_per_bucket
            and self._cached_bytes + bucket.nbytes <= self.max_cached_bytes
        ):
            bucket.free.append(block)
            self._cached_bytes += bucket.nbytes
            return
        cached = len(bucket.free)
        if (
            cached < self.max_cached_per_bucket
            and (cached + 1) * bucket.nbytes <= self.max_cached_bytes
        ):
            # Over the byte cap, but it fits once the least recently used other buckets
            # make room (evicting them otherwise would free buffers for nothing).
            self._trim_to(self.max_cached_bytes - bucket.nbytes, keep=bucket)
            bucket.free.append(block)
            self._cached_bytes += bucket.nbytes
            return
        self._free(block)

    def _free(self, block: _Block) -> None:
        """(lock held) Drop a buffer that is no longer cached; its memory goes back."""
        # The kept handle refers to the block: break that cycle, or the memory would wait
        # for the garbage collector.
        block.spare = None
        bucket = block.bucket
        bucket.allocated -= 1
        self._freed_total += 1
        self._freed_bytes_total += bucket.nbytes
        self._blocks.discard(block)

    def _trim_to(self, max_bytes: int, keep: _Bucket | None) -> int:
        """(lock held) Free cached buffers, LRU bucket first, down to *max_bytes*."""
        freed = 0
        for bucket in sorted(self._buckets, key=lambda b: b.last_tick):
            while bucket.free and bucket is not keep and self._cached_bytes > max_bytes:
                freed += self._uncache(bucket)
        return freed

    def _uncache(self, bucket: _Bucket) -> int:
        """(lock held) Free *bucket*'s least recently released cached buffer; return bytes."""
        self._free(bucket.free.popleft())
        self._cached_bytes -= bucket.nbytes
        return bucket.nbytes

    def _sweep(self, tick: int) -> None:
        """(lock held) Retire done parked buffers; trim buckets idle for too long."""
        self._next_sweep = tick + self._sweep_interval()
        if not self.idle_trim_acquires:
            return
        for bucket in self._buckets:
            if bucket.parked:
                self._retire_ready(bucket)
            if bucket.free and tick - bucket.last_tick >= self.idle_trim_acquires:
                while bucket.free:
                    self._uncache(bucket)

    def _sweep_interval(self) -> int:
        # An idle bucket is trimmed at most idle_trim_acquires * 5 / 4 acquires after its
        # last use, and the sweep costs ~1 ns an acquire amortised.
        return max(1, self.idle_trim_acquires // 4) if self.idle_trim_acquires else 1 << 62

    def _retire_ready(self, bucket: _Bucket) -> int:
        """(lock held) Retire the parked handles of *bucket* whose events are done."""
        ready = [handle for handle in bucket.parked if _all_done(handle)]
        if ready:
            bucket.parked = [handle for handle in bucket.parked if handle._events]
            for handle in ready:
                self._retire(handle)
        return len(ready)

    def _adopt_orphans(self) -> None:
        """Release the handles that were garbage-collected unreleased."""
        while self._orphans:
            try:
                handle = self._orphans.pop()
            except IndexError:  # another thread took the last one
                return
            if not handle._released:
                handle.release()

    def _raise_deferred(self) -> None:
        if not self._deferred:
            return
        with _Holding(self._lock):
            error = self._deferred.pop(0) if self._deferred else None
        if error is not None:
            raise error

    def _site(self) -> _Site:
        """Where the caller outside this package is (file and line, or the whole stack)."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            frame = frame.f_back
        if frame is None:
            return None
        if self.trace:
            return traceback.extract_stack(frame)
        return (frame.f_code.co_filename, frame.f_lineno)

    def _check_poison(self, block: _Block, free: collections.deque[_Block]) -> None:
        """(lock held) Verify a cached buffer's poison before handing it out."""
        if _poisoned(block):
            return
        _poison(block)
        free.append(block)
        raise UseAfterReleaseError(
            f"a buffer of capacity {block.bucket.capacity} was written after its release, "
            f"through a stale view of {_describe(None, block.acquired_at, block.released_at)}. "
            "Keep views only inside the handle's with block; the buffer was re-poisoned and "
            "kept, and the next acquire can proceed"
        )

    def _check_escapes(self, handle: BufferHandle, frame: FrameType, raising: bool) -> None:
        """Release *handle* at the end of its with block, then report escaped views.

        At ``strict`` this raises, unless the block is already raising (*raising* false):
        then it warns, so that the block's own exception is not hidden.
        """
        escaped = _escaped_views(handle._block, handle._n, frame)
        handle.release()
        if not escaped:
            return
        message = (
            f"views of {_describe(handle._n, handle._site, None)} are still "
            f"referenced after its with block: {', '.join(escaped)} (or a view kept from an "
            "earlier handle of the same buffer). The buffer is reused by later acquires; "
            "copy the data out (tensor.clone()) instead of keeping views"
        )
        if self._level >= 2 and raising:
            raise EscapedViewError(message)
        warnings.warn(message, ResourceWarning, stacklevel=3)


def _all_done(handle: BufferHandle) -> bool:
    events = handle._events
    if events:
        handle._events = events = [event for event in events if not event.query()]
    return not events


def _check_non_negative(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def _host_device(device: str | torch.device) -> torch.device:
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device {device!r} is not a torch device: {error}") from None
    if resolved.type != "cpu":
        raise ValueError(
            f"device must be 'cpu', got {device!r}: swap_blocks_batch reads descriptors from "
            "host memory; use pin_memory=True for fast non-blocking uploads"
        )
    return resolved


def _check_pinning() -> None:
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError as error:
        raise RuntimeError(
            "pin_memory=True needs an accelerator (CUDA, ROCm, XPU, ...) and none is "
            f"available here ({error}); use pin_memory=False on this machine"
        ) from None


def _checksum(block: _Block, n: int) -> int:
    checksum = 0
    for array in block.arrays:
        checksum = zlib.crc32(array[:n].data, checksum)
    return checksum


def _poison(block: _Block) -> None:
    src, dst, sizes = block.arrays
    src.view(np.uint64)[:] = POISON
    dst.view(np.uint64)[:] = POISON
    sizes[:] = 0


def _poisoned(block: _Block) -> bool:
    src, dst, sizes = block.arrays
    return bool(
        (src.view(np.uint64) == POISON).all()
        and (dst.view(np.uint64) == POISON).all()
        and not sizes.any()
    )


def _escaped_views(block: _Block, n: int, frame: FrameType) -> list[str]:
    """Name the views of *block* that something other than the running code holds.

    The running code is *frame* and its callers: their local variables (and a module's
    globals) are how views are used inside a with block.  Anything else that refers to a
    view -- a list, an object, a closure cell, a suspended generator, a tensor sliced from a
    view and kept -- outlives the block.  Found through the garbage collector's referrers
    and PyTorch's storage use counts: exact, and slow, which is why only debug levels do it.
    """
    views = block.views
    arrays = block.view_arrays if block.arrays_n == n else ()
    names = {id(views): "the DescriptorBuffers tuple"}
    for name, view in zip(DescriptorBuffers._fields, views, strict=True):
        names[id(view)] = name
    for name, array in zip(DescriptorBuffers._fields, arrays, strict=False):  # () if not cut
        names[id(array)] = f"the numpy array of {name}"
    running: list[FrameType] = []
    caller: FrameType | None = frame
    while caller is not None:
        running.append(caller)
        caller = caller.f_back
    namespaces = [caller.f_locals for caller in running] + [caller.f_globals for caller in running]
    ignored = {id(block), id(views), id(block.view_arrays), id(block.alias)}
    ignored.update(id(caller) for caller in running)
    ignored.update(id(namespace) for namespace in namespaces)
    targets = (views, *views, *arrays)
    escaped: list[str] = []
    for referrer in gc.get_referrers(*targets):
        if id(referrer) in ignored or (
            # the argument tuple of the get_referrers call itself
            type(referrer) is tuple
            and len(referrer) == len(targets)
            and all(a is b for a, b in zip(referrer, targets, strict=True))
        ):
            continue
        for referent in gc.get_referents(referrer):
            held = names.get(id(referent))
            if held is not None and held not in escaped:
                escaped.append(held)
    if _storage_use_count is not None:
        for i, name in enumerate(DescriptorBuffers._fields):
            storage = views[i].untyped_storage()
            # The full tensor, its numpy array, the view, `storage` here, and tensors that
            # the running code holds in variables.
            expected = 4 + _tensors_sharing(namespaces, views[i])
            if _storage_use_count(storage._cdata) > expected:
                escaped.append(f"a tensor derived from {name}")
    return escaped


def _tensors_sharing(namespaces: list[dict[str, object]], view: torch.Tensor) -> int:
    """Count the tensors other than *view* in *namespaces* that share *view*'s storage."""
    # A function of its own: a generator expression in `_escaped_views` would keep the
    # views in closure cells, which the garbage collector reports as referrers.
    data = view.untyped_storage().data_ptr()
    return sum(
        1
        for namespace in namespaces
        for value in list(namespace.values())
        if isinstance(value, torch.Tensor)
        and value is not view
        and value.untyped_storage().data_ptr() == data
    )


def _format_site(site: _Site) -> str:
    if site is None:
        return "<unknown: set debug='checks' or BUCKETPOOL_DEBUG=checks to record sites>"
    if isinstance(site, traceback.StackSummary):
        return "\n" + "".join(site.format())
    return f"{site[0]}:{site[1]}"


def _describe(n: int | None, acquired: _Site, released: _Site) -> str:
    """Say which handle: ``a handle (n=5, acquired at f.py:3, released at f.py:9)``."""
    parts = [] if n is None else [f"n={n}"]
    if acquired is not None:
        parts.append(f"acquired at {_format_site(acquired)}")
    if released is not None:
        parts.append(f"released at {_format_site(released)}")
    return f"a handle ({', '.join(parts)})" if parts else "a handle"
