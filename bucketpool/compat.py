"""Drop-in replacements for vLLM's ``DescriptorBufferPool``: swap the import, keep the calls.

``DescriptorBufferPool`` keeps the original three-field API; ``AliasedDescriptorBufferPool``
keeps the later six-field one (tensors plus numpy aliases and ``add_copies``).  Both are
backed by a `BucketPool` (made with the defaults, so ``BUCKETPOOL_CONF`` applies) and keep
the original's contract: ``acquire(n)`` returns a triple of *capacity* >= ``n`` -- the
whole power-of-two bucket, so callers keep cutting their ``[:n]`` slices.  Each acquire
returns a new tuple object holding the same tensors (the same memory) as the last tuple of
that buffer, so that a late release of an earlier tuple is refused instead of ending the
new holder's hand-out.  They add what the originals lacked: `ReleaseError` on a double,
stale or foreign release, bounded memory, reuse deferred until an ``event`` reports done,
and a `LeakWarning` for a triple dropped without release (its buffer comes back).

The adapter keeps nothing of what it handed out, so a dropped tuple is finalised at once,
without the garbage collector.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Iterator
from typing import NamedTuple, SupportsIndex

import torch

from bucketpool import _fill, _verify
from bucketpool._buckets import check_count
from bucketpool._buffer import HELD, LEAK_TUPLE, Buffer
from bucketpool._errors import ReleaseError
from bucketpool._lock import LATE, inside, owned, reentered
from bucketpool._pool import BucketPool
from bucketpool._refill import serve_slowly
from bucketpool._types import CompletionEvent, DescriptorBuffers, IntArray, IntegerInput

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
    src_np: IntArray
    dst_np: IntArray
    sizes_np: IntArray

    def add_copies(
        self,
        first: SupportsIndex,
        sources: IntegerInput,
        destinations: IntegerInput,
        byte_counts: IntegerInput | SupportsIndex,
    ) -> int:
        """Write ``len(sources)`` copies at ``[first, first + len(sources))``.

        The same checks as `BufferHandle.add_copies`; a failed call writes nothing.  Returns
        the next free entry, ``first + len(sources)`` (vLLM's returns None): pass exactly
        the entries written, ``bufs.src_ptrs[:end]``.

        Raises:
            CapacityError: the copies do not fit in the triple's entries; it is both an
                `IndexError` and the `ValueError` the original raised.
            ValueError: lengths differ, or a byte count is negative.
            TypeError: an input is not integer.
        """
        return _fill.add_copies(
            (self.src_np, self.dst_np, self.sizes_np), first, sources, destinations, byte_counts
        )


class _Holding:
    """A tuple an adapter hands out: the public class, one object per hand-out.

    It holds its buffer while `bucketpool._ledger.HELD` has its ``id()``; dropping it then
    reports a leak and takes the buffer back, as for a `BufferHandle`.  ``copy``,
    ``deepcopy`` and ``pickle`` give the public tuple class (``DescriptorBuffers`` or
    ``AliasedDescriptorBuffers``) holding the data: a copy is never a second holder.
    """

    __slots__ = ()
    _public: typing.ClassVar[type[DescriptorBuffers] | type[AliasedDescriptorBuffers]]

    def __copy__(self) -> DescriptorBuffers | AliasedDescriptorBuffers:
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
        record = HELD.get(id(self))
        if record is None:  # released, or never handed out
            return
        buffer, token = record
        buffer.bucket.inbox.append(
            (buffer, token, LEAK_TUPLE, buffer.views_cost())
        )  # as a BufferHandle's finaliser
        HELD.pop(id(self), None)  # after the append: from it on, the pool has the buffer
        pool = buffer.pool_ref() if buffer.pool_ref is not None else None
        if isinstance(pool, BucketPool):
            if inside():  # never wait for the lock from inside it: the move's caller drains
                LATE.append(pool._self_ref)
            else:
                pool._drain()


def _held_add_copies(
    self: _HeldBuffers | _HeldAliasedBuffers,
    first: SupportsIndex,
    sources: IntegerInput,
    destinations: IntegerInput,
    byte_counts: IntegerInput | SupportsIndex,
) -> int:
    """Write copies into the tuple's entries ``[first, first + k)``; return ``first + k``.

    The same checks as `BufferHandle.add_copies`; a failed call writes nothing.

    Raises:
        ReleaseError: the tuple was released (its buffer may be another's now).
        CapacityError, ValueError, TypeError: as for `BufferHandle.add_copies`.
    """
    record = HELD.get(id(self))
    if record is not None:  # every input read first (user code may run there), then checked
        buffer = record[0]
        plan = _fill.plan_copies(buffer._arrays, first, sources, destinations, byte_counts)
        if HELD.get(id(self)) is record:
            return _fill.write_copies(buffer.arrays, buffer.bucket.capacity, plan)
    raise ReleaseError(
        f"add_copies: this {type(self).__name__} was released; its buffer may be handed "
        "out again. Write descriptors before pool.release(bufs), or acquire a new triple"
    )


def _held_record_event(self: _HeldBuffers | _HeldAliasedBuffers, event: object) -> None:
    """Refuse: a compat tuple's events are given to its release."""
    raise TypeError(
        "a compat triple records its copy's end event at release: pool.release(bufs, "
        "event=event); bufs.record_event is for the views of with pool.acquire(n) as bufs:"
    )


# The tuples the adapters hand out: the public classes, one object per hand-out.
class _HeldBuffers(DescriptorBuffers, _Holding):
    __slots__ = ()
    add_copies = _held_add_copies
    record_event = _held_record_event


class _HeldAliasedBuffers(AliasedDescriptorBuffers, _Holding):
    __slots__ = ()
    add_copies = _held_add_copies
    record_event = _held_record_event


for _held, _public in (
    (_HeldBuffers, DescriptorBuffers),
    (_HeldAliasedBuffers, AliasedDescriptorBuffers),
):
    _held.__name__ = _held.__qualname__ = _public.__name__  # reprs and messages say the public name
    _held._public = _public

_Buffers = typing.TypeVar("_Buffers", DescriptorBuffers, AliasedDescriptorBuffers)
_getframe = sys._getframe


class _Adapter(typing.Generic[_Buffers]):
    """What both adapters share: acquire and release through the pool's one path."""

    # No __slots__: tests patch methods on instances (mock.patch.object(pool, "acquire")).
    _held: type[_HeldBuffers | _HeldAliasedBuffers]
    _aliased: typing.ClassVar[bool]

    def __init__(self, *, dtype: torch.dtype = torch.int64) -> None:
        self.pool = BucketPool(dtype=dtype)
        self._ref = self.pool._self_ref

    def acquire(self, n: SupportsIndex) -> _Buffers:
        """Return a triple of capacity >= *n* (its bucket's whole capacity).  Thread-safe.

        The pool's acquire path, with the tuple the ledger keeps with the buffer as the
        holder (see `BucketPool.acquire`).

        Raises:
            TypeError: *n* is a bool or not an integer.
            ValueError: *n* is negative or above the pool's ``max_capacity``.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        pool = self.pool
        if type(n) is not int or n < 0 or n > pool._max_capacity:
            n = check_count(n, pool._max_capacity)
        bucket = pool._by_bits[((n or 1) - 1).bit_length()]
        if owned():
            raise reentered("acquire")
        frame = _getframe(1)
        ledger = pool._ledger
        held = ledger.serve(bucket, n, None, frame.f_code, frame.f_lasti)
        if type(held) is int:
            held = serve_slowly(
                pool, bucket, n, None, frame.f_code, frame.f_lasti, self._make, held
            )
        if ledger.tick >= ledger.next_sweep and ledger.claim_sweep():
            pool._maintain()
        buffer, _ = HELD[id(held)]
        if pool._watching:
            pool._handed_out(buffer)
        if buffer.base._version != buffer.version:  # views to check, not holding: `Buffer`
            # A holder changed the views in place: this hand-out gets a tuple of intact ones.
            fresh, fresh_id = self._make(buffer, True)
            # Bound to the new tuple before the old lets go: a signal between the two
            # leaves both bound, and the one dropped brings the buffer back, as a leak.
            HELD[fresh_id] = HELD[id(held)]
            del HELD[id(held)]
            held = fresh
        return held  # type: ignore[return-value]  # the tuple this adapter's _make made

    def _make(self, buffer: Buffer, exclusive: bool) -> tuple[object, int]:
        """A tuple of *buffer*'s whole fields for a hand-out to come, and its ``id()``.

        *exclusive*: this thread alone may touch the buffer (its cached views may be used).
        """
        whole: tuple[object, ...] | None = buffer.whole
        if whole is None or buffer.base._version != buffer.version:
            # None yet, or the views may have changed (at the debug levels: always taken so):
            # views_for() repairs them, or, for a tuple made ahead, new ones are cut.
            capacity = buffer.bucket.capacity
            views = buffer.views_for(capacity) if exclusive else buffer.cut(capacity)
            if buffer.views.get(capacity) is views:
                # The compat tuples' own from now on, out of the handles' cache: a handle's
                # shrink, or the cache resizing its oldest set, would resize them under the
                # tuples made from them.  (At the debug levels every compat acquire makes
                # its tuple anew, from views checked for that hand-out.)
                del buffer.views[capacity]
            # An exact tuple: a tuple subclass is made from one without a copy in between.
            whole = tuple(views)
            if exclusive:
                buffer.whole = whole
        if self._aliased:
            src, dst, sizes = buffer.arrays  # new aliases: the pool's own stay its own
            whole = (*typing.cast("tuple[object, ...]", whole), src[:], dst[:], sizes[:])
        bufs = tuple.__new__(self._held, whole)
        return bufs, id(bufs)

    def release(self, bufs: _Buffers, *, event: CompletionEvent | None = None) -> None:
        """Return *bufs* to the pool.  Thread-safe.

        Args:
            bufs: what `acquire` returned.
            event: when given, the buffers are not reused until ``event.query()`` is true;
                pass the end event recorded after the ``swap_blocks_batch`` call.

        Raises:
            ReleaseError: *bufs* was released already (or a later acquire handed its
                buffer out again), or did not come from this pool; nothing changes.
            TypeError: *event* has no ``query()`` method; *bufs* stays acquired.
            BaseException: what ``event.query()`` raised; the release took effect and the
                buffer stays parked until the event reports done.
        """
        holder_id = id(bufs)
        record = HELD.get(holder_id)
        if record is None or type(bufs) is not self._held or record[0].pool_ref is not self._ref:
            raise ReleaseError(self._refusal(bufs))
        buffer, token = record
        pending: list[CompletionEvent] | None = None
        error: BaseException | None = None
        try:
            if event is not None:
                if not callable(getattr(event, "query", None)):
                    raise TypeError(
                        "release: event needs a query() -> bool method (torch.Event, "
                        f"torch.cuda.Event), got {type(event).__name__}; the buffers stay acquired"
                    )
                try:
                    pending = None if event.query() else [event]
                except BaseException as exc:  # user code: the buffer stays parked; it is theirs
                    pending, error = [event], exc
            pool = self.pool
            marks = None
            if pool._watching:
                checksum = None
                if pool._level and pending:
                    checksum = _verify.checksum(buffer.arrays, buffer.span)
                marks = (_verify.site(pool._full_stack), checksum)
            # Made while the hand-out lasts, from the views as they are: never the cached
            # ones, which a racing release could share (the next acquire checks the views).
            whole = buffer.whole
            if whole is None or self._aliased or buffer.base._version != buffer.version:
                following = self._make(buffer, False)
            else:
                following_tuple = tuple.__new__(self._held, whole)
                following = (following_tuple, id(following_tuple))
            # One move checks the token and ends the hand-out, so that of two releases of one
            # tuple exactly one takes effect, whatever ran between (the event's query()).
            if not pool._ledger.end_held(
                buffer, token, holder_id, pending, following, marks, buffer.views_cost()
            ):
                raise ReleaseError(self._refusal(bufs))
            if owned():  # a finaliser or handler that interrupted a move: taken back later
                LATE.append(pool._self_ref)
            else:  # at once: a cap frees it before this returns
                pool._drain(buffer.bucket)
            if error is not None:
                raise error
        finally:
            error = None  # no cycle through this frame (see `BufferHandle.__exit__`)

    @property
    def _pool(self) -> _IdleBuffers[_Buffers]:
        """The idle buffers, for code that inspects the original's private list.

        Exists only for code and tests written against the original pool, which read its
        ``_pool`` list: ``len()``, truth, iteration and indexing behave like that list of
        idle triples, bucket by bucket (smallest first), in each the most recently released
        last.  Each entry holds the tensors that buffer's next acquire hands out, in a
        tuple of the public class: releasing one is refused, as for any tuple not acquired,
        so that looking never lets anyone end another's hand-out.  Each call reads a fresh
        snapshot.  Read-only.
        """
        return _IdleBuffers(self.pool, self._make, self._held._public)

    def _refusal(self, bufs: object) -> str:
        name = type(bufs).__name__
        if type(bufs) is self._held and _owned_by(self.pool, typing.cast("tuple[object]", bufs)[0]):
            return (
                f"release: this {name} was already released (or its buffer was handed out "
                "again since, as a new tuple); release each acquire() result exactly once"
            )
        return (
            f"release: this {name} was not acquired from this pool ({self!r}); release it "
            "into the pool whose acquire() returned it"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} at {id(self):#x} backed by {self.pool!r}>"


def _owned_by(pool: BucketPool, tensor: object) -> bool:
    """Whether *tensor* is a view of one of *pool*'s buffers (for the refusals' messages)."""
    if not isinstance(tensor, torch.Tensor):
        return False
    try:
        with torch._C.DisableTorchFunctionSubclass():  # a strict view, released, refuses
            address = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return False
    return any(buffer.address == address for buffer in pool._ledger.buffers())


@typing.final
class _IdleBuffers(typing.Generic[_Buffers]):
    """A read-only, list-like view of a pool's idle buffers (see `_Adapter._pool`)."""

    __slots__ = ("_pool", "_public", "_triple")

    def __init__(
        self,
        pool: BucketPool,
        make: typing.Callable[[Buffer, bool], tuple[object, int]],
        public: type[DescriptorBuffers] | type[AliasedDescriptorBuffers],
    ) -> None:
        self._pool = pool
        self._triple = make
        self._public = public

    def _snapshot(self) -> list[_Buffers]:
        """Copies of the tuples the cached buffers' next hand-outs get, newest last per bucket."""
        pool = self._pool
        pool._outside("_pool")
        pool._drain()
        entries = []
        for bucket in pool._buckets:
            for buffer in list(bucket.free):  # read without the lock: a snapshot to look at
                held = buffer.next_holder
                if held is None:
                    held = self._triple(buffer, False)[0]
                entries.append(self._public(*typing.cast("tuple[typing.Any, ...]", held)))
        return typing.cast("list[_Buffers]", entries)

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
    _aliased = False


@typing.final
class AliasedDescriptorBufferPool(_Adapter[AliasedDescriptorBuffers]):
    """vLLM's later six-field pool API (numpy aliases, ``add_copies``), backed by a `BucketPool`.

    Thread-safe.

    Args:
        dtype: `torch.int64` (default) or `torch.uint64` (vLLM's XPU pointer dtype).
    """

    _held = _HeldAliasedBuffers
    _aliased = True
