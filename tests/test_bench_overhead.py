"""The overhead case measures bytes per cached buffer, once and exactly."""

from __future__ import annotations

from bucketpool.bench import _overhead as overhead
from bucketpool.bench._cases import Case
from bucketpool.bench._stats import Measurement


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
