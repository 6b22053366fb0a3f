"""The threads cases: eight threads on one pool (tiny sizes; no time is asserted)."""

from __future__ import annotations

import sys

import pytest
from _bench_case import run_case

from bench import _threads as threads


def test_threads_case_runs_every_workload() -> None:
    case = threads.ThreadsCase(ops_per_thread=10, threads=3)
    figures = run_case(case, rounds=1)
    assert case.name == "threads-3"
    assert figures["bucketpool p99 latency"].unit == "ns"
    assert figures["bucketpool ops/s"].unit == "ops/s"
    assert figures["bucketpool/original throughput"].unit == "x"
    assert "bare acquire/release throughput ratio" in figures


def test_switch_case_figures_and_units() -> None:
    before = sys.getswitchinterval()
    case = threads.SwitchCase(ops_per_thread=20, threads=3)
    figures = run_case(case, rounds=2)
    assert sys.getswitchinterval() == before
    assert case.name == "threads-3-switch"
    units = {name: figure.unit for name, figure in figures.items()}
    assert units == {
        "throughput at 100us / at default": "x",
        "p99 op latency at 100us / single-thread median op": "x",
        "default ops/s": "ops/s",
        "100us ops/s": "ops/s",
        "100us p99 latency": "ns",
        "single-thread median op": "ns",
    }
    assert all(figure.timed and figure.rounds == 2 for figure in figures.values())
    assert threads.THREADS == 8
    assert threads.FAST_SWITCH == 1e-4


def test_the_switch_interval_is_restored_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    before = sys.getswitchinterval()
    seen: list[float] = []

    def failing(work: object, count: int, record: bool) -> list[int]:
        seen.append(sys.getswitchinterval())
        raise RuntimeError("boom")

    inside: list[float] = []

    def fail_inside() -> None:
        with threads.switch_interval(1e-3):
            inside.append(sys.getswitchinterval())
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert inside == [pytest.approx(1e-3)]
    assert sys.getswitchinterval() == before
    case = threads.SwitchCase(ops_per_thread=5, threads=2)
    case.setup()
    monkeypatch.setattr(threads, "threaded", failing)
    with pytest.raises(RuntimeError, match="boom"):
        case.round()
    assert seen == [before]  # the first call, at the default
    assert sys.getswitchinterval() == before


def test_the_fast_interval_is_in_effect_while_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    real = threads.threaded

    def spy(work: threads.Work, count: int, record: bool) -> list[int]:
        seen.append(sys.getswitchinterval())
        return real(work, count, record)

    case = threads.SwitchCase(ops_per_thread=5, threads=2)
    case.setup()
    monkeypatch.setattr(threads, "threaded", spy)
    case.round()
    default = sys.getswitchinterval()
    assert seen == [default, default, pytest.approx(1e-4), pytest.approx(1e-4)]


def test_a_thread_error_reaches_the_caller() -> None:
    def work(latencies: list[int] | None) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        threads.threaded(work, 2, record=False)
