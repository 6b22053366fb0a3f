"""The records of the pool's buffers and buckets: plain data, no locking of their own.

Which fields the pool's lock guards is said in `bucketpool._pool`.
"""

from __future__ import annotations

import collections

import numpy as np
import numpy.typing as npt
import torch

from bucketpool import _debug, _fill
from bucketpool._handle import CompletionEvent, DescriptorBuffers

__all__ = ["ENTRY_BYTES", "FIELDS", "Bucket", "Buffer"]

ENTRY_BYTES = 8
FIELDS = 3


class Bucket:
    """The buffers of one capacity, with their counters."""

    __slots__ = ("allocated", "capacity", "free", "last_tick", "misses", "nbytes", "takes")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.nbytes = capacity * ENTRY_BYTES * FIELDS
        # A deque: a list that empties and refills reallocates its array.
        self.free: collections.deque[Buffer] = collections.deque()
        self.takes = 0  # acquires served; those that allocated are also misses
        self.misses = 0
        self.allocated = 0
        self.last_tick = 0


class Buffer:
    """One buffer: three full-capacity fields, and one set of views resized to each ``n``."""

    __slots__ = (
        "arrays",
        "arrays_n",
        "bucket",
        "checksum",
        "events",
        "guard",
        "handed_arrays",
        "kept",
        "n",
        "parked",
        "poisoned",
        "released_at",
        "site",
        "tensors",
        "token",
        "view_arrays",
        "view_n",
        "views",
    )

    bucket: Bucket
    tensors: tuple[torch.Tensor, ...]
    arrays: _fill.DescriptorArrays
    token: int
    n: int
    kept: object

    def __init__(self, bucket: Bucket, tensors: tuple[torch.Tensor, ...], guard: bool) -> None:
        self.bucket = bucket
        # At debug level strict every hand-out gets views of its own (`_debug.GuardedView`)
        # instead of the shared ones, and view_n never matches so handles always ask.
        self.guard = guard
        self.handed_arrays: list[npt.NDArray[np.integer]] = []
        self.tensors = tensors  # full capacity, never resized
        self.arrays = (
            tensors[0].numpy(),
            tensors[1].numpy(),
            tensors[2].numpy(),
        )
        # One view per field for the buffer's life, resized in place to each n: cheaper
        # than cutting three new views per hand-out.  Views of the tensors (not from_numpy)
        # keep a pinned buffer recognisable to PyTorch's host allocator.
        self.views = DescriptorBuffers(tensors[0][:], tensors[1][:], tensors[2][:])
        self.view_n = -1 if guard else bucket.capacity
        self.view_arrays = self.arrays
        self.arrays_n = bucket.capacity
        # The hand-out that holds it; 0 when free, parked or freed; minus the hand-out's
        # token while its release waits in the pool's inbox.
        self.token = 0
        self.n = 0  # the n of the latest hand-out
        self.events: list[CompletionEvent] | None = None
        self.parked = False
        self.poisoned = 0  # entries holding the poison pattern, at the debug levels
        self.site: _debug.Site = None  # where the latest hand-out was acquired (tracing)
        self.released_at: _debug.Site = None
        self.checksum: int | None = None  # of the first n entries, at the debug levels
        self.kept = None  # what a compat adapter keeps with the idle buffer

    def narrow(self, n: int) -> DescriptorBuffers:
        """Resize the shared views to *n* entries (within the capacity: nothing moves)."""
        views = self.views
        self.view_n = -1  # until all three are resized (an exception may come in between)
        views[0].resize_(n)
        views[1].resize_(n)
        views[2].resize_(n)
        self.view_n = n
        return views

    def narrow_arrays(self, n: int) -> _fill.DescriptorArrays:
        """Return (and cache) numpy arrays of the first *n* entries."""
        if self.guard:
            # Arrays of this hand-out's own, made read-only when it ends (`end_hand_out`);
            # the same three for every call of one hand-out with one n.
            handed = self.handed_arrays
            if len(handed) >= 3 and len(handed[-1]) == n:
                return (handed[-3], handed[-2], handed[-1])
            src, dst, sizes = self.arrays
            fresh = (src[:n], dst[:n], sizes[:n])
            handed.extend(fresh)
            return fresh
        if self.arrays_n != n:
            src, dst, sizes = self.arrays
            self.view_arrays = (src[:n], dst[:n], sizes[:n])
            self.arrays_n = n
        return self.view_arrays

    def end_hand_out(self) -> None:
        """(strict) Make the numpy arrays handed out read-only: stale writes then raise."""
        for array in self.handed_arrays:
            array.flags.writeable = False
        self.handed_arrays.clear()
