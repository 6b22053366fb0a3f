"""The cache policy: which cached buffers a trim, the byte cap or idle trimming frees.

Each buffer is freed by its own `Ledger.uncache` move; the choosing and the looping happen
here, outside the lock, so a trim of many buffers never holds it for long.  What is freed
is scrapped here too, outside the lock, so that its memory goes at once.
"""

from __future__ import annotations

from bucketpool._buffer import Bucket
from bucketpool._ledger import Ledger

__all__ = ["check_reserve", "sweep_idle", "trim_to"]


def trim_to(ledger: Ledger, limit: int | None, keep: Bucket | None = None) -> int:
    """Free cached buffers, least recently used bucket first; return the bytes freed.

    Until at most *limit* bytes stay cached (None: until the cache fits the byte cap);
    never *keep*'s.
    """
    freed = 0
    for bucket in sorted(ledger.buckets, key=_last_use):
        if bucket is keep or not bucket.free:  # a hint, read without the lock: uncache checks
            continue
        while (buffer := ledger.uncache(bucket, False, limit)) is not None:
            freed += bucket.nbytes
            buffer.scrap()
    return freed


def sweep_idle(ledger: Ledger, idle: int) -> None:
    """Free every cached buffer of the buckets unused for *idle* acquires or more (0: none)."""
    if not idle:
        return
    tick = ledger.tick
    for bucket in ledger.buckets:
        if bucket.free and tick - bucket.last_tick >= idle:
            while (buffer := ledger.uncache(bucket, False, -1)) is not None:
                buffer.scrap()


def _last_use(bucket: Bucket) -> int:
    return bucket.last_tick


def check_reserve(ledger: Ledger, bucket: Bucket, size: int, number: int) -> None:
    """Refuse to reserve *number* buffers of *bucket* (for *size*) that the caps would not keep.

    Raises:
        ValueError: they would take the bucket over ``max_cached_per_bucket`` or the idle
            bytes (cached and parked) over ``max_cached_bytes``; nothing was allocated.
    """
    cached = ledger.cached[bucket.index] + number
    idle_bytes = ledger.allocated_bytes - ledger.active_bytes + number * bucket.nbytes
    idle_bytes += ledger.view_bytes
    per_bucket, max_bytes = ledger.max_cached_per_bucket, ledger.max_cached_bytes
    if number and (cached > per_bucket or idle_bytes > max_bytes):
        raise ValueError(
            f"reserve({size}, count={number}) would cache {cached} buffers ({idle_bytes:,} "
            f"bytes) but max_cached_per_bucket={per_bucket} and max_cached_bytes="
            f"{max_bytes:,}; reserve fewer or raise the caps"
        )
