"""The original vLLM ``DescriptorBufferPool``, rebuilt from its documentation: the baseline.

Kept only to be measured beside bucketpool in one process.  It never frees, keeps the
largest triple it ever made, hands out tensors longer than asked and accepts double and
foreign releases without a word.
"""

from __future__ import annotations

import typing
from typing import NamedTuple

import torch

__all__ = ["OriginalDescriptorBufferPool", "OriginalDescriptorBuffers"]


class OriginalDescriptorBuffers(NamedTuple):
    """Three 1-D int64 tensors of one length, the capacity (callers slice ``[:n]``)."""

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor


@typing.final
class OriginalDescriptorBufferPool:
    """The original LIFO pool of triples, with counters for the benchmark.

    ``acquire(n)`` pops the last released triple and returns it if it has at least *n*
    entries; otherwise the popped triple is dropped and three ``torch.empty(n)`` are made.
    ``release`` appends, unchecked.  The counters change only where the original allocates,
    so a cache hit runs exactly the original's code; `bytes_held` counts a dropped triple as
    freed, as it is when the pool held its last reference.  Not thread-safe, as the original.
    """

    # No __slots__, as the original: attribute lookups cost what they cost there.

    def __init__(self) -> None:
        self._pool: list[OriginalDescriptorBuffers] = []
        self.allocations = 0
        self.bytes_held = 0
        self.peak_bytes_held = 0

    def acquire(self, n: int) -> OriginalDescriptorBuffers:
        """Return a triple of at least *n* entries (the original's code, plus counting)."""
        if self._pool:
            bufs = self._pool.pop()
            if bufs.src_ptrs.numel() >= n:
                return bufs
            self.bytes_held -= bufs.src_ptrs.numel() * 24  # dropped: its memory goes back
        bufs = OriginalDescriptorBuffers(
            torch.empty(n, dtype=torch.int64),
            torch.empty(n, dtype=torch.int64),
            torch.empty(n, dtype=torch.int64),
        )
        self.allocations += 1
        self.bytes_held += n * 24
        self.peak_bytes_held = max(self.peak_bytes_held, self.bytes_held)
        return bufs

    def release(self, bufs: OriginalDescriptorBuffers) -> None:
        """Return a triple to the pool for reuse (no checks, as the original)."""
        self._pool.append(bufs)
