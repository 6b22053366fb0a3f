"""The targets are data, split into promises and goals, each judged on its whole interval."""

from __future__ import annotations

import fnmatch

import pytest

from bench import _targets as targets
from bench._fills import FILL_SIZES, SETITEM_SIZES
from bench._stats import Measurement, Verdict, exact
from bench._targets import STEP, Check, Kind, TargetSpec
from bench._traces import TRACE_NAMES

SPEC = TargetSpec(("repeated-*",), STEP, "<=", 0.30, "repeated n", kind="goal")
CASES = [
    "host-ec-small",
    "host-ec-large",
    "host-kv",
    "view-cache",
    *TRACE_NAMES,
    *(f"fills-{k}" for k in FILL_SIZES),
    "fill-step",
    "parked-10000",
    "parked-stuck",
    "evented",
    "collect",
    "debug",
    "compat",
    "kv-offload",
    "fork",
]


def timed(value: float, low: float, high: float, spread: float = 0.05) -> Measurement:
    return Measurement(value, low, high, "x", timed=True, rounds=7, spread=spread)


def specs_for(case: str, figure: str, kind: Kind) -> list[TargetSpec]:
    return [
        spec
        for spec in targets.TARGETS
        if spec.kind == kind and spec.figure == figure and spec.applies_to(case)
    ]


def limit_of(case: str, figure: str, kind: Kind = "promise") -> float:
    (spec,) = specs_for(case, figure, kind)
    return spec.limit


def test_every_target_names_a_known_case() -> None:
    for spec in targets.TARGETS:
        assert any(fnmatch.fnmatchcase(case, p) for p in spec.cases for case in CASES), spec
    assert targets.TARGETS == targets.PROMISES + targets.GOALS
    assert {spec.kind for spec in targets.PROMISES} == {"promise"}
    assert {spec.kind for spec in targets.GOALS} == {"goal"}


@pytest.mark.parametrize("trace", TRACE_NAMES)
def test_the_step_on_every_trace(trace: str) -> None:
    recur = trace.startswith(("repeated-", "normal-")) or trace in ("alternating", "blocks")
    if trace == "ramp":  # every n new: a goal, never failing --check
        assert not specs_for(trace, STEP, "promise")
        assert limit_of(trace, STEP, "goal") == 1.0
    else:
        assert limit_of(trace, STEP) == (1.0 if recur else 1.45)
    assert limit_of(trace, "compat/original") == 1.5  # issue 32: the drop-in's step
    assert not specs_for(trace, "compat/original", "goal")
    assert limit_of(trace, "compat refusals") == 0
    assert limit_of(trace, "bucketpool peak bytes / (2 x peak live + cache cap)") == 1.0
    steady = trace not in ("ramp", "spike")
    assert bool(specs_for(trace, "bucketpool allocations after warm-up", "promise")) == steady


@pytest.mark.parametrize(
    ("case", "limit"),
    [
        ("repeated-64", 0.40),
        ("loguniform-w1", 0.90),
        ("loguniform-w16", 0.80),
        ("normal-64", 0.55),
        ("blocks", 0.70),
    ],
)
def test_speed_goals(case: str, limit: float) -> None:
    assert limit_of(case, STEP, "goal") == limit


@pytest.mark.parametrize("k", FILL_SIZES)
def test_fill_promises(k: int) -> None:
    limit = 4.0 if k <= 64 else 3.0 if k == 256 else 2.0
    for source in ("arrays", "lists"):
        assert limit_of(f"fills-{k}", f"add_copies/numpy ({source})") == limit
    (setitem,) = specs_for(f"fills-{k}", "setitem/add_copies", "promise")
    assert (setitem.op, setitem.limit) == (">=", 100)
    assert set(SETITEM_SIZES) <= set(FILL_SIZES)


def test_the_other_promises_and_goals() -> None:
    assert limit_of("spike", "bucketpool final bytes / cache cap") == 1.0
    assert limit_of("parked-10000", "parked/none parked") == 1.2
    assert limit_of("parked-stuck", "stuck/none stuck") == 1.2
    assert limit_of("parked-stuck", "stuck allocations after warm-up") == 0
    assert limit_of("evented", "evented/plain") == 2.0
    assert limit_of("evented", "evented/original by hand", "goal") == 1.0
    for state in ("pending", "done"):
        assert limit_of("collect", f"{state}: per-buffer cost, 100x parked / 1x") == 1.5
    assert limit_of("compat", "refused calls") == 0
    assert limit_of("debug", "checks/off", "goal") == 3.0
    assert not [spec for spec in targets.TARGETS if spec.applies_to("fill-step")]


def test_pass_fail_unsure() -> None:
    figures = {
        "repeated-64": {STEP: timed(0.25, 0.24, 0.26)},
        "repeated-1196": {STEP: timed(0.40, 0.38, 0.42)},
        "repeated-16384": {STEP: timed(0.30, 0.29, 0.31)},
        "spike": {STEP: timed(0.1, 0.1, 0.1)},  # SPEC does not apply to spike
    }
    checks = targets.check_targets(figures, specs=[SPEC])
    assert [(c.case, c.verdict) for c in checks] == [
        ("repeated-64", "PASS"),
        ("repeated-1196", "FAIL"),
        ("repeated-16384", "UNSURE"),
    ]
    assert checks[0].name == "repeated-64: bucketpool/original"


def test_promises_come_first_whatever_the_order_of_the_specs() -> None:
    promise = TargetSpec(("repeated-*",), STEP, "<=", 1.0, "p", kind="promise")
    figures = {"repeated-64": {STEP: timed(0.5, 0.45, 0.55)}}
    checks = targets.check_targets(figures, specs=[SPEC, promise])
    assert [c.spec.kind for c in checks] == ["promise", "goal"]


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
    ],
)
def test_exit_status(checks: list[tuple[Kind, Verdict]], status: int, strict: int) -> None:
    made = [check(kind, verdict) for kind, verdict in checks]
    assert targets.exit_status(made) == status
    assert targets.exit_status(made, strict=True) == strict


def test_a_loaded_machine_is_not_judged() -> None:
    promise = TargetSpec(("repeated-*",), STEP, "<=", 0.3, "p", kind="promise")
    figures = {
        "repeated-64": {STEP: timed(0.25, 0.24, 0.26)},
        "repeated-1196": {STEP: timed(0.40, 0.38, 0.42, spread=0.5)},  # a jumpy baseline
    }
    checks = targets.check_targets(figures, frozenset({"repeated-64"}), specs=[promise])
    assert [(c.verdict, c.interval_verdict) for c in checks] == [
        ("LOADED", "PASS"),
        ("LOADED", "FAIL"),
    ]
    assert targets.exit_status(checks) == 3


def test_exact_figures_are_judged_under_load() -> None:
    spec = TargetSpec(("spike",), "allocs", "<=", 0, "steady", kind="promise")
    (judged,) = targets.check_targets(
        {"spike": {"allocs": exact(3, "count")}}, frozenset({"spike"}), specs=[spec]
    )
    assert judged.verdict == "FAIL"
    assert targets.exit_status([judged]) == 1
