"""The pool: which buffer is where, who holds it, and the lock that says so.

The life of a buffer
--------------------
A buffer is three tensors of one power-of-two capacity.  It is, at every moment, in exactly
one of these places:

* **free** -- in its bucket's free list, ready to hand out (LIFO: the warmest first);
* **held** -- handed out.  ``buffer.token`` is the token of that hand-out, a number never
  used before; the `BufferHandle` carries the same token.  Only a release whose token
  matches, checked under the lock, ends the hand-out, so a stale, copied or forged handle
  releases nothing;
* **parked** -- released while a recorded event was pending.  Parked buffers wait in one
  FIFO in release order (events on one stream complete in order), and leave it, through the
  same checks as a release, when all their events report done;
* **freed** -- dropped by a cap, a trim or idle trimming; its memory goes back at once.

The locking rule
----------------
One `threading.RLock` per pool, always taken with ``with``, guards every field of the pool
and of its buckets, and each buffer's ``token``, ``n``, ``events`` and ``parked`` fields.
No user code runs under it: ``event.query()`` and warnings run before the lock is taken or
after it is let go.  Code that the garbage collector or a signal handler can run at any
moment (a handle's finaliser, the exit of a ``with`` block in a collected generator) may
find its own thread inside the lock; it never waits for it then.  The lock knows its owner
(``_is_owned()``, which `threading.Condition` relies on too), so such a release goes to
``_inbox``, which the next operation drains: the lock is an RLock for that test alone and
is never re-entered.  No decision rests on reference counts, the garbage collector's view of
the heap, or the GIL: the pool stays correct on a free-threaded build.

Signals: a signal handler runs, and may raise (``KeyboardInterrupt``), only where the
interpreter checks for it: at a function's entry, on a loop's backward jump, after a call.
So a buffer changes place only in a *move* (the methods under "the moves", and the hand-out
and release fast path spelled out in place): straight-line code that calls nothing but, as
its last step, one container method.  Everything that may call out (verifying, making room,
poisoning) comes before the move and moves nothing, so an exception lands before a move or
after it, and a buffer is always in exactly one place.  The holder (handle or compat tuple)
is bound inside the hand-out's move, so an acquire interrupted after it leaves a dropped
holder, whose finaliser brings the buffer back.

Fork: every pool's lock is taken around ``os.fork()``, so a child never inherits a pool in
the middle of a change.  The child inherits the cached and parked buffers and the records of
what is out; buffers that other threads of the parent held stay out in the child.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
import typing
import warnings
import weakref
from collections.abc import Callable
from typing import Protocol, SupportsIndex

import torch

from bucketpool import _debug
from bucketpool._buckets import as_index, check_count
from bucketpool._buffer import FIELDS, Bucket, Buffer
from bucketpool._errors import InFlightWriteError, LeakWarning, PoolError, ReleaseError
from bucketpool._handle import BufferHandle, CompletionEvent
from bucketpool._parking import Entry, ParkingLot, all_done, wait
from bucketpool._settings import DebugLevel, Settings, resolve_settings
from bucketpool._stats import OutstandingBuffer, PoolStats, build_stats

__all__ = ["BucketPool"]

#: Parked buffers an acquire looks at before it allocates: enough to retire the buffers of
#: the steps that finished since the last look, and a bound on the cost whatever is parked.
_POLL_BUDGET = 4

_new_handle = object.__new__
_empty = torch.empty


#: A release the lock could not take at once: (buffer, token, leaked).
_Deferred = tuple[Buffer, int, bool]


class _Holder(Protocol):
    """What a compat adapter's tuple records of its hand-out (see `BucketPool._lease`)."""

    _token: int
    _pool: BucketPool | None
    _buffer: Buffer | None


