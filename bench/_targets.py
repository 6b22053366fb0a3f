"""The targets, as data: promises (``--check`` fails on them) and goals (reported only).

*Promises* are what the README claims and users rely on: the ``with pool.acquire(n)`` path is
not slower than the original, memory stays bounded, parked handles cost nothing, the compat
drop-in refuses nothing the original's callers do.  *Goals* are speed the project aims for;
they are reported with a verdict but never fail ``--check`` (``--strict-check`` judges them
as promises).

Each entry names the cases it applies to (shell patterns over case names), the figure and
the bound.  A timed figure is judged on its whole interval (see `bench._stats.judge`), and
not at all (``LOADED``) when the machine looked loaded while it was measured.
"""

from __future__ import annotations

import fnmatch
import typing
from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from bench._stats import LOADED_SPREAD, Measurement, Op, Verdict, judge

__all__ = [
    "CHECK_FAILED",
    "CHECK_PASSED",
    "CHECK_UNSURE",
    "GOALS",
    "PROMISES",
    "TARGETS",
    "USAGE_ERROR",
    "Check",
    "Kind",
    "TargetSpec",
    "check_targets",
    "exit_status",
]

#: ``--check`` exit statuses.
CHECK_PASSED = 0  # every promise (with --strict-check: every target) holds
CHECK_FAILED = 1  # one FAILs
USAGE_ERROR = 2  # bad arguments, replay file or output path, --plot without matplotlib
CHECK_UNSURE = 3  # none FAILs, but load (LOADED) or the interval (UNSURE) left one unjudged

Kind = Literal["promise", "goal"]

_RECUR = ("repeated-*", "alternating", "normal-*", "blocks")
_VARY = ("loguniform-*", "spike", "encoder-cache")
_STEADY = (*_RECUR, "loguniform-*", "encoder-cache")
_TRACES = (*_STEADY, "ramp", "spike", "replay:*")


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
        kind: ``promise`` (``--check`` fails on it) or ``goal`` (reported only).
    """

    cases: tuple[str, ...]
    figure: str
    op: Op
    limit: float
    why: str
    kind: Kind = attrs.field(kw_only=True)

    def applies_to(self, case: str) -> bool:
        """Return whether *case* matches one of the patterns."""
        return any(fnmatch.fnmatchcase(case, pattern) for pattern in self.cases)


def _promise(cases: tuple[str, ...], figure: str, op: Op, limit: float, why: str) -> TargetSpec:
    return TargetSpec(cases, figure, op, limit, why, kind="promise")


def _goal(cases: tuple[str, ...], figure: str, op: Op, limit: float, why: str) -> TargetSpec:
    return TargetSpec(cases, figure, op, limit, why, kind="goal")


_OURS = "bucketpool/original"
_COLLECT_PENDING = "pending: per-buffer cost, 100x parked / 1x"
_COLLECT_DONE = "done: per-buffer cost, 100x parked / 1x"
#: What the README claims; ``--check`` fails when one FAILs.
PROMISES: tuple[TargetSpec, ...] = (
    _promise(
        (*_RECUR, "replay:*"),
        _OURS,
        "<=",
        1.0,
        "with pool.acquire(n) is not slower than the original where sizes recur",
    ),
    _promise(
        _VARY,
        _OURS,
        "<=",
        1.2,
        "at most 1.2x where sizes vary (each release is taken back at once, under the lock)",
    ),
    _promise(_STEADY, "bucketpool allocations after warm-up", "<=", 0, "steady: no allocation"),
    _promise(("spike",), "bucketpool final bytes / cache cap", "<=", 1.0, "memory comes back"),
    _promise(
        _TRACES, "bucketpool peak bytes / (2 x peak live + cache cap)", "<=", 1.0, "peak bounded"
    ),
    _promise(("parked-*",), "parked/none parked", "<=", 1.2, "parked handles cost nothing"),
    _promise(("evented",), "evented/plain", "<=", 2.0, "recording an event is cheap"),
    _promise(("parked-stuck",), "stuck/none stuck", "<=", 1.2, "stuck events cost nothing"),
    _promise(
        ("parked-stuck",),
        "stuck allocations after warm-up",
        "<=",
        0,
        "a stuck event holds back its own buffer only",
    ),
    _promise(("collect",), _COLLECT_PENDING, "<=", 1.5, "collect() flat per parked buffer"),
    _promise(("collect",), _COLLECT_DONE, "<=", 1.5, "collect() flat per retired buffer"),
    _promise(("fills",), "setitem/add_copies", ">=", 100, "fills beat per-element writes"),
    _promise(_TRACES, "compat refusals", "<=", 0, "compat accepts the original's calls"),
    _promise(("compat",), "refused calls", "<=", 0, "compat accepts the original's calls"),
)
#: Speed the project aims for: reported with a verdict, never failing ``--check``.
GOALS: tuple[TargetSpec, ...] = (
    _goal(("repeated-*",), _OURS, "<=", 0.40, "repeated n"),
    _goal(("loguniform-w1",), _OURS, "<=", 0.90, "log-uniform n"),
    _goal(("loguniform-w4", "loguniform-w16"), _OURS, "<=", 0.80, "log-uniform n, in flight"),
    _goal(("normal-*",), _OURS, "<=", 0.55, "n near one size"),
    _goal(("blocks",), _OURS, "<=", 0.70, "batched requests of blocks"),
    # Every n new: each acquire resizes three cached views, as dear as the original's slices.
    _goal(("ramp",), _OURS, "<=", 1.0, "n never the same twice"),
    _goal(_TRACES, "compat/original", "<=", 1.25, "the drop-in costs little more"),
    _goal(("threads-*",), "bucketpool/original throughput", ">=", 3.0, "threads"),
    _goal(("threads-*",), "bucketpool p99 latency", "<=", 10_000, "p99 under threads"),
    _goal(("threads-*-switch",), "throughput at 100us / at default", ">=", 0.80, "fast switching"),
    _goal(
        ("threads-*-switch",),
        "p99 op latency at 100us / single-thread median op",
        "<=",
        10,
        "fast switching: tail latency",
    ),
    _goal(("evented",), "evented/original by hand", "<=", 1.0, "events beat polling by hand"),
    _goal(("debug",), "checks/off", "<=", 3.0, "debug='checks' affordable"),
    _goal(("fills",), "add_copies/numpy", "<=", 3, "add_copies near numpy"),
    _goal(("fills",), "add_block_copies-consecutive/add_copies", "<=", 5, "block fill"),
    _goal(("fills",), "add_block_copies-shuffled/add_copies", "<=", 5, "block fill"),
)
#: Every target, promises first, in report order.
TARGETS: tuple[TargetSpec, ...] = PROMISES + GOALS


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
        One check per (target, matching case that has the figure): promises first, then
        goals, each in the order of *specs*.
    """
    checks = []
    for spec in sorted(specs, key=lambda spec: spec.kind != "promise"):
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
    """Return the ``--check`` exit status of *checks*.

    Only promises are judged; with *strict* (``--strict-check``) goals are judged alike.

    Returns:
        `CHECK_FAILED` (1) when a judged target FAILs; else `CHECK_UNSURE` (3) when one is
        UNSURE or LOADED (its verdict could not be given, which is never a pass); else
        `CHECK_PASSED` (0), also when no judged target applies to the cases run.
    """
    verdicts = {check.verdict for check in checks if strict or check.spec.kind == "promise"}
    if "FAIL" in verdicts:
        return CHECK_FAILED
    if verdicts & {"UNSURE", "LOADED"}:
        return CHECK_UNSURE
    return CHECK_PASSED
