"""The parked cases: handles parked on pending or stuck events (tiny sizes; no time asserted)."""

from __future__ import annotations

from _bench_case import run_case

from bench import _parked as parked
from bucketpool import BucketPool


def test_parked_case_parks_in_another_bucket() -> None:
    case = parked.ParkedCase(ops=20, parked=50)
    figures = run_case(case)
    assert case.name == "parked-50"
    assert set(figures) == {"parked/none parked", "none parked ns/op", "parked ns/op"}
    assert figures["parked/none parked"].unit == "x"


def test_after_ops_is_done_once_the_clock_reaches_it() -> None:
    clock = parked.OpClock()
    event = parked.AfterOps(clock, 3)
    clock.ops = 2
    assert not event.query()
    clock.ops = 3
    assert event.query()


def test_in_flight_ops_keeps_the_window_and_the_delay() -> None:
    pool, clock = BucketPool(), parked.OpClock()
    parked.in_flight_ops(pool, 100, 50, clock)
    assert clock.ops == 50
    assert pool.stats().active_requests.current == 0  # every handle released
    pool.collect()
    # Pending: the copies of the last `DELAY` releases and of the last window's handles.
    pending = parked.WINDOW - 1 + parked.DELAY
    assert pool.stats().parked == pending
    clock.ops += pending - 1  # the last handle's copy ends `DELAY` ops after the last op
    assert pool.collect() == pending - 1
    clock.ops += 1
    assert pool.collect() == 1
    assert pool.stats().parked == 0


def test_parked_stuck_case_figures() -> None:
    case = parked.ParkedStuckCase(ops=40)
    figures = run_case(case)
    assert case.name == "parked-stuck"
    assert figures["stuck/none stuck"].unit == "x"
    assert figures["stuck/none stuck"].timed
    for name in ("stuck", "none stuck"):
        assert figures[f"{name} allocations after warm-up"].unit == "count"
        assert not figures[f"{name} allocations after warm-up"].timed
        assert figures[f"{name} ns/op"].unit == "ns"
    # The loop alone allocates nothing after its warm-up; the stuck handle stays parked.
    assert figures["none stuck allocations after warm-up"].value == 0
    assert figures["none stuck parked after a pass"].value >= parked.WINDOW - 1 + parked.DELAY
    assert figures["stuck parked after a pass"].value >= parked.WINDOW + parked.DELAY
