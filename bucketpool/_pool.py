"""`BucketPool`: the pool's face -- settings, acquire and release, the public methods.

Where the rest lives: every record and move of a buffer is the ledger's
(`bucketpool._ledger`); the lock and the fork handlers `bucketpool._lock`'s; taking back
the inbox, leak reports and the caps' trims `bucketpool._returns`'; asking parked buffers'
events `bucketpool._parking`'s; a buffer's memory and views `bucketpool._buffer`'s; the
fills `bucketpool._views`'; the debug levels `bucketpool._debug`'s.  The threat model and
the locking rule are in docs/design.md.
"""

from __future__ import annotations

import sys
import typing
import weakref
from collections.abc import Callable, Sequence
from types import CodeType
from typing import SupportsIndex

import torch

from bucketpool import _debug, _parking, _returns
from bucketpool._buffer import Bucket, Buffer
from bucketpool._errors import InFlightWriteError, PoolError, ReleaseError
from bucketpool._handle import BufferHandle
from bucketpool._ledger import CACHE, EMPTY, SETTLE, SWEEP, Entry, Ledger
from bucketpool._lock import LATE, owned
from bucketpool._settings import (
    DEBUG_LEVELS,
    DebugLevel,
    Settings,
    check_count,
    check_non_negative,
    resolve_settings,
)
from bucketpool._stats import OutstandingBuffer, PoolStats, build_stats, outstanding_of
from bucketpool._views import CompletionEvent

__all__ = ["ADAPTERS", "BucketPool"]

