"""The fills case writes with every method (tiny batches; no time is asserted)."""

from __future__ import annotations

from _bench_case import run_case

from bench import _fills as fills


def test_fills_case_writes_every_method() -> None:
    case = fills.FillsCase(min_batch_ns=1)
    figures = run_case(case, rounds=1)
    assert case.descriptors["add_block_copies-consecutive"] == 1
    assert case.descriptors["add_copies"] == fills.FILL_COPIES
    assert "setitem/add_copies" in figures
    assert set(case.labels) == set(case.samples)
