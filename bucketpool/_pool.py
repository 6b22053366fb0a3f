"""`BucketPool`: the façade -- settings, the acquire and release paths, the public methods.

Where the rest lives: every record and every move of a buffer is the ledger's
(`bucketpool._ledger`, which also tells a buffer's life); the lock, its rule and the fork
handlers are `bucketpool._lock`'s; taking back the inbox and reporting leaks,
`bucketpool._inbox`'s; asking parked buffers' events, `bucketpool._parking`'s; what the
caps free, `bucketpool._policy`'s; a buffer's views, `bucketpool._buffer`'s; the debug
checks, `bucketpool._verify`'s and `bucketpool._guard`'s.
"""

from __future__ import annotations

import collections
import sys
import typing
import weakref
from collections.abc import Callable
from typing import SupportsIndex

import torch

from bucketpool import _guard, _verify
from bucketpool._buckets import as_index, check_count
from bucketpool._buffer import Bucket, Buffer
from bucketpool._errors import InFlightWriteError, PoolError, ReleaseError
from bucketpool._handle import BufferHandle
from bucketpool._inbox import drain, warn
from bucketpool._ledger import CACHE, EMPTY, HELD, NEEDS_HOLDER, SETTLE, SWEEP, Ledger
from bucketpool._lock import LOCK
from bucketpool._parking import all_done, poll, sweep, wait
from bucketpool._policy import sweep_idle, trim_to
from bucketpool._settings import DEBUG_LEVELS, DebugLevel, Settings, resolve_settings
from bucketpool._stats import OutstandingBuffer, PoolStats, build_stats
from bucketpool._types import CompletionEvent, DescriptorArrays

__all__ = ["BucketPool"]

_new = object.__new__
_getframe = sys._getframe
_is_owned = LOCK._is_owned  # type: ignore[attr-defined]

#: Makes the tuple a compat adapter hands out with a buffer (see `bucketpool.compat`).
MakeHolder = Callable[[Buffer, bool], tuple[object, int]]


