"""A buffer's side of its views' fills: `add_copies`, `add_block_copies` and `shrink`.

The views a pool hands out fill themselves through their buffer (`bucketpool._types.Views`).
Each fill reads every input first (user code may run there: ``__index__``, ``__array__``),
then checks that the views are still the live hand-out's, then writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, SupportsIndex

from bucketpool import _fill
from bucketpool._buckets import as_index
from bucketpool._errors import ReleaseError
from bucketpool._types import CompletionEvent, DescriptorArrays, DescriptorBuffers, IntegerInput

if TYPE_CHECKING:
    from bucketpool._types import Views

__all__ = ["ViewFills"]


class _Bucket(Protocol):
    @property
    def capacity(self) -> int: ...


class _Owner(Protocol):
    """What the fills read of the buffer (`bucketpool._buffer.Buffer`)."""

    token: int
    n: int
    _arrays: DescriptorArrays  # their dtypes, for planning (`arrays` checks the memory)

    @property
    def current(self) -> Views | None: ...
    @property
    def bucket(self) -> _Bucket: ...
    @property
    def arrays(self) -> DescriptorArrays: ...
    @property
    def pool_ref(self) -> Callable[[], object] | None: ...
    def narrow(self, views: DescriptorBuffers, count: int) -> None: ...
    def check_live(self: _Owner, views: DescriptorBuffers, operation: str, token: int) -> None: ...


class ViewFills:
    """What `bucketpool._buffer.Buffer` does for its views' fills (a mixin of it)."""

    __slots__ = ()

    def fill_copies(
        self: _Owner,
        views: DescriptorBuffers,
        first: SupportsIndex,
        sources: IntegerInput,
        destinations: IntegerInput,
        byte_counts: IntegerInput | SupportsIndex,
    ) -> int:
        """`DescriptorBuffers.add_copies`: read every input, check the hand-out, write."""
        token = self.token  # the hand-out the inputs are read for
        plan = _fill.plan_copies(self._arrays, first, sources, destinations, byte_counts)  # dtypes
        self.check_live(views, "add_copies", token)
        return _fill.write_copies(self.arrays, self.n, plan)

    def fill_block_copies(
        self: _Owner,
        views: DescriptorBuffers,
        first: SupportsIndex,
        src_base: SupportsIndex,
        dst_base: SupportsIndex,
        src_blocks: IntegerInput,
        dst_blocks: IntegerInput,
        block_bytes: SupportsIndex,
        total_bytes: SupportsIndex | None,
        coalesce: bool,
    ) -> int:
        """`DescriptorBuffers.add_block_copies`: read every input, check, write."""
        token = self.token
        plan = _fill.plan_block_copies(
            self._arrays,
            first,
            src_base,
            dst_base,
            src_blocks,
            dst_blocks,
            block_bytes,
            total_bytes,
            coalesce,
        )
        self.check_live(views, "add_block_copies", token)
        return _fill.write_block_copies(self.arrays, self.n, plan)

    def shrink_views(
        self: _Owner, views: DescriptorBuffers, count: SupportsIndex
    ) -> DescriptorBuffers:
        """`DescriptorBuffers.shrink`: check the count and the hand-out, then resize."""
        token = self.token
        k = as_index(count, "shrink: count", hint="pass the index add_copies() returned")
        self.check_live(views, "shrink", token)
        if not 0 <= k <= self.n:
            raise ValueError(
                f"shrink: count={k} is outside 0..n={self.n}; views can only shrink (acquire "
                "a larger handle to write more entries)"
            )
        self.narrow(views, k)
        return views

    def record_on(self: _Owner, views: DescriptorBuffers, event: CompletionEvent) -> None:
        """`DescriptorBuffers.record_event`: the handle's, through the pool that handed out."""
        token = self.token
        self.check_live(views, "record_event", token)
        pool = self.pool_ref() if self.pool_ref is not None else None
        if pool is None or not pool._record(self, token, event):  # type: ignore[attr-defined]
            self.check_live(views, "record_event", token)  # a query() ended it: refused
            raise ReleaseError("record_event: the pool that handed these views out is gone")

    def check_live(self: _Owner, views: DescriptorBuffers, operation: str, token: int) -> None:
        """Refuse *operation* unless *views* are the live hand-out's, *token*'s."""
        # *token* was read as the operation began: its inputs (user code) may end it.
        if token <= 0 or self.token != token or self.current is not views:
            raise ReleaseError(
                f"{operation}: these views (capacity {self.bucket.capacity}) belong to a "
                "hand-out that is over; use the views of a live handle (with "
                "pool.acquire(n) as bufs: ...)"
            )
