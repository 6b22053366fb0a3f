"""Each case sets up, runs rounds and yields its figures (tiny sizes; no time is asserted)."""

from __future__ import annotations

import pytest

from bucketpool.bench import _cases as cases
from bucketpool.bench._stats import Measurement
from bucketpool.bench._traces import ENTRY_BYTES, Trace, windowed_events


def run(case: cases.Case, rounds: int = 2) -> dict[str, Measurement]:
    case.setup()
    for _ in range(rounds):
        case.round()
    for samples in case.samples.values():
        assert len(samples) == rounds
        assert all(value > 0 for value in samples)
    figures = case.measurements()
    case.close()
    for figure in figures.values():
        assert figure.low <= figure.value <= figure.high
    return figures


def test_trace_case_counts_allocations_and_bytes() -> None:
    trace = Trace("t", "", windowed_events([64] * 30), record_bytes=True)
    case = cases.TraceCase(trace)
    figures = run(case)
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
    figures = run(case)
    assert case.name == "parked-50"
    assert set(figures) == {"parked/none parked", "none parked ns/op", "parked ns/op"}


def test_threads_case_runs_every_workload() -> None:
    case = cases.ThreadsCase(ops_per_thread=10, threads=3)
    figures = run(case, rounds=1)
    assert case.name == "threads-3"
    assert figures["bucketpool p99 latency"].unit == "ns"
    assert "bare acquire/release throughput ratio" in figures


def test_a_thread_error_reaches_the_caller() -> None:
    def work(latencies: list[int] | None) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cases._threaded(work, 2, record=False)


def test_debug_case_sizes_each_level() -> None:
    figures = run(cases.DebugCase(min_pass_ns=1, max_ops=2), rounds=1)
    assert set(figures) == {"checks/off", "strict/off", "off ns/op"}


def test_fills_case_writes_every_method() -> None:
    case = cases.FillsCase(min_batch_ns=1)
    figures = run(case, rounds=1)
    assert case.descriptors["add_block_copies-consecutive"] == 1
    assert case.descriptors["add_copies"] == cases.FILL_COPIES
    assert "setitem/add_copies" in figures
    assert set(case.labels) == set(case.samples)


def test_overhead_case_is_exact() -> None:
    case = cases.OverheadCase(buffers=4)
    figures = run(case, rounds=1)
    assert case.samples == {}
    assert set(figures) == {
        "bucketpool bytes per cached buffer",
        "original bytes per cached buffer",
        "compat bytes per cached buffer",
    }
    assert all(not figure.timed and figure.value > 0 for figure in figures.values())
