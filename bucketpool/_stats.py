"""Frozen statistics records returned by `BucketPool.stats()`."""

from __future__ import annotations

import typing
from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs

from bucketpool._debug import format_site

__all__ = ["BucketStats", "OutstandingBuffer", "PoolStats", "Stat", "build_stats", "outstanding_of"]


@typing.final
@attrs.frozen
class Stat:
    """One counter with its history, named as in PyTorch's host-allocator stats.

    Attributes:
        current: the value now.
        peak: the highest value since the pool was made or `BucketPool.reset_peak_stats()`.
        allocated: the total ever added.
        freed: the total ever removed; ``allocated - freed == current``.
    """

    current: int
    peak: int
    allocated: int
    freed: int


@typing.final
@attrs.frozen
class BucketStats:
    """Counters of one power-of-two bucket.

    Attributes:
        capacity: entries per buffer of this bucket.
        hits: acquires served from a cached (or retired parked) buffer.
        misses: acquires that allocated a buffer.
        cached: buffers idle in the bucket, ready to hand out.
        active: buffers held by live handles.
        parked: buffers released while a recorded event was pending.
    """

    capacity: int
    hits: int
    misses: int
    cached: int
    active: int
    parked: int


@typing.final
@attrs.frozen
class PoolStats:
    """A consistent snapshot of a pool's counters, taken under its lock.

    Counts are in buffers (one buffer is a triple of ``capacity`` entries per field) and
    bytes are the bytes of all three fields.

    Attributes:
        allocations: buffers held by the pool, whatever their state.
        allocated_bytes: bytes of those buffers.
        active_requests: handles acquired and not yet released.
        active_bytes: bytes of the buffers behind those handles.
        cached_bytes: bytes of idle buffers ready for reuse.
        parked_bytes: bytes of buffers waiting for their events.
        view_bytes: bytes of the view sets that idle (cached and parked) buffers keep so
            that a repeated ``n`` makes no tensor; counted against ``max_cached_bytes``
            with the buffers' own bytes (an estimate: torch does not report them).
        parked: buffers waiting for their events.
        hits: acquires served without allocating.
        misses: acquires that allocated.
        leaks: handles dropped without release (each reported with a `LeakWarning`; their
            buffers came back).
        requested_entries: the sum of ``n`` over every acquire.
        rounded_entries: the sum of bucket capacities over every acquire; the difference
            to ``requested_entries`` is the rounding waste.
        buckets: one record per bucket that has been used, smallest first.
    """

    allocations: Stat
    allocated_bytes: Stat
    active_requests: Stat
    active_bytes: Stat
    cached_bytes: int
    parked_bytes: int
    view_bytes: int
    parked: int
    hits: int
    misses: int
    leaks: int
    requested_entries: int
    rounded_entries: int
    buckets: tuple[BucketStats, ...]

    def __str__(self) -> str:
        """Return a fixed-width table for logs."""
        lines = [
            f"{'':16}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}",
        ]
        for name in ("allocations", "allocated_bytes", "active_requests", "active_bytes"):
            stat: Stat = getattr(self, name)
            lines.append(
                f"{name:16}{stat.current:>14,}{stat.peak:>14,}"
                f"{stat.allocated:>14,}{stat.freed:>14,}"
            )
        total = self.hits + self.misses
        hit_rate = f"{100 * self.hits / total:.1f}%" if total else "-"
        waste = self.rounded_entries - self.requested_entries
        lines.append(
            f"cached_bytes {self.cached_bytes:,}  parked {self.parked} "
            f"({self.parked_bytes:,} bytes)  hits {self.hits:,}  misses {self.misses:,} "
            f"(hit rate {hit_rate})  leaks {self.leaks:,}  rounding waste {waste:,} entries"
        )
        if self.buckets:
            lines.append(
                f"{'bucket':>12}{'hits':>12}{'misses':>10}{'cached':>8}{'active':>8}{'parked':>8}"
            )
            lines.extend(
                f"{b.capacity:>12,}{b.hits:>12,}{b.misses:>10,}{b.cached:>8}{b.active:>8}"
                f"{b.parked:>8}"
                for b in self.buckets
            )
        return "\n".join(lines)


@typing.final
@attrs.frozen
class OutstandingBuffer:
    """One buffer handed out and not yet released, as `BucketPool.outstanding()` lists it.

    Attributes:
        n: the entries of the hand-out's views (after a `shrink`, the count it shrank to).
        capacity: the capacity of its bucket.
        acquired_at: where it was acquired, or `None` when the pool does not trace
            (make it with ``trace=True`` or a debug level).
    """

    n: int
    capacity: int
    acquired_at: str | None


def build_stats(
    buckets: Sequence[_Bucket], snapshot: tuple[list[int] | tuple[int, ...], ...]
) -> PoolStats:
    """Build the records from `Ledger.snapshot`, deriving what the ledger does not keep.

    *buckets* are the ledger's buckets, indexed like the snapshot's per-bucket lists.
    """
    takes, misses, allocated, cached, parked, totals = snapshot
    (
        active,
        active_peak,
        active_bytes,
        active_bytes_peak,
        allocations,
        allocations_peak,
        allocated_bytes,
        allocated_bytes_peak,
        allocations_total,
        allocated_bytes_total,
        parked_bytes,
        requested,
        leaks,
        _tick,
        view_bytes,
    ) = totals
    used = [b for b in buckets if takes[b.index] or allocated[b.index]]
    freed_total = allocations_total - allocations
    freed_bytes_total = allocated_bytes_total - allocated_bytes
    acquires = sum(takes)
    acquired_bytes = sum(takes[b.index] * b.nbytes for b in used)
    return PoolStats(
        allocations=Stat(allocations, allocations_peak, allocations_total, freed_total),
        allocated_bytes=Stat(
            allocated_bytes, allocated_bytes_peak, allocated_bytes_total, freed_bytes_total
        ),
        active_requests=Stat(active, active_peak, acquires, acquires - active),
        active_bytes=Stat(
            active_bytes, active_bytes_peak, acquired_bytes, acquired_bytes - active_bytes
        ),
        cached_bytes=allocated_bytes - active_bytes - parked_bytes,
        parked_bytes=parked_bytes,
        view_bytes=view_bytes,
        parked=sum(parked),
        hits=acquires - sum(misses),
        misses=sum(misses),
        leaks=leaks,
        requested_entries=requested,
        rounded_entries=sum(takes[b.index] * b.capacity for b in used),
        buckets=tuple(
            BucketStats(
                capacity=b.capacity,
                hits=takes[b.index] - misses[b.index],
                misses=misses[b.index],
                cached=cached[b.index],
                active=allocated[b.index] - cached[b.index] - parked[b.index],
                parked=parked[b.index],
            )
            for b in used
        ),
    )


class _Bucket(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


def outstanding_of(buffers: Iterable[_Held]) -> list[OutstandingBuffer]:
    """The records of the *buffers* handed out (token > 0), oldest hand-out first."""
    held = sorted((b.token, b.n, b.bucket.capacity, b.site) for b in buffers if b.token > 0)
    return [
        OutstandingBuffer(
            n=n,
            capacity=capacity,
            acquired_at=None if where is None else format_site(where),  # type: ignore[arg-type]
        )
        for _, n, capacity, where in held
    ]


class _Held(Protocol):
    token: int
    n: int
    site: object

    @property
    def bucket(self) -> _Bucket: ...
