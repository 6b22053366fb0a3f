"""The targets are data, and each is judged on its whole interval."""

from __future__ import annotations

import fnmatch

from bucketpool.bench import _targets as targets
from bucketpool.bench._stats import Measurement, exact
from bucketpool.bench._targets import TargetSpec
from bucketpool.bench._traces import TRACE_NAMES

SPEC = TargetSpec(("repeated-*",), "bucketpool/original", "<=", 0.30, "repeated n")


def timed(value: float, low: float, high: float, spread: float = 0.05) -> Measurement:
    return Measurement(value, low, high, "x", timed=True, rounds=7, spread=spread)


def test_every_target_names_a_known_case() -> None:
    cases = [*TRACE_NAMES, "parked-10000", "threads-8", "debug", "fills"]
    for spec in targets.TARGETS:
        assert any(fnmatch.fnmatchcase(case, p) for p in spec.cases for case in cases), spec
        assert spec.op in ("<=", ">=")


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
    assert targets.exit_status(checks) == 1
    assert targets.exit_status(checks[:1]) == 0
    assert targets.exit_status(checks[::2]) == 0  # UNSURE does not fail ...
    assert targets.exit_status(checks[::2], strict=True) == 1  # ... unless strict


def test_a_loaded_machine_is_not_judged() -> None:
    figures = {
        "repeated-64": {"bucketpool/original": timed(0.25, 0.24, 0.26)},
        "repeated-1196": {"bucketpool/original": timed(0.40, 0.38, 0.42, spread=0.5)},
    }
    checks = targets.check_targets(figures, frozenset({"repeated-64"}), specs=[SPEC])
    assert [(c.verdict, c.interval_verdict) for c in checks] == [
        ("LOADED", "PASS"),
        ("LOADED", "FAIL"),
    ]
    assert targets.exit_status(checks) == 0
    assert targets.exit_status(checks, strict=True) == 1


def test_exact_figures_are_judged_under_load() -> None:
    spec = TargetSpec(("spike",), "allocs", "<=", 0, "steady")
    figures = {"spike": {"allocs": exact(3, "count")}}
    (check,) = targets.check_targets(figures, frozenset({"spike"}), specs=[spec])
    assert check.verdict == "FAIL"
    assert targets.exit_status([check]) == 1
