"""The compat drop-in accepts the original's calls; a refusal is counted, never a crash."""

from __future__ import annotations

import pytest
from _bench_case import run_case

from bench import _compat as compat
from bench._stats import exact
from bench._traces import builtin_traces, windowed_events
from bucketpool.compat import DescriptorBufferPool


def test_a_valid_trace_is_accepted() -> None:
    for trace in builtin_traces(50):
        assert compat.compat_refusals(trace.events) == 0, trace.name
    assert compat.compat_refusals((0, ~0)) == 0  # n = 0, as the original takes it


def test_refusals_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    real = DescriptorBufferPool.acquire

    def picky(self: DescriptorBufferPool, n: int) -> object:
        if n > 100:
            raise ValueError("too big")
        return real(self, n)

    monkeypatch.setattr(DescriptorBufferPool, "acquire", picky)
    events = windowed_events([10, 200, 20, 300, 30], 2)
    assert compat.compat_refusals(events) == 2


def test_a_short_triple_is_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    real = DescriptorBufferPool.acquire
    monkeypatch.setattr(DescriptorBufferPool, "acquire", lambda self, n: real(self, max(n // 2, 1)))
    assert compat.compat_refusals(windowed_events([64, 64])) == 2


def test_compat_case_makes_every_call() -> None:
    case = compat.CompatCase()
    figures = run_case(case, rounds=1)
    assert figures == {"refused calls": exact(0, "count")}
    assert case.refused == {}
    assert "acquire(0)" in case.description
    assert "six-field pool" in case.description


def test_compat_case_names_what_was_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = DescriptorBufferPool.acquire

    def no_zero(self: DescriptorBufferPool, n: int) -> object:
        if n == 0:
            raise ValueError("n must be positive")
        return real(self, n)

    monkeypatch.setattr(DescriptorBufferPool, "acquire", no_zero)
    case = compat.CompatCase()
    figures = run_case(case, rounds=1)
    assert figures["refused calls"].value == 1
    assert list(case.refused) == ["acquire(0)"]
    assert "REFUSED: acquire(0) (ValueError: n must be positive)" in case.description
