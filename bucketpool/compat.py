"""Drop-in replacements for vLLM's ``DescriptorBufferPool``: swap the import, keep the calls.

``DescriptorBufferPool`` keeps the original three-field API; ``AliasedDescriptorBufferPool``
keeps the later six-field one (tensors plus numpy aliases and ``add_copies``).  Both are
backed by a `BucketPool` made with the defaults (so ``BUCKETPOOL_CONF`` applies) and add what
the originals lacked: tensors of exactly ``n`` entries, errors on double or foreign release,
bounded memory, and reuse deferred until an ``event`` reports done.
"""

from __future__ import annotations

import typing
from typing import NamedTuple, SupportsIndex

import torch

from bucketpool import _fill
from bucketpool._errors import ReleaseError
from bucketpool._pool import BucketPool, BufferHandle, CompletionEvent, DescriptorBuffers

__all__ = [
    "AliasedDescriptorBufferPool",
    "AliasedDescriptorBuffers",
    "DescriptorBufferPool",
    "DescriptorBuffers",
]


class AliasedDescriptorBuffers(NamedTuple):
    """vLLM's six-field descriptor buffers: three tensors and numpy aliases of them.

    ``src_np``, ``dst_np`` and ``sizes_np`` share memory with ``src_ptrs``, ``dst_ptrs``
    and ``sizes``; all six have exactly ``n`` entries.
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
            IndexError: the copies do not fit in the ``n`` entries.
            ValueError: lengths differ, or a byte count is negative.
            TypeError: an input is not integer.
        """
        _fill.add_copies(
            (self.src_np, self.dst_np, self.sizes_np), first, sources, destinations, byte_counts
        )


_Buffers = typing.TypeVar("_Buffers", DescriptorBuffers, AliasedDescriptorBuffers)


class _Adapter(typing.Generic[_Buffers]):
    """The bookkeeping both adapters share: which tuple belongs to which handle."""

    __slots__ = ("_out", "_pool")

    def __init__(self, dtype: torch.dtype) -> None:
        self._pool = BucketPool(dtype=dtype)
        # id(tuple) -> (tuple, handle); holding the tuple keeps its id unique while out.
        self._out: dict[int, tuple[_Buffers, BufferHandle]] = {}

    @property
    def pool(self) -> BucketPool:
        """The `BucketPool` behind the adapter, for `~BucketPool.stats`, `~BucketPool.trim`."""
        return self._pool

    def acquire(self, n: SupportsIndex) -> _Buffers:
        """Return buffers of exactly *n* entries.

        Acquiring the same *n* right after releasing returns the very same object.

        Raises:
            TypeError: *n* is a bool or not an integer.
            ValueError: *n* is negative or above the pool's ``max_capacity``.
        """
        handle = self._pool.acquire(n)
        bufs = self._wrap(handle)
        self._out[id(bufs)] = (bufs, handle)
        return bufs

    def release(self, bufs: _Buffers, *, event: CompletionEvent | None = None) -> None:
        """Return *bufs* to the pool.

        Args:
            bufs: what `acquire` returned.
            event: when given, the buffers are not reused until ``event.query()`` is true;
                pass the end event recorded after the ``swap_blocks_batch`` call.

        Raises:
            ReleaseError: *bufs* was released already or did not come from this pool;
                nothing changes.
            TypeError: *event* has no ``query()`` method; *bufs* stays acquired.
        """
        if event is not None and not callable(getattr(event, "query", None)):
            raise TypeError(
                f"event must have a query() -> bool method (torch.Event, torch.cuda.Event), "
                f"got {type(event).__name__}; the buffers stay acquired"
            )
        entry = self._out.pop(id(bufs), None)
        if entry is None or entry[0] is not bufs:
            if entry is not None:
                self._out[id(bufs)] = entry
            raise ReleaseError(
                f"release: these {type(bufs).__name__} were already released or were not "
                "acquired from this pool; release each acquire() result exactly once, into "
                "the pool that returned it"
            )
        handle = entry[1]
        if event is not None:
            handle.record_event(event)
        handle.release()
        # Nobody outside this adapter ever sees its handles: keep the released one on its
        # buffer for the next acquire, as a with block does (acquire re-checks that nothing
        # else refers to it).  Saves finalising and freeing a handle per step.
        handle._block.spare = handle

    def _wrap(self, handle: BufferHandle) -> _Buffers:
        raise NotImplementedError


@typing.final
class DescriptorBufferPool(_Adapter[DescriptorBuffers]):
    """The original three-field pool's API, backed by a `BucketPool`.

    ``acquire(n)`` returns `DescriptorBuffers` whose tensors have exactly *n* entries (so
    callers' ``[:n]`` slices keep working); ``release(bufs)`` takes them back.  Thread-safe.

    The adapter keeps every triple it hands out until it is released: the original API has
    no handle, so a triple dropped without release cannot be told from one still in use and
    is not reported as a leak.  ``pool.outstanding()`` lists what is out.

    Args:
        dtype: `torch.int64` (default) or `torch.uint64` (vLLM's XPU pointer dtype).
    """

    __slots__ = ()

    def __init__(self, *, dtype: torch.dtype = torch.int64) -> None:
        super().__init__(dtype)

    def _wrap(self, handle: BufferHandle) -> DescriptorBuffers:
        return handle.buffers


@typing.final
class AliasedDescriptorBufferPool(_Adapter[AliasedDescriptorBuffers]):
    """vLLM's later six-field pool API (numpy aliases, ``add_copies``), backed by a `BucketPool`.

    Thread-safe.

    Args:
        dtype: `torch.int64` (default) or `torch.uint64` (vLLM's XPU pointer dtype).
    """

    __slots__ = ()

    def __init__(self, *, dtype: torch.dtype = torch.int64) -> None:
        super().__init__(dtype)

    def _wrap(self, handle: BufferHandle) -> AliasedDescriptorBuffers:
        block = handle._block
        views = handle.buffers  # resizes the views to n first, which resets block.alias
        alias = block.alias
        if type(alias) is AliasedDescriptorBuffers:
            return alias
        src_np, dst_np, sizes_np = handle.arrays
        alias = AliasedDescriptorBuffers(*views, src_np, dst_np, sizes_np)
        block.alias = alias
        return alias
