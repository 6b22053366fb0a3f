"""The parked cases: handles parked on pending or stuck events (tiny sizes; no time asserted)."""

from __future__ import annotations

from collections.abc import Mapping

from _bench_case import run_case

from bench import _parked as parked
from bench._cases import Case
from bench._original import OriginalDescriptorBufferPool, OriginalDescriptorBuffers
from bench._stats import Measurement
from bench._targets import check_targets
from bucketpool import BucketPool


def judged(case: Case, figures: Mapping[str, Measurement]) -> dict[str, str]:
    """The figures of *case* that targets judge, to the kind of each target."""
    checks = check_targets({case.name: figures})
    return {check.spec.figure: check.spec.kind for check in checks}


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


def test_evented_ops_keep_the_delay() -> None:
    pool, clock = BucketPool(), parked.OpClock()
    parked.evented_ops(pool, 64, 50, clock)
    assert clock.ops == 50
    assert pool.stats().active_requests.current == 0  # every handle released
    pool.collect()
    assert pool.stats().parked == parked.DELAY  # the copies of the last `DELAY` ops
    clock.ops += 1
    assert pool.collect() == 1
    plain = BucketPool()
    parked.evented_ops(plain, 64, 50, None)  # the plain step records nothing
    assert plain.stats().parked == 0
    assert plain.stats().active_requests.current == 0


def test_the_original_by_hand_releases_what_is_done_before_each_acquire() -> None:
    pool, clock = OriginalDescriptorBufferPool(), parked.OpClock()
    pending: list[tuple[parked.AfterOps, OriginalDescriptorBuffers]] = []
    parked.hand_evented_ops(pool, 64, 50, clock, pending)
    assert clock.ops == 50
    assert len(pending) == parked.DELAY + 1  # asked last before op 49's acquire
    assert pool.allocations == parked.DELAY + 1  # steady: released triples are reused
    assert pool.cached == 0


def test_evented_case_figures_and_targets() -> None:
    case = parked.EventedCase(ops=30)
    figures = run_case(case)
    assert case.name == "evented"
    assert figures["evented/plain"].unit == "x"
    assert figures["evented/plain"].timed
    assert figures["evented/original by hand"].unit == "x"
    for name in ("plain", "evented", "original by hand"):
        assert figures[f"{name} ns/op"].unit == "ns"
    assert judged(case, figures) == {
        "evented/plain": "promise",
        "evented/original by hand": "goal",
    }


def test_parked_stuck_case_figures_and_targets() -> None:
    case = parked.ParkedStuckCase(ops=40, stuck=50)
    figures = run_case(case)
    assert case.name == "parked-stuck"
    assert "50 buffers" in case.description
    assert figures["stuck/none stuck"].unit == "x"
    assert figures["stuck/none stuck"].timed
    for name in ("stuck", "none stuck"):
        assert figures[f"{name} allocations after warm-up"].unit == "count"
        assert not figures[f"{name} allocations after warm-up"].timed
        assert figures[f"{name} ns/op"].unit == "ns"
    # The loop alone allocates nothing after its warm-up; the stuck buffers stay parked.
    assert figures["none stuck allocations after warm-up"].value == 0
    assert figures["none stuck parked after a pass"].value >= parked.DELAY
    assert figures["stuck parked after a pass"].value >= 50 + parked.DELAY
    assert judged(case, figures) == {
        "stuck/none stuck": "promise",
        "stuck allocations after warm-up": "promise",
    }


def test_collect_case_figures_and_targets() -> None:
    case = parked.CollectCase(parked=200)
    case.setup()
    for _ in range(2):
        case.round()
        for pool, _clock in case._pools:  # every buffer parked again after each cycle
            assert pool.stats().parked in (2, 200)
            assert pool.stats().allocations.allocated == pool.stats().parked  # reused
    assert set(case.samples) == {"pending 2", "done 2", "pending 200", "done 200"}
    assert all(len(samples) == 2 for samples in case.samples.values())
    figures = case.measurements()
    case.close()
    assert case.name == "collect"
    for state in ("pending", "done"):
        ratio = figures[f"{state}: per-buffer cost, 100x parked / 1x"]
        assert (ratio.unit, ratio.timed, ratio.rounds) == ("x", True, 2)
        assert figures[f"{state} 200 ns/buffer"].unit == "ns"
    assert judged(case, figures) == {
        "pending: per-buffer cost, 100x parked / 1x": "promise",
        "done: per-buffer cost, 100x parked / 1x": "promise",
    }
