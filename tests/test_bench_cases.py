"""The case interface, the trace cases and the debug levels (tiny sizes; no time is asserted)."""

from __future__ import annotations

import pytest
from _bench_case import run_case

from bench import _cases as cases
from bench._traces import ENTRY_BYTES, Trace, builtin_traces, windowed_events


def test_trace_case_counts_allocations_and_bytes() -> None:
    trace = Trace("t", "", windowed_events([64] * 30), record_bytes=True)
    case = cases.TraceCase(trace)
    figures = run_case(case)
    for impl in ("original", "bucketpool", "compat"):
        assert figures[f"{impl} allocations after warm-up"].value == 0
        assert figures[f"{impl} final bytes"].value == 64 * ENTRY_BYTES
        assert not figures[f"{impl} final bytes"].timed
        assert figures[f"{impl} ns/op"].timed
        assert figures[f"{impl} ns/op"].unit == "ns"
        assert len(case.series[impl]) == 30
    assert figures["bucketpool/original"].rounds == 2
    assert figures["compat/original"].unit == "x"
    assert figures["compat refusals"].value == 0
    assert not figures["compat refusals"].timed
    assert 0 < figures["bucketpool final bytes / cache cap"].value < 1


@pytest.mark.parametrize("name", ["normal-64", "blocks"])
def test_the_new_traces_are_steady(name: str) -> None:
    (trace,) = (t for t in builtin_traces(300) if t.name == name)
    figures = run_case(cases.TraceCase(trace), rounds=1)
    assert figures["bucketpool allocations after warm-up"].value == 0
    assert figures["compat allocations after warm-up"].value == 0
    assert figures["bucketpool/original"].unit == "x"


def test_a_refusing_compat_is_counted_and_left_out_of_the_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cases, "compat_refusals", lambda events: 2)
    case = cases.TraceCase(Trace("t", "", windowed_events([64] * 10)))
    figures = run_case(case, rounds=1)
    assert set(case.samples) == {"original", "bucketpool"}
    assert "compat/original" not in figures
    assert figures["compat refusals"].value == 2


def test_ops_for_stops_at_the_cap() -> None:
    calls: list[int] = []
    assert cases.ops_for(calls.append, min_ns=10**12, max_ops=5) == 5
    assert calls[-1] == 5


def test_debug_case_sizes_each_level() -> None:
    figures = run_case(cases.DebugCase(min_pass_ns=1, max_ops=2), rounds=1)
    assert set(figures) == {"checks/off", "strict/off", "off ns/op"}