#: The code of acquire calls that stand for their caller (the compat adapters'): the
#: acquire site a leak warning names is their caller's.
ADAPTERS: set[CodeType] = set()
_new = object.__new__
_getframe = sys._getframe


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
        *("__weakref__", "_by_bits", "_full_stack", "_ledger", "_level", "_max_capacity"),
        *("_reported", "_self_ref", "_settings", "_watching"),
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
            _debug.verify if self._level else None,
        )
        self._max_capacity = settings.max_capacity
        first = settings.min_capacity.bit_length() - 1  # n <= min_capacity (0 too): the first
        buckets = ledger.buckets
        self._by_bits = [buckets[max(bits, first)] for bits in range(len(buckets))]
        self._full_stack = settings.trace
        self._watching = self._level > 0 or settings.trace
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
        if owned():
            raise _reentered("acquire")
        frame = _getframe(1)  # the acquire's site, for a leak warning: no stack walk
        code, lasti = frame.f_code, frame.f_lasti
        if code in ADAPTERS:  # a compat adapter's: its caller's site, marked by ~lasti
            frame = frame.f_back or frame
            code, lasti = frame.f_code, ~frame.f_lasti
        # The handle exists before the hand-out and is bound inside the move: from then on
        # its finaliser owns the buffer, also when a signal unwinds this call.
        handle = _new(BufferHandle)
        handle._pool = self
        handle._n = n
        if bucket.free or bucket.inbox:  # hints: `serve` decides
            got = self._ledger.serve(bucket, n, handle, code, lasti)
        else:  # nothing to serve from: straight to the parked buffers, then a new one
            got = EMPTY
        if got is not handle:
            if got is not SWEEP:
                got = self._serve_slowly(bucket, n, handle, code, lasti, got)
            if got is SWEEP:
                self._maintain()
        if self._watching:
            self._handed_out(handle._buffer)
        if LATE:
            self._drain()
        return handle

    def _serve_slowly(
        self, bucket: Bucket, n: int, handle: BufferHandle, code: object, lasti: int, got: object
    ) -> object:
        """Serve *handle* once `Ledger.serve` said *got*: settle, poll, else allocate."""
        ledger = self._ledger
        polled = False
        while True:
            if got is SETTLE:
                self._drain(bucket)
            elif got is EMPTY:
                if not polled and (ledger.young or ledger.old):
                    polled = True
                    retired, queued, found, index = _parking.poll(ledger, bucket, take=ledger.plain)
                    if found is not None:  # done, and of this bucket: handed out at once
                        got = ledger.serve(
                            bucket, n, handle, code, lasti, parked=found, index=index
                        )
                        if got is not EMPTY:
                            return got
                    if retired or found is not None:
                        if queued:  # retired into an inbox, not straight into the cache
                            self._drain()
                        got = ledger.serve(bucket, n, handle, code, lasti)
                        continue
                fresh = self._new_buffer(bucket)  # outside the lock: pinning can be slow
                return ledger.serve(bucket, n, handle, code, lasti, fresh)
            else:
                return got
            got = ledger.serve(bucket, n, handle, code, lasti)

    def _new_buffer(self, bucket: Bucket) -> Buffer:
        s = self._settings
        return Buffer(bucket, s.dtype, s.pin_memory, self._ledger, self._level)

    def _handed_out(self, buffer: Buffer) -> None:
        """(the new holder) Check the last release's poison, record the site."""
        if self._level:
            stale = _debug.check_poison(buffer)
            if stale is not None:
                _returns.warn(stale, RuntimeWarning)
        code = buffer.code  # the acquire's caller, found without a walk
        if self._full_stack or not isinstance(code, CodeType) or _debug.in_package(code):
            buffer.site = _debug.site(self._full_stack)
        else:
            buffer.site = (code, buffer.lasti if buffer.lasti >= 0 else ~buffer.lasti)

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

    def _take_back(self, entry: Entry, seen: int) -> bool | None:
        """(a handle's release, when `Ledger.give_back` could not) Take *entry* back now.

        Returns what `bucketpool._returns.take_back` does; warns of a problem found.
        """
        problems: list[str] = []
        taken = _returns.take_back(
            self._ledger, entry[0].bucket, self._reported, problems, entry, seen
        )
        for problem in problems:
            _returns.warn(problem, RuntimeWarning)
        return taken

    def _drain(self, only: Bucket | None = None) -> None:
        """Take back what waits in the inboxes (all, or *only*'s); not from inside a move."""
        if owned():
            return
        for problem in _returns.drain(self._ledger, self._reported, only):
            _returns.warn(problem, RuntimeWarning)
        while LATE:  # queued inside a move that this thread, or another, has left since
            try:
                pool = LATE.pop()()
            except IndexError:  # another thread took the last one
                break
            if isinstance(pool, BucketPool):  # (None: dropped since, its queue with it)
                for problem in _returns.drain(pool._ledger, pool._reported):
                    _returns.warn(problem, RuntimeWarning)

    def _maintain(self) -> None:
        """Every few acquires: retire finished parked buffers, trim idle buckets."""
        ledger = self._ledger
        if ledger.young:
            _parking.poll(ledger)
        if ledger.old:  # asked here too: a miss that the young ones serve never does
            _parking.poll_old(ledger, _parking.POLL_BUDGET)
        self._drain()
        _returns.sweep_idle(ledger, self._settings.idle_trim_acquires)

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
        return self._settle_parked(_parking.all_done, "collect")

    def synchronize(self) -> None:
        """Wait for every parked buffer's events, then retire them all (for shutdown).

        Calls ``event.synchronize()`` where the event has it, else polls ``query()``.

        Raises:
            BaseException: the first error an event raised; the rest were still waited for
                and retired, and buffers whose event raised stay parked.
            InFlightWriteError: (debug levels), as for `collect`.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._settle_parked(_parking.wait, "synchronize")

    def _settle_parked(
        self, finished: Callable[[Sequence[CompletionEvent]], bool], operation: str
    ) -> int:
        self._outside(operation)
        self._drain()
        retired, error = _parking.sweep(self._ledger, finished)
        try:
            problems = _returns.drain(self._ledger, self._reported)
            if LATE:
                self._drain()
            if error is not None:
                raise error
        finally:
            error = None  # no cycle through this frame: its traceback holds the frame
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
        number = check_non_negative(count, "reserve: count")
        bucket = self._bucket_for(size)
        self._drain()
        _returns.check_reserve(self._ledger, bucket, size, number)
        for done in range(number):
            fresh = self._new_buffer(bucket)
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
        limit = check_non_negative(max_bytes, "trim: max_bytes")
        self._outside("trim")
        self._drain()
        freed = _returns.trim_to(self._ledger, limit)
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
        return build_stats(self._ledger.buckets, snapshot)

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
        if owned():
            raise _reentered(operation)


_NO_COPY = (
    "a BucketPool cannot be copied or pickled: its buffers have one holder each, and a "
    "copy would hand them out twice. Make a new BucketPool with the same settings instead"
)


def _reentered(operation: str) -> PoolError:
    return PoolError(
        f"{operation} was called from a finaliser or signal handler that interrupted this "
        "thread inside a pool, whose records may be half-way through a change; call "
        f"{operation} outside finalisers and signal handlers (releases are fine there: they "
        "are queued)"
    )
