"""`BucketPool`: the façade -- settings, the acquire and release paths, the public methods.

Where the rest lives: every record and every move of a buffer is the ledger's
(`bucketpool._ledger`, which also tells a buffer's life); the lock, its rule and the fork
handlers are `bucketpool._lock`'s; taking back the inbox and reporting leaks,
`bucketpool._inbox`'s; asking parked buffers' events, `bucketpool._parking`'s; what the
caps free, `bucketpool._policy`'s; a buffer's views, `bucketpool._buffer`'s; the debug
checks, `bucketpool._verify`'s and `bucketpool._guard`'s.
"""

from __future__ import annotations

import sys
import typing
import weakref
from collections.abc import Callable
from types import CodeType
from typing import SupportsIndex

import torch

from bucketpool import _guard, _verify
from bucketpool._buckets import check_count, check_non_negative_count
from bucketpool._buffer import Bucket, Buffer, MakeHolder
from bucketpool._errors import ReleaseError
from bucketpool._handle import BufferHandle
from bucketpool._inbox import drain, warn
from bucketpool._ledger import CACHE, EMPTY, SWEEP, Ledger
from bucketpool._lock import LATE, LOCK, owned, reentered
from bucketpool._parking import (
    POLL_BUDGET,
    all_done,
    poll,
    poll_old,
    record,
    settle_parked,
    wait,
)
from bucketpool._policy import check_reserve, sweep_idle, trim_to
from bucketpool._refill import serve_slowly
from bucketpool._settings import DEBUG_LEVELS, DebugLevel, Settings, resolve_settings
from bucketpool._stats import OutstandingBuffer, PoolStats, build_stats, outstanding_of
from bucketpool._types import CompletionEvent

__all__ = ["BucketPool"]

