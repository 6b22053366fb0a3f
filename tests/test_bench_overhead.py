"""The overhead case measures bytes per cached buffer, once and exactly."""

from __future__ import annotations

from _bench_case import run_case

from bench import _overhead as overhead


def test_overhead_case_is_exact() -> None:
    case = overhead.OverheadCase(buffers=4)
    figures = run_case(case, rounds=1)
    assert case.samples == {}
    assert set(figures) == {
        "bucketpool bytes per cached buffer",
        "original bytes per cached buffer",
        "compat bytes per cached buffer",
    }
    assert all(not figure.timed and figure.value > 0 for figure in figures.values())
