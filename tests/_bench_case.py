"""Run one benchmark case for a test: the checks every case's samples and figures pass."""

from __future__ import annotations

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
