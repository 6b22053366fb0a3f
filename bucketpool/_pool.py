"""`BucketPool`: the pool's face over its ledger (`bucketpool._ledger`); see docs/design.md."""

from __future__ import annotations

import numbers
import sys
import time
import typing
import weakref
from collections.abc import Callable, Sequence
from types import CodeType
from typing import SupportsIndex

import torch

from bucketpool import _debug, _parking, _returns, _settings
from bucketpool._buffer import Bucket, Buffer
from bucketpool._errors import InFlightWriteError, ReleaseError, reentered
from bucketpool._handle import BufferHandle
from bucketpool._ledger import CACHE, EMPTY, SETTLE, SWEEP, Entry, Ledger
from bucketpool._lock import LATE, hold_across_forks, owned
from bucketpool._settings import DEBUG_LEVELS, DebugLevel, Settings, check_count, check_non_negative
from bucketpool._stats import OutstandingBuffer, PoolStats, build_stats, outstanding_of
from bucketpool._views import CompletionEvent

__all__ = ["BucketPool"]

_new = object.__new__
_getframe = sys._getframe


@typing.final
class BucketPool:
    """A thread-safe pool of descriptor buffers in power-of-two capacity buckets.

    ``n`` entries come from bucket ``bucket_capacity(n)``'s latest released buffer, else a new
    one.  Options left `None` come from ``BUCKETPOOL_CONF``/``BUCKETPOOL_DEBUG`` or defaults.

    Args:
        dtype: `torch.int64` (default) or `torch.uint64` (XPU's batched copy).
        device: where the buffers live; only a CPU device (the host reads descriptors).
        pin_memory: page-locked buffers, for non-blocking uploads of the descriptors.
        min_capacity: the smallest bucket, a power of two (default 16).
        max_capacity: the largest ``n`` accepted, a power of two (default 2**24).
        max_cached_bytes: bytes of idle (cached and parked) buffers kept (default 64 MiB).
        max_cached_per_bucket: idle buffers kept per bucket (default 32).
        idle_trim_acquires: acquires before an unused bucket is trimmed; 0: never (default 1024).
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
        hold_across_forks()  # the first pool registers the fork hooks
        arguments = dict(locals())  # every keyword argument is a setting
        del arguments["self"]
        self._settings = s = _settings.resolve_settings(arguments)
        self._level = DEBUG_LEVELS.index(s.debug)
        verify = _debug.verify if self._level else None
        idle = s.idle_trim_acquires  # trimmed at most idle * 5 / 4 acquires after last use
        sweep = max(1, idle // 4) if idle else 256  # it drains the inboxes too: always runs
        self._ledger = ledger = Ledger(
            s.max_capacity, s.max_cached_bytes, s.max_cached_per_bucket, sweep, verify
        )
        self._max_capacity = s.max_capacity
        first = s.min_capacity.bit_length() - 1  # n <= min_capacity (0 too)
        self._by_bits = [ledger.buckets[max(bits, first)] for bits in range(len(ledger.buckets))]
        self._full_stack, self._watching = s.trace, self._level > 0 or s.trace
        self._reported: set[object] = set()
        self._self_ref = weakref.ref(self)
        if _parking.ORPHANS and not owned():  # dropped pools' buffers wait parked: all asked
            _reap(every=True)

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
        # Parked buffers outlive their pool until their events report done (`_parking.adopt`).
        # The rest: break the cycles (buffers, buckets, views), not to wait for the collector.
        ledger = getattr(self, "_ledger", None)  # None: its __init__ raised
        if ledger is None:
            return
        for buffer in ledger.registry.values():
            buffer.views, buffer.lent, buffer.lent_sets = {}, [None, None], 0
        kept = _parking.adopt(ledger)
        for bucket in ledger.buckets:
            bucket.free = []
            if not kept:  # (else its releases are taken back, as the buffers retire)
                bucket.inbox.clear()

    def __reduce_ex__(self, *args: object) -> typing.NoReturn:
        raise TypeError(_NO_COPY)

    __copy__ = __deepcopy__ = __reduce_ex__

    def acquire(self, n: SupportsIndex) -> BufferHandle:
        """Return a handle on a buffer of at least *n* entries; its views have exactly *n*.

        Args:
            n: the number of descriptors, an int (or numpy integer), 0 to ``max_capacity``.

        Raises:
            TypeError: *n* is a bool or not an integer.
            ValueError: *n* is negative or above ``settings.max_capacity``.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        if type(n) is not int or n < 0 or n > self._max_capacity:
            n = check_count(n, self._max_capacity)
        bucket = self._by_bits[((n or 1) - 1).bit_length()]
        if owned():
            raise reentered("acquire")
        frame = _getframe(1)  # the site, for a leak warning: no stack walk
        code, lasti = frame.f_code, frame.f_lasti
        handle = _new(BufferHandle)  # bound inside the move: its finaliser owns the buffer
        handle._pool, handle._n = self, n
        got: object = EMPTY  # none cached: straight to the parked buffers, then a new one
        if bucket.free or bucket.inbox:  # hints: `serve` decides
            got = self._ledger.serve(bucket, n, handle, code, lasti)
        if got is not handle or self._watching or LATE:
            self._served(got, bucket, n, handle, code, lasti)
        return handle

    def _served(
        self, got: object, bucket: Bucket, n: int, handle: BufferHandle, code: object, lasti: int
    ) -> None:
        """Finish a hand-out `Ledger.serve` answered *got*: serve it slowly, sweep, record."""
        if got is not handle:
            if got is not SWEEP:
                got = self._serve_slowly(bucket, n, handle, code, lasti, got)
            if got is SWEEP:
                self._maintain()
        if self._watching:
            self._handed_out(handle._buffer)
        if LATE:
            self._drain()

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
                    if found is not None:  # done, and of this bucket: hand it out
                        got = ledger.serve(bucket, n, handle, code, lasti, None, found, index)
                        if got is not EMPTY:
                            return got
                    if retired or found is not None:
                        if queued:  # retired into an inbox
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
        """Check the last release's poison, record the site."""
        if buffer.ended:  # an interrupt kept the last release from making them read-only
            _debug.end_arrays(buffer)
        if self._level and (stale := _debug.check_poison(buffer)) is not None:
            _returns.warn(stale, RuntimeWarning)
        code = buffer.code
        if self._full_stack or not isinstance(code, CodeType) or _debug.in_package(code):
            buffer.site = _debug.site(self._full_stack)
        else:
            buffer.site = (code, buffer.lasti if buffer.lasti >= 0 else ~buffer.lasti)

    def release(self, handle: BufferHandle) -> None:
        """Release *handle*; the same as ``handle.release()``.

        Raises:
            TypeError: *handle* is not a `BufferHandle`.
            ReleaseError: *handle* is another pool's, or was released already.
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

    def _take_back(self, entry: Entry, seen: int, raised: bool) -> bool | None:
        problems: list[str] = []
        taken = _returns.take_back(
            self._ledger, entry[0].bucket, self._reported, problems, entry, seen, raised
        )
        for problem in problems:
            _returns.warn(problem, RuntimeWarning)
        return taken

    def _drain(self, only: Bucket | None = None) -> None:
        """Take back what waits in the inboxes (all, or *only*'s), unless inside a move."""
        if owned():
            return
        for problem in _returns.drain(self._ledger, self._reported, only):
            _returns.warn(problem, RuntimeWarning)
        while LATE:  # queued inside a move left since
            try:
                pool = LATE.pop()()
            except IndexError:  # another thread took the last one
                break
            if isinstance(pool, BucketPool):  # None: dropped since
                for problem in _returns.drain(pool._ledger, pool._reported):
                    _returns.warn(problem, RuntimeWarning)

    def _maintain(self) -> None:
        """Every few acquires: retire finished parked buffers, trim idle buckets."""
        ledger = self._ledger
        if ledger.young:
            _parking.poll(ledger)
        if ledger.old:  # a miss the young ones serve never asks them
            _parking.poll_old(ledger, _parking.POLL_BUDGET)
        if _parking.ORPHANS:  # a dropped pool's buffers wait parked
            _reap()
        self._drain()
        _returns.sweep_idle(ledger, self._settings.idle_trim_acquires)

    def collect(self) -> int:
        """Retire every parked buffer whose events are all done (each asked once); return how many.

        Raises:
            BaseException: the first error a ``query()`` raised that no call raised before
                (a note names the buffer); that buffer stays parked, and no later `collect`
                or `synchronize` raises its error.
            InFlightWriteError: (debug levels) a retired buffer's descriptors changed in flight.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        return self._settle_parked(_parking.all_done, "collect")

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait for every parked buffer's events (``synchronize()``, else ``query()``); retire them.

        Args:
            timeout: seconds to wait in all, or `None` (the default): for ever.  With a
                timeout only ``query()`` is polled, as ``synchronize()`` cannot be interrupted.

        Raises:
            TimeoutError: events still pending at the timeout; their buffers stay parked.
            TypeError, ValueError: *timeout* is not a number of seconds >= 0.
            BaseException: as for `collect`; an event that raises ends the wait for its
                buffer, which stays parked.
            InFlightWriteError: (debug levels), as for `collect`.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        deadline = None
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
                raise TypeError(f"synchronize: timeout must be seconds or None, got {timeout!r}")
            if not timeout >= 0:  # (NaN too)
                raise ValueError(f"synchronize: timeout must be >= 0 seconds, got {timeout!r}")
            deadline = time.monotonic() + min(timeout, 1e18)  # (an int past float range)
        late: list[Sequence[CompletionEvent]] = []  # the events still pending at the deadline

        def finished(events: Sequence[CompletionEvent]) -> bool:
            done = _parking.wait(events, deadline)
            if not done:
                late.append(events)
            return done

        self._settle_parked(finished, "synchronize")
        if late:
            raise TimeoutError(
                f"synchronize: {len(late)} parked buffer(s) still wait for events not done after "
                f"timeout={timeout} s; they stay parked (counted in stats().parked_bytes) and "
                "come back once their events report done: call synchronize() or collect() "
                "again later, or find the copy that never completes"
            )

    def _settle_parked(
        self, finished: Callable[[Sequence[CompletionEvent]], bool], operation: str
    ) -> int:
        self._outside(operation)
        if _parking.ORPHANS:  # a dropped pool's buffers wait parked
            _reap()
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

    def reserve(self, n: SupportsIndex, count: SupportsIndex = 1) -> None:
        """Pre-allocate *count* cached buffers of *n*'s bucket, so first steps allocate nothing.

        Raises:
            TypeError, ValueError: a bad *n* or *count*, or more than the caps would keep.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        if owned():
            raise reentered("reserve")
        size = check_count(n, self._max_capacity, "reserve")
        number = check_non_negative(count, "reserve: count")
        bucket = self._by_bits[((size or 1) - 1).bit_length()]
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
        """Free cached buffers (LRU first) until at most *max_bytes* stay; return bytes freed.

        Raises:
            TypeError, ValueError: *max_bytes* is not an integer, or is negative.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        limit = check_non_negative(max_bytes, "trim: max_bytes")
        self._outside("trim")
        freed = _returns.trim_to(self._ledger, limit)
        if LATE:
            self._drain()
        return freed

    def empty_cache(self) -> int:
        """Free every cached buffer (``trim(0)``); return bytes freed."""
        return self.trim(0)

    def outstanding(self) -> list[OutstandingBuffer]:
        """Return a record (``n``, capacity, site if tracing) of each buffer out, oldest first.

        Raises:
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._outside("outstanding")
        buffers = self._ledger.buffers()
        while LATE:  # a finaliser released a holder inside the move: again
            self._drain()
            buffers = self._ledger.buffers()
        return outstanding_of(buffers.values())

    def stats(self) -> PoolStats:
        """Return a consistent snapshot of the counters (see `PoolStats`).

        Raises:
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._outside("stats")
        snapshot = self._ledger.snapshot()
        while LATE:  # a finaliser released a holder inside the move: again
            self._drain()
            snapshot = self._ledger.snapshot()
        return build_stats(self._ledger.buckets, snapshot)

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value.

        Raises:
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        self._outside("reset_peak_stats")  # drains first: queued releases are not active
        self._ledger.reset_peaks()

    def bucket_capacity(self, n: SupportsIndex) -> int:
        """Return the capacity of the bucket that serves *n* in this pool.

        Raises:
            TypeError, ValueError: as for `acquire`.
        """
        size = check_count(n, self._max_capacity, "bucket_capacity")
        return self._by_bits[((size or 1) - 1).bit_length()].capacity

    def _outside(self, operation: str) -> None:
        """Refuse *operation* inside a move (a finaliser's or signal handler's); else drain."""
        if owned():
            raise reentered(operation)
        self._drain()


def _reap(every: bool = False) -> None:
    """Ask dropped pools' parked buffers (`_parking.reap`); free those whose events are done."""
    for ledger in _parking.reap(every):
        _returns.drain(ledger, set())  # (its caps keep nothing)


_NO_COPY = (
    "a BucketPool cannot be copied or pickled: its buffers have one holder each, and a "
    "copy would hand them out twice. Make a new BucketPool with the same settings instead"
)
