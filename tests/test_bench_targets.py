"""The targets are data, split into promises and goals, each judged on its whole interval."""

from __future__ import annotations

import fnmatch

import pytest

from bench import _targets as targets
from bench._stats import Measurement, Verdict, exact
from bench._targets import Check, Kind, TargetSpec
from bench._traces import TRACE_NAMES

SPEC = TargetSpec(("repeated-*",), "bucketpool/original", "<=", 0.30, "repeated n", kind="goal")
CASES = [
    *TRACE_NAMES,
    "replay:x.trace",
    "parked-10000",
    "parked-stuck",
    "evented",
    "collect",
    "threads-8",
    "threads-8-switch",
    "debug",
    "fills",
    "compat",
]


def timed(value: float, low: float, high: float, spread: float = 0.05) -> Measurement:
    return Measurement(value, low, high, "x", timed=True, rounds=7, spread=spread)


def specs_for(case: str, figure: str, kind: Kind) -> list[TargetSpec]:
    return [
        spec
        for spec in targets.TARGETS
        if spec.kind == kind and spec.figure == figure and spec.applies_to(case)
    ]


def test_every_target_names_a_known_case() -> None:
    for spec in targets.TARGETS:
        assert any(fnmatch.fnmatchcase(case, p) for p in spec.cases for case in CASES), spec
        assert spec.op in ("<=", ">=")
    assert targets.TARGETS == targets.PROMISES + targets.GOALS
    assert {spec.kind for spec in targets.PROMISES} == {"promise"}
    assert {spec.kind for spec in targets.GOALS} == {"goal"}


@pytest.mark.parametrize("trace", [*TRACE_NAMES, "replay:x.trace"])
def test_every_trace_promises_no_slowdown_and_aims_for_cheap_compat(trace: str) -> None:
    kind: Kind = "goal" if trace == "ramp" else "promise"  # see the ramp's own test
    varying = trace.startswith("loguniform") or trace in {"spike", "encoder-cache"}
    limit = 1.2 if varying and kind == "promise" else 1.0
    (speed,) = [s for s in specs_for(trace, "bucketpool/original", kind) if s.limit == limit]
    assert speed.op == "<="
    (goal,) = specs_for(trace, "compat/original", "goal")
    assert (goal.op, goal.limit) == ("<=", 1.25)
    assert specs_for(trace, "compat/original", "promise") == []  # no timing promise for compat
    assert specs_for(trace, "compat refusals", "promise")
    assert specs_for(trace, "bucketpool peak bytes / (2 x peak live + cache cap)", "promise")


@pytest.mark.parametrize(
    ("case", "limit"),
    [
        ("repeated-64", 0.40),
        ("repeated-16384", 0.40),
        ("loguniform-w1", 0.90),
        ("loguniform-w4", 0.80),
        ("loguniform-w16", 0.80),
        ("normal-64", 0.55),
        ("blocks", 0.70),
    ],
)
def test_speed_goals(case: str, limit: float) -> None:
    (goal,) = specs_for(case, "bucketpool/original", "goal")
    assert (goal.op, goal.limit) == ("<=", limit)


def test_a_ramp_of_new_sizes_is_a_goal_not_a_promise() -> None:
    # Every n new defeats the view cache: reported, never failing --check.
    assert not specs_for("ramp", "bucketpool/original", "promise")
    (goal,) = specs_for("ramp", "bucketpool/original", "goal")
    assert (goal.op, goal.limit) == ("<=", 1.0)
    for trace in ("repeated-64", "normal-64", "replay:x.trace"):  # sizes recur
        assert specs_for(trace, "bucketpool/original", "promise")[0].limit == 1.0
    for trace in ("loguniform-w16", "spike", "encoder-cache"):  # sizes vary
        assert specs_for(trace, "bucketpool/original", "promise")[0].limit == 1.2


def test_steady_traces_promise_no_allocation() -> None:
    steady = {"normal-64", "blocks", "encoder-cache", "alternating", "loguniform-w16"}
    for trace in steady:
        assert specs_for(trace, "bucketpool allocations after warm-up", "promise")
    for trace in ("ramp", "spike", "replay:x.trace"):  # they grow, or may
        assert not specs_for(trace, "bucketpool allocations after warm-up", "promise")


