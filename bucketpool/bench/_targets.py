"""The project's targets, as data, and how a run's figures are judged against them.

`TARGETS` is the one place that says what the benchmark expects.  Each entry names the
cases it applies to (shell patterns over case names), the figure, and the bound.  A timed
figure is judged on its whole interval (see `bucketpool.bench._stats.judge`), and is not
judged at all (``LOADED``) when the machine looked loaded while it was measured.
"""

from __future__ import annotations

import fnmatch
import typing
from collections.abc import Mapping, Sequence

import attrs

from bucketpool.bench._stats import LOADED_SPREAD, Measurement, Op, Verdict, judge

__all__ = ["TARGETS", "Check", "TargetSpec", "check_targets", "exit_status"]

_STEADY = ("repeated-*", "alternating", "loguniform-*", "encoder-cache")
_TRACES = ("repeated-*", "alternating", "loguniform-*", "ramp", "spike", "encoder-cache")


@typing.final
@attrs.frozen
class TargetSpec:
    """One target: a bound on one figure of the matching cases.

    Attributes:
        cases: shell patterns (``fnmatch``) of the case names it applies to.
        figure: the figure's name in `Case.measurements`.
        op: ``<=`` or ``>=``.
        limit: the bound.
        why: what the target stands for, for the report.
    """

    cases: tuple[str, ...]
    figure: str
    op: Op
    limit: float
    why: str

    def applies_to(self, case: str) -> bool:
        """Return whether *case* matches one of the patterns."""
        return any(fnmatch.fnmatchcase(case, pattern) for pattern in self.cases)


#: Every target of the project, in report order.
TARGETS: tuple[TargetSpec, ...] = (
    TargetSpec(("repeated-*",), "bucketpool/original", "<=", 0.30, "repeated n"),
    TargetSpec(("loguniform-*",), "bucketpool/original", "<=", 0.70, "log-uniform n, each window"),
    TargetSpec(_STEADY, "bucketpool allocations after warm-up", "<=", 0, "steady traces"),
    TargetSpec(("spike",), "bucketpool final bytes / cache cap", "<=", 1.0, "spike comes back"),
    TargetSpec(
        _TRACES, "bucketpool peak bytes / (2 x peak live + cache cap)", "<=", 1.0, "peak bytes"
    ),
    TargetSpec(_TRACES, "compat/original", "<=", 1.10, "the drop-in costs no more"),
    TargetSpec(("parked-*",), "parked/none parked", "<=", 1.2, "parked handles cost nothing"),
    TargetSpec(("threads-*",), "bucketpool/original throughput", ">=", 3.0, "threads"),
    TargetSpec(("threads-*",), "bucketpool p99 latency", "<=", 10_000, "p99 under threads"),
    TargetSpec(("debug",), "checks/off", "<=", 3.0, "debug='checks' affordable"),
    TargetSpec(("fills",), "setitem/add_copies", ">=", 100, "add_copies vs setitem"),
    TargetSpec(("fills",), "add_copies/numpy", "<=", 3, "add_copies near numpy"),
    TargetSpec(("fills",), "add_block_copies-consecutive/add_copies", "<=", 5, "block fill"),
    TargetSpec(("fills",), "add_block_copies-shuffled/add_copies", "<=", 5, "block fill"),
)


@typing.final
@attrs.frozen
class Check:
    """One target checked on one case.

    Attributes:
        case: the case's name.
        spec: the target.
        measurement: the figure and its interval.
        interval_verdict: what the interval alone says (PASS, FAIL or UNSURE).
        verdict: the verdict reported: ``interval_verdict``, or ``LOADED`` when the figure is
            timed and the machine looked loaded while it was measured.
    """

    case: str
    spec: TargetSpec
    measurement: Measurement
    interval_verdict: Verdict
    verdict: Verdict

    @property
    def name(self) -> str:
        """``case: figure``, the target's name in reports."""
        return f"{self.case}: {self.spec.figure}"


def check_targets(
    figures: Mapping[str, Mapping[str, Measurement]],
    loaded_cases: frozenset[str] = frozenset(),
    specs: Sequence[TargetSpec] = TARGETS,
) -> tuple[Check, ...]:
    """Judge every target that applies to a measured case.

    Args:
        figures: case name to its measurements.
        loaded_cases: cases measured while the machine looked loaded (by load average).
        specs: the targets (all of `TARGETS` by default).

    Returns:
        One check per (target, matching case that has the figure), targets in order.
    """
    checks = []
    for spec in specs:
        for case, measured in figures.items():
            if not spec.applies_to(case) or spec.figure not in measured:
                continue
            measurement = measured[spec.figure]
            raw = judge(measurement, spec.op, spec.limit)
            loaded = measurement.timed and (
                case in loaded_cases or measurement.spread > LOADED_SPREAD
            )
            checks.append(Check(case, spec, measurement, raw, "LOADED" if loaded else raw))
    return tuple(checks)


def exit_status(checks: Sequence[Check], *, strict: bool = False) -> int:
    """Return the ``--check`` exit status: 1 if a target FAILs, else 0.

    With *strict* (``--strict-check``), UNSURE and LOADED fail too.
    """
    failing = {"FAIL", "UNSURE", "LOADED"} if strict else {"FAIL"}
    return int(any(check.verdict in failing for check in checks))
