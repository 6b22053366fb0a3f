from __future__ import annotations

import attrs
import pytest

from bucketpool import BucketStats, OutstandingBuffer, PoolStats, Stat


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


def test_table_without_buckets() -> None:
    lines = str(record()).splitlines()
    assert lines[0].split() == ["current", "peak", "allocated", "freed"]
    assert lines[1].split() == ["allocations", "2", "3", "5", "3"]
    assert lines[2].split() == ["allocated_bytes", "768", "1,152", "1,920", "1,152"]
    assert "hit rate -" in lines[5]
    assert "rounding waste 44 entries" in lines[5]
    assert "leaks 0" in lines[5]
    assert len(lines) == 6


def test_table_shows_leaks() -> None:
    assert "leaks 1,234 " in str(record(leaks=1234)).splitlines()[5]


def test_outstanding_buffer_is_a_frozen_record() -> None:
    out = OutstandingBuffer(n=3, capacity=16, acquired_at=None)
    assert out == OutstandingBuffer(3, 16, None)
    assert out != OutstandingBuffer(3, 16, "f.py:1")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        out.n = 4  # type: ignore[misc]


def test_table_with_buckets() -> None:
    buckets = (BucketStats(16, 7, 1, 1, 0, 0), BucketStats(1 << 20, 0, 1, 0, 1, 2))
    lines = str(record(buckets, hits=7, misses=2)).splitlines()
    assert "hit rate 77.8%" in lines[5]
    assert lines[6].split() == ["bucket", "hits", "misses", "cached", "active", "parked"]
    assert lines[7].split() == ["16", "7", "1", "1", "0", "0"]
    assert lines[8].split() == ["1,048,576", "0", "1", "0", "1", "2"]
