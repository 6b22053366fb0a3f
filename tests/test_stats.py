"""Statistics: exact after every step, frozen records, the readable table."""

from __future__ import annotations

import attrs
import pytest
from _events import FlagEvent

from bucketpool import (
    BucketPool,
    BucketStats,
    OutstandingBuffer,
    PoolStats,
    Stat,
)
from bucketpool._ledger import TOTALS
from bucketpool.compat import DescriptorBufferPool

# -- the records ---------------------------------------------------------------------------


def record(
    buckets: tuple[BucketStats, ...] = (), hits: int = 0, misses: int = 0, leaks: int = 0
) -> PoolStats:
    return PoolStats(
        allocations=Stat(2, 3, 5, 3),
        allocated_bytes=Stat(768, 1152, 1920, 1152),
        active_requests=Stat(1, 2, 9, 8),
        active_bytes=Stat(384, 768, 3456, 3072),
        cached_bytes=384,
        parked_bytes=0,
        view_bytes=0,
        parked=0,
        hits=hits,
        misses=misses,
        leaks=leaks,
        requested_entries=100,
        rounded_entries=144,
        buckets=buckets,
    )


def test_records_are_frozen() -> None:
    stat = Stat(1, 2, 3, 4)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        stat.current = 5  # type: ignore[misc]
    assert record() == record()
    assert record(hits=1) != record()
    assert record(leaks=1) != record()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record().leaks = 2  # type: ignore[misc]


def test_outstanding_buffer_is_a_frozen_record() -> None:
    out = OutstandingBuffer(n=3, capacity=16, acquired_at=None)
    assert out == OutstandingBuffer(3, 16, None)
    assert out != OutstandingBuffer(3, 16, "f.py:1")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        out.n = 4  # type: ignore[misc]


# -- the table -----------------------------------------------------------------------------


def test_table_without_buckets() -> None:
    lines = str(record()).splitlines()
    assert lines[0].split() == ["current", "peak", "allocated", "freed"]
    assert lines[1].split() == ["allocations", "2", "3", "5", "3"]
    assert lines[2].split() == ["allocated_bytes", "768", "1,152", "1,920", "1,152"]
    assert lines[5].split() == [
        *("cached_bytes", "384", "view_bytes", "0", "(cached", "view", "sets)"),
        *("parked", "0", "(0", "bytes)"),
    ]
    assert "hit rate -" in lines[6]
    assert "rounding waste 44 entries" in lines[6]
    assert "leaks 0" in lines[6]
    assert len(lines) == 7


def test_table_shows_leaks() -> None:
    assert "leaks 1,234 " in str(record(leaks=1234)).splitlines()[6]


def test_table_shows_the_view_sets_beside_the_cached_buffers(pool: BucketPool) -> None:
    # Where n varies the view sets outweigh the buffers: the table says what they hold.
    for n in range(1, 33):
        with pool.acquire(n):
            pass
    stats = pool.stats()
    assert stats.view_bytes > stats.cached_bytes
    table = str(stats)
    assert f"cached_bytes {stats.cached_bytes:,}  view_bytes {stats.view_bytes:,} " in table
    assert max(len(line) for line in table.splitlines()) < 100


def test_table_with_buckets() -> None:
    buckets = (BucketStats(16, 7, 1, 1, 0, 0), BucketStats(1 << 20, 0, 1, 0, 1, 2))
    lines = str(record(buckets, hits=7, misses=2)).splitlines()
    assert "hit rate 77.8%" in lines[6]
    assert lines[7].split() == ["bucket", "hits", "misses", "cached", "active", "parked"]
    assert lines[8].split() == ["16", "7", "1", "1", "0", "0"]
    assert lines[9].split() == ["1,048,576", "0", "1", "0", "1", "2"]


def test_stats_table_is_readable(pool: BucketPool) -> None:
    with pool.acquire(1196):
        pass
    with pool.acquire(1500):
        pass
    table = str(pool.stats())
    assert "allocations" in table
    assert "hit rate 50.0%" in table
    assert "rounding waste 1,400 entries" in table
    assert table.splitlines()[-1].split() == ["2,048", "1", "1", "1", "0", "0"]


# -- exact accounting ----------------------------------------------------------------------


def expected_stats(
    allocations: Stat,
    allocated_bytes: Stat,
    active_requests: Stat,
    active_bytes: Stat,
    cached_bytes: int,
    parked: tuple[int, int],
    hits_misses: tuple[int, int],
    entries: tuple[int, int],
    buckets: tuple[BucketStats, ...],
    views: int = 0,
) -> PoolStats:
    """A whole expected PoolStats, written out (parked as (count, bytes))."""
    return PoolStats(
        allocations=allocations,
        allocated_bytes=allocated_bytes,
        active_requests=active_requests,
        active_bytes=active_bytes,
        cached_bytes=cached_bytes,
        parked=parked[0],
        parked_bytes=parked[1],
        view_bytes=views,
        hits=hits_misses[0],
        misses=hits_misses[1],
        leaks=0,
        requested_entries=entries[0],
        rounded_entries=entries[1],
        buckets=buckets,
    )


