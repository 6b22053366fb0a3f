"""Drop-in replacements for vLLM's ``DescriptorBufferPool``: swap the import, keep the calls.

``DescriptorBufferPool`` keeps the original three-field API; ``AliasedDescriptorBufferPool``
keeps the later six-field one (tensors plus numpy aliases and ``add_copies``).  Both are
backed by a `BucketPool` (made with the defaults, so ``BUCKETPOOL_CONF`` applies) and keep
the original's semantics: ``acquire(n)`` returns a triple of *capacity* >= ``n`` -- the
whole power-of-two bucket, so callers keep cutting their ``[:n]`` slices -- and the very
same object comes back for any ``n`` its capacity holds.  They add what the originals
lacked: `ReleaseError` on a double or foreign release, bounded memory, reuse deferred until
an ``event`` reports done, and a `LeakWarning` for a triple dropped without release (its
buffer comes back).

Each triple refers to its hand-out (a `BufferHandle`); the adapter itself keeps nothing of
what it handed out, so a dropped triple is freed at once, without the garbage collector.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import NamedTuple, SupportsIndex

import torch

from bucketpool import _fill
from bucketpool._buffer import Buffer
from bucketpool._errors import InFlightWriteError, ReleaseError
from bucketpool._handle import CompletionEvent, DescriptorBuffers
from bucketpool._pool import BucketPool

__all__ = [
    "AliasedDescriptorBufferPool",
    "AliasedDescriptorBuffers",
    "DescriptorBufferPool",
    "DescriptorBuffers",
]


class AliasedDescriptorBuffers(NamedTuple):
    """vLLM's six-field descriptor buffers: three tensors and numpy aliases of them.

    ``src_np``, ``dst_np`` and ``sizes_np`` share memory with ``src_ptrs``, ``dst_ptrs``
    and ``sizes``; all six have the same length.
    """

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor
    src_np: _fill.IntArray
    dst_np: _fill.IntArray
    sizes_np: _fill.IntArray

    def add_copies(
        self,
        first: int,
        sources: _fill.IntegerInput,
        destinations: _fill.IntegerInput,
        byte_counts: _fill.IntegerInput | int,
    ) -> None:
        """Write ``len(sources)`` copies at ``[first, first + len(sources))``.

        The same checks as `BufferHandle.add_copies`; a failed call writes nothing.

        Raises:
            CapacityError: the copies do not fit in the triple's entries; it is both an
                `IndexError` and the `ValueError` the original raised.
            ValueError: lengths differ, or a byte count is negative.
            TypeError: an input is not integer.
        """
        _fill.add_copies(
            (self.src_np, self.dst_np, self.sizes_np), first, sources, destinations, byte_counts
        )


class _Holding:
    """What a handed-out tuple knows of its hand-out, in its ``__dict__``.

    ``_buffer``, ``_token`` and ``_pool`` name the hand-out; ``_buffer`` and ``_pool`` are
    None once it is released, so an idle tuple kept with its buffer makes no reference
    cycle.  ``_owner`` is the ``id()`` of the pool, for telling a double release from a
    foreign tuple in messages.
    Dropping a tuple unreleased reports a leak and takes its buffer back, as for a
    `BufferHandle`.  ``copy``, ``deepcopy`` and ``pickle`` give the public tuple class
    (``DescriptorBuffers`` or ``AliasedDescriptorBuffers``) holding the data: a copy is
    never a second holder.
    """

    _buffer: Buffer | None
    _token: int
    _pool: BucketPool | None
    _owner: int
    _public: typing.ClassVar[type[DescriptorBuffers] | type[AliasedDescriptorBuffers]]

    def __copy__(self) -> DescriptorBuffers | AliasedDescriptorBuffers:
        # A copy is the data, never a second holder: the public tuple of the same tensors,
        # which `release` refuses as not acquired from the pool.
        return self._public(*self._items())

    def __deepcopy__(self, memo: dict[int, object]) -> DescriptorBuffers | AliasedDescriptorBuffers:
        tensors = [tensor.clone() for tensor in self._items()[:3]]
        aliases = (
            [tensor.numpy() for tensor in tensors] if self._public is not DescriptorBuffers else []
        )
        return self._public(*tensors, *aliases)

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[object, ...]:
        return (self._public, self._items())

    def _items(self) -> tuple[typing.Any, ...]:
        return tuple(typing.cast("tuple[typing.Any, ...]", self))

    def __del__(self) -> None:
        buffer = self.__dict__.get("_buffer")
        pool = self.__dict__.get("_pool")
        if buffer is not None and pool is not None and buffer.token == self._token:
            pool._inbox.append((buffer, self._token, True))  # as a BufferHandle's finaliser
            pool._drain_from_finaliser()


# The tuples the adapters hand out: the public classes plus a __dict__ (no __slots__ on
# purpose) holding the hand-out.
class _HeldBuffers(DescriptorBuffers, _Holding):
    pass


class _HeldAliasedBuffers(AliasedDescriptorBuffers, _Holding):
    pass


for _held, _public in (
    (_HeldBuffers, DescriptorBuffers),
    (_HeldAliasedBuffers, AliasedDescriptorBuffers),
):
    _held.__name__ = _held.__qualname__ = _public.__name__  # reprs and messages say the public name
    _held._public = _public

_Buffers = typing.TypeVar("_Buffers", DescriptorBuffers, AliasedDescriptorBuffers)


class _Adapter(typing.Generic[_Buffers]):
    """What both adapters share: acquire and release through the pool's one path."""

    # No __slots__: tests patch methods on instances (mock.patch.object(pool, "acquire")).
    _held: type[_HeldBuffers | _HeldAliasedBuffers]

    def __init__(self, *, dtype: torch.dtype = torch.int64) -> None:
        self.pool = BucketPool(dtype=dtype)

    def acquire(self, n: SupportsIndex) -> _Buffers:
        """Return a triple of capacity >= *n* (its bucket's whole capacity).

        The same object comes back for any *n* that the capacity holds, as in the original.
        Thread-safe.

        Raises:
            TypeError: *n* is a bool or not an integer.
            ValueError: *n* is negative or above the pool's ``max_capacity``.
        """
        # The pool binds the tuple to the hand-out inside its lock (see `BucketPool._lease`).
        return typing.cast("_Buffers", self.pool._lease(n, None, self._triple))

    def _triple(self, buffer: Buffer) -> _HeldBuffers | _HeldAliasedBuffers:
        """The tuple of *buffer*'s whole tensors (and arrays) that stays with the buffer."""
        whole: tuple[object, ...] = buffer.tensors
        if self._held is _HeldAliasedBuffers:
            whole = (*whole, *buffer.arrays)
        bufs = tuple.__new__(self._held, whole)
        bufs._owner = id(self.pool)
        return bufs

    def release(self, bufs: _Buffers, *, event: CompletionEvent | None = None) -> None:
        """Return *bufs* to the pool.  Thread-safe.

        Args:
            bufs: what `acquire` returned.
            event: when given, the buffers are not reused until ``event.query()`` is true;
                pass the end event recorded after the ``swap_blocks_batch`` call.

        Raises:
            ReleaseError: *bufs* was released already, or did not come from this pool;
                nothing changes.
            TypeError: *event* has no ``query()`` method; *bufs* stays acquired.
            Exception: what ``event.query()`` raised; the release took effect and the
                buffer stays parked until the event reports done.
        """
        held = bufs if type(bufs) is self._held else None
        record = held.__dict__ if held is not None else {}
        buffer: Buffer | None = record.get("_buffer")
        if held is None or buffer is None or record.get("_pool") is not self.pool:
            raise ReleaseError(self._refusal(bufs))
        token: int = record["_token"]
        problem = None
        if event is not None:
            if not callable(getattr(event, "query", None)):
                raise TypeError(
                    "release: event needs a query() -> bool method (torch.Event, "
                    f"torch.cuda.Event), got {type(event).__name__}; the buffers stay acquired"
                )
            if buffer.token == token:
                try:
                    self.pool._record(buffer, event)
                except InFlightWriteError as error:  # recorded all the same: release, then say
                    problem = error
        # The release's move keeps the tuple with the buffer and clears the tuple's record
        # of the hand-out (no reference cycle), in one step that nothing can interrupt.
        if not self.pool._release(buffer, token, held):
            raise ReleaseError(self._refusal(bufs))
        if problem is not None:
            raise problem

    @property
    def _pool(self) -> _IdleBuffers[_Buffers]:
        """The idle buffers, for code that inspects the original's private list.

        Exists only for code and tests written against the original pool, which read its
        ``_pool`` list: ``len()``, truth, iteration and indexing behave like that list of
        idle triples, the most recently released last.  Each call reads a fresh snapshot.
        Read-only.
        """
        return _IdleBuffers(self.pool, self._triple)

    def _refusal(self, bufs: object) -> str:
        name = type(bufs).__name__
        if type(bufs) is self._held and bufs.__dict__.get("_owner") == id(self.pool):
            return (
                f"release: this {name} was already released; release each acquire() result "
                "exactly once"
            )
        return (
            f"release: this {name} was not acquired from this pool ({self!r}); release it "
            "into the pool whose acquire() returned it"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} at {id(self):#x} backed by {self.pool!r}>"


@typing.final
class _IdleBuffers(typing.Generic[_Buffers]):
    """A read-only, list-like view of a pool's idle buffers (see `_Adapter._pool`)."""

    __slots__ = ("_pool", "_triple")

    def __init__(self, pool: BucketPool, triple: typing.Callable[[Buffer], object]) -> None:
        self._pool = pool
        self._triple = triple

    def _snapshot(self) -> list[_Buffers]:
        return typing.cast("list[_Buffers]", self._pool._idle_kept(self._triple))

    def __len__(self) -> int:
        return len(self._snapshot())

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[_Buffers]:
        return iter(self._snapshot())

    @typing.overload
    def __getitem__(self, index: int) -> _Buffers: ...

    @typing.overload
    def __getitem__(self, index: slice) -> list[_Buffers]: ...

    def __getitem__(self, index: int | slice) -> _Buffers | list[_Buffers]:
        return self._snapshot()[index]

    def __repr__(self) -> str:
        return f"<{len(self)} idle buffers of {self._pool!r}>"


@typing.final
class DescriptorBufferPool(_Adapter[DescriptorBuffers]):
    """The original three-field pool's API, backed by a `BucketPool`.

    ``acquire(n)`` returns `DescriptorBuffers` of capacity >= *n*; ``release(bufs)`` takes
    them back.  Thread-safe.

    Args:
        dtype: `torch.int64` (default) or `torch.uint64` (vLLM's XPU pointer dtype).
    """

    _held = _HeldBuffers


@typing.final
class AliasedDescriptorBufferPool(_Adapter[AliasedDescriptorBuffers]):
    """vLLM's later six-field pool API (numpy aliases, ``add_copies``), backed by a `BucketPool`.

    Thread-safe.

    Args:
        dtype: `torch.int64` (default) or `torch.uint64` (vLLM's XPU pointer dtype).
    """

    _held = _HeldAliasedBuffers
