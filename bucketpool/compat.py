"""Drop-in replacements for vLLM's ``DescriptorBufferPool``: swap the import (docs/compat.md)."""

from __future__ import annotations

import typing
from typing import NamedTuple, SupportsIndex

import torch

from bucketpool import _lend
from bucketpool._handle import BufferHandle
from bucketpool._inputs import as_integer, read_copies
from bucketpool._pool import BucketPool
from bucketpool._views import CompletionEvent, DescriptorBuffers, IntArray, IntegerInput, write

__all__ = [
    "AliasedDescriptorBufferPool",
    "AliasedDescriptorBuffers",
    "DescriptorBufferPool",
    "DescriptorBuffers",
]


class AliasedDescriptorBuffers(NamedTuple):
    """vLLM's six-field descriptor buffers: three tensors and numpy aliases (``*_np``) of them."""

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
        *,
        step: SupportsIndex = 1,
    ) -> int:
        """Write copies as `DescriptorBuffers.add_copies`; return the next free entry (vLLM: None).

        Raises:
            CapacityError: the copies do not fit (an `IndexError` and the original's `ValueError`).
            ValueError: lengths differ, a byte count is negative, or *step* is below 1.
            TypeError: an input is not integer.
        """
        arrays = (self.src_np, self.dst_np, self.sizes_np)
        plan = read_copies(first, sources, destinations, byte_counts, self.src_np.dtype)
        every = as_integer(step, "step", "add_copies")
        return write(arrays, len(self.src_np), plan, "add_copies", every)


class _Holding:
    """A tuple an adapter hands out: its handle (``_handle``) holds the buffer; copies do not.

    The classes below have no ``__slots__``, so each tuple has a ``__dict__`` for its handle.
    """

    __slots__ = ()
    _public: typing.ClassVar[type[DescriptorBuffers] | type[AliasedDescriptorBuffers]]
    _handle: BufferHandle
    _buffer: object  # the hand-out's buffer and token, which fills check (as views' do)
    _token: int

    def __copy__(self) -> DescriptorBuffers | AliasedDescriptorBuffers:
        return self._public(*self._items())

    def __deepcopy__(self, memo: dict[int, object]) -> DescriptorBuffers | AliasedDescriptorBuffers:
        tensors = [tensor.clone() for tensor in self._items()[:3]]
        aliases = [t.numpy() for t in tensors] if self._public is not DescriptorBuffers else []
        return self._public(*tensors, *aliases)

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[object, ...]:
        return (self._public, self._items())

    def _items(self) -> tuple[typing.Any, ...]:
        return tuple(typing.cast("tuple[typing.Any, ...]", self))

    add_copies = DescriptorBuffers.add_copies  # into the whole bucket, while it is held

    def record_event(self, event: object) -> None:
        raise TypeError(
            "a compat triple records its copy's end event at release: pool.release(bufs, "
            "event=event); bufs.record_event is for the views of with pool.acquire(n) as bufs:"
        )


class _HeldBuffers(_Holding, DescriptorBuffers):  # shrink, add_block_copies: as views'
    _public = DescriptorBuffers


class _HeldAliasedBuffers(_Holding, AliasedDescriptorBuffers):
    _public = AliasedDescriptorBuffers


for _held in (_HeldBuffers, _HeldAliasedBuffers):
    _held.__name__ = _held.__qualname__ = _held._public.__name__  # reprs say the public name

_Buffers = typing.TypeVar("_Buffers", DescriptorBuffers, AliasedDescriptorBuffers)


class _Adapter(typing.Generic[_Buffers]):
    """What both adapters share (no __slots__: tests patch it)."""

    _held: type[_HeldBuffers | _HeldAliasedBuffers]
    _fields: int  # how many of a buffer's lent fields a tuple has

    def __init__(self, *, dtype: torch.dtype = torch.int64) -> None:
        self.pool = BucketPool(dtype=dtype)

    def acquire(self, n: SupportsIndex) -> _Buffers:
        """Return a triple of its bucket's whole capacity (>= *n*).  Thread-safe.

        Under ``torch.inference_mode()`` its tensors are inference tensors, as vLLM's pool
        makes them there.

        Raises:
            TypeError: *n* is a bool or not an integer.
            ValueError: *n* is negative or above the pool's ``max_capacity``.
            PoolError: called from a finaliser that interrupted this thread inside the pool.
        """
        return _lend.acquire(self, n)  # type: ignore[no-any-return]

    def release(self, bufs: _Buffers, *, event: CompletionEvent | None = None) -> None:
        """Return *bufs* to the pool.  Thread-safe.

        Args:
            bufs: what `acquire` returned.
            event: the ``swap_blocks_batch`` call's end event: no reuse until it is done.

        Raises:
            ReleaseError: *bufs* was released already, or is not from this pool; no change.
            TypeError: *event* has no ``query()`` method; *bufs* stays acquired.
            PoolError: an *event* given from a finaliser or signal handler that interrupted
                this thread inside the pool; *bufs* stays acquired (release it after).
            BaseException: what ``event.query()`` raised; released all the same (parked).
        """
        _lend.release(self, bufs, event)

    @property
    def _pool(self) -> list[_Buffers]:
        """For the host's tests: the cached buffers' tuples, as vLLM's list (docs/compat.md)."""
        public: typing.Any = self._held._public
        return [public(*fields[: self._fields]) for fields in _lend.cached_fields(self.pool)]

    def _refusal(self, bufs: object, released: bool) -> str:
        name = type(bufs).__name__
        if released:
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


@typing.final
class DescriptorBufferPool(_Adapter[DescriptorBuffers]):
    """The original three-field pool's API (`DescriptorBuffers`), backed by a `BucketPool`.

    Args:
        dtype: `torch.int64` (default) or `torch.uint64` (vLLM's XPU pointer dtype).
    """

    _held = _HeldBuffers
    _fields = 3


@typing.final
class AliasedDescriptorBufferPool(_Adapter[AliasedDescriptorBuffers]):
    """vLLM's later six-field pool API (numpy aliases, ``add_copies``), backed by a `BucketPool`.

    Args:
        dtype: `torch.int64` (default) or `torch.uint64` (vLLM's XPU pointer dtype).
    """

    _held = _HeldAliasedBuffers
    _fields = 6
