"""Helpers of the benchmark's tests: a case's rounds checked, a toy run, a trace's validity."""

from __future__ import annotations

from collections.abc import Sequence

from bench._cases import Case
from bench._runner import BenchResult, Settings, build_cases, run_benchmark
from bench._stats import Measurement
from bench._traces import CASE_KINDS, builtin_traces

#: A whole run at toy sizes: every case kind runs in well under a few seconds.
TOY = Settings(
    rounds=2,
    max_rounds=2,
    budget_s=0,
    ops=40,
    fill_step_ops=20,
    parked=20,
    stuck=200,
    min_pass_ns=10_000,
)


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


def tiny_run(names: Sequence[str] | None = ("repeated-64", "normal-64", "spike")) -> BenchResult:
    """A whole run at `TOY` sizes: the traces *names* (None: all) and every other case."""
    traces = [t for t in builtin_traces(TOY.ops) if names is None or t.name in names]
    return run_benchmark(TOY, build_cases(TOY, traces, CASE_KINDS))


def live_handles(events: Sequence[int]) -> list[int]:
    """Check that every release names an earlier live acquire; return the live counts."""
    live: set[int] = set()
    acquired = 0
    counts = []
    for event in events:
        if event >= 0:
            live.add(acquired)
            acquired += 1
        else:
            assert ~event in live
            live.remove(~event)
        counts.append(len(live))
    assert not live, "every acquire is released by the end"
    return counts
