"""The targets, as data: promises (``--check`` fails on them) and goals (reported only).

Each target names the cases it applies to (shell patterns), a figure and a bound.  A timed
figure is judged on its whole interval (`bench._stats.judge`), and not at all (``LOADED``)
when the machine looked loaded while it was measured.
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
    "FILL_LIMITS",
    "GOALS",
    "HOST_STEP",
    "PROMISES",
    "STEP",
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
USAGE_ERROR = 2  # bad arguments or output path
CHECK_UNSURE = 3  # none FAILs, but load (LOADED) or the interval (UNSURE) left one unjudged

Kind = Literal["promise", "goal"]

#: The headline figure of every trace: the documented step over the original's.
STEP = "bucketpool/original"
#: The headline figure of the host-step cases: vLLM's step after ``install()`` over its own.
HOST_STEP = "installed/vllm"
#: k to the most ``add_copies`` may cost over bare numpy (arrays and lists alike).
FILL_LIMITS = {16: 4.0, 64: 4.0, 256: 3.0, 4_096: 2.0, 65_536: 2.0}
_RECUR = ("repeated-*", "alternating", "normal-*", "blocks")
_STEADY = ("repeated-*", "alternating", "normal-*", "blocks", "loguniform-*", "encoder-cache")
_TRACES = (*_STEADY, "ramp", "spike")
_VARIES = ("loguniform-*", "spike", "encoder-cache")


@typing.final
@attrs.frozen
class TargetSpec:
    """A bound on one figure of the matching cases.

    Attributes:
        cases: shell patterns (``fnmatch``) of the case names it applies to.
        figure: the figure's name in `Case.measurements`.
        op: ``<=`` or ``>=``.
        limit: the bound.
        why: what the target stands for.
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


_COLLECT = "per-buffer cost, 100x parked / 1x"
_CUTS = "view sets cut per step, log-uniform n"
_KV_SPIKE = "spike: retained bytes bucketpool/lists"
#: What the README claims; ``--check`` fails when one FAILs.
PROMISES: tuple[TargetSpec, ...] = (
    _promise(("host-ec-large",), HOST_STEP, "<=", 1.02, "vLLM's EC step, large entries"),
    _promise(("host-ec-small",), HOST_STEP, "<=", 1.10, "vLLM's EC step, small entries"),
    _promise(("host-kv",), HOST_STEP, "<=", 1.05, "vLLM's KV-offload step"),
    _promise(("view-cache",), _CUTS, "<=", 0.6, "view sets cut, counted"),
    _promise(("view-cache",), "tensors made per step, n recurring", "<=", 0, "hits make none"),
    _promise(("view-cache",), "torch calls per view set cut", "<=", 3, "one call a field"),
    _promise(_RECUR, STEP, "<=", 1.0, "the step is not slower than the original's where n recurs"),
    _promise(_VARIES, STEP, "<=", 1.45, "at most 1.45x where n varies (quiet machine)"),
    _promise(_STEADY, "bucketpool allocations after warm-up", "<=", 0, "steady: no allocation"),
    _promise(("spike",), "bucketpool final bytes / cache cap", "<=", 1.0, "memory comes back"),
    _promise(
        _TRACES, "bucketpool peak bytes / (2 x peak live + cache cap)", "<=", 1.0, "peak bounded"
    ),
    _promise(("parked-*",), "parked/none parked", "<=", 1.2, "parked handles cost nothing"),
    _promise(("evented",), "evented/plain", "<=", 2.0, "recording an event is cheap"),
    _promise(("parked-stuck",), "stuck/none stuck", "<=", 1.2, "stuck events cost nothing"),
    _promise(
        ("parked-stuck",), "stuck allocations after warm-up", "<=", 0, "stuck holds its own only"
    ),
    _promise(("collect",), f"pending: {_COLLECT}", "<=", 1.5, "collect() flat per parked"),
    _promise(("collect",), f"done: {_COLLECT}", "<=", 1.5, "collect() flat per retired"),
    *(
        _promise((f"fills-{k}",), f"add_copies/numpy ({source})", "<=", limit, "near numpy")
        for k, limit in FILL_LIMITS.items()
        for source in ("arrays", "lists")
    ),
    _promise(("fills-*",), "setitem/add_copies", ">=", 100, "fills beat element writes"),
    _promise(_TRACES, "compat refusals", "<=", 0, "compat accepts the original's calls"),
    _promise(_TRACES, "compat/original", "<=", 1.5, "the drop-in's step, slices included"),
    _promise(("compat",), "refused calls", "<=", 0, "compat accepts the original's calls"),
    _promise(("kv-offload",), "allocations bucketpool/lists", "<=", 1.0, "KV: fewer allocations"),
    _promise(("kv-offload",), _KV_SPIKE, "<=", 0.25, "KV: a spike's memory comes back"),
)
#: Speed aimed for: reported with a verdict, never failing ``--check``.
GOALS: tuple[TargetSpec, ...] = (
    _goal(("repeated-*",), STEP, "<=", 0.40, "repeated n"),
    _goal(("loguniform-w1",), STEP, "<=", 0.90, "log-uniform n"),
    _goal(("loguniform-w4", "loguniform-w16"), STEP, "<=", 0.80, "log-uniform n, in flight"),
    _goal(("normal-*",), STEP, "<=", 0.55, "n near one size"),
    _goal(("blocks",), STEP, "<=", 0.70, "batched requests of blocks"),
    _goal(("ramp",), STEP, "<=", 1.0, "n never the same twice"),
    _goal(("evented",), "evented/original by hand", "<=", 1.0, "events beat polling by hand"),
    _goal(("debug",), "checks/off", "<=", 3.0, "debug='checks' affordable"),
    _goal(("fills-*",), "add_block_copies-consecutive/add_copies", "<=", 5, "block fill"),
    _goal(("fills-*",), "add_block_copies-shuffled/add_copies", "<=", 5, "block fill"),
    _goal(("fork",), "fork with hooks/without", "<=", 1.1, "the pool's fork hooks cost little"),
)
#: Every target, promises first.
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
        verdict: ``interval_verdict``, or ``LOADED`` for a timed figure measured under load.
    """

    case: str
    spec: TargetSpec
    measurement: Measurement
    interval_verdict: Verdict
    verdict: Verdict

    @property
    def name(self) -> str:
        """``case: figure``, the check's name in reports."""
        return f"{self.case}: {self.spec.figure}"


def check_targets(
    figures: Mapping[str, Mapping[str, Measurement]],
    loaded_cases: frozenset[str] = frozenset(),
    specs: Sequence[TargetSpec] = TARGETS,
) -> tuple[Check, ...]:
    """Judge every target of *specs* on each measured case that has its figure.

    A timed figure of a case in *loaded_cases*, or whose baseline spread exceeds
    `LOADED_SPREAD`, is ``LOADED``.  Promises come first, then goals, each in *specs* order.
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
    """Return the ``--check`` status of the promises (with *strict*, of every target).

    1 when one FAILs, else 3 when one is UNSURE or LOADED (never a pass), else 0.
    """
    verdicts = {check.verdict for check in checks if strict or check.spec.kind == "promise"}
    if "FAIL" in verdicts:
        return CHECK_FAILED
    if verdicts & {"UNSURE", "LOADED"}:
        return CHECK_UNSURE
    return CHECK_PASSED
