"""The fills cases write k copies every way (tiny batches; no time is asserted)."""

from __future__ import annotations

import pytest
from _bench_case import run_case

from bench import _fills as fills


@pytest.mark.parametrize("k", fills.FILL_SIZES)
def test_fills_case_writes_every_way(k: int) -> None:
    case = fills.FillsCase(k, min_batch_ns=1)
    figures = run_case(case, rounds=1)
    assert case.name == f"fills-{k}"
    for source in ("arrays", "lists"):
        assert figures[f"add_copies/numpy ({source})"].unit == "x"
        assert f"numpy ({source}) ns/call" in figures
    assert ("setitem/add_copies" in figures) == (k in fills.SETITEM_SIZES)
    assert "add_block_copies-shuffled/add_copies" in figures


def test_each_call_writes_what_it_is_timed_for() -> None:
    case = fills.FillsCase(64, min_batch_ns=1)
    calls = case._calls()
    assert set(calls) == {
        "numpy (arrays)",
        "add_copies (arrays)",
        "numpy (lists)",
        "add_copies (lists)",
        "add_block_copies-consecutive",
        "add_block_copies-shuffled",
        "setitem",
    }
    assert calls["add_copies (arrays)"]() == calls["add_copies (lists)"]() == 64
    assert calls["add_block_copies-consecutive"]() == 1  # one run of blocks: coalesced
    shuffled = calls["add_block_copies-shuffled"]()
    assert isinstance(shuffled, int)
    assert 1 <= shuffled <= 64
    case.close()
