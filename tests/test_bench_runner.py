"""The runner adds rounds while a verdict is UNSURE and holds back judgement under load."""

from __future__ import annotations

import itertools
import os
import pathlib
from collections.abc import Iterator

import attrs
import pytest

from bench import _runner as runner
from bench._cases import FillStepCase
from bench._fills import FILL_SIZES
from bench._stats import Measurement, paired_ratios, summarize
from bench._targets import TargetSpec
from bench._traces import builtin_traces

SPEC = TargetSpec(("fake",), "fast/base", "<=", 1.0, "fake", kind="promise")


class FakeCase:
    """A case whose rounds give preset ratios: no pool, no clock."""

    def __init__(self, ratios: Iterator[float], name: str = "fake") -> None:
        self.name = name
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


def settings(budget_s: float = 60.0, *, settle_goals: bool = False) -> runner.Settings:
    return runner.Settings(rounds=5, max_rounds=14, budget_s=budget_s, settle_goals=settle_goals)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "other_runnable", lambda: 0.0)


def test_a_clear_verdict_stops_after_the_first_rounds() -> None:
    case = FakeCase(itertools.repeat(0.5))
    result = runner.run_benchmark(settings(), [case], specs=[SPEC])
    assert case.set_up == 1
    assert case.closed
    assert result.rounds == {"fake": 5}
    assert [check.verdict for check in result.checks] == ["PASS"]
    assert result.load == {"fake": 0.0}


def test_cases_close_in_the_reverse_order_of_their_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case undoes its patches over the state it found, as the host-step cases do with
    vLLM's modules in ``sys.modules``: closed first to last, a case set up later put back
    an earlier one's modules, which outlived the run (and ``import vllm`` worked after it)."""
    closed: list[str] = []
    cases = [FakeCase(itertools.repeat(0.5), name) for name in ("fake", "later")]
    for case in cases:
        monkeypatch.setattr(case, "close", lambda name=case.name: closed.append(name))
    runner.run_benchmark(settings(), cases, specs=[SPEC])
    assert closed == ["later", "fake"]


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


def test_other_busy_tasks_hold_back_the_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runner, "other_runnable", lambda: 2.0)  # both CPUs taken
    case = FakeCase(itertools.repeat(2.0))
    result = runner.run_benchmark(settings(), [case], specs=[SPEC])
    (check,) = result.checks
    assert (check.verdict, check.interval_verdict) == ("LOADED", "FAIL")
    assert result.load["fake"] == 2.0


def test_one_other_task_on_two_cpus_leaves_the_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runner, "other_runnable", lambda: 1.0)  # one CPU left: the bench's
    result = runner.run_benchmark(settings(), [FakeCase(itertools.repeat(2.0))], specs=[SPEC])
    assert [c.verdict for c in result.checks] == ["FAIL"]


def test_other_runnable_reads_a_count() -> None:
    count = runner.other_runnable()
    assert count >= 0
    if pathlib.Path("/proc/loadavg").exists():
        assert count == int(count)  # an instantaneous count, not an average


def test_quick_settings_are_smaller() -> None:
    full, quick = runner.Settings(), runner.QUICK
    assert quick.quick
    assert not full.quick
    for field in ("rounds", "max_rounds", "budget_s", "ops", "fill_step_ops", "min_pass_ns"):
        assert getattr(quick, field) < getattr(full, field), field


def test_build_cases() -> None:
    traces = builtin_traces(10)[:2]
    cases = runner.build_cases(runner.Settings(), traces, ["fills", "parked", "fill-step"])
    names = [case.name for case in cases]
    assert names == [
        "repeated-64",
        "repeated-1196",
        *(f"fills-{k}" for k in FILL_SIZES),
        "fill-step",
        "parked-10000",
        "evented",
        "parked-stuck",
        "collect",
    ]
    assert runner.build_cases(runner.Settings(), (), ()) == []
    (fill_step,) = runner.build_cases(runner.QUICK, (), ["fill-step"])
    assert isinstance(fill_step, FillStepCase)
    assert fill_step.trace.ops == runner.QUICK.fill_step_ops
    env = runner.environment()
    assert {"version", "python", "torch", "numpy", "platform", "cpus"} <= set(env)


def test_an_interval_at_the_resolution_floor_gets_no_more_rounds() -> None:
    case = FakeCase(itertools.repeat(1.0))  # exactly at the target: UNSURE for good
    result = runner.run_benchmark(settings(), [case], specs=[SPEC])
    assert [check.verdict for check in result.checks] == ["UNSURE"]
    assert result.rounds == {"fake": 5}


def test_unsure_goals_get_no_extra_rounds() -> None:
    goal = TargetSpec(("goal",), "fast/base", "<=", 1.0, "fake", kind="goal")
    case = FakeCase(itertools.cycle([0.8, 1.2]), name="goal")  # UNSURE for good
    result = runner.run_benchmark(settings(), [case], specs=[goal])
    assert result.rounds == {"goal": 5}
    assert [check.verdict for check in result.checks] == ["UNSURE"]


def test_with_settle_goals_promises_get_the_extra_rounds_first() -> None:
    goal = TargetSpec(("goal",), "fast/base", "<=", 1.0, "fake", kind="goal")
    promise = TargetSpec(("promise",), "fast/base", "<=", 1.0, "fake", kind="promise")
    cases = [
        FakeCase(itertools.cycle([0.8, 1.2]), name="goal"),  # UNSURE for good
        FakeCase(itertools.cycle([0.8, 1.2]), name="promise"),
    ]
    lines: list[str] = []
    strict = settings(settle_goals=True)
    result = runner.run_benchmark(strict, cases, specs=[goal, promise], progress=lines.append)
    assert result.rounds == {"goal": 14, "promise": 14}
    extra = [line for line in lines if line.startswith("UNSURE")]
    assert all("of promise (" in line for line in extra[:3])  # 5 + 3 x 3 = 14 rounds
    assert "of goal (" in extra[3]
    assert [check.spec.kind for check in result.checks] == ["promise", "goal"]


def test_a_quiet_machines_daemons_load_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    monkeypatch.setattr(runner, "other_runnable", lambda: runner.LOAD_TOLERANCE - 0.1)
    case = FakeCase(itertools.repeat(2.0), name="one")
    result = runner.run_benchmark(settings(), [case], specs=[attrs.evolve(SPEC, cases=("*",))])
    assert [c.verdict for c in result.checks] == ["FAIL"]