def test_the_new_cases_promises_and_goals() -> None:
    assert specs_for("parked-stuck", "stuck/none stuck", "promise")[0].limit == 1.2
    assert specs_for("parked-stuck", "stuck allocations after warm-up", "promise")[0].limit == 0
    assert specs_for("parked-10000", "parked/none parked", "promise")[0].limit == 1.2
    assert specs_for("evented", "evented/plain", "promise")[0].limit == 2.0
    (by_hand,) = specs_for("evented", "evented/original by hand", "goal")
    assert (by_hand.op, by_hand.limit) == ("<=", 1.0)
    for state in ("pending", "done"):
        figure = f"{state}: per-buffer cost, 100x parked / 1x"
        assert specs_for("collect", figure, "promise")[0].limit == 1.5
    (throughput,) = specs_for("threads-8-switch", "throughput at 100us / at default", "goal")
    assert (throughput.op, throughput.limit) == (">=", 0.80)
    figure = "p99 op latency at 100us / single-thread median op"
    assert specs_for("threads-8-switch", figure, "goal")[0].limit == 10
    (three,) = specs_for("threads-8", "bucketpool/original throughput", "goal")
    assert (three.op, three.limit) == (">=", 3.0)
    assert specs_for("fills", "setitem/add_copies", "promise")[0].limit == 100
    assert specs_for("debug", "checks/off", "goal")[0].limit == 3


def test_pass_fail_unsure() -> None:
    figures = {
        "repeated-64": {"bucketpool/original": timed(0.25, 0.24, 0.26)},
        "repeated-1196": {"bucketpool/original": timed(0.40, 0.38, 0.42)},
        "repeated-16384": {"bucketpool/original": timed(0.30, 0.29, 0.31)},
        "spike": {"bucketpool/original": timed(0.1, 0.1, 0.1)},  # no target on spike's ratio
    }
    checks = targets.check_targets(figures, specs=[SPEC])
    assert [(c.case, c.verdict) for c in checks] == [
        ("repeated-64", "PASS"),
        ("repeated-1196", "FAIL"),
        ("repeated-16384", "UNSURE"),
    ]
    assert checks[0].name == "repeated-64: bucketpool/original"


def test_promises_come_first_whatever_the_order_of_the_specs() -> None:
    promise = TargetSpec(("repeated-*",), "bucketpool/original", "<=", 1.0, "p", kind="promise")
    figures = {"repeated-64": {"bucketpool/original": timed(0.5, 0.45, 0.55)}}
    checks = targets.check_targets(figures, specs=[SPEC, promise])
    assert [c.spec.kind for c in checks] == ["promise", "goal"]
    default = targets.check_targets(figures)
    kinds = [c.spec.kind for c in default]
    assert kinds == sorted(kinds, key=lambda kind: kind != "promise")
    assert "promise" in kinds
    assert "goal" in kinds


def check(kind: Kind, verdict: Verdict) -> Check:
    spec = TargetSpec(("x",), "f", "<=", 1.0, "", kind=kind)
    interval: Verdict = "FAIL" if verdict == "LOADED" else verdict
    return Check("x", spec, timed(1.0, 0.9, 1.1), interval, verdict)


@pytest.mark.parametrize(
    ("checks", "status", "strict"),
    [
        ([], 0, 0),
        ([("promise", "PASS"), ("goal", "FAIL")], 0, 1),
        ([("promise", "PASS"), ("goal", "UNSURE")], 0, 3),
        ([("promise", "PASS"), ("goal", "LOADED")], 0, 3),
        ([("promise", "FAIL"), ("goal", "PASS")], 1, 1),
        ([("promise", "UNSURE")], 3, 3),
        ([("promise", "LOADED")], 3, 3),  # a FAIL interval, not judged under load
        ([("promise", "UNSURE"), ("promise", "FAIL")], 1, 1),  # a FAIL wins
        ([("promise", "PASS"), ("goal", "UNSURE"), ("goal", "FAIL")], 0, 1),
    ],
)
def test_exit_status(checks: list[tuple[Kind, Verdict]], status: int, strict: int) -> None:
    made = [check(kind, verdict) for kind, verdict in checks]
    assert targets.exit_status(made) == status
    assert targets.exit_status(made, strict=True) == strict
    assert targets.CHECK_UNSURE == 3
    assert targets.USAGE_ERROR == 2


def test_a_loaded_machine_is_not_judged() -> None:
    promise = TargetSpec(("repeated-*",), "bucketpool/original", "<=", 0.3, "p", kind="promise")
    figures = {
        "repeated-64": {"bucketpool/original": timed(0.25, 0.24, 0.26)},
        "repeated-1196": {"bucketpool/original": timed(0.40, 0.38, 0.42, spread=0.5)},
    }
    checks = targets.check_targets(figures, frozenset({"repeated-64"}), specs=[promise])
    assert [(c.verdict, c.interval_verdict) for c in checks] == [
        ("LOADED", "PASS"),
        ("LOADED", "FAIL"),
    ]
    assert targets.exit_status(checks) == 3


def test_exact_figures_are_judged_under_load() -> None:
    spec = TargetSpec(("spike",), "allocs", "<=", 0, "steady", kind="promise")
    figures = {"spike": {"allocs": exact(3, "count")}}
    (judged,) = targets.check_targets(figures, frozenset({"spike"}), specs=[spec])
    assert judged.verdict == "FAIL"
    assert targets.exit_status([judged]) == 1