@typing.final
class BucketPool:
    """A thread-safe pool of descriptor buffers in power-of-two capacity buckets.

    A request for ``n`` entries is served from the bucket of capacity
    ``bucket_capacity(n)``: the most recently released buffer of that bucket is reused,
    else one is allocated.  Released buffers are cached up to *max_cached_bytes* and
    *max_cached_per_bucket*; a bucket unused for *idle_trim_acquires* acquires gives its
    cached buffers back.

    Options left as `None` come from ``BUCKETPOOL_CONF`` (and ``BUCKETPOOL_DEBUG``) or the
    built-in defaults; explicit arguments win.  The resolved options are `settings`.

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

    # A plain __slots__ class: attrs' hooks would cost time on every counter update.
    __slots__ = (
        "__weakref__",
        "_active",
        "_active_bytes",
        "_active_bytes_peak",
        "_active_peak",
        "_allocated_bytes_peak",
        "_allocated_bytes_total",
        "_allocations_peak",
        "_allocations_total",
        "_buckets",
        "_cached_bytes",
        "_freed_bytes_total",
        "_freed_total",
        "_full_stack",
        "_held",
        "_inbox",
        "_leak_sites",
        "_leaks",
        "_level",
        "_lock",
        "_max_cached_bytes",
        "_max_cached_per_bucket",
        "_max_capacity",
        "_min_capacity",
        "_min_k",
        "_next_sweep",
        "_parked",
        "_requested_entries",
        "_settings",
        "_tick",
        "_tracing",
    )

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
        settings = resolve_settings(
            {
                "dtype": dtype,
                "device": device,
                "pin_memory": pin_memory,
                "min_capacity": min_capacity,
                "max_capacity": max_capacity,
                "max_cached_bytes": max_cached_bytes,
                "max_cached_per_bucket": max_cached_per_bucket,
                "idle_trim_acquires": idle_trim_acquires,
                "debug": debug,
                "trace": trace,
            }
        )
        self._settings = settings
        self._min_capacity = settings.min_capacity
        self._max_cached_per_bucket = settings.max_cached_per_bucket
        self._max_cached_bytes = settings.max_cached_bytes
        self._max_capacity = settings.max_capacity
        self._min_k = settings.min_capacity.bit_length() - 1
        self._level = ("off", "checks", "strict").index(settings.debug)
        self._tracing = self._level > 0 or settings.trace
        self._full_stack = settings.trace
        # An RLock only for its owner test (`_is_owned`): the pool never re-enters it.
        self._lock = threading.RLock()
        self._inbox: collections.deque[_Deferred] = collections.deque()
        self._buckets = [Bucket(1 << k) for k in range(settings.max_capacity.bit_length())]
        self._held: dict[Buffer, None] = {}  # a set whose add and remove call nothing
        self._parked = ParkingLot()
        self._tick = 0
        self._next_sweep = self._sweep_interval()
        self._active = self._active_peak = 0
        self._active_bytes = self._active_bytes_peak = 0
        self._cached_bytes = 0
        self._allocations_peak = self._allocated_bytes_peak = 0
        self._allocations_total = self._allocated_bytes_total = 0
        self._freed_total = self._freed_bytes_total = 0
        self._requested_entries = 0
        self._leaks = 0
        self._leak_sites: set[tuple[str, int] | int] = set()
        _pools.add(self)

    @property
    def settings(self) -> Settings:
        """The pool's resolved options (read-only)."""
        return self._settings

    def __repr__(self) -> str:
        s = self._settings
        return (
            f"<BucketPool at {id(self):#x} dtype={s.dtype} debug={s.debug!r} "
            f"max_cached_bytes={s.max_cached_bytes:,}>"
        )

    def __copy__(self) -> typing.NoReturn:
        raise TypeError(_NO_COPY)

    def __deepcopy__(self, memo: object) -> typing.NoReturn:
        raise TypeError(_NO_COPY)

    def __reduce_ex__(self, protocol: SupportsIndex) -> typing.NoReturn:
        raise TypeError(_NO_COPY)

    # -- acquire ----------------------------------------------------------------------------

    def acquire(self, n: SupportsIndex) -> BufferHandle:
        """Return a handle on a buffer of at least *n* entries; its views have exactly *n*.

        Thread-safe.

        Args:
            n: the number of descriptors, an int (or numpy integer) from 0 to
                ``settings.max_capacity``.

        Raises:
            TypeError: *n* is a bool or not an integer.
            ValueError: *n* is negative or above ``settings.max_capacity``.
            PoolError: called from a finaliser or signal handler that interrupted this same
                thread inside the pool.
        """
        # The handle exists before the hand-out and is filled in under the lock: from then on
        # its finaliser owns the buffer, also when an exception (a signal handler's
        # KeyboardInterrupt) unwinds this call before it returns.
        handle = _new_handle(BufferHandle)
        handle._pool = self
        self._lease(n, handle)
        return handle

    def _lease(
        self,
        n: SupportsIndex,
        handle: BufferHandle | None,
        make: Callable[[Buffer], _Holder] | None = None,
    ) -> _Holder | None:
        """Hand a buffer out for *n* entries: the one hand-out path (`acquire`, compat).

        The holder is bound inside the lock, so that from then on its finaliser owns the
        buffer: *handle*, or (compat) the tuple kept with the buffer, made by *make* when it
        has none.  Returns that tuple (None for a handle).
        """
        if type(n) is not int or n < 0 or n > self._max_capacity:
            n = check_count(n, self._max_capacity)
        bucket = self._buckets[(n - 1).bit_length() if n > self._min_capacity else self._min_k]
        if self._inbox:
            self._drain()
        lock = self._lock
        if lock._is_owned():  # type: ignore[attr-defined]
            raise _reentered("acquire")  # `_outside`, inlined on the hot path
        fresh: Buffer | None = None
        held: _Holder | None = None
        while True:
            with lock:
                free = bucket.free
                if fresh is not None:
                    # Counted and taken in this one section: nobody sees it cached.
                    self._cache_new(fresh, miss=True)
                    fresh = None
                if free:
                    buffer = free[-1]
                    if make is not None:
                        held = typing.cast("_Holder | None", buffer.kept)
                        if held is None:  # may be interrupted: nothing has moved yet
                            held = buffer.kept = make(buffer)
                    # The one hand-out: a move (see "The locking rule"), ending with the
                    # buffer recorded as held and off the free list.
                    self._tick = token = self._tick + 1
                    bucket.last_tick = token
                    bucket.takes += 1
                    buffer.token = token
                    buffer.n = n
                    if handle is not None:
                        handle._buffer = buffer
                        handle._token = token
                        handle._n = n
                    elif held is not None:
                        held._token = token
                        held._pool = self
                        held._buffer = buffer
                        buffer.kept = None  # the holder's own until it releases
                    self._active = active = self._active + 1
                    if active > self._active_peak:
                        self._active_peak = active
                    self._active_bytes = active_bytes = self._active_bytes + bucket.nbytes
                    if active_bytes > self._active_bytes_peak:
                        self._active_bytes_peak = active_bytes
                    self._cached_bytes -= bucket.nbytes
                    self._requested_entries += n
                    self._held[buffer] = None
                    free.pop()  # last: a signal handler may run after a call
                    break
            fresh = self._refill(bucket)
        if self._level:
            self._check_poison(buffer)
        if token >= self._next_sweep:
            self._maintain(token)
        if self._tracing:
            buffer.site = _debug.site(self._full_stack)
        return held

    def _refill(self, bucket: Bucket) -> Buffer | None:
        """The bucket had nothing free: retire finished parked buffers, else allocate one.

        Returns the new buffer, for `_lease` to count and hand out under its lock, or None
        when polling put buffers back on the free list.
        """
        if self._parked.count:
            self._poll()
            with self._lock:
                if bucket.free:
                    return None
        return self._new_buffer(bucket)  # outside the lock: pinning can take milliseconds

    def _new_buffer(self, bucket: Bucket) -> Buffer:
        # One tensor per field, so that the pinned allocator's power-of-two rounding adds no
        # waste.  `_empty` was bound at import: a test that patches `torch.empty` to watch
        # its own code's allocations does not hand the pool mock tensors.
        s = self._settings
        tensors = tuple(
            _empty(bucket.capacity, dtype=s.dtype, pin_memory=s.pin_memory) for _ in range(FIELDS)
        )
        return Buffer(bucket, tensors, self._level == 2)

    def _cache_new(self, buffer: Buffer, miss: bool) -> None:
        """(lock held; a move) Account a new buffer and cache it (for an acquire: a miss)."""
        bucket = buffer.bucket
        bucket.last_tick = self._tick  # not idle: the idle sweep must leave it be
        if miss:
            bucket.misses += 1
        bucket.allocated += 1
        self._allocations_total += 1
        self._allocated_bytes_total += bucket.nbytes
        allocations = self._allocations_total - self._freed_total
        allocated_bytes = self._allocated_bytes_total - self._freed_bytes_total
        if allocations > self._allocations_peak:
            self._allocations_peak = allocations
        if allocated_bytes > self._allocated_bytes_peak:
            self._allocated_bytes_peak = allocated_bytes
        self._cached_bytes += bucket.nbytes
        bucket.free.append(buffer)

    # -- release ----------------------------------------------------------------------------

    def release(self, handle: BufferHandle) -> None:
        """Release *handle*; the same as ``handle.release()``.

        Raises:
            TypeError: *handle* is not a `BufferHandle`.
            ReleaseError: *handle* was handed out by another pool, or was released already;
                nothing changes.
        """
        if type(handle) is not BufferHandle:
            raise TypeError(
                f"release takes a BufferHandle from acquire(), got {type(handle).__name__}"
            )
        if not hasattr(handle, "_buffer"):
            raise ReleaseError(
                "release: this handle was never handed out (made without acquire()); release "
                "only what acquire() returned"
            )
        if handle._pool is not self:
            raise ReleaseError(
                f"release: this handle (n={handle.n}) was handed out by another pool, "
                f"{handle._pool!r}, not {self!r}; release it there (or call handle.release())"
            )
        handle.release()

    def _release(self, buffer: Buffer, token: int, keep: _Holder | None = None) -> bool:
        """End the hand-out *token* of *buffer*; the one release path.

        Every release comes here: a handle's `release` and ``with`` exit, the compat
        adapters; leak recovery goes through the inbox to `_take_back`, as this does.
        *keep* (a compat adapter's tuple) stays with the buffer for its next holder; the
        move that caches or parks the buffer clears the tuple's record of the hand-out.
        Returns False, changing nothing, when the hand-out was over already.  Raises,
        after the release took effect, what an event's ``query()`` raised, or (debug
        levels) `InFlightWriteError`.
        """
        if buffer.token != token:  # tokens never come back: a mismatch is final
            return False
        if self._lock._is_owned():  # type: ignore[attr-defined]
            # A finaliser or signal handler that interrupted this thread inside the pool:
            # no waiting, and no user code; the next operation takes it back.  The lock is
            # this thread's, so the token can move to the pending mark (-token) at once: the
            # hand-out is over for every later look (`released`, a second release), and
            # the drain takes back the buffer whose token is still that mark.
            buffer.token = -token
            self._inbox.append((buffer, -token, False))
            return True
        events = buffer.events  # only the holder writes them, and the holder is calling
        pending: list[CompletionEvent] | None = None
        error: Exception | None = None
        if events:
            try:
                pending = [event for event in events if not event.query()]
            except Exception as exc:  # user code: the buffer stays parked, the error is theirs
                pending, error = list(events), exc
        released_at = _debug.site(self._full_stack) if self._tracing else None
        with self._lock:
            if buffer.token != token:
                return False
            bucket = buffer.bucket
            if (
                pending is None
                and released_at is None
                and not self._level
                and len(bucket.free) < self._max_cached_per_bucket
                and self._cached_bytes + bucket.nbytes <= self._max_cached_bytes
            ):
                # The common case of `_take_back`, spelled out (the move `_cache_held`,
                # without its call): no events, no checks, and the cache has room.
                del self._held[buffer]
                buffer.token = 0
                buffer.events = None
                if keep is not None:
                    keep._buffer = keep._pool = None  # kept with the buffer: no cycle
                buffer.kept = keep
                self._active -= 1
                self._active_bytes -= bucket.nbytes
                self._cached_bytes += bucket.nbytes
                bucket.free.append(buffer)
                return True
            buffer.released_at = released_at
            problem = self._take_back(buffer, pending, keep)
        if error is not None:
            raise error
        if problem is not None:
            raise InFlightWriteError(problem)
        return True

    def _take_back(
        self, buffer: Buffer, pending: list[CompletionEvent] | None, keep: _Holder | None = None
    ) -> str | None:
        """(lock held) End *buffer*'s hand-out: park it, or retire it (cache or free).

        Everything that calls out comes first and moves nothing; then one move.  Returns
        the in-flight-write problem found at retirement (debug levels), if any.
        """
        if buffer.handed_arrays:
            buffer.end_hand_out()
        if pending:
            self._park_held(buffer, pending, keep)
            return None
        problem, cache = self._prepare_retire(buffer)
        if cache:
            self._cache_held(buffer, keep)
        else:
            self._free_held(buffer, keep)
        return problem

    def _prepare_retire(self, buffer: Buffer) -> tuple[str | None, bool]:
        """(lock held) Verify *buffer* before it retires; say if it is cached or freed.

        Verifies at the debug levels; returns the problem found and True when the buffer
        is to be cached (room made, by freeing least recently used others) or False when
        it is to be freed.  Moves no buffer but those others.
        """
        problem = self._verify(buffer) if self._level else None
        bucket = buffer.bucket
        s = self._settings
        cached = len(bucket.free)
        if cached >= s.max_cached_per_bucket:
            return problem, False
        if self._cached_bytes + bucket.nbytes > s.max_cached_bytes:
            if (cached + 1) * bucket.nbytes > s.max_cached_bytes:
                return problem, False  # cannot fit even alone: evicting others is no use
            # It fits once the least recently used other buckets make room.
            self._trim_to(s.max_cached_bytes - bucket.nbytes, keep=bucket)
        return problem, True

    # -- the moves ----------------------------------------------------------------------------
    # Each takes a buffer from one place to another in code that calls nothing (or, last,
    # one container method), so that a signal handler's exception is raised before a move
    # or after it, never inside (see "The locking rule").  All run with the lock held.

    def _cache_held(self, buffer: Buffer, keep: _Holder | None) -> None:
        """Held -> free, *keep* (if any) kept with it."""
        bucket = buffer.bucket
        del self._held[buffer]
        buffer.token = 0
        buffer.events = None
        if keep is not None:
            keep._buffer = keep._pool = None
        buffer.kept = keep
        self._active -= 1
        self._active_bytes -= bucket.nbytes
        self._cached_bytes += bucket.nbytes
        bucket.free.append(buffer)

    def _free_held(self, buffer: Buffer, keep: _Holder | None) -> None:
        """Held -> freed; *keep* (if any) no longer refers to it."""
        bucket = buffer.bucket
        del self._held[buffer]
        buffer.token = 0
        buffer.events = None
        if keep is not None:
            keep._buffer = keep._pool = None
        self._active -= 1
        self._active_bytes -= bucket.nbytes
        bucket.allocated -= 1
        self._freed_total += 1
        self._freed_bytes_total += bucket.nbytes

    def _park_held(
        self, buffer: Buffer, pending: list[CompletionEvent], keep: _Holder | None
    ) -> None:
        """Held -> parked until every event in *pending* is done, *keep* kept with it."""
        bucket = buffer.bucket
        parked = self._parked
        del self._held[buffer]
        buffer.token = 0
        if keep is not None:
            keep._buffer = keep._pool = None
        buffer.kept = keep
        buffer.events = pending
        buffer.parked = True
        self._active -= 1
        self._active_bytes -= bucket.nbytes
        parked.count += 1
        parked.queue.append((buffer, pending))

    def _cache_parked(self, buffer: Buffer) -> None:
        """Parked -> free."""
        bucket = buffer.bucket
        buffer.parked = False
        buffer.events = None
        self._parked.count -= 1
        self._cached_bytes += bucket.nbytes
        bucket.free.append(buffer)

    def _free_parked(self, buffer: Buffer) -> None:
        """Parked -> freed."""
        bucket = buffer.bucket
        buffer.parked = False
        buffer.events = None
        self._parked.count -= 1
        bucket.allocated -= 1
        self._freed_total += 1
        self._freed_bytes_total += bucket.nbytes

    def _uncache(self, bucket: Bucket) -> int:
        """Free -> freed: *bucket*'s least recently released cached buffer; return bytes."""
        self._cached_bytes -= bucket.nbytes
        bucket.allocated -= 1
        self._freed_total += 1
        self._freed_bytes_total += bucket.nbytes
        bucket.free.popleft()
        return bucket.nbytes

    def _verify(self, buffer: Buffer) -> str | None:
        """(lock held, debug levels) Check the in-flight checksum, then poison the buffer."""
        problem = None
        if buffer.checksum is not None:
            if buffer.checksum != _debug.checksum(buffer.arrays, buffer.n):
                which = _debug.describe(buffer.n, buffer.site, buffer.released_at)
                problem = (
                    f"the descriptors of {which} changed between record_event() and the "
                    "completion of its events: a copy in flight may have read the new "
                    "values. Fill descriptors before recording the event, or acquire "
                    "another buffer"
                )
            buffer.checksum = None
        _debug.poison(buffer.arrays, buffer.n)
        buffer.poisoned = buffer.n
        return problem

    def _record(self, buffer: Buffer, event: CompletionEvent) -> None:
        """Add *event* to the holder's events (called by the holder: no lock needed).

        Checksums cover the hand-out's whole ``n`` entries, as `_verify` does, also when
        the holder shrank its views.
        """
        n = buffer.n
        events = buffer.events
        if self._level and events and buffer.checksum is not None:
            # Descriptors may change between copies, but not while an earlier one is in
            # flight: check the last checksum before this record replaces it.
            try:
                earlier_pending = any(not earlier.query() for earlier in events)
            except Exception:
                earlier_pending = True
            if earlier_pending and buffer.checksum != _debug.checksum(buffer.arrays, n):
                buffer.events.append(event)  # type: ignore[union-attr]
                buffer.checksum = _debug.checksum(buffer.arrays, n)
                raise InFlightWriteError(
                    f"record_event: the descriptors of {_debug.describe(n, buffer.site)} "
                    "changed while an earlier recorded copy could still read them; the new "
                    "event was recorded. Fill descriptors only before recording an event"
                )
        if events is None:
            buffer.events = [event]
        else:
            events.append(event)
        if self._level:
            buffer.checksum = _debug.checksum(buffer.arrays, n)

    def _drain_from_finaliser(self) -> None:
        """`_drain`, for a finaliser that has just queued a dropped holder's buffer.

        Drains at once unless this thread is inside any pool (a collection there ran the
        finaliser): it must not wait for a lock then, as another thread holding this pool's
        lock may be waiting for that one, or holding every lock around ``os.fork()``.  The
        next operation on this pool drains it otherwise.
        """
        if not any(pool._lock._is_owned() for pool in list(_pools)):  # type: ignore[attr-defined]
            self._drain()

    def _drain(self) -> None:
        """Take back what finalisers queued (leaks, deferred releases), then report leaks.

        Returns at once when this thread is inside the pool already: the next operation
        drains.
        """
        if self._lock._is_owned():  # type: ignore[attr-defined]
            return
        leaks: list[tuple[int, _debug.Site]] = []
        problems: list[str] = []
        with self._lock:
            inbox = self._inbox
            while inbox:
                # Taken off only once handled: an exception in between leaves it queued,
                # and a second look finds the token gone.
                buffer, token, leaked = inbox[0]
                if buffer.token != token:
                    inbox.popleft()
                    continue  # released in between: nothing to do
                # Events are not queried here (no user code under the lock): a buffer
                # with events parks, and the next poll retires it.
                problem = self._take_back(buffer, buffer.events)
                if leaked:
                    self._leaks += 1
                    leaks.append((buffer.n, buffer.site))
                if problem is not None:
                    problems.append(problem)
                inbox.popleft()
        for n, where in leaks:
            line = _debug.line_of(where)
            key = line or n  # sites unknown: once per n
            if key in self._leak_sites:
                continue
            self._leak_sites.add(key)
            self._warn(
                f"a bucketpool buffer of n={n} was never released; acquired at "
                f"{_debug.format_site(where)}. Use 'with pool.acquire(n) as bufs:' or call "
                "handle.release(); the buffer went back to the pool (reported once per "
                "acquire site)",
                LeakWarning,
                line,
            )
        for problem in problems:
            self._warn(problem, RuntimeWarning)

    @staticmethod
    def _warn(message: str, category: type[Warning], line: tuple[str, int] | None = None) -> None:
        """Warn, at *line* (a user's file and line) when known; never raise from here.

        Warnings here report what some earlier code did (a leak, a stale write) and may run
        in a finaliser or in another caller's operation.  A filter that turns the warning
        into an error (``-W error``, ``simplefilter("error", LeakWarning)``) must not raise
        it in the wrong place, nor hide it: the error goes to ``sys.unraisablehook``, as
        an exception raised in a finaliser does (printed as "Exception ignored", and
        reported by pytest).
        """
        try:
            if line is None:
                warnings.warn(message, category, stacklevel=3)
            else:
                warnings.warn_explicit(message, category, line[0], line[1], module="bucketpool")
        except Exception as error:
            with contextlib.suppress(Exception):
                _Unraisable(error)

    # -- parked buffers -----------------------------------------------------------------------

    def _poll(self) -> None:
        """Retire the finished parked buffers at the head of the FIFO (a bounded number).

        Polling stops at the first buffer not done, or whose event raised: that error is
        not this caller's, and `collect` reports it.
        """
        with self._lock:
            heads = self._parked.heads(_POLL_BUDGET)
        done: list[Entry] = []
        for entry in heads:
            try:
                if not all_done(entry[1]):
                    break
            except Exception:
                break
            done.append(entry)
        if done:
            for problem in self._unpark(done):
                self._warn(problem, RuntimeWarning)

    def _unpark(self, entries: list[Entry]) -> list[str]:
        """Retire parked *entries* whose events are done; return problems found."""
        problems: list[str] = []
        with self._lock:
            for buffer, events in entries:
                if not (buffer.parked and buffer.events is events):
                    continue  # another thread retired it first
                problem, cache = self._prepare_retire(buffer)
                if cache:
                    self._cache_parked(buffer)
                else:
                    self._free_parked(buffer)
                if problem is not None:
                    problems.append(problem)
            self._parked.prune()
        return problems

    def collect(self) -> int:
        """Retire every parked buffer whose events are all done; return how many.

        Every parked buffer is polled, not only the head of the FIFO.  Thread-safe.

        Raises:
            Exception: the first error an event's ``query()`` raised; every finished buffer
                was still retired, and the one whose event raised stays parked.
            InFlightWriteError: (debug levels) a retired buffer's descriptors changed while
                in flight; every finished buffer was still retired.
            PoolError: called from a finaliser or signal handler that interrupted this
                thread inside the pool.
        """
        return self._settle(all_done, "collect")

    def synchronize(self) -> None:
        """Wait for every parked buffer's events, then retire them all (for shutdown).

        Calls ``event.synchronize()`` where the event has it, else polls ``query()``.

        Raises:
            Exception: the first error an event raised; the rest were still waited for and
                retired, and buffers whose event raised stay parked.
            InFlightWriteError: (debug levels), as for `collect`.
            PoolError: called from a finaliser or signal handler that interrupted this
                thread inside the pool.
        """
        self._settle(_waited, "synchronize")

    def _settle(self, finished: Callable[[list[CompletionEvent]], bool], operation: str) -> int:
        """Ask *finished* about every parked buffer (outside the lock), retire those done."""
        self._outside(operation)
        self._drain()
        with self._lock:
            entries = list(self._parked)
        done: list[Entry] = []
        first_error: Exception | None = None
        for entry in entries:
            try:
                if finished(entry[1]):
                    done.append(entry)
            except Exception as error:
                first_error = first_error or error
        problems = self._unpark(done)
        with self._lock:
            self._parked.compact()
        if first_error is not None:
            raise first_error
        if problems:
            raise InFlightWriteError(problems[0])
        return len(done)

    # -- caching, trimming ------------------------------------------------------------------

    def _trim_to(self, max_bytes: int, keep: Bucket | None) -> int:
        """(lock held) Free cached buffers, LRU bucket first, down to *max_bytes*."""
        freed = 0
        for bucket in sorted(self._buckets, key=lambda b: b.last_tick):
            while bucket.free and bucket is not keep and self._cached_bytes > max_bytes:
                freed += self._uncache(bucket)
        return freed

    def _sweep_interval(self) -> int:
        # An idle bucket is trimmed at most idle_trim_acquires * 5 / 4 acquires after its
        # last use, and the sweep's cost spreads over a quarter of that.
        idle = self._settings.idle_trim_acquires
        return max(1, idle // 4) if idle else 1 << 62

    def _maintain(self, tick: int) -> None:
        """Every few acquires: retire finished parked buffers, trim idle buckets."""
        if self._parked.count:
            self._poll()
        idle = self._settings.idle_trim_acquires
        with self._lock:
            self._next_sweep = tick + self._sweep_interval()
            for bucket in self._buckets:
                if bucket.free and tick - bucket.last_tick >= idle:
                    while bucket.free:
                        self._uncache(bucket)

    def reserve(self, n: SupportsIndex, count: SupportsIndex = 1) -> None:
        """Pre-allocate *count* cached buffers of *n*'s bucket, so first steps allocate nothing.

        Raises:
            TypeError, ValueError: a bad *n* (as for `acquire`) or *count*, or a reservation
                that the caps (``max_cached_bytes``, ``max_cached_per_bucket``) would not keep.
            PoolError: called from a finaliser or signal handler that interrupted this
                thread inside the pool.
        """
        self._outside("reserve")
        size = check_count(n, self._max_capacity, "reserve")
        number = _non_negative("reserve", "count", count)
        bucket = self._bucket_for(size)
        s = self._settings
        with self._lock:
            cached = len(bucket.free) + number
            cached_bytes = self._cached_bytes + number * bucket.nbytes
        if cached > s.max_cached_per_bucket or cached_bytes > s.max_cached_bytes:
            raise ValueError(
                f"reserve({size}, count={number}) would cache {cached} buffers "
                f"({cached_bytes:,} bytes) but max_cached_per_bucket="
                f"{s.max_cached_per_bucket} and max_cached_bytes={s.max_cached_bytes:,}; "
                "reserve fewer or raise the caps"
            )
        buffers = [self._new_buffer(bucket) for _ in range(number)]
        with self._lock:
            bucket.last_tick = self._tick
            for buffer in buffers:
                buffer.n = bucket.capacity  # the debug levels poison all of it
                _, cache = self._prepare_retire(buffer)
                if cache:  # else another thread filled the cache since the check above
                    self._cache_new(buffer, miss=False)

    def trim(self, max_bytes: SupportsIndex = 0) -> int:
        """Free cached buffers until at most *max_bytes* stay cached; return bytes freed.

        Least recently used buckets are trimmed first.  Parked and held buffers are never
        freed.  Thread-safe.

        Raises:
            TypeError, ValueError: *max_bytes* is not an integer, or is negative.
            PoolError: called from a finaliser or signal handler that interrupted this
                thread inside the pool.
        """
        limit = _non_negative("trim", "max_bytes", max_bytes)
        self._outside("trim")
        self._drain()
        with self._lock:
            return self._trim_to(limit, keep=None)

    def empty_cache(self) -> int:
        """Free every cached buffer (``trim(0)``); return bytes freed."""
        return self.trim(0)

    # -- what is out, and the counters --------------------------------------------------------

    def outstanding(self) -> list[OutstandingBuffer]:
        """Return a record of each buffer handed out and not released, oldest first.

        Each names ``n``, the capacity and, when the pool traces (``trace=True`` or a debug
        level), where it was acquired.  Read from the pool's own records: the cost is in
        proportion to what is out, whatever else the process holds.  Thread-safe.

        Raises:
            PoolError: called from a finaliser or signal handler that interrupted this
                thread inside the pool.
        """
        self._outside("outstanding")
        self._drain()
        with self._lock:
            out = [(b.token, b.n, b.bucket.capacity, b.site) for b in self._held]
        out.sort(key=lambda record: record[0])
        return [
            OutstandingBuffer(
                n=n,
                capacity=capacity,
                acquired_at=None if where is None else _debug.format_site(where),
            )
            for _, n, capacity, where in out
        ]

    def _idle_kept(self, make: Callable[[Buffer], object]) -> list[object]:
        """What a compat adapter keeps with each cached buffer, newest last per bucket.

        A buffer that has none yet (never handed out through the adapter, or its tuple was
        dropped unreleased) gets ``make(buffer)``, the adapter's own constructor.
        """
        self._outside("_pool")
        self._drain()
        with self._lock:
            kept = []
            for bucket in self._buckets:
                for buffer in bucket.free:
                    if buffer.kept is None:
                        buffer.kept = make(buffer)
                    kept.append(buffer.kept)
            return kept

    def stats(self) -> PoolStats:
        """Return a consistent snapshot of the counters (see `PoolStats`).  Thread-safe.

        Raises:
            PoolError: called from a finaliser or signal handler that interrupted this
                thread inside the pool.
        """
        self._outside("stats")
        self._drain()
        with self._lock:
            buckets = [
                (b.capacity, b.nbytes, b.takes - b.misses, b.misses, b.allocated, len(b.free))
                for b in self._buckets
                if b.takes or b.allocated
            ]
            parked = collections.Counter(
                e[0].bucket.capacity for e in self._parked if e[0].parked and e[0].events is e[1]
            )
            held = collections.Counter(b.bucket.capacity for b in self._held)
            counters = (
                self._active,
                self._active_peak,
                self._active_bytes,
                self._active_bytes_peak,
                self._allocations_peak,
                self._allocated_bytes_peak,
                self._allocations_total,
                self._allocated_bytes_total,
                self._freed_total,
                self._freed_bytes_total,
                self._cached_bytes,
                self._requested_entries,
                self._leaks,
            )
        return build_stats(buckets, parked, held, counters)

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value.

        Raises:
            PoolError: called from a finaliser or signal handler that interrupted this
                thread inside the pool.
        """
        self._outside("reset_peak_stats")
        with self._lock:
            self._active_peak = self._active
            self._active_bytes_peak = self._active_bytes
            self._allocations_peak = self._allocations_total - self._freed_total
            self._allocated_bytes_peak = self._allocated_bytes_total - self._freed_bytes_total

    def _outside(self, operation: str) -> None:
        """Refuse *operation* when this thread is inside the pool already.

        That happens only in a finaliser or signal handler that interrupted this thread in
        the middle of a pool call: the pool's records may be half-way through a change
        there, and the lock must not be re-entered.
        """
        if self._lock._is_owned():  # type: ignore[attr-defined]
            raise _reentered(operation)

    def bucket_capacity(self, n: SupportsIndex) -> int:
        """Return the capacity of the bucket that serves *n* in this pool.

        Raises:
            TypeError, ValueError: as for `acquire`.
        """
        return self._bucket_for(check_count(n, self._max_capacity, "bucket_capacity")).capacity

    def _bucket_for(self, n: int) -> Bucket:
        return self._buckets[(n - 1).bit_length() if n > self._min_capacity else self._min_k]

    def _check_poison(self, buffer: Buffer) -> None:
        """(debug levels, the new holder) Verify the poison the last release left."""
        if _debug.poisoned(buffer.arrays, buffer.poisoned):
            return
        # The previous hand-out's sites are still on the buffer until this acquire records
        # its own; the stale writer is reported, not blamed on this caller.
        self._warn(
            f"a buffer of capacity {buffer.bucket.capacity} was written after its release, "
            f"through a stale view of "
            f"{_debug.describe(buffer.poisoned, buffer.site, buffer.released_at)}"
            ". Keep views only inside the handle's with block (copy data out with "
            "tensor.clone()); the new holder is not affected",
            RuntimeWarning,
        )


def _waited(events: list[CompletionEvent]) -> bool:
    wait(events)
    return True


def _non_negative(operation: str, name: str, value: object) -> int:
    number = as_index(value, f"{operation}: {name}")
    if number < 0:
        raise ValueError(f"{operation}: {name} must be >= 0, got {number}")
    return number


class _Unraisable:
    """Hand *error* to ``sys.unraisablehook``.

    Made and dropped at once: its finaliser raises the error, and the interpreter reports an
    exception raised in a finaliser there.
    """

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __del__(self) -> None:
        raise self.error


def _reentered(operation: str) -> PoolError:
    return PoolError(
        f"{operation} was called from a finaliser or signal handler that interrupted this "
        "thread inside the same pool, whose records may be half-way through a change; call "
        f"{operation} outside finalisers and signal handlers (releases are fine there: they "
        "are queued)"
    )


_NO_COPY = (
    "a BucketPool cannot be copied or pickled: its buffers have one holder each, and a "
    "copy would hand them out twice. Make a new BucketPool with the same settings instead"
)

# -- fork ---------------------------------------------------------------------------------

_pools: weakref.WeakSet[BucketPool] = weakref.WeakSet()
_fork_pools: list[BucketPool] = []


def _before_fork() -> None:
    """Hold every pool's lock across ``os.fork()``, so no child inherits a change half-made.

    The locks are taken with a short timeout, and all let go and tried again when one is
    busy: a thread inside one pool may be waiting for another's lock (a finaliser or a
    collected ``with`` block of that pool), and waiting for all in turn could deadlock with
    it.  This and `_after_fork` are the one place the locks are not taken with ``with``: a
    hold across the fork has no block to live in.  A lock that this thread owns after an
    exception is let go, so an interrupt here leaks none.
    """
    pools = [pool for pool in list(_pools) if not pool._lock._is_owned()]  # type: ignore[attr-defined]
    try:
        while not _take_all(pools):
            time.sleep(_FORK_RETRY_SECONDS)
    except BaseException:
        _let_go(pools)
        raise
    _fork_pools[:] = pools


def _take_all(pools: list[BucketPool]) -> bool:
    for pool in pools:
        if not pool._lock.acquire(timeout=_FORK_RETRY_SECONDS):
            _let_go(pools)
            return False
    return True


def _let_go(pools: list[BucketPool]) -> None:
    for pool in pools:
        if pool._lock._is_owned():  # type: ignore[attr-defined]
            pool._lock.release()


def _after_fork() -> None:
    pools, _fork_pools[:] = list(_fork_pools), []
    _let_go(pools)


_FORK_RETRY_SECONDS = 0.001


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
    )
