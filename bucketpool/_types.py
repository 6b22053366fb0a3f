"""The types every module shares: the views tuple, the event protocol, the descriptor layout.

A leaf: it imports nothing of the package, so no import circle passes through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, SupportsIndex, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "DTYPES",
    "ENTRY_BYTES",
    "FIELDS",
    "CompletionEvent",
    "DescriptorArrays",
    "DescriptorBuffers",
    "IntArray",
    "IntegerInput",
    "PoolCore",
    "ViewOwner",
    "Views",
]

#: Bytes of one descriptor entry of one field (int64 or uint64).
ENTRY_BYTES = 8
#: Fields per buffer: source addresses, destination addresses, sizes.
FIELDS = 3
#: The pointer dtypes a pool may use: int64, or uint64 (XPU's batched copy).
DTYPES = (torch.int64, torch.uint64)

#: A 1-D numpy array of any integer dtype.
IntArray: TypeAlias = npt.NDArray[np.integer[Any]]
#: ``(src, dst, sizes)``: three 1-D int64 or uint64 arrays of one length, written in place.
DescriptorArrays: TypeAlias = tuple[IntArray, IntArray, IntArray]
#: What the fills accept for a column of values: a numpy array of any integer dtype, a CPU
#: integer tensor, or a sequence (list, tuple, range) of ints and numpy integer scalars.
#: Bools are refused at run time, but ``bool`` is an ``int`` to a type checker.
IntegerInput: TypeAlias = IntArray | torch.Tensor | Sequence[int | np.integer[Any]]


class CompletionEvent(Protocol):
    """What `BufferHandle.record_event` accepts: `torch.Event`, `torch.cuda.Event`, ...

    Only ``query()`` is required; ``synchronize()``, where present, lets
    `BucketPool.synchronize` block instead of polling.
    """

    def query(self) -> bool:
        """Return whether the work recorded before the event has finished."""
        ...


class PoolCore(Protocol):
    """What a handle needs of the pool that handed it out (a `bucketpool.BucketPool`)."""

    _watching: bool  # record release sites (tracing or a debug level)
    _full_stack: bool  # the whole stack, not only the file and line
    _level: int  # the debug level's index: 0 off, 1 checks, 2 strict
    _ledger: Any  # its `bucketpool._ledger.Ledger` (not imported: this module is the ground)
    _reported: set[object]  # the acquire sites whose leaks were reported

    def _record(self, buffer: Any, token: int, event: CompletionEvent) -> bool: ...

    @property
    def _self_ref(self) -> Callable[[], object]: ...  # a weak reference to itself

    def _drain(self, only: Any = None) -> None: ...  # only: that bucket's inbox


class ViewOwner(Protocol):
    """What the views a pool hands out fill through: the buffer behind them."""

    def fill_copies(
        self,
        views: DescriptorBuffers,
        first: SupportsIndex,
        sources: IntegerInput,
        destinations: IntegerInput,
        byte_counts: IntegerInput | SupportsIndex,
    ) -> int: ...

    def fill_block_copies(
        self,
        views: DescriptorBuffers,
        first: SupportsIndex,
        src_base: SupportsIndex,
        dst_base: SupportsIndex,
        src_blocks: IntegerInput,
        dst_blocks: IntegerInput,
        block_bytes: SupportsIndex,
        total_bytes: SupportsIndex | None,
        coalesce: bool,
    ) -> int: ...

    def shrink_views(self, views: DescriptorBuffers, count: SupportsIndex) -> DescriptorBuffers: ...

    def record_on(self, views: DescriptorBuffers, event: CompletionEvent) -> None: ...


class DescriptorBuffers(NamedTuple):
    """The three descriptor tensors one `swap_blocks_batch` call takes.

    Each is a 1-D contiguous CPU tensor of the pool's dtype and exactly ``n`` entries, a
    zero-copy view of one of the pool's buffers.  Unpack it as ``src, dst, sizes = bufs``
    or use the fields.  The views that ``with pool.acquire(n) as bufs:`` binds also fill
    themselves: `add_copies`, `add_block_copies`, `shrink` and `record_event` behave as the
    handle's methods of the same names, for as long as the hand-out lasts.
    """

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor

    def add_copies(
        self,
        first: SupportsIndex,
        sources: IntegerInput,
        destinations: IntegerInput,
        byte_counts: IntegerInput | SupportsIndex,
    ) -> int:
        """Write copies into entries ``[first, first + k)``; see `BufferHandle.add_copies`.

        Raises:
            ReleaseError: the hand-out these views belong to is over.
            TypeError: these views were not handed out by a pool.
            CapacityError, ValueError: as for `BufferHandle.add_copies`.
        """
        return _owner(self, "add_copies").fill_copies(
            self, first, sources, destinations, byte_counts
        )

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
        """Write copies of whole blocks; see `BufferHandle.add_block_copies`.

        Raises:
            ReleaseError: the hand-out these views belong to is over.
            TypeError: these views were not handed out by a pool.
            CapacityError, ValueError: as for `BufferHandle.add_block_copies`.
        """
        return _owner(self, "add_block_copies").fill_block_copies(
            self,
            first,
            src_base,
            dst_base,
            src_blocks,
            dst_blocks,
            block_bytes,
            total_bytes,
            coalesce,
        )

    def shrink(self, count: SupportsIndex) -> DescriptorBuffers:
        """Shrink these views, in place, to their first *count* entries; return them.

        ``swap_blocks_batch(*bufs.shrink(end))`` passes exactly what was written.  See
        `BufferHandle.shrink`.

        Raises:
            ReleaseError: the hand-out these views belong to is over.
            TypeError: these views were not handed out by a pool, or *count* is no integer.
            ValueError: *count* is negative or above ``n``.
        """
        return _owner(self, "shrink").shrink_views(self, count)

    def record_event(self, event: CompletionEvent) -> None:
        """Keep the buffer out of reuse until *event* reports done; see `BufferHandle.record_event`.

        Raises:
            ReleaseError: the hand-out these views belong to is over.
            TypeError: these views were not handed out by a pool, or *event* has no
                ``query()`` method.
            InFlightWriteError: (debug levels) as for `BufferHandle.record_event`.
        """
        _owner(self, "record_event").record_on(self, event)


def _owner(views: DescriptorBuffers, operation: str) -> ViewOwner:
    owner: ViewOwner | None = getattr(views, "_buffer", None)
    if owner is None:
        raise TypeError(
            f"{operation} works on the views a pool hands out (with pool.acquire(n) as "
            "bufs: ...); these DescriptorBuffers were built some other way, so there is no "
            "hand-out to fill: write the tensors directly"
        )
    return owner


class Views(DescriptorBuffers):
    """A view set a pool hands out: `DescriptorBuffers` that know their buffer.

    ``_buffer`` lets the views fill themselves (`DescriptorBuffers.add_copies`); the buffer
    checks that they are its live hand-out's views before it writes.
    """

    _buffer: ViewOwner
    #: (checks) The same views again, never handed out, to check them by (the buffer's ``_own``).
    masters: tuple[torch.Tensor, torch.Tensor, torch.Tensor]

    # A copy is the public tuple, never a second set of views that could fill the buffer.
    def __copy__(self) -> DescriptorBuffers:
        return DescriptorBuffers(*self)

    def __deepcopy__(self, memo: dict[int, object]) -> DescriptorBuffers:
        return DescriptorBuffers(*(tensor.clone() for tensor in self))

    def __reduce__(self) -> tuple[object, ...]:
        # Plain tensors: a strict hand-out's guarded views carry what cannot be pickled.
        return (DescriptorBuffers, tuple(tensor.as_subclass(torch.Tensor) for tensor in self))


Views.__name__ = Views.__qualname__ = "DescriptorBuffers"  # reprs say the public name
