"""The caller's side of a hand-out: `BufferHandle`.

A handle owns nothing by itself.  It names one hand-out of one buffer: the buffer, and the
token the ledger gave that hand-out.  Every call first checks that the token is still the
buffer's, so a stale or forged handle can do nothing; releasing sets the handle's token to
0, so a second release is refused at once.  A copy of a handle is refused.
"""

from __future__ import annotations

import sys
import typing
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex

from bucketpool import _debug
from bucketpool._buffer import VIEW_SET_BYTES, field_arrays
from bucketpool._errors import ReleaseError
from bucketpool._ledger import AS_RECORDED, LEAK
from bucketpool._lock import LATE, owned
from bucketpool._views import (
    CompletionEvent,
    DescriptorArrays,
    DescriptorBuffers,
    IntegerInput,
    record,
)

if TYPE_CHECKING:
    from bucketpool._buffer import Buffer

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

    _pool: Any  # the `bucketpool.BucketPool` that handed it out (which imports this module)
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
        if buffer.token == token:  # dropped while it held the buffer: from here on, the pool's
            buffer.bucket.inbox.append((buffer, token, LEAK, buffer.views_cost()))
            if owned():  # never wait for the lock from inside it: the move's caller drains
                LATE.append(self._pool._self_ref)
            else:
                self._pool._drain()

    @property
    def n(self) -> int:
        """The number of entries the views have."""
        return self._n

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
        if self.released or buffer.site is None:
            return None
        return _debug.format_site(buffer.site)

    @property
    def buffers(self) -> DescriptorBuffers:
        """The three length-``n`` views (the ones the ``with`` statement binds).

        Raises:
            ReleaseError: the handle has been released.
        """
        return self._live("buffers").views_for(self._n)

    @property
    def arrays(self) -> DescriptorArrays:
        """The three fields as length-``n`` numpy arrays sharing memory with the views.

        Raises:
            ReleaseError: the handle has been released.
        """
        return field_arrays(self._live("arrays"), self._n)

    def __enter__(self) -> DescriptorBuffers:
        """Return the views; the ``with`` block releases the handle when it ends."""
        buffer = self._buffer
        token = self._token
        if token <= 0 or buffer.token != token:
            self._refuse("with")
        if buffer.base._version == buffer.version:  # (`Buffer.views_for`, inline)
            views = buffer.views.get(self._n) or buffer.cut(self._n)
            views._token = token
            return views
        return buffer.views_for(self._n)

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
        seen = buffer.recorded  # first: an event recorded after this makes the move refuse
        if exc is None and not buffer.events and not pool._watching and not owned():
            # The common release (no event, no exception, no tracing): one move.
            views = len(buffer.views) * VIEW_SET_BYTES  # what its view sets count
            if pool._ledger.give_back(buffer, token, None, views, seen):
                self._token = 0
                if LATE:  # a finaliser that ran inside the move queued a release
                    pool._drain()
                return
        error: BaseException | None = None
        try:
            if exc is not None:
                # A torch op that raised may have changed a view without counting the change
                # (a failed resize_ or out=): the next hand-out checks every view set.
                buffer.version = -2
            if pool._watching:
                buffer.released_at = _debug.site(pool._full_stack)
            views = len(buffer.views) * VIEW_SET_BYTES  # what its view sets count
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
                taken = pool._take_back((buffer, token, pending, views), seen)
                if taken is None:
                    continue
                self._token = 0
                if not taken:  # another thread released this handle meanwhile
                    raise ReleaseError(self._released_message("release"))
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
        self._live("release")
        self.__exit__(None, None, None)

    def shrink(self, count: SupportsIndex) -> DescriptorBuffers:
        """Views of the first *count* entries; see `DescriptorBuffers.shrink`."""
        return self._live("shrink").views_for(self._n).shrink(count)

    def record_event(self, event: CompletionEvent) -> None:
        """Keep the buffer out of reuse until *event* is done; see `DescriptorBuffers`."""
        record(self._live("record_event"), self._token, event)

    def add_copies(
        self,
        first: SupportsIndex,
        sources: IntegerInput,
        destinations: IntegerInput,
        byte_counts: IntegerInput | SupportsIndex,
    ) -> int:
        """Write copies into the views; see `DescriptorBuffers.add_copies`."""
        views = self._live("add_copies").views_for(self._n)
        return views.add_copies(first, sources, destinations, byte_counts)

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
        """Write copies of whole blocks; see `DescriptorBuffers.add_block_copies`."""
        return self._live("add_block_copies").views_for(self._n).add_block_copies(
            *(first, src_base, dst_base, src_blocks, dst_blocks, block_bytes),
            total_bytes=total_bytes,
            coalesce=coalesce,
        )

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


def _copy(events: Any) -> tuple[CompletionEvent, ...]:
    """A copy of a hand-out's events, which another thread's record may change meanwhile."""
    while True:
        try:
            return tuple(events or ())
        except RuntimeError:  # changed while copied (deque mutated during iteration): again
            continue


def _add_note(exc: BaseException, note: str) -> None:
    """`BaseException.add_note` (3.11 and later; on 3.10 the note is dropped)."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
