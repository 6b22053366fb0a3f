"""The runner adds rounds while a verdict is UNSURE and holds back judgement under load."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from bucketpool.bench import _runner as runner
from bucketpool.bench._stats import Measurement, paired_ratios, summarize
from bucketpool.bench._targets import TargetSpec
from bucketpool.bench._traces import builtin_traces

SPEC = TargetSpec(("fake",), "fast/base", "<=", 1.0, "fake")


class FakeCase:
    """A case whose rounds give preset ratios: no pool, no clock."""

    def __init__(self, ratios: Iterator[float]) -> None:
        self.name = "fake"
        self.description = "synthetic"
        self.samples: dict[str, list[float]] = {"base": [], "fast": []}
        self._ratios = ratios
        self.set_up = 0
        self.closed = False

    def setup(self) -> None:
        self.set_up += 1

    def round(self) -> None:
        self.samples["base"].append(100.0)
        self.samples["fast"].append(100.0 * next(self._ratios))

    def close(self) -> None:
        self.closed = True

    def measurements(self) -> dict[str, Measurement]:
        ratios = paired_ratios(self.samples["fast"], self.samples["base"])
        return {"fast/base": summarize(ratios, "x")}


def settings(budget_s: float = 60.0) -> runner.Settings:
    return runner.Settings(rounds=5, max_rounds=14, budget_s=budget_s)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "load_average", lambda: 0.0)


def test_a_clear_verdict_stops_after_the_first_rounds() -> None:
    case = FakeCase(itertools.repeat(0.5))
    result = runner.run_benchmark(settings(), [case], specs=[SPEC])
    assert case.set_up == 1
    assert case.closed
    assert result.rounds == {"fake": 5}
    assert [check.verdict for check in result.checks] == ["PASS"]
    assert not result.loaded


def test_unsure_adds_rounds_up_to_the_limit() -> None:
    case = FakeCase(itertools.cycle([0.8, 1.2]))  # the interval straddles 1.0 for good
    lines: list[str] = []
    result = runner.run_benchmark(settings(), [case], specs=[SPEC], progress=lines.append)
    assert result.rounds == {"fake": 14}
    assert [check.verdict for check in result.checks] == ["UNSURE"]
    assert any(line.startswith("UNSURE: 3 more rounds of fake") for line in lines)


def test_unsure_can_settle_with_more_rounds() -> None:
    # Noisy first rounds, then steady ones: the median settles below the target.
    case = FakeCase(itertools.chain([0.6, 1.4, 0.6, 1.4, 0.6], itertools.repeat(0.6)))
    result = runner.run_benchmark(settings(), [case], specs=[SPEC])
    assert 5 < result.rounds["fake"] < 14
    assert [check.verdict for check in result.checks] == ["PASS"]


def test_no_budget_no_extra_rounds() -> None:
    case = FakeCase(itertools.cycle([0.8, 1.2]))
    result = runner.run_benchmark(settings(budget_s=0.0), [case], specs=[SPEC])
    assert result.rounds == {"fake": 5}


def test_a_high_load_average_holds_back_the_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "load_average", lambda: 1000.0)
    case = FakeCase(itertools.repeat(2.0))
    result = runner.run_benchmark(settings(), [case], specs=[SPEC])
    (check,) = result.checks
    assert (check.verdict, check.interval_verdict) == ("LOADED", "FAIL")
    assert result.loaded
    assert result.load["fake"] == 1000.0


def test_settings_for_mode() -> None:
    quick = runner.Settings.for_mode(quick=True)
    full = runner.Settings.for_mode(quick=False)
    assert quick.quick
    assert not full.quick
    assert quick.rounds < full.rounds
    assert quick.budget_s < full.budget_s
    custom = runner.Settings.for_mode(quick=True, rounds=50, ops=10, budget_s=0)
    assert (custom.rounds, custom.ops, custom.budget_s) == (50, 10, 0)
    assert custom.max_rounds >= 50


def test_build_cases() -> None:
    traces = builtin_traces(10)[:2]
    cases = runner.build_cases(runner.Settings(), traces, ["fills", "threads"])
    assert [case.name for case in cases] == ["repeated-64", "repeated-1196", "threads-8", "fills"]
    assert runner.build_cases(runner.Settings(), (), ()) == []
    env = runner.environment()
    assert {"version", "python", "torch", "numpy", "machine"} <= set(env)


def test_an_interval_at_the_resolution_floor_gets_no_more_rounds() -> None:
    case = FakeCase(itertools.repeat(1.0))  # exactly at the target: UNSURE for good
    result = runner.run_benchmark(settings(), [case], specs=[SPEC])
    assert [check.verdict for check in result.checks] == ["UNSURE"]
    assert result.rounds == {"fake": 5}
