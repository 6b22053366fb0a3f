"""The caller's side of a hand-out: `BufferHandle`, the views it yields, the events it records.

A handle owns nothing by itself.  It names one hand-out of one buffer (the buffer and the
token the pool gave that hand-out) and asks the pool, which checks the token under its lock,
for everything that changes ownership.  A copy of a handle is refused; a handle forged some
other way names a token that the pool has already retired, so it can release nothing.
"""

from __future__ import annotations

import contextlib
import sys
import typing
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple, NoReturn, Protocol, SupportsIndex

import torch

from bucketpool import _fill
from bucketpool._buckets import as_index
from bucketpool._debug import format_site, guarded_views
from bucketpool._errors import ReleaseError

if TYPE_CHECKING:
    from bucketpool._buffer import Buffer
    from bucketpool._pool import BucketPool

__all__ = ["BufferHandle", "CompletionEvent", "DescriptorBuffers"]


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
    __slots__ = ("_buffer", "_guarded", "_n", "_pool", "_token")

    _pool: BucketPool
    _buffer: Buffer
    _token: int
    _n: int

    def __init__(self) -> None:
        """Refuse: handles come from `BucketPool.acquire`."""
        raise TypeError("a BufferHandle comes from BucketPool.acquire(n); do not build one")

    def __del__(self) -> None:
        try:
            buffer, token, pool = self._buffer, self._token, self._pool
        except AttributeError:  # never handed out
            return
        if buffer.token == token:  # tokens never come back: a mismatch is final
            # Queued first, in one step: from here on the pool takes the buffer back.
            pool._inbox.append((buffer, token, True))
            pool._drain_from_finaliser()

    # -- what the holder sees -------------------------------------------------------------

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
        return self._buffer.token != self._token

    @property
    def acquired_at(self) -> str | None:
        """Where the handle was acquired, when the pool traces (``trace`` or a debug level)."""
        where = self._buffer.site if self._buffer.token == self._token else None
        return None if where is None else format_site(where)

    @property
    def buffers(self) -> DescriptorBuffers:
        """The three length-``n`` views.

        Raises:
            ReleaseError: the handle has been released.
        """
        buffer = self._buffer
        if buffer.token != self._token:
            self._refuse("buffers")
        if buffer.view_n != self._n:
            return self._views()
        return buffer.views

    @property
    def arrays(self) -> _fill.DescriptorArrays:
        """The three fields as length-``n`` numpy arrays sharing memory with the views.

        Raises:
            ReleaseError: the handle has been released.
        """
        buffer = self._buffer
        if buffer.token != self._token:
            self._refuse("arrays")
        return buffer.narrow_arrays(self._n)

    def __enter__(self) -> DescriptorBuffers:
        """Return the views; the ``with`` block releases the handle when it ends."""
        buffer = self._buffer
        if buffer.token != self._token:
            self._refuse("with")
        if buffer.view_n != self._n:
            return self._views()
        return buffer.views

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the handle, also when the block raised (the exception propagates).

        Raises:
            ReleaseError: the block released the handle itself and did not raise.
        """
        if exc is None:
            if not self._pool._release(self._buffer, self._token):
                raise ReleaseError(self._released_message("end of with block"))
            return
        # The block is raising: release all the same, and keep its exception, noting on it
        # anything else that went wrong.
        try:
            released = self._pool._release(self._buffer, self._token)
        except Exception as error:
            _add_note(exc, f"bucketpool: releasing at the end of the with block: {error!r}")
            return
        if not released:
            _add_note(exc, f"bucketpool: {self._released_message('end of with block')}")

    def release(self) -> None:
        """Give the buffer back to the pool.

        If an event recorded with `record_event` has not completed, the buffer is parked:
        it is not handed out again until every recorded event reports done.  Thread-safe.

        Raises:
            ReleaseError: the handle was already released; nothing changes.
            InFlightWriteError: (debug levels) the descriptors changed while a recorded
                copy could read them; the release took effect.
            Exception: whatever an event's ``query()`` raised; the release took effect and
                the buffer stays parked until the event reports done.
        """
        if not self._pool._release(self._buffer, self._token):
            raise ReleaseError(self._released_message("release"))

    def shrink(self, count: SupportsIndex) -> DescriptorBuffers:
        """Shrink the views, in place, to their first *count* entries, and return them.

        A buffer's entries are not cleared between holders: entries a step did not write
        hold whatever the last holder left.  Pass `swap_blocks_batch` exactly what was
        written by shrinking to the count that `add_copies` or `add_block_copies` returned::

            with pool.acquire(n) as bufs:
                written = handle.add_copies(0, sources, destinations, sizes)
                swap_blocks_batch(*handle.shrink(written))

        The views bound by the ``with`` statement are the ones resized; `n` becomes
        *count*.  No tensor is created.

        Raises:
            ReleaseError: the handle has been released.
            TypeError: *count* is not an integer.
            ValueError: *count* is negative or above `n`.
        """
        if self._buffer.token != self._token:
            self._refuse("shrink")
        k = as_index(count, "shrink: count", hint="pass the index add_copies() returned")
        if not 0 <= k <= self._n:
            raise ValueError(
                f"shrink: count={k} is outside 0..n={self._n}; views can only shrink (acquire "
                "a larger handle to write more entries)"
            )
        self._n = k
        if self._buffer.guard:
            views = self._views()
            for view in views:
                view.resize_(k)
            return views
        return self._buffer.narrow(k)

    def record_event(self, event: CompletionEvent) -> None:
        """Keep the buffer out of reuse until *event* reports done.

        Record the event after the `swap_blocks_batch` call (or upload) that reads the
        descriptors.  Several events may be recorded; all must complete.

        Raises:
            ReleaseError: the handle has been released.
            TypeError: *event* has no ``query()`` method.
            InFlightWriteError: (debug levels) the descriptors changed while an earlier
                recorded copy could still read them; *event* was recorded all the same.
        """
        if not callable(getattr(event, "query", None)):
            raise TypeError(
                "record_event needs an object with a query() -> bool method "
                f"(torch.Event, torch.cuda.Event), got {type(event).__name__}"
            )
        if self._buffer.token != self._token:
            self._refuse("record_event")
        self._pool._record(self._buffer, event)

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
            CapacityError: ``first + k > n`` (an `IndexError` and a `ValueError`).
            ValueError: lengths differ, or a byte count is negative.
            TypeError: an input is not integer.
        """
        if self._buffer.token != self._token:
            self._refuse("add_copies")
        arrays = self._buffer.narrow_arrays(self._n)
        return _fill.add_copies(arrays, first, sources, destinations, byte_counts)

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
            CapacityError: the descriptors do not fit in ``[first, n)``.
            ValueError: bad lengths, block indices, block size or *total_bytes*.
            TypeError: an input is not integer.
        """
        if self._buffer.token != self._token:
            self._refuse("add_block_copies")
        return _fill.add_block_copies(
            self._buffer.narrow_arrays(self._n),
            first,
            src_base,
            dst_base,
            src_blocks,
            dst_blocks,
            block_bytes,
            total_bytes=total_bytes,
            coalesce=coalesce,
        )

    def _views(self) -> DescriptorBuffers:
        """The views of this hand-out when the shared ones do not fit: resize, or guard."""
        buffer = self._buffer
        if not buffer.guard:
            return buffer.narrow(self._n)
        views: DescriptorBuffers | None = getattr(self, "_guarded", None)
        if views is None:
            views = DescriptorBuffers(*guarded_views(buffer, self._token, self._n))
            self._guarded = views
        return views

    # -- no second holder -----------------------------------------------------------------

    def __copy__(self) -> NoReturn:
        raise TypeError(_NO_COPY)

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise TypeError(_NO_COPY)

    def __reduce_ex__(self, protocol: typing.SupportsIndex) -> NoReturn:
        raise TypeError(_NO_COPY)

    def __repr__(self) -> str:
        if not hasattr(self, "_buffer"):  # made with object.__new__, never handed out
            return "<BufferHandle never handed out>"
        state = "released" if self.released else "live"
        where = self.acquired_at
        at = "" if where is None else f" acquired at {where}"
        return f"<BufferHandle n={self._n} capacity={self.capacity} {state}{at}>"

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
