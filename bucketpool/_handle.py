"""The caller's side of a hand-out: `BufferHandle`, its views, fills and events.

A handle owns nothing by itself.  It names one hand-out of one buffer: the buffer, and the
token the ledger gave that hand-out.  Every call first checks that the token is still the
buffer's, so a stale or forged handle can do nothing; releasing sets the handle's token to
0, so a second release is refused at once.  A copy of a handle is refused.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import typing
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn, SupportsIndex

from bucketpool import _fill, _guard, _verify
from bucketpool._buckets import as_index
from bucketpool._buffer import AS_RECORDED, LEAK
from bucketpool._errors import ReleaseError
from bucketpool._inbox import take_back, warn
from bucketpool._lock import LATE, inside, owned
from bucketpool._types import CompletionEvent, DescriptorArrays, DescriptorBuffers, IntegerInput

if TYPE_CHECKING:
    from bucketpool._buffer import Buffer
    from bucketpool._types import PoolCore

__all__ = ["BufferHandle"]


@typing.final
class BufferHandle:
    """One hand-out of a buffer: its views, its events, and the duty to release it.

    Use it as a context manager (``with pool.acquire(n) as bufs:``), which binds the
    `DescriptorBuffers` and releases on exit, or call `release` yourself.  A handle dropped
    unreleased is reported with a `LeakWarning` and its buffer goes back to the pool.

    A handle is used by one thread at a time; handing it to another thread (to release it
    there, say) is fine.  Handles cannot be copied or pickled: a copy would be a second
    holder of the same buffer.
    """

    # A plain __slots__ class: handles are made on the hot path without calling __init__.
    __slots__ = ("_buffer", "_n", "_pool", "_token")

    _pool: PoolCore
    _buffer: Buffer
    _token: int  # the hand-out's token; 0 once this handle released it
    _n: int

    def __init__(self) -> None:
        """Refuse: handles come from `BucketPool.acquire`."""
        raise TypeError("a BufferHandle comes from BucketPool.acquire(n); do not build one")

    def __del__(self) -> None:
        try:
            token = self._token
        except AttributeError:  # never handed out
            return
        if token <= 0:  # released (the common case: nothing more to read)
            return
        buffer = self._buffer
        if buffer.token == token:  # dropped while it held the buffer
            buffer.bucket.inbox.append(
                (buffer, token, LEAK, buffer.views_cost())
            )  # from here on the pool has it
            if inside():  # never wait for the lock from inside it: the move's caller drains
                LATE.append(self._pool._self_ref)
            else:
                self._pool._drain()

    # -- what the holder sees ------------------------------------------------------------

    @property
    def n(self) -> int:
        """The number of entries the views have."""
        buffer = self._buffer
        return buffer.n if buffer.token == self._token else self._n

    @property
    def capacity(self) -> int:
        """The capacity of the bucket this buffer came from (a power of two)."""
        return self._buffer.bucket.capacity

    @property
    def released(self) -> bool:
        """Whether this hand-out is over (the buffer may still be parked on its events)."""
        return self._token <= 0 or self._buffer.token != self._token

    @property
    def acquired_at(self) -> str | None:
        """Where the handle was acquired, when the pool traces (``trace`` or a debug level)."""
        buffer = self._buffer
        token = self._token
        if token <= 0 or buffer.token != token or buffer.site is None:
            return None
        return _verify.format_site(buffer.site)  # type: ignore[arg-type]

    @property
    def buffers(self) -> DescriptorBuffers:
        """The three length-``n`` views (the ones the ``with`` statement binds).

        Raises:
            ReleaseError: the handle has been released.
        """
        buffer = self._live("buffers")
        views = buffer.current
        if views is None or buffer.base._version != buffer.version:
            views = buffer.current = buffer.views_for(buffer.n)
        return views

    @property
    def arrays(self) -> DescriptorArrays:
        """The three fields as length-``n`` numpy arrays sharing memory with the views.

        Raises:
            ReleaseError: the handle has been released.
        """
        buffer = self._live("arrays")
        if buffer.guard is not None:
            return _guard.guarded_arrays(buffer, buffer.n)
        return buffer.field_arrays(buffer.n)

    def __enter__(self) -> DescriptorBuffers:
        """Return the views; the ``with`` block releases the handle when it ends."""
        buffer = self._buffer
        token = self._token
        if token <= 0 or buffer.token != token:
            self._refuse("with")
        if buffer.base._version == buffer.version:
            views = buffer.views.get(buffer.n)
            if views is not None:
                buffer.current = views
                return views
        views = buffer.current = buffer.views_for(buffer.n)
        return views

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the handle, also when the block raised (the exception propagates).

        The handle's one release path: its events are asked (``query()``, user code), then
        the pool takes the buffer back before this returns: parked if an event is pending,
        else cached, or freed if the caps do not keep it.  (From a finaliser or signal
        handler that interrupted this thread inside the pool, the buffer is queued instead,
        and taken back as soon as that thread leaves the pool.)  A block's exception keeps
        precedence: what went wrong in the release is noted on it.

        Raises:
            ReleaseError: the block released the handle itself and did not raise.
            BaseException: what an event's ``query()`` raised, after the release took effect.
        """
        buffer = self._buffer
        token = self._token
        if token <= 0 or buffer.token != token:
            if exc is None:
                raise ReleaseError(self._released_message("end of with block"))
            _add_note(exc, f"bucketpool: {self._released_message('end of with block')}")
            return
        pool = self._pool
        error: BaseException | None = None
        try:
            if exc is not None:
                # A torch op that raised may have changed a view without counting the change
                # (a failed resize_ or out=): the next hand-out checks every view set.
                buffer.version = -2
            if pool._watching:
                buffer.released_at = _verify.site(pool._full_stack)
            views = buffer.views_cost()
            while True:  # again if an event is recorded meanwhile (by a query(), a thread)
                seen = buffer.recorded
                events = buffer.events
                pending = None
                if events:
                    try:  # a copy: a query() (or a thread) may record more meanwhile
                        asked = tuple(events)
                    except RuntimeError:  # another thread's record changed it as copied
                        asked = _copy(events)
                    try:
                        if len(asked) == 1:
                            pending = [] if asked[0].query() else [asked[0]]
                        else:
                            pending = [event for event in asked if not event.query()]
                    except BaseException as caught:  # user code: the buffer stays parked
                        pending, error = list(asked), caught
                    if buffer.recorded != seen:  # a query() recorded more: pending, unasked
                        seen = buffer.recorded  # first: a later one makes the move refuse
                        ids = {id(event) for event in asked}
                        pending += [event for event in _copy(buffer.events) if id(event) not in ids]
                    pending = pending or None
                    if self._token != token or buffer.token != token:  # a query() released it
                        if error is not None:
                            raise error
                        self.__exit__(exc_type, exc, tb)  # refuses, as any released handle
                        return
                # The move that takes the buffer back checks the token and *seen*: a late
                # second release from another thread, or a record that raced this one,
                # changes nothing of the next hand-out's.
                if owned():  # a finaliser or handler that interrupted a move: queued
                    self._token = 0  # from here to the append no signal handler can run
                    try:  # it parks on every event recorded by the time it is taken back
                        buffer.bucket.inbox.append((buffer, token, AS_RECORDED, views))
                    except (RecursionError, MemoryError):  # not appended: still held
                        self._token = token
                        raise
                    LATE.append(pool._self_ref)
                    break
                given = pool._ledger.give_back(buffer, token, pending, views, seen)
                if given:
                    self._token = 0  # cached or parked: the common case, in one move
                    break
                if given is None:
                    continue
                # Taken back at once (parked, cached or freed: a cap frees it before this
                # returns), then the handle lets go: a signal between the two finds the
                # hand-out over all the same (the buffer's token moved on).
                problems: list[str] = []
                entry = (buffer, token, pending, views)
                ledger, reported = pool._ledger, pool._reported
                taken = take_back(ledger, buffer.bucket, reported, problems, entry, seen)
                if taken is None:
                    continue
                self._token = 0
                if not taken:  # another thread released this handle meanwhile
                    raise ReleaseError(self._released_message("release"))
                for problem in problems:
                    warn(problem, RuntimeWarning)
                break
            if LATE:  # a finaliser that ran inside this release's move queued a release
                pool._drain()
            if error is not None:
                if exc is None or not isinstance(error, Exception):
                    raise error
                _add_note(exc, f"bucketpool: releasing at the end of the with block: {error!r}")
        finally:
            # Kept past this frame, the error's traceback (which holds this frame) would
            # keep this frame's locals alive, and theirs: a cycle only the collector breaks.
            error = None

    def release(self) -> None:
        """Give the buffer back to the pool.

        If an event recorded with `record_event` has not completed, the buffer is parked:
        it is not handed out again until every recorded event reports done.  Thread-safe.

        Raises:
            ReleaseError: the handle was already released; nothing changes.
            BaseException: whatever an event's ``query()`` raised; the release took effect
                and the buffer stays parked until the event reports done.
        """
        buffer = self._buffer
        token = self._token
        if token <= 0 or buffer.token != token:
            self._refuse("release")
        self.__exit__(None, None, None)

    def shrink(self, count: SupportsIndex) -> DescriptorBuffers:
        """Shrink the views, in place, to their first *count* entries, and return them.

        A buffer's entries are not cleared between holders: entries a step did not write
        hold whatever the last holder left.  Pass `swap_blocks_batch` exactly what was
        written by shrinking to the count that `add_copies` or `add_block_copies` returned::

            with pool.acquire(n) as bufs:
                written = bufs.add_copies(0, sources, destinations, sizes)
                swap_blocks_batch(*bufs.shrink(written))

        The views bound by the ``with`` statement are the ones resized; `n` becomes
        *count*.  No tensor is created.

        Raises:
            ReleaseError: the handle has been released.
            TypeError: *count* is not an integer.
            ValueError: *count* is negative or above `n`.
        """
        k = as_index(count, "shrink: count", hint="pass the index add_copies() returned")
        self._live("shrink")
        views = self.buffers
        buffer = self._buffer
        if not 0 <= k <= buffer.n:
            raise ValueError(
                f"shrink: count={k} is outside 0..n={buffer.n}; views can only shrink (acquire "
                "a larger handle to write more entries)"
            )
        buffer.narrow(views, k)
        self._n = k
        return views

    def record_event(self, event: CompletionEvent) -> None:
        """Keep the buffer out of reuse until *event* reports done.

        Record the event after the `swap_blocks_batch` call (or upload) that reads the
        descriptors.  Several events may be recorded; all must complete.  Events found done
        while the handle is held are dropped.

        Raises:
            ReleaseError: the handle has been released.
            TypeError: *event* has no ``query()`` method.
            InFlightWriteError: (debug levels) the descriptors changed while an earlier
                recorded copy could still read them; *event* was recorded all the same.
        """
        buffer = self._buffer
        token = self._token
        if token <= 0 or buffer.token != token:
            self._refuse("record_event")
        pool = self._pool
        if buffer.events is None and not pool._level and callable(getattr(event, "query", 0)):
            recorded = pool._ledger.add_event(  # the first: nothing to ask, one move
                buffer, token, event, collections.deque(), None, False, None
            )
        else:
            recorded = pool._record(buffer, token, event)
        if not recorded:
            self._refuse("record_event")  # its hand-out ended meanwhile

    def add_copies(
        self,
        first: SupportsIndex,
        sources: IntegerInput,
        destinations: IntegerInput,
        byte_counts: IntegerInput | SupportsIndex,
    ) -> int:
        """Write copies into entries ``[first, first + k)`` and return ``first + k``.

        *sources* and *destinations* are numpy integer arrays, CPU integer tensors or
        sequences of ints of one length ``k``; *byte_counts* is the same or one integer for
        every copy.  Addresses up to 2**64 - 1 are stored exactly (as their bit pattern in
        an int64 pool).  Every input is read before the hand-out is checked and the first
        entry is written, so a call that raises writes nothing.

        Raises:
            ReleaseError: the handle has been released.
            CapacityError: ``first + k > n`` (an `IndexError` and a `ValueError`).
            ValueError: lengths differ, or a byte count is negative.
            TypeError: an input is not integer.
        """
        # Planning reads the arrays' dtypes only: the checked `arrays` is for the write.
        plan = _fill.plan_copies(self._buffer._arrays, first, sources, destinations, byte_counts)
        buffer = self._live("add_copies")
        return _fill.write_copies(buffer.arrays, buffer.n, plan)

    def add_block_copies(
        self,
        first: SupportsIndex,
        src_base: SupportsIndex,
        dst_base: SupportsIndex,
        src_blocks: IntegerInput,
        dst_blocks: IntegerInput,
        block_bytes: SupportsIndex,
        *,
        total_bytes: SupportsIndex | None = None,
        coalesce: bool = True,
    ) -> int:
        """Write copies of whole blocks between two block-structured regions.

        Copy ``i`` moves *block_bytes* from ``src_base + src_blocks[i] * block_bytes`` to
        ``dst_base + dst_blocks[i] * block_bytes``.  With *coalesce*, runs where both block
        indices are consecutive become one descriptor.  *total_bytes* trims the last copy so
        that exactly that many bytes move.  Returns the next free entry.  Every input is
        read before the hand-out is checked and the first entry is written.

        Raises:
            ReleaseError: the handle has been released.
            CapacityError: the descriptors do not fit in ``[first, n)``.
            ValueError: bad lengths, block indices, block size or *total_bytes*.
            TypeError: an input is not integer.
        """
        plan = _fill.plan_block_copies(
            self._buffer._arrays,
            first,
            src_base,
            dst_base,
            src_blocks,
            dst_blocks,
            block_bytes,
            total_bytes,
            coalesce,
        )
        buffer = self._live("add_block_copies")
        return _fill.write_block_copies(buffer.arrays, buffer.n, plan)

    # -- no second holder -----------------------------------------------------------------

    def __copy__(self) -> NoReturn:
        raise TypeError(_NO_COPY)

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise TypeError(_NO_COPY)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise TypeError(_NO_COPY)

    def __repr__(self) -> str:
        if not hasattr(self, "_buffer"):  # made with object.__new__, never handed out
            return "<BufferHandle never handed out>"
        state = "released" if self.released else "live"
        where = self.acquired_at
        at = "" if where is None else f" acquired at {where}"
        return f"<BufferHandle n={self.n} capacity={self.capacity} {state}{at}>"

    def _live(self, operation: str) -> Buffer:
        buffer = self._buffer
        token = self._token
        if token <= 0 or buffer.token != token:
            self._refuse(operation)
        return buffer

    def _refuse(self, operation: str) -> NoReturn:
        raise ReleaseError(self._released_message(operation))

    def _released_message(self, operation: str) -> str:
        return (
            f"{operation}: this handle (n={self._n}, capacity {self.capacity}) was already "
            "released; acquire a new handle instead"
        )


_NO_COPY = (
    "a BufferHandle cannot be copied or pickled: it is the one holder of its buffer. "
    "Pass the handle itself, or copy the data out of its views (tensor.clone())"
)


def _add_note(exc: BaseException, note: str) -> None:
    """`BaseException.add_note` (3.11+); on 3.10 the same ``__notes__`` list, unprinted."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:  # pragma: no cover - 3.10 only
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list):
            notes.append(note)
        else:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, "__notes__", [note])  # noqa: B010 - not typed on 3.10


def _copy(events: Iterable[CompletionEvent] | None) -> tuple[CompletionEvent, ...]:
    """A copy of a hand-out's events, which another thread's record may change meanwhile."""
    while True:
        try:
            return tuple(events or ())
        except RuntimeError:  # changed while copied (deque mutated during iteration): again
            continue
