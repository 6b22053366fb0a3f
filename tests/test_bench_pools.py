"""The pools under test are driven as their callers drive them, through public API only."""

from __future__ import annotations

from bench import _pools as pools
from bench._traces import ENTRY_BYTES as TRIPLE
from bench._traces import Trace, windowed_events
from bucketpool import BucketPool


def test_implementations_drive_their_pools() -> None:
    impls = pools.make_implementations()
    assert tuple(impl.name for impl in impls) == pools.IMPLEMENTATIONS
    trace = Trace("t", "", windowed_events([100, 20], 2))
    assert trace.events == (100, 20, ~0, ~1)
    for impl in impls:
        impl.replay(trace.events)
    original, ours, compat = (impl.memory() for impl in impls)
    assert original == pools.Memory(2, 120 * TRIPLE, 120 * TRIPLE)
    assert ours == compat == pools.Memory(2, (128 + 32) * TRIPLE, (128 + 32) * TRIPLE)
    for impl in impls:
        impl.cycle([64, 64])
    original, ours, compat = (impl.memory() for impl in impls)
    # The original pops the 20-entry triple, drops it and allocates 64 entries.
    assert original == pools.Memory(3, 164 * TRIPLE, 164 * TRIPLE)
    assert ours == compat == pools.Memory(3, 224 * TRIPLE, 224 * TRIPLE)
    for impl in impls:
        held = impl.record(trace.events)
        assert len(held) == trace.ops
        assert held[-1] == impl.memory().bytes_held


def test_park_keeps_buffers_out_of_reuse() -> None:
    pool = BucketPool()
    pools.park(pool, 16, 5)
    stats = pool.stats()
    assert stats.parked == 5
    assert pool.collect() == 0  # never done
    assert pools.NeverDone().query() is False


def test_threaded_ops_record_one_latency_per_op() -> None:
    original, pool = pools.LockedOriginal(), BucketPool()
    for bare in (False, True):
        latencies: list[int] = []
        pools.sliced_ops(original, 10, 5, latencies, bare=bare)
        pools.handle_ops(pool, 10, 5, latencies, bare=bare)
        assert len(latencies) == 10
        assert all(ns >= 0 for ns in latencies)
    pools.handle_ops(pool, 10, 3, None)
    assert pool.stats().active_requests.current == 0
    assert pools.memory_of(pool).allocations == 1


def test_make_implementations_keeps_the_order_of_a_round() -> None:
    chosen = pools.make_implementations(["compat", "original"])
    assert [impl.name for impl in chosen] == ["original", "compat"]
