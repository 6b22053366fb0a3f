"""The threads case: eight threads on one pool (tiny sizes; no time is asserted)."""

from __future__ import annotations

import pytest
from _bench_case import run_case

from bucketpool.bench import _threads as threads


def test_threads_case_runs_every_workload() -> None:
    case = threads.ThreadsCase(ops_per_thread=10, threads=3)
    figures = run_case(case, rounds=1)
    assert case.name == "threads-3"
    assert figures["bucketpool p99 latency"].unit == "ns"
    assert "bare acquire/release throughput ratio" in figures


def test_a_thread_error_reaches_the_caller() -> None:
    def work(latencies: list[int] | None) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        threads.threaded(work, 2, record=False)
