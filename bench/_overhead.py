"""The overhead case: Python-heap bytes per cached buffer, beyond its tensor payload.

Measured once with tracemalloc around caching `_OVERHEAD_BUFFERS` buffers of n = `HOT_N`
in each pool (the pools' own structures and the tensors' Python objects).  torch allocates
tensor payloads outside the Python heap, where tracemalloc does not look; should it ever
see them, the payload (3 x capacity x 8 bytes) is subtracted.  Exact, so never re-run.
"""

from __future__ import annotations

import gc
import tracemalloc
import typing
from collections.abc import Callable

import torch

from bench._cases import HOT_N
from bench._original import OriginalDescriptorBufferPool
from bench._pools import memory_of
from bench._stats import Measurement, exact
from bucketpool import BucketPool
from bucketpool.compat import DescriptorBufferPool

__all__ = ["OverheadCase"]

_OVERHEAD_BUFFERS = 31  # the default max_cached_per_bucket (32), less the warm-up buffer


def _traced(make: Callable[[], object]) -> tuple[int, object]:
    """Bytes that tracemalloc sees allocated by *make*, and what it returned (kept alive)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = make()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def _cycle_original(pool: OriginalDescriptorBufferPool, count: int) -> object:
    held = [pool.acquire(HOT_N) for _ in range(count)]
    for bufs in held:
        pool.release(bufs)
    return None


def _cycle_compat(pool: DescriptorBufferPool, count: int) -> object:
    held = [pool.acquire(HOT_N) for _ in range(count)]
    for bufs in held:
        pool.release(bufs)
    return None


@typing.final
class OverheadCase:
    """Python-heap bytes per cached buffer beyond its tensor payload (tracemalloc; untimed)."""

    def __init__(self, buffers: int = _OVERHEAD_BUFFERS) -> None:
        self.name = "overhead"
        self.description = (
            f"tracemalloc bytes per cached buffer of n = {HOT_N:,} ({buffers} cached), less the "
            "tensor payload when tracemalloc sees it"
        )
        self.samples: dict[str, list[float]] = {}
        self._buffers = buffers
        self._figures: dict[str, Measurement] = {}

    def setup(self) -> None:
        """Measure each pool once: one buffer cached untraced, then *buffers* more traced."""
        count = self._buffers
        payload_seen = _traced(lambda: torch.empty(1 << 16, dtype=torch.int64))[0] >= 1 << 18
        pool = BucketPool()
        pool.reserve(HOT_N, 1)
        traced, _ = _traced(lambda: pool.reserve(HOT_N, count))
        capacity = pool.bucket_capacity(HOT_N)
        self._figures["bucketpool bytes per cached buffer"] = self._per_buffer(
            traced, count, capacity, payload_seen
        )
        original = OriginalDescriptorBufferPool()
        _cycle_original(original, 1)
        before = original.allocations
        traced, _ = _traced(lambda: _cycle_original(original, count + 1))
        self._figures["original bytes per cached buffer"] = self._per_buffer(
            traced, original.allocations - before, HOT_N, payload_seen
        )
        compat = DescriptorBufferPool()
        _cycle_compat(compat, 1)
        before = memory_of(compat.pool).allocations
        traced, _ = _traced(lambda: _cycle_compat(compat, count + 1))
        self._figures["compat bytes per cached buffer"] = self._per_buffer(
            traced, memory_of(compat.pool).allocations - before, capacity, payload_seen
        )

    @staticmethod
    def _per_buffer(traced: int, buffers: int, capacity: int, payload_seen: bool) -> Measurement:
        payload = 3 * capacity * 8 if payload_seen else 0
        return exact((traced - payload * buffers) / max(buffers, 1), "bytes")

    def round(self) -> None:
        """Nothing: the figures are exact, measured once in `setup`."""

    def close(self) -> None:
        """Nothing: the pools went at the end of `setup`."""

    def measurements(self) -> dict[str, Measurement]:
        """Bytes per cached buffer, per pool."""
        return dict(self._figures)
