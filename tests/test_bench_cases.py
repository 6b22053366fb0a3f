"""The case interface and its single-threaded cases (tiny sizes; no time is asserted)."""

from __future__ import annotations

from _bench_case import run_case

from bucketpool.bench import _cases as cases
from bucketpool.bench._traces import ENTRY_BYTES, Trace, windowed_events


def test_trace_case_counts_allocations_and_bytes() -> None:
    trace = Trace("t", "", windowed_events([64] * 30), record_bytes=True)
    case = cases.TraceCase(trace)
    figures = run_case(case)
    for impl in ("original", "bucketpool", "compat"):
        assert figures[f"{impl} allocations after warm-up"].value == 0
        assert figures[f"{impl} final bytes"].value == 64 * ENTRY_BYTES
        assert not figures[f"{impl} final bytes"].timed
        assert figures[f"{impl} ns/op"].timed
        assert len(case.series[impl]) == 30
    assert figures["bucketpool/original"].rounds == 2
    assert figures["compat/original"].unit == "x"
    assert 0 < figures["bucketpool final bytes / cache cap"].value < 1


def test_parked_case_parks_in_another_bucket() -> None:
    case = cases.ParkedCase(ops=20, parked=50)
    figures = run_case(case)
    assert case.name == "parked-50"
    assert set(figures) == {"parked/none parked", "none parked ns/op", "parked ns/op"}


def test_ops_for_stops_at_the_cap() -> None:
    calls: list[int] = []
    assert cases.ops_for(calls.append, min_ns=10**12, max_ops=5) == 5
    assert calls[-1] == 5


def test_debug_case_sizes_each_level() -> None:
    figures = run_case(cases.DebugCase(min_pass_ns=1, max_ops=2), rounds=1)
    assert set(figures) == {"checks/off", "strict/off", "off ns/op"}
