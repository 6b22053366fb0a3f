"""The trace, fill-step and debug cases, and the series base (toy sizes; no time asserted)."""

from __future__ import annotations

import pytest
from _bench_case import run_case

from bench import _cases as cases
from bench._stats import ops_for
from bench._traces import ENTRY_BYTES, Trace, builtin_traces, make_trace, windowed_events


def test_trace_case_counts_allocations_and_bytes() -> None:
    case = cases.TraceCase(make_trace("t", "", windowed_events([64] * 30)))
    figures = run_case(case)
    for impl in ("original", "bucketpool", "compat"):
        assert figures[f"{impl} allocations after warm-up"].value == 0
        assert figures[f"{impl} final bytes"].value == 64 * ENTRY_BYTES
        assert not figures[f"{impl} final bytes"].timed
        assert figures[f"{impl} ns/step"].unit == "ns"
    assert figures["bucketpool/original"].rounds == 2
    assert figures["compat/original"].unit == "x"
    assert figures["compat refusals"].value == 0
    assert 0 < figures["bucketpool final bytes / cache cap"].value < 1
    assert 0 < figures["bucketpool peak bytes / (2 x peak live + cache cap)"].value < 1


@pytest.mark.parametrize("name", ["normal-64", "blocks", "loguniform-w16"])
def test_steady_traces_allocate_nothing_after_warm_up(name: str) -> None:
    (trace,) = (t for t in builtin_traces(300) if t.name == name)
    figures = run_case(cases.TraceCase(trace), rounds=1)
    assert figures["bucketpool allocations after warm-up"].value == 0
    assert figures["compat allocations after warm-up"].value == 0


def test_a_refusing_compat_is_counted_and_left_out_of_the_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cases, "compat_refusals", lambda events: 2)
    case = cases.TraceCase(make_trace("t", "", windowed_events([64] * 10)))
    figures = run_case(case, rounds=1)
    assert set(case.samples) == {"original", "bucketpool"}
    assert "compat/original" not in figures
    assert figures["compat refusals"].value == 2


def test_fill_step_case() -> None:
    case = cases.FillStepCase(20)
    (normal,) = (t for t in builtin_traces(1_000) if t.name == "normal-64")
    assert case.trace.steps is not None
    assert normal.steps is not None
    assert case.trace.steps == normal.steps[:20]  # the full trace's first steps and ends
    figures = run_case(case)
    assert set(case.samples) == {"original setitem", "original numpy", "bucketpool"}
    for way in ("setitem", "numpy"):
        assert figures[f"bucketpool/original ({way})"].unit == "x"
    assert "normal-64's first 20 steps" in case.description


def test_debug_case_times_every_level() -> None:
    figures = run_case(cases.DebugCase(min_pass_ns=1, max_ops=2), rounds=1)
    assert set(figures) == {
        "checks/off",
        "strict/off",
        "off ns/step",
        "checks ns/step",
        "strict ns/step",
    }


def test_series_case_reports_the_ratios_whose_series_exist() -> None:
    class Two(cases.SeriesCase):
        per = "call"

        def make(self) -> dict[str, cases.Series]:
            return {"a": cases.timed(2, sum, [1, 2]), "b": cases.timed(1, len, "xy")}

    case = Two("two", "", [("a/b", "a", "b"), ("c/b", "c", "b")])
    figures = run_case(case, rounds=3)
    assert set(figures) == {"a/b", "a ns/call", "b ns/call"}
    assert figures["a/b"].rounds == 3


def test_ops_for_stops_at_the_cap() -> None:
    calls: list[int] = []
    assert ops_for(calls.append, min_ns=10**12, max_ops=5) == 5
    assert calls[-1] == 5
    assert ops_for(calls.append, min_ns=0, max_ops=5) == 1


def test_trace_with_no_steps_is_replayed() -> None:
    trace = Trace("t", "", windowed_events([8, 16, 8], 2), (8, 10, 4))
    figures = run_case(cases.TraceCase(trace), rounds=1)
    assert figures["bucketpool allocations after warm-up"].value == 0
