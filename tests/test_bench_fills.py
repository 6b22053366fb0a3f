"""The fills case writes with every method (tiny batches; no time is asserted)."""

from __future__ import annotations

from bucketpool.bench import _fills as fills
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


def test_fills_case_writes_every_method() -> None:
    case = fills.FillsCase(min_batch_ns=1)
    figures = run_case(case, rounds=1)
    assert case.descriptors["add_block_copies-consecutive"] == 1
    assert case.descriptors["add_copies"] == fills.FILL_COPIES
    assert "setitem/add_copies" in figures
    assert set(case.labels) == set(case.samples)
