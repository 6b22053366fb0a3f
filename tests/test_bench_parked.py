"""The parked cases: handles parked on pending or stuck events (toy sizes; no time asserted)."""

from __future__ import annotations

from collections.abc import Mapping

from _bench_case import run_case

from bench import _parked as parked
from bench._cases import Case
from bench._original import OriginalDescriptorBufferPool, OriginalDescriptorBuffers
from bench._stats import Measurement
from bench._targets import check_targets
from bucketpool import BucketPool, orphaned_buffers


def judged(case: Case, figures: Mapping[str, Measurement]) -> dict[str, str]:
    """The figures of *case* that targets judge, to the kind of each target."""
    return {c.spec.figure: c.spec.kind for c in check_targets({case.name: figures})}


def test_parked_case() -> None:
    case = parked.ParkedCase(ops=20, parked=50)
    figures = run_case(case)
    assert orphaned_buffers() == 0  # it ended its copies: no pool it dropped keeps a buffer
    assert case.name == "parked-50"
    assert set(figures) == {"parked/none parked", "none parked ns/step", "parked ns/step"}
    assert judged(case, figures) == {"parked/none parked": "promise"}


def test_after_ops_is_done_once_the_clock_reaches_it() -> None:
    clock = parked.OpClock()
    event = parked.AfterOps(clock, 3)
    clock.ops = 2
    assert not event.query()
    clock.ops = 3
    assert event.query()
    assert not parked.NeverDone().query()


def test_park_keeps_buffers_out_of_reuse() -> None:
    pool = BucketPool()
    parked.park(pool, 16, 5)
    assert pool.stats().parked == 5
    assert pool.collect() == 0  # never done


def test_evented_ops_keep_the_delay() -> None:
    pool, clock = BucketPool(), parked.OpClock()
    parked.evented_ops(pool, 64, 50, clock)
    assert clock.ops == 50
    assert pool.stats().active_requests.current == 0  # every handle released
    pool.collect()
    assert pool.stats().parked == parked.DELAY  # the copies of the last `DELAY` steps
    clock.ops += 1
    assert pool.collect() == 1


def test_the_original_by_hand_releases_what_is_done_before_each_acquire() -> None:
    pool, clock = OriginalDescriptorBufferPool(), parked.OpClock()
    pending: list[tuple[parked.AfterOps, OriginalDescriptorBuffers]] = []
    parked.hand_evented_ops(pool, 64, 50, clock, pending)
    assert clock.ops == 50
    assert len(pending) == parked.DELAY + 1  # asked last before step 49's acquire
    assert pool.allocations == parked.DELAY + 1  # steady: released triples are reused


def test_evented_case() -> None:
    case = parked.EventedCase(ops=30)
    figures = run_case(case)
    assert orphaned_buffers() == 0
    for name in ("plain", "evented", "original by hand"):
        assert figures[f"{name} ns/step"].unit == "ns"
    assert judged(case, figures) == {
        "evented/plain": "promise",
        "evented/original by hand": "goal",
    }


def test_parked_stuck_case() -> None:
    case = parked.ParkedStuckCase(ops=40, stuck=50)
    figures = run_case(case)
    assert orphaned_buffers() == 0
    assert "50 buffers" in case.description
    for name in ("stuck", "none stuck"):
        assert figures[f"{name} allocations after warm-up"].unit == "count"
        assert not figures[f"{name} allocations after warm-up"].timed
    assert figures["none stuck allocations after warm-up"].value == 0
    assert not figures[parked.STUCK_ASKED].timed  # (gated by the test below, not a target)
    assert judged(case, figures) == {
        "stuck/none stuck": "promise",
        "stuck allocations after warm-up": "promise",
    }


def test_the_stuck_events_cost_the_steps_the_same_however_many() -> None:
    # Exact: the questions stuck events get in a timed pass, per 1,000 steps: four in each
    # sweep (every 256 steps: 9 or 10 a pass), whether 100 or 4,000 are stuck.
    sweeps = parked.STUCK_OPS // 256
    for stuck in (100, 4_000):
        figures = run_case(parked.ParkedStuckCase(ops=parked.STUCK_OPS, stuck=stuck), rounds=1)
        asked = figures[parked.STUCK_ASKED].value * parked.STUCK_OPS / 1_000
        assert 4 * sweeps <= asked <= 4 * (sweeps + 1), stuck


def test_collect_case() -> None:
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
    assert orphaned_buffers() == 0
    for state in ("pending", "done"):
        ratio = figures[f"{state}: per-buffer cost, 100x parked / 1x"]
        assert (ratio.unit, ratio.timed, ratio.rounds) == ("x", True, 2)
        assert figures[f"{state} 200 ns/buffer"].unit == "ns"
    assert set(judged(case, figures).values()) == {"promise"}
