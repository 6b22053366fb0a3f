"""The original vLLM ``DescriptorBufferPool``, rebuilt from its documentation as the baseline.

This is the pool the package replaces, kept only so that the benchmark
(``python -m bench``) can measure both side by side in one process.  Do not use
it in new code: it never frees, keeps the largest triple it ever made, hands out tensors
longer than asked, and accepts double and foreign releases without a word.
"""

from __future__ import annotations

import typing
from typing import NamedTuple

import torch

__all__ = ["OriginalDescriptorBufferPool", "OriginalDescriptorBuffers"]

_TRIPLE_ENTRY_BYTES = 3 * 8  # three int64 entries per descriptor


class OriginalDescriptorBuffers(NamedTuple):
    """The original pool's triple: three 1-D int64 tensors of one length (its capacity).

    The capacity may exceed the ``n`` that was asked for; callers slice ``[:n]``.
    """

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor


@typing.final
class OriginalDescriptorBufferPool:
    """The original LIFO pool of descriptor triples, with counters for the benchmark.

    ``acquire(n)`` pops the most recently released triple and returns it if its capacity
    is at least *n*; otherwise the popped triple is dropped and three
    ``torch.empty(n, dtype=torch.int64)`` are allocated.  ``release(bufs)`` appends, with no
    checks.  Nothing is ever freed by the pool.

    The counters (`allocations`, `bytes_held`, `peak_bytes_held`) change only on the
    allocating branch of `acquire`, so a cache hit runs exactly the original's code.
    `bytes_held` assumes what the original's callers do: a released triple is referenced by
    the pool alone, so a triple the pool drops is freed.

    Not thread-safe, like the original.
    """

    # A plain class without __slots__, as the original: attribute lookups on the hot path
    # cost what they cost there.

    def __init__(self) -> None:
        # LIFO stack of idle buffer triples.
        self._pool: list[OriginalDescriptorBuffers] = []
        self._allocations = 0
        self._bytes_held = 0
        self._peak_bytes_held = 0

    def acquire(self, n: int) -> OriginalDescriptorBuffers:
        """Get a buffer triple with capacity >= *n* (the original's code, plus counting).

        Args:
            n: the number of descriptors needed.

        Returns:
            A triple whose tensors have at least *n* entries.
        """
        if self._pool:
            bufs = self._pool.pop()
            if bufs.src_ptrs.numel() >= n:
                return bufs
            # The original drops the popped triple here; its memory goes back.
            self._bytes_held -= bufs.src_ptrs.numel() * _TRIPLE_ENTRY_BYTES
        bufs = OriginalDescriptorBuffers(
            torch.empty(n, dtype=torch.int64),
            torch.empty(n, dtype=torch.int64),
            torch.empty(n, dtype=torch.int64),
        )
        self._allocations += 1
        self._bytes_held += n * _TRIPLE_ENTRY_BYTES
        if self._bytes_held > self._peak_bytes_held:
            self._peak_bytes_held = self._bytes_held
        return bufs

    def release(self, bufs: OriginalDescriptorBuffers) -> None:
        """Return a buffer triple to the pool for reuse (no checks, as the original)."""
        self._pool.append(bufs)

    @property
    def allocations(self) -> int:
        """Triples allocated since the pool was made."""
        return self._allocations

    @property
    def bytes_held(self) -> int:
        """Bytes of the triples allocated and not dropped: cached plus handed out."""
        return self._bytes_held

    @property
    def peak_bytes_held(self) -> int:
        """The highest `bytes_held` since the pool was made."""
        return self._peak_bytes_held

    @property
    def cached(self) -> int:
        """Triples idle in the pool (a triple released twice counts twice)."""
        return len(self._pool)

    @property
    def cached_bytes(self) -> int:
        """Bytes of the idle triples, computed from the list on each call."""
        return sum(bufs.src_ptrs.numel() for bufs in self._pool) * _TRIPLE_ENTRY_BYTES