_new = object.__new__
_getframe = sys._getframe
_is_owned = owned


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
        "_by_bits",
        "_full_stack",
        "_ledger",
        "_level",
        "_lock",
        "_max_capacity",
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
        arguments = dict(locals())  # every keyword argument is a setting
        del arguments["self"]
        self._settings = settings = resolve_settings(arguments)
        self._level = DEBUG_LEVELS.index(settings.debug)
        idle = settings.idle_trim_acquires
        # An idle bucket is trimmed at most idle * 5 / 4 acquires after its last use, and the
        # sweep's cost spreads over a quarter of that.  The sweep also takes back what waits
        # in buckets not asked for since, so it runs with idle trimming off too.
        sweep_every = max(1, idle // 4) if idle else 256
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
        first = settings.min_capacity.bit_length() - 1  # n <= min_capacity (0 too): the first
        self._by_bits = [self._buckets[max(bits, first)] for bits in range(len(self._buckets))]
        self._full_stack = settings.trace
        self._tracing = self._level > 0 or settings.trace
        self._watching = self._tracing
        self._reported: set[object] = set()
        self._self_ref = weakref.ref(self)

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

    def __del__(self) -> None:
        # Cached buffers refer to their buckets and to their cached views, which refer
        # back: without this, a dropped pool's memory would wait for the collector
        # (forever under gc.disable()).  Nothing else reaches these buckets now (a compat
        # tuple still out holds its own tensors), so no lock is needed.
        try:
            ledger = self._ledger
        except AttributeError:  # its __init__ raised: nothing was made
            return
        for bucket in ledger.buckets:
            bucket.free = []
            bucket.inbox.clear()
        for buffer in ledger.registry:
            buffer.views = {}
            buffer.current = buffer.whole = None

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
        bucket = self._by_bits[((n or 1) - 1).bit_length()]
        if _is_owned():
            raise reentered("acquire")
        frame = _getframe(1)  # the acquire's site, for a leak warning: no stack walk
        # The handle exists before the hand-out and is bound inside the move: from then on
        # its finaliser owns the buffer, also when a signal unwinds this call.
        handle = _new(BufferHandle)
        handle._pool = self
        handle._n = n
        if bucket.free or bucket.inbox:  # hints: `serve` decides
            got = self._ledger.serve(bucket, n, handle, frame.f_code, frame.f_lasti)
        else:  # nothing to serve from: straight to the parked buffers, then a new one
            got = EMPTY
        if got is not handle:
            if got is not SWEEP:
                got = serve_slowly(self, bucket, n, handle, frame.f_code, frame.f_lasti, None, got)
            if got is SWEEP:
                self._maintain()
        if self._watching:
            self._handed_out(handle._buffer)
        if LATE:
            self._drain()
        return handle

    def _new_buffer(self, bucket: Bucket, make: MakeHolder | None) -> Buffer:
        """A new buffer, outside the lock (pinning can take milliseconds)."""
        s = self._settings
        guard = _guard.guarded_views if self._level == 2 else None
        buffer = Buffer(bucket, s.dtype, s.pin_memory, guard, self._level == 1)
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
        code = buffer.code  # the acquire's caller, found without a walk
        if self._full_stack or not isinstance(code, CodeType) or _verify.in_package(code):
            buffer.site = _verify.site(self._full_stack)
        else:
            buffer.site = (code, buffer.lasti)

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

    def _drain(self, only: Bucket | None = None) -> None:
        """Take back what waits in the inboxes (all, or *only*'s).

        Not from inside the lock: the next call will.
        """
        if _is_owned():
            return
        for problem in drain(self._ledger, self._reported, only):
            warn(problem, RuntimeWarning)
        while LATE:  # queued inside a move that this thread, or another, has left since
            try:
                pool = LATE.pop()()
            except IndexError:  # another thread took the last one
                break
            if isinstance(pool, BucketPool):  # (None: dropped since, its queue with it)
                for problem in drain(pool._ledger, pool._reported):
                    warn(problem, RuntimeWarning)

    def _maintain(self) -> None:
        """Every few acquires: retire finished parked buffers, trim idle buckets."""
        ledger = self._ledger
        if ledger.young:
            poll(ledger)
        if ledger.queues.old:  # asked here too: a miss that the young ones serve never does
            poll_old(ledger, POLL_BUDGET)
        self._drain()
        sweep_idle(self._ledger, self._settings.idle_trim_acquires)

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
        retired = settle_parked(self._ledger, self._reported, finished)
        if LATE:
            self._drain()
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
        number = check_non_negative_count(count, "reserve: count")
        bucket = self._bucket_for(size)
        self._drain()
        check_reserve(self._ledger, bucket, size, number)
        for done in range(number):
            fresh = self._new_buffer(bucket, None)
            if self._ledger.serve(bucket, 0, CACHE, None, 0, fresh) is not CACHE:
                raise ValueError(
                    f"reserve({size}, count={number}): the caps filled up while it ran "
                    f"(another thread cached buffers), so {done} of {number} were reserved; "
                    "reserve from one thread, or raise max_cached_bytes/max_cached_per_bucket"
                )

    def trim(self, max_bytes: SupportsIndex = 0) -> int:
        """Free cached buffers until at most *max_bytes* stay cached; return bytes freed.

        Least recently used buckets are trimmed first.  Parked and held buffers are never
        freed.  Thread-safe.

        Raises:
            TypeError, ValueError: *max_bytes* is not an integer, or is negative.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        limit = check_non_negative_count(max_bytes, "trim: max_bytes")
        self._outside("trim")
        self._drain()
        freed = trim_to(self._ledger, limit)
        if LATE:
            self._drain()
        return freed

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
        buffers = self._ledger.buffers()
        while LATE:  # a finaliser released a holder inside the copy's move: again
            self._drain()
            buffers = self._ledger.buffers()
        return outstanding_of(buffers)

    def stats(self) -> PoolStats:
        """Return a consistent snapshot of the counters (see `PoolStats`).  Thread-safe.

        Raises:
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._outside("stats")
        self._drain()
        snapshot = self._ledger.snapshot()
        while LATE:  # a finaliser released a holder inside the snapshot's move: again
            self._drain()
            snapshot = self._ledger.snapshot()
        return build_stats(self._buckets, snapshot)

    def _record(self, buffer: Buffer, token: int, event: CompletionEvent) -> bool:
        """(a holder's `record_event`) Add *event* to *buffer*'s hand-out *token*.

        Returns False, having recorded nothing, if the hand-out ended meanwhile (an earlier
        event's ``query()`` released it).

        Raises:
            TypeError: *event* has no ``query()`` method.
            InFlightWriteError: (debug levels) see `BufferHandle.record_event`.
        """
        if not callable(getattr(event, "query", None)):
            raise TypeError(
                "record_event needs an object with a query() -> bool method "
                f"(torch.Event, torch.cuda.Event), got {type(event).__name__}"
            )
        return record(self._ledger, buffer, token, event, self._level > 0)

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value.

        Raises:
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._outside("reset_peak_stats")
        self._drain()  # releases waiting in the inboxes are over: not counted as active
        self._ledger.reset_peaks()

    def bucket_capacity(self, n: SupportsIndex) -> int:
        """Return the capacity of the bucket that serves *n* in this pool.

        Raises:
            TypeError, ValueError: as for `acquire`.
        """
        return self._bucket_for(check_count(n, self._max_capacity, "bucket_capacity")).capacity

    def _bucket_for(self, n: int) -> Bucket:
        return self._by_bits[((n or 1) - 1).bit_length()]  # the bucket of n, by its bit length

    def _outside(self, operation: str) -> None:
        """Refuse *operation* when this thread is inside a move already.

        That happens only in a finaliser that a collection ran inside one of the pool's own
        sections: the records may be half-way through a change there.
        """
        if _is_owned():
            raise reentered(operation)


_NO_COPY = (
    "a BucketPool cannot be copied or pickled: its buffers have one holder each, and a "
    "copy would hand them out twice. Make a new BucketPool with the same settings instead"
)
