"""The runner: settings, the cases of a run, rounds until the verdicts settle, the result.

A run sets every case up, runs `Settings.rounds` rounds of each, and judges the targets.
While a timed target's interval straddles its bound (``UNSURE``), the cases behind such
targets get more rounds, a few at a time, until the verdicts settle, a case reaches
`Settings.max_rounds`, `Settings.budget_s` seconds of extra measuring are spent, or the
interval is down to the resolution floor (more rounds cannot narrow it further).

The load average is read after every round.  A case measured while it exceeded the number
of CPUs is reported ``LOADED`` instead of judged, as is a figure whose baseline varied by
more than `bucketpool.bench._stats.LOADED_SPREAD` between rounds.

Progress goes through a callback, one line per step: a run is a minute or so, and a line
per step says enough without a progress-bar dependency.  Nothing here is thread-safe;
run one benchmark at a time.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np
import torch

from bucketpool.bench._cases import Case, DebugCase, ParkedCase, TraceCase
from bucketpool.bench._fills import FillsCase
from bucketpool.bench._overhead import OverheadCase
from bucketpool.bench._stats import RESOLUTION, Measurement
from bucketpool.bench._targets import TARGETS, Check, TargetSpec, check_targets
from bucketpool.bench._threads import ThreadsCase
from bucketpool.bench._traces import DEFAULT_OPS, QUICK_OPS, Trace

__all__ = [
    "CASE_KINDS",
    "BenchResult",
    "Progress",
    "Settings",
    "build_cases",
    "environment",
    "load_average",
    "run_benchmark",
]

#: Called with one line before each step of a run.
Progress = Callable[[str], None]
#: The cases beside the traces, as ``--trace`` names them.
CASE_KINDS = ("parked", "threads", "debug", "fills", "overhead")
_EXTRA_ROUNDS = 3  # rounds per UNSURE case between two judgements


@typing.final
@attrs.frozen
class Settings:
    """How a run is made.

    Attributes:
        rounds: rounds of every case before the first judgement.
        max_rounds: the most rounds a case gets.
        budget_s: seconds of extra rounds while a verdict is UNSURE.
        ops: acquires per trace pass and per hot-loop pass.
        thread_ops: ops per thread per threaded run: long enough that the locked original's
            throughput (lock convoys come and go) varies little between rounds.
        parked: handles parked in the parked case.
        min_pass_ns: a fill batch or debug-level pass lasts at least this long.
        quick: whether ``--quick`` chose the defaults.
        seed: seeds the traces, the fill inputs and the bootstrap.
    """

    rounds: int = 7
    max_rounds: int = 40
    budget_s: float = 40.0
    ops: int = DEFAULT_OPS
    thread_ops: int = 3_000
    parked: int = 10_000
    min_pass_ns: int = 5_000_000
    quick: bool = False
    seed: int = 0

    @classmethod
    def for_mode(
        cls,
        *,
        quick: bool,
        rounds: int | None = None,
        ops: int | None = None,
        budget_s: float | None = None,
    ) -> Settings:
        """Return the defaults of the full or the ``--quick`` run, with overrides."""
        if quick:
            base = cls(
                rounds=4,
                max_rounds=12,
                budget_s=3.0,
                ops=QUICK_OPS,
                thread_ops=1_000,
                min_pass_ns=1_000_000,
                quick=True,
            )
        else:
            base = cls()
        return attrs.evolve(
            base,
            rounds=rounds or base.rounds,
            max_rounds=max(base.max_rounds, rounds or 0),
            ops=ops or base.ops,
            budget_s=base.budget_s if budget_s is None else budget_s,
        )


def build_cases(settings: Settings, traces: Sequence[Trace], kinds: Iterable[str]) -> list[Case]:
    """Return the cases of a run: one per trace, then the named *kinds* of `CASE_KINDS`."""
    chosen = set(kinds)
    cases: list[Case] = [TraceCase(trace) for trace in traces]
    makers: dict[str, Callable[[], Case]] = {
        "parked": lambda: ParkedCase(settings.ops, settings.parked),
        "threads": lambda: ThreadsCase(settings.thread_ops),
        "debug": lambda: DebugCase(settings.min_pass_ns, settings.ops),
        "fills": lambda: FillsCase(settings.min_pass_ns, settings.seed),
        "overhead": OverheadCase,
    }
    cases.extend(make() for kind, make in makers.items() if kind in chosen)
    return cases


@typing.final
@attrs.frozen
class BenchResult:
    """Everything one run measured; the table, the JSON and the plot all come from it.

    Attributes:
        settings: how the run was made.
        environment: versions and machine (see `environment`).
        cases: the cases, with their samples.
        figures: case name to its measurements.
        checks: the targets judged.
        rounds: case name to rounds run.
        load: the highest 1-minute load average read during each case's rounds.
        duration_s: the run's wall time.
    """

    settings: Settings
    environment: Mapping[str, object]
    cases: tuple[Case, ...]
    figures: Mapping[str, Mapping[str, Measurement]]
    checks: tuple[Check, ...]
    rounds: Mapping[str, int]
    load: Mapping[str, float]
    duration_s: float

    @property
    def loaded(self) -> bool:
        """Whether any timed target went unjudged because the machine looked loaded."""
        return any(check.verdict == "LOADED" for check in self.checks)


def load_average() -> float:
    """Return the 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def _version() -> str:
    try:
        return importlib.metadata.version("bucketpool")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def environment() -> dict[str, object]:
    """Return the versions and the machine: what a figure depends on."""
    return {
        "version": _version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
        },
    }


