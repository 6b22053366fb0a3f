"""Benchmark runs for the tests: one case with the checks every case passes, or a toy run."""

from __future__ import annotations

from bucketpool.bench._cases import Case
from bucketpool.bench._runner import BenchResult, Settings, build_cases, run_benchmark
from bucketpool.bench._stats import Measurement
from bucketpool.bench._traces import builtin_traces


def run_case(case: Case, rounds: int = 2) -> dict[str, Measurement]:
    """Set *case* up, run *rounds* rounds, check the samples and return its figures."""
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


def tiny_run() -> BenchResult:
    """A whole benchmark run at toy sizes (two traces and the other case kinds)."""
    settings = Settings(rounds=2, max_rounds=2, budget_s=0, ops=40, thread_ops=5, parked=20)
    traces = [t for t in builtin_traces(40) if t.name in ("repeated-64", "spike")]
    kinds = ("parked", "threads", "fills", "overhead")
    return run_benchmark(settings, build_cases(settings, traces, kinds))