@typing.final
class BucketPool:
    """A thread-safe pool of descriptor buffers in power-of-two capacity buckets.

    A request for ``n`` entries is served from the bucket of capacity
    ``bucket_capacity(n)``: the most recently released buffer of that bucket is reused,
    else one is allocated.  Released buffers are cached up to *max_cached_bytes* (parked
    buffers count against it too) and *max_cached_per_bucket*; a bucket unused for
    *idle_trim_acquires* acquires gives its cached buffers back.

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
        debug: ``"off"`` (default), ``"checks"`` or ``"strict"``; see the docs.
        trace: record the full stack of every acquire, not only the file and line.

    Raises:
        TypeError: *dtype* is neither int64 nor uint64.
        ValueError: any other bad option, here or in the environment.
        RuntimeError: *pin_memory* without an accelerator.
    """

    __slots__ = (
        "__weakref__",
        "_buckets",
        "_full_stack",
        "_ledger",
        "_level",
        "_lock",
        "_max_capacity",
        "_min_capacity",
        "_min_index",
        "_reported",
        "_self_ref",
        "_settings",
        "_tracing",
        "_watching",
    )

    def __init__(
        self,
        *,
        dtype: torch.dtype = torch.int64,
        device: str | torch.device = "cpu",
        pin_memory: bool = False,
        min_capacity: SupportsIndex | None = None,
        max_capacity: SupportsIndex | None = None,
        max_cached_bytes: SupportsIndex | None = None,
        max_cached_per_bucket: SupportsIndex | None = None,
        idle_trim_acquires: SupportsIndex | None = None,
        debug: DebugLevel | None = None,
        trace: bool | None = None,
    ) -> None:
        self._settings = settings = resolve_settings(
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
        self._level = DEBUG_LEVELS.index(settings.debug)
        idle = settings.idle_trim_acquires
        # An idle bucket is trimmed at most idle * 5 / 4 acquires after its last use, and the
        # sweep's cost spreads over a quarter of that.
        sweep_every = max(1, idle // 4) if idle else 1 << 62
        self._ledger = ledger = Ledger(
            settings.max_capacity,
            settings.max_cached_bytes,
            settings.max_cached_per_bucket,
            sweep_every,
            _verify.verify if self._level else None,
        )
        self._buckets = ledger.buckets
        self._lock = LOCK
        self._max_capacity = settings.max_capacity
        self._min_capacity = settings.min_capacity
        self._min_index = settings.min_capacity.bit_length() - 1
        self._full_stack = settings.trace
        self._tracing = self._level > 0 or settings.trace
        self._watching = self._tracing
        self._reported: set[object] = set()
        self._self_ref = weakref.ref(self)

    @property
    def _inbox(self) -> list[object]:
        """What waits to be taken back, every bucket's, for tests and debuggers to look at."""
        return [entry for bucket in self._buckets for entry in list(bucket.inbox)]

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

    # -- the acquire path ---------------------------------------------------------------------

    def acquire(self, n: SupportsIndex) -> BufferHandle:
        """Return a handle on a buffer of at least *n* entries; its views have exactly *n*.

        Thread-safe.

        Args:
            n: the number of descriptors, an int (or numpy integer) from 0 to
                ``settings.max_capacity``.

        Raises:
            TypeError: *n* is a bool or not an integer.
            ValueError: *n* is negative or above ``settings.max_capacity``.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        if type(n) is not int or n < 0 or n > self._max_capacity:
            n = check_count(n, self._max_capacity)
        bucket = self._buckets[(n - 1).bit_length() if n > self._min_capacity else self._min_index]
        if _is_owned():
            raise _reentered("acquire")
        frame = _getframe(1)  # the acquire's site, for a leak warning: no stack walk
        # The handle exists before the hand-out and is bound inside the move: from then on
        # its finaliser owns the buffer, also when a signal unwinds this call.
        handle = _new(BufferHandle)
        handle._pool = self
        handle._n = n
        got = self._ledger.serve(bucket, n, handle, frame.f_code, frame.f_lasti)
        if got is not handle:
            if got is not SWEEP:
                got = self._serve(bucket, n, handle, frame.f_code, frame.f_lasti, None)
            if got is SWEEP:
                self._maintain()
        if self._watching:
            self._handed_out(handle._buffer)
        return handle

    def _serve(
        self,
        bucket: Bucket,
        n: int,
        holder: object,
        code: object,
        lasti: int,
        make: MakeHolder | None,
    ) -> object:
        """The hand-out when the fast path could not: settle, poll, allocate; then serve."""
        ledger = self._ledger
        polled = False
        while True:
            got = ledger.serve(bucket, n, holder, code, lasti)
            if got is SETTLE:
                self._drain(bucket)
            elif got is NEEDS_HOLDER and make is not None:
                top = bucket.free[-1:]  # a hint: attach_holder checks it again
                if top:
                    ledger.attach_holder(top[0], *make(top[0], False))
            elif got is EMPTY:
                if not polled and ledger.parked_queue:
                    polled = True
                    if poll(ledger):
                        self._drain()
                        continue
                fresh = self._new_buffer(bucket, make)
                return ledger.serve(bucket, n, holder, code, lasti, fresh)
            else:
                return got

    def _new_buffer(self, bucket: Bucket, make: MakeHolder | None) -> Buffer:
        """A new buffer, outside the lock (pinning can take milliseconds)."""
        s = self._settings
        buffer = Buffer(bucket, s.dtype, s.pin_memory, self._level == 2)
        buffer.pool_ref = self._self_ref
        if make is not None:
            buffer.next_holder, buffer.next_id = make(buffer, True)
        return buffer

    def _handed_out(self, buffer: Buffer) -> None:
        """(the new holder) Check the last release's poison, record the site."""
        if self._level:
            buffer.span = buffer.n
            stale = _verify.check_poison(buffer)
            if stale is not None:
                warn(stale, RuntimeWarning)
        buffer.site = _verify.site(self._full_stack)

    def _acquired_at(self, buffer: Buffer, token: int) -> str | None:
        if token <= 0 or buffer.token != token or buffer.site is None:
            return None
        return _verify.format_site(buffer.site)  # type: ignore[arg-type]

    def _arrays(self, buffer: Buffer) -> DescriptorArrays:
        if buffer.guard:
            return _guard.guarded_arrays(buffer, buffer.n)
        return buffer.field_arrays(buffer.n)

    # -- the release path ---------------------------------------------------------------------

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

    def _record(self, buffer: Buffer, event: CompletionEvent) -> None:
        """Add *event* to the live hand-out's events; drop ones found done (bounded looks)."""
        # A held buffer's events are a deque (the parked ones' a list of those pending).
        events = typing.cast("collections.deque[CompletionEvent] | None", buffer.events)
        if events is None:
            buffer.events = events = collections.deque()
        else:
            for _ in range(min(2, len(events))):  # amortised O(1): each event leaves once
                oldest = events[0]
                try:
                    done = oldest.query()
                except KeyboardInterrupt:
                    raise
                except BaseException:  # not this call's to report: kept, asked at release
                    done = False
                events.popleft()
                if not done:
                    events.append(oldest)
        if self._level:
            current = _verify.checksum(buffer.arrays, buffer.span)
            earlier = buffer.checksum
            buffer.checksum = current
            if earlier is not None and earlier != current and _any_pending(events):
                events.append(event)
                raise InFlightWriteError(_verify.in_flight_problem(buffer))
        events.append(event)

    def _drain(self, only: Bucket | None = None) -> None:
        """Take back what waits in the inboxes (all, or *only*'s).

        Not from inside the lock: the next call will.
        """
        if _is_owned():
            return
        for problem in drain(self._ledger, self._reported, only):
            warn(problem, RuntimeWarning)

    def _maintain(self) -> None:
        """Every few acquires: retire finished parked buffers, trim idle buckets."""
        ledger = self._ledger
        if ledger.parked_queue:
            poll(ledger)
        self._drain()
        idle = self._settings.idle_trim_acquires
        if idle:
            sweep_idle(ledger, idle)

    # -- parked buffers -----------------------------------------------------------------------

    def collect(self) -> int:
        """Retire every parked buffer whose events are all done; return how many.

        Every parked buffer is asked once, whatever order its events complete in.
        Thread-safe.

        Raises:
            BaseException: the first error an event's ``query()`` raised; every finished
                buffer was still retired, and the one whose event raised stays parked.
            InFlightWriteError: (debug levels) a retired buffer's descriptors changed while
                in flight; every finished buffer was still retired.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        return self._settle_parked(all_done, "collect")

    def synchronize(self) -> None:
        """Wait for every parked buffer's events, then retire them all (for shutdown).

        Calls ``event.synchronize()`` where the event has it, else polls ``query()``.

        Raises:
            BaseException: the first error an event raised; the rest were still waited for
                and retired, and buffers whose event raised stay parked.
            InFlightWriteError: (debug levels), as for `collect`.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._settle_parked(wait, "synchronize")

    def _settle_parked(
        self, finished: Callable[[typing.Sequence[CompletionEvent]], bool], operation: str
    ) -> int:
        self._outside(operation)
        self._drain()
        retired, error = sweep(self._ledger, finished)
        problems = drain(self._ledger, self._reported)
        if error is not None:
            raise error
        if problems:
            raise InFlightWriteError(problems[0])
        return retired

    # -- memory -------------------------------------------------------------------------------

    def reserve(self, n: SupportsIndex, count: SupportsIndex = 1) -> None:
        """Pre-allocate *count* cached buffers of *n*'s bucket, so first steps allocate nothing.

        Raises:
            TypeError, ValueError: a bad *n* (as for `acquire`) or *count*, or a reservation
                that the caps (``max_cached_bytes``, ``max_cached_per_bucket``) would not keep.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._outside("reserve")
        size = check_count(n, self._max_capacity, "reserve")
        number = _non_negative("reserve", "count", count)
        bucket = self._bucket_for(size)
        self._drain()
        s = self._settings
        ledger = self._ledger
        cached = ledger.cached[bucket.index] + number
        idle_bytes = ledger.allocated_bytes - ledger.active_bytes + number * bucket.nbytes
        if number and (cached > s.max_cached_per_bucket or idle_bytes > s.max_cached_bytes):
            raise ValueError(
                f"reserve({size}, count={number}) would cache {cached} buffers "
                f"({idle_bytes:,} bytes) but max_cached_per_bucket="
                f"{s.max_cached_per_bucket} and max_cached_bytes={s.max_cached_bytes:,}; "
                "reserve fewer or raise the caps"
            )
        for _ in range(number):
            ledger.serve(bucket, 0, CACHE, None, 0, self._new_buffer(bucket, None))

    def trim(self, max_bytes: SupportsIndex = 0) -> int:
        """Free cached buffers until at most *max_bytes* stay cached; return bytes freed.

        Least recently used buckets are trimmed first.  Parked and held buffers are never
        freed.  Thread-safe.

        Raises:
            TypeError, ValueError: *max_bytes* is not an integer, or is negative.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        limit = _non_negative("trim", "max_bytes", max_bytes)
        self._outside("trim")
        self._drain()
        return trim_to(self._ledger, limit)

    def empty_cache(self) -> int:
        """Free every cached buffer (``trim(0)``); return bytes freed."""
        return self.trim(0)

    # -- what is out, and the counters --------------------------------------------------------

    def outstanding(self) -> list[OutstandingBuffer]:
        """Return a record of each buffer handed out and not released, oldest first.

        Each names ``n``, the capacity and, when the pool traces (``trace=True`` or a debug
        level), where it was acquired.  Read from the pool's own records: the cost is in
        proportion to the buffers the pool has, whatever else the process holds.
        Thread-safe.

        Raises:
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._outside("outstanding")
        self._drain()
        held = sorted(
            (b.token, b.n, b.bucket.capacity, b.site) for b in self._ledger.buffers() if b.token > 0
        )
        return [
            OutstandingBuffer(
                n=n,
                capacity=capacity,
                acquired_at=None if where is None else _verify.format_site(where),  # type: ignore[arg-type]
            )
            for _, n, capacity, where in held
        ]

    def stats(self) -> PoolStats:
        """Return a consistent snapshot of the counters (see `PoolStats`).  Thread-safe.

        Raises:
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._outside("stats")
        self._drain()
        return build_stats(self._buckets, self._ledger.snapshot())

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value.

        Raises:
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._outside("reset_peak_stats")
        self._ledger.reset_peaks()

    def bucket_capacity(self, n: SupportsIndex) -> int:
        """Return the capacity of the bucket that serves *n* in this pool.

        Raises:
            TypeError, ValueError: as for `acquire`.
        """
        return self._bucket_for(check_count(n, self._max_capacity, "bucket_capacity")).capacity

    def _bucket_for(self, n: int) -> Bucket:
        return self._buckets[(n - 1).bit_length() if n > self._min_capacity else self._min_index]

    def _outside(self, operation: str) -> None:
        """Refuse *operation* when this thread is inside a move already.

        That happens only in a finaliser that a collection ran inside one of the pool's own
        sections: the records may be half-way through a change there.
        """
        if _is_owned():
            raise _reentered(operation)

    # -- for the compat adapters --------------------------------------------------------------

    def _lease(self, n: SupportsIndex, make: MakeHolder) -> object:
        """Hand a buffer out to a compat tuple (the one *make* made for it); return the tuple."""
        if type(n) is not int or n < 0 or n > self._max_capacity:
            n = check_count(n, self._max_capacity)
        bucket = self._buckets[(n - 1).bit_length() if n > self._min_capacity else self._min_index]
        if _is_owned():
            raise _reentered("acquire")
        frame = _getframe(2)  # the adapter's caller
        ledger = self._ledger
        held = ledger.serve(bucket, n, None, frame.f_code, frame.f_lasti)
        if type(held) is int:
            held = self._serve(bucket, n, None, frame.f_code, frame.f_lasti, make)
        if ledger.tick >= ledger.next_sweep and ledger.claim_sweep():
            self._maintain()
        if self._watching:
            self._handed_out(HELD[id(held)][0])
        return held

    def _owns(self, tensor: object) -> bool:
        """Whether *tensor* is a view of one of this pool's buffers (for compat's messages)."""
        if not isinstance(tensor, torch.Tensor):
            return False
        try:
            address = tensor.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return False
        return any(buffer.address == address for buffer in self._ledger.buffers())

    def _idle_holders(self, make: MakeHolder) -> list[object]:
        """The tuples kept with the cached buffers, newest last per bucket (compat's _pool)."""
        self._outside("_pool")
        self._drain()
        ledger = self._ledger
        holders = []
        for bucket in self._buckets:
            for buffer in list(bucket.free):  # read without the lock: a snapshot to look at
                if buffer.next_holder is None:
                    ledger.attach_holder(buffer, *make(buffer, False))
                if buffer.next_holder is not None:
                    holders.append(buffer.next_holder)
        return holders


def _any_pending(events: typing.Iterable[CompletionEvent]) -> bool:
    """Whether an earlier event may still be running (one whose query raises may be)."""
    for event in events:
        try:
            if not event.query():
                return True
        except KeyboardInterrupt:
            raise
        except BaseException:  # not this call's to report: asked again at release
            return True
    return False


def _non_negative(operation: str, name: str, value: object) -> int:
    number = as_index(value, f"{operation}: {name}")
    if number < 0:
        raise ValueError(f"{operation}: {name} must be >= 0, got {number}")
    return number


def _reentered(operation: str) -> PoolError:
    return PoolError(
        f"{operation} was called from a finaliser or signal handler that interrupted this "
        "thread inside a pool, whose records may be half-way through a change; call "
        f"{operation} outside finalisers and signal handlers (releases are fine there: they "
        "are queued)"
    )


_NO_COPY = (
    "a BucketPool cannot be copied or pickled: its buffers have one holder each, and a "
    "copy would hand them out twice. Make a new BucketPool with the same settings instead"
)