def _unsure(checks: Iterable[Check]) -> set[str]:
    """Cases with an UNSURE timed target that more rounds could still settle."""
    return {
        check.case
        for check in checks
        if check.measurement.timed
        and check.interval_verdict == "UNSURE"
        and not _at_resolution(check.measurement)
    }


def _at_resolution(measurement: Measurement) -> bool:
    """Whether the interval is down to the resolution floor, which no round can narrow."""
    floor = 2 * RESOLUTION * abs(measurement.value)
    return measurement.high - measurement.low <= floor * (1 + 1e-9)


def run_benchmark(
    settings: Settings,
    cases: Sequence[Case],
    *,
    progress: Progress | None = None,
    specs: Sequence[TargetSpec] = TARGETS,
) -> BenchResult:
    """Set up and run *cases*, add rounds while a verdict is UNSURE, and judge the targets.

    Args:
        settings: rounds, budget and seed.
        cases: what to run, in order.
        progress: called with a line before each step (the CLI prints it to stderr).
        specs: the targets to judge.

    Returns:
        Everything measured.
    """
    report = progress or (lambda message: None)
    start = time.perf_counter()
    cpus = os.cpu_count() or 1
    rounds = dict.fromkeys((case.name for case in cases), 0)
    load = dict.fromkeys((case.name for case in cases), 0.0)

    def run_rounds(case: Case, count: int) -> None:
        if not case.samples:
            return  # an untimed case: its figures are exact
        for _ in range(count):
            case.round()
            rounds[case.name] += 1
            load[case.name] = max(load[case.name], load_average())

    def judge() -> tuple[dict[str, dict[str, Measurement]], tuple[Check, ...]]:
        figures = {case.name: case.measurements() for case in cases}
        loaded = frozenset(name for name, seen in load.items() if seen > cpus)
        return figures, check_targets(figures, loaded, specs)

    try:
        for step, case in enumerate(cases, start=1):
            report(f"[{step}/{len(cases)}] {case.name}: set-up and {settings.rounds} rounds")
            case.setup()
            run_rounds(case, settings.rounds)
        figures, checks = judge()
        extra_start = time.perf_counter()
        while True:
            unsure = _unsure(checks)
            pending = [
                c for c in cases if c.name in unsure and rounds[c.name] < settings.max_rounds
            ]
            spent = time.perf_counter() - extra_start
            if not pending or spent >= settings.budget_s:
                break
            names = ", ".join(case.name for case in pending)
            report(f"UNSURE: {_EXTRA_ROUNDS} more rounds of {names} ({spent:.0f}s of extra time)")
            for case in pending:
                run_rounds(case, min(_EXTRA_ROUNDS, settings.max_rounds - rounds[case.name]))
            figures, checks = judge()
    finally:
        for case in cases:
            case.close()
    return BenchResult(
        settings=settings,
        environment=environment(),
        cases=tuple(cases),
        figures=figures,
        checks=checks,
        rounds=rounds,
        load=load,
        duration_s=time.perf_counter() - start,
    )
