"""Frozen statistics records returned by `BucketPool.stats()` and `BucketPool.outstanding()`."""

from __future__ import annotations

import typing
from collections.abc import Iterable, Sequence

import attrs

from bucketpool._debug import format_site

if typing.TYPE_CHECKING:
    from bucketpool._buffer import Bucket, Buffer

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
    """A consistent snapshot of a pool's counters: counts in buffers, bytes of all three fields.

    Attributes:
        allocations: buffers held by the pool, whatever their state.
        allocated_bytes: bytes of those buffers.
        active_requests: handles acquired and not yet released.
        active_bytes: bytes of the buffers behind those handles.
        cached_bytes: bytes of idle buffers ready for reuse.
        parked_bytes: bytes of buffers waiting for their events.
        view_bytes: estimated bytes of the view sets idle buffers keep, counted as cached.
        parked: buffers waiting for their events.
        hits: acquires served without allocating.
        misses: acquires that allocated.
        leaks: handles dropped without release (each warned with a `LeakWarning`).
        requested_entries: the sum of ``n`` over every acquire.
        rounded_entries: the sum of bucket capacities over every acquire (rounding included).
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
        lines = [f"{'':16}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"]
        for name in ("allocations", "allocated_bytes", "active_requests", "active_bytes"):
            s: Stat = getattr(self, name)
            lines.append(f"{name:16}{s.current:>14,}{s.peak:>14,}{s.allocated:>14,}{s.freed:>14,}")
        total = self.hits + self.misses
        hit_rate = f"{100 * self.hits / total:.1f}%" if total else "-"
        waste = self.rounded_entries - self.requested_entries
        lines.append(
            f"cached_bytes {self.cached_bytes:,}  view_bytes {self.view_bytes:,} (cached view "
            f"sets)  parked {self.parked} ({self.parked_bytes:,} bytes)"
        )
        lines.append(
            f"hits {self.hits:,}  misses {self.misses:,} (hit rate {hit_rate})  leaks "
            f"{self.leaks:,}  rounding waste {waste:,} entries"
        )
        if self.buckets:
            lines.append(
                f"{'bucket':>12}{'hits':>12}{'misses':>10}{'cached':>8}{'active':>8}{'parked':>8}"
            )
        lines.extend(
            f"{b.capacity:>12,}{b.hits:>12,}{b.misses:>10,}{b.cached:>8}{b.active:>8}{b.parked:>8}"
            for b in self.buckets
        )
        return "\n".join(lines)


@typing.final
@attrs.frozen
class OutstandingBuffer:
    """One buffer handed out and not yet released, as `BucketPool.outstanding()` lists it.

    Attributes:
        n: the entries the hand-out acquired (a `shrink` does not change it).
        capacity: the capacity of its bucket.
        acquired_at: where it was acquired, or `None` if the pool does not trace (``trace``).
    """

    n: int
    capacity: int
    acquired_at: str | None


def _stat(current: int, peak: int, total: int) -> Stat:
    return Stat(current, peak, total, total - current)


def build_stats(
    buckets: Sequence[Bucket], snapshot: tuple[list[int] | tuple[int, ...], ...]
) -> PoolStats:
    """Build the records from `Ledger.snapshot`, whose per-bucket lists follow *buckets*."""
    takes, misses, allocated, cached, parked, totals = snapshot
    active, active_peak, active_bytes, active_bytes_peak = totals[:4]
    allocations, allocations_peak, allocated_bytes, allocated_bytes_peak = totals[4:8]
    allocations_total, allocated_bytes_total, parked_bytes, requested, leaks = totals[8:13]
    rows = zip(buckets, takes, misses, allocated, cached, parked, strict=True)
    used = [(b, t, m, a, c, p) for b, t, m, a, c, p in rows if t or a]
    acquires = sum(takes)
    acquired_bytes = sum(t * b.nbytes for b, t, *_ in used)
    return PoolStats(
        allocations=_stat(allocations, allocations_peak, allocations_total),
        allocated_bytes=_stat(allocated_bytes, allocated_bytes_peak, allocated_bytes_total),
        active_requests=_stat(active, active_peak, acquires),
        active_bytes=_stat(active_bytes, active_bytes_peak, acquired_bytes),
        cached_bytes=allocated_bytes - active_bytes - parked_bytes,
        parked_bytes=parked_bytes,
        view_bytes=totals[14],
        parked=sum(parked),
        hits=acquires - sum(misses),
        misses=sum(misses),
        leaks=leaks,
        requested_entries=requested,
        rounded_entries=sum(t * b.capacity for b, t, *_ in used),
        buckets=tuple(
            BucketStats(b.capacity, t - m, m, c, a - c - p, p) for b, t, m, a, c, p in used
        ),
    )


def outstanding_of(buffers: Iterable[Buffer]) -> list[OutstandingBuffer]:
    """The records of the *buffers* handed out (token > 0), oldest hand-out first."""
    held = sorted((b.token, b.n, b.bucket.capacity, b.site) for b in buffers if b.token > 0)
    return [
        OutstandingBuffer(n, capacity, None if where is None else format_site(where))  # type: ignore[arg-type]
        for _, n, capacity, where in held
    ]
