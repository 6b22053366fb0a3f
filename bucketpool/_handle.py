"""`BufferHandle`: one hand-out of a buffer, named by the ledger's token (0 once released)."""

from __future__ import annotations

import sys
from typing import Any, NoReturn, SupportsIndex, cast, final

from bucketpool import _copies, _debug, _views
from bucketpool._buffer import VIEW_SET_BYTES, Buffer, field_arrays
from bucketpool._errors import ReleaseError
from bucketpool._ledger import AS_RECORDED, LEAK
from bucketpool._lock import LATE, owned
from bucketpool._views import CompletionEvent, DescriptorBuffers, IntegerInput, record

__all__ = ["BufferHandle"]


@final
class BufferHandle:
    """One hand-out of a buffer: ``with pool.acquire(n) as bufs:`` binds its views, then releases.

    Or call `release`.  Dropped unreleased, it warns (`LeakWarning`) and its buffer goes back.
    One thread at a time uses it; it cannot be copied or pickled (it is the buffer's holder).
    """

    __slots__ = ("_buffer", "_n", "_pool", "_token")  # made on the hot path, without __init__

    _pool: Any  # its `bucketpool.BucketPool` (which imports this module)
    _buffer: Buffer
    _token: int  # the hand-out's token; 0 once this handle released it
    _n: int

    def __init__(self) -> None:
        raise TypeError("a BufferHandle comes from BucketPool.acquire(n); do not build one")

    def __del__(self) -> None:
        try:
            token = self._token
        except AttributeError:  # never handed out
            return
        if token > 0 and (buffer := self._buffer).token == token:  # dropped while it held it
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
        site = cast("_debug.Site", self._buffer.site)
        return None if self.released or site is None else _debug.format_site(site)

    @property
    def buffers(self) -> DescriptorBuffers:
        """The three length-``n`` views (the ones the ``with`` statement binds).

        Raises:
            ReleaseError: the handle has been released.
        """
        return self._live("buffers").views_for(self._n)

    @property
    def arrays(self) -> _views.DescriptorArrays:
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
        if buffer.entered == token:
            raise ReleaseError(
                f"with: this handle (n={self._n}) is already bound by a with block, which "
                "releases it as it ends; enter each handle once"
            )
        buffer.entered = token  # (the holder's: one thread uses a handle at a time)
        if buffer.base._version == buffer.version:  # (`Buffer.views_for` inline: views to trust)
            views = buffer.views.get(self._n) or buffer.cut(self._n)
            views._token = token
            return views
        return buffer.views_for(self._n)

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Release the handle, as `release` does; a block's exception keeps precedence.

        Raises:
            ReleaseError: the block released the handle itself and did not raise.
            BaseException: what an event's ``query()`` raised, after the release took effect.
        """
        buffer = self._buffer
        token = self._token
        buffer.entered = 0  # the block is over (a release() may follow an interrupted exit)
        if token <= 0 or buffer.token != token:
            if exc is None:
                raise ReleaseError(self._released_message("end of with block"))
            _add_note(exc, f"bucketpool: {self._released_message('end of with block')}")
            return
        pool = self._pool
        seen = buffer.recorded  # first: an event recorded after this makes the move refuse
        if exc is None and not buffer.events and not pool._watching and not owned():
            views = (len(buffer.views) + buffer.lent_sets) * VIEW_SET_BYTES
            if pool._ledger.give_back(buffer, token, None, views, seen):
                self._token = 0
                if LATE:  # a finaliser that ran inside the move queued a release
                    pool._drain()
                return
        error: BaseException | None = None
        pending: list[Any] | None = None
        try:
            if exc is not None:
                buffer.version = -2  # a failed torch op may have changed a view uncounted
            if pool._watching:
                buffer.released_at = _debug.site(pool._full_stack)
            views = buffer.views_cost()
            while True:  # again if an event is recorded meanwhile (by a query(), a thread)
                if owned():  # inside a move (a finaliser, a handler): queued, no event asked
                    self._token = 0  # from here to the append no signal handler can run
                    try:  # it parks on every event recorded by the time it is taken back
                        buffer.bucket.inbox.append((buffer, token, AS_RECORDED, views))
                    except (RecursionError, MemoryError):  # not appended: still held
                        self._token = token
                        raise
                    LATE.append(pool._self_ref)
                    break
                seen, events, pending = buffer.recorded, buffer.events, None
                if events and buffer.token != token:  # released by another thread: not ours
                    self.__exit__(exc_type, exc, tb)  # refuses, as any released handle
                    return
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
                        seen = buffer.recorded
                        ids = {id(event) for event in asked}
                        pending += [event for event in _copy(buffer.events) if id(event) not in ids]
                    pending = pending or None
                    if self._token != token or buffer.token != token:  # a query() released it
                        if error is not None:
                            raise error
                        self.__exit__(exc_type, exc, tb)  # refuses, as any released handle
                        return
                raised = error is not None  # (raised to this releaser: to no one else)
                given = pool._ledger.give_back(buffer, token, pending, views, seen, raised)
                if given:
                    self._token = 0
                    break
                if given is None:
                    continue
                taken = pool._take_back((buffer, token, pending, views), seen, raised)
                if taken is None:
                    continue
                self._token = 0
                if not taken:  # another thread released this handle meanwhile
                    raise ReleaseError(self._released_message("release"))
                break
            if LATE:  # a finaliser that ran inside this release's move queued a release
                pool._drain()
            if pending and pool._level and error is None:  # (at off the parking suffices)
                error = _copies.early(pool, buffer, pending)
            if error is not None:
                if exc is None or not isinstance(error, Exception):
                    raise error
                _add_note(exc, f"bucketpool: releasing at the end of the with block: {error!r}")
        finally:
            error = None  # its traceback holds this frame: a cycle only the collector breaks

    def release(self) -> None:
        """Give the buffer back; parked until every `record_event` event is done.  Thread-safe.

        Raises:
            ReleaseError: the handle was already released, or a ``with`` block binds it (it
                releases it as it ends); nothing changes.
            BaseException: what an event's ``query()`` raised; released all the same (parked).
        """
        buffer = self._live("release")
        if buffer.entered == self._token:
            raise ReleaseError(
                f"release: this handle (n={self._n}) is bound by a with block, which "
                "releases it as it ends; leave the block to release it (nothing changed; a "
                "block whose end an exception stopped before it began: call "
                "handle.__exit__(None, None, None))"
            )
        self.__exit__(None, None, None)

    def shrink(self, count: SupportsIndex) -> DescriptorBuffers:
        """Views of the first *count* entries; see `DescriptorBuffers.shrink`.

        No view set of ``n`` is cut for it: a holder that only shrinks never uses one.
        """
        self._live("shrink").check_views()
        return DescriptorBuffers.shrink(cast(Any, self), count)

    def record_event(self, event: CompletionEvent) -> None:
        """Keep the buffer out of reuse until *event* is done; see `DescriptorBuffers`."""
        record(self._live("record_event"), self._token, event)

    def add_copies(
        self,
        first: SupportsIndex,
        sources: IntegerInput,
        destinations: IntegerInput,
        byte_counts: IntegerInput | SupportsIndex,
        *,
        step: SupportsIndex = 1,
    ) -> int:
        """Write copies into the views; see `DescriptorBuffers.add_copies`."""
        self._live("add_copies")  # (fills need no view set: they write the buffer's arrays)
        args = (first, sources, destinations, byte_counts)
        return DescriptorBuffers.add_copies(cast(Any, self), *args, step=step)

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
        self._live("add_block_copies")
        args = (first, src_base, dst_base, src_blocks, dst_blocks, block_bytes)
        fill = DescriptorBuffers.add_block_copies
        return fill(cast(Any, self), *args, total_bytes=total_bytes, coalesce=coalesce)

    def _no_copy(self, *args: object) -> NoReturn:
        raise TypeError(
            "a BufferHandle cannot be copied or pickled: it is the one holder of its buffer. "
            "Pass the handle itself, or copy the data out of its views (tensor.clone())"
        )

    __copy__ = __deepcopy__ = __reduce_ex__ = _no_copy

    def __repr__(self) -> str:
        if not hasattr(self, "_buffer"):  # made with object.__new__, never handed out
            return "<BufferHandle never handed out>"
        state = "released" if self.released else "live"
        at = "" if (where := self.acquired_at) is None else f" acquired at {where}"
        return f"<BufferHandle n={self.n} capacity={self.capacity} {state}{at}>"

    def _live(self, operation: str) -> Buffer:
        buffer, token = self._buffer, self._token
        if token <= 0 or buffer.token != token:
            self._refuse(operation)
        return buffer

    def _refuse(self, operation: str) -> NoReturn:
        raise ReleaseError(self._released_message(operation))

    def _released_message(self, operation: str) -> str:
        what = f"this handle (n={self._n}, capacity {self.capacity})"
        return f"{operation}: {what} was already released; acquire a new handle instead"


def _copy(events: Any) -> tuple[CompletionEvent, ...]:
    while True:
        try:
            return tuple(events or ())
        except RuntimeError:  # another thread's record changed it while copied: again
            continue


def _add_note(exc: BaseException, note: str) -> None:
    if sys.version_info >= (3, 11):  # (3.10 has no notes)
        exc.add_note(note)