@pytest.mark.pool(max_cached_per_bucket=1)
def test_exact_accounting_after_every_step(pool: BucketPool) -> None:
    zero = Stat(0, 0, 0, 0)
    assert pool.stats() == expected_stats(zero, zero, zero, zero, 0, (0, 0), (0, 0), (0, 0), ())

    a = pool.acquire(10)  # miss in bucket 16 (384 bytes a buffer)
    assert pool.stats() == expected_stats(
        Stat(1, 1, 1, 0),
        Stat(384, 384, 384, 0),
        Stat(1, 1, 1, 0),
        Stat(384, 384, 384, 0),
        0,
        (0, 0),
        (0, 1),
        (10, 16),
        (BucketStats(16, 0, 1, 0, 1, 0),),
    )

    b = pool.acquire(100)  # miss in bucket 128 (3,072 bytes)
    assert pool.stats() == expected_stats(
        Stat(2, 2, 2, 0),
        Stat(3456, 3456, 3456, 0),
        Stat(2, 2, 2, 0),
        Stat(3456, 3456, 3456, 0),
        0,
        (0, 0),
        (0, 2),
        (110, 144),
        (BucketStats(16, 0, 1, 0, 1, 0), BucketStats(128, 0, 1, 0, 1, 0)),
    )

    a.release()
    assert pool.stats() == expected_stats(
        Stat(2, 2, 2, 0),
        Stat(3456, 3456, 3456, 0),
        Stat(1, 2, 2, 1),
        Stat(3072, 3456, 3456, 384),
        384,
        (0, 0),
        (0, 2),
        (110, 144),
        (BucketStats(16, 0, 1, 1, 0, 0), BucketStats(128, 0, 1, 0, 1, 0)),
    )

    c = pool.acquire(16)  # hit
    d = pool.acquire(1)  # miss: the only cached 16 is out
    assert pool.stats() == expected_stats(
        Stat(3, 3, 3, 0),
        Stat(3840, 3840, 3840, 0),
        Stat(3, 3, 4, 1),
        Stat(3840, 3840, 4224, 384),
        0,
        (0, 0),
        (1, 3),
        (127, 176),
        (BucketStats(16, 1, 2, 0, 2, 0), BucketStats(128, 0, 1, 0, 1, 0)),
    )

    event = FlagEvent()
    d.record_event(event)
    d.release()  # parked
    c.release()  # cached
    assert pool.stats() == expected_stats(
        Stat(3, 3, 3, 0),
        Stat(3840, 3840, 3840, 0),
        Stat(1, 3, 4, 3),
        Stat(3072, 3840, 4224, 1152),
        384,
        (1, 384),
        (1, 3),
        (127, 176),
        (BucketStats(16, 1, 2, 1, 0, 1), BucketStats(128, 0, 1, 0, 1, 0)),
    )

    event.done = True
    assert pool.collect() == 1  # over max_cached_per_bucket=1: freed
    after_collect = expected_stats(
        Stat(2, 3, 3, 1),
        Stat(3456, 3840, 3840, 384),
        Stat(1, 3, 4, 3),
        Stat(3072, 3840, 4224, 1152),
        384,
        (0, 0),
        (1, 3),
        (127, 176),
        (BucketStats(16, 1, 2, 1, 0, 0), BucketStats(128, 0, 1, 0, 1, 0)),
    )
    assert pool.stats() == after_collect

    pool.reset_peak_stats()
    assert pool.stats() == attrs.evolve(
        after_collect,
        allocations=Stat(2, 2, 3, 1),
        allocated_bytes=Stat(3456, 3456, 3840, 384),
        active_requests=Stat(1, 1, 4, 3),
        active_bytes=Stat(3072, 3072, 4224, 1152),
    )

    b.release()
    assert pool.empty_cache() == 3456
    assert pool.stats() == expected_stats(
        Stat(0, 2, 3, 3),
        Stat(0, 3456, 3840, 3840),
        Stat(0, 1, 4, 4),
        Stat(0, 3072, 4224, 4224),
        0,
        (0, 0),
        (1, 3),
        (127, 176),
        (BucketStats(16, 1, 2, 0, 0, 0), BucketStats(128, 0, 1, 0, 0, 0)),
    )


@pytest.mark.parametrize("holder", ["handle", "compat tuple"])
def test_a_peak_reset_after_releases_is_the_current_value(holder: str) -> None:
    # Releases wait in their inbox until the next operation: the reset takes them back
    # first, so it does not count them as active.
    compat = DescriptorBufferPool()
    pool = compat.pool
    if holder == "handle":
        for handle in [pool.acquire(5) for _ in range(3)]:
            handle.release()
    else:
        for bufs in [compat.acquire(5) for _ in range(3)]:
            compat.release(bufs)
    pool.reset_peak_stats()
    stats = pool.stats()
    assert stats.active_requests.current == stats.active_requests.peak == 0
    assert stats.active_bytes.current == stats.active_bytes.peak == 0
    assert stats.allocations.peak == stats.allocations.current == 3


def test_the_snapshot_copies_every_total_in_its_order() -> None:
    ledger = BucketPool()._ledger
    for value, name in enumerate(TOTALS, 100):
        setattr(ledger, name, value)
    assert ledger.snapshot()[-1] == tuple(range(100, 100 + len(TOTALS)))
