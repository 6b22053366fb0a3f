"""The runner: settings, the cases of a run, rounds until the verdicts settle, the result.

A run sets every case up, runs `Settings.rounds` rounds of each, and judges the targets.
While a timed target's interval straddles its bound (``UNSURE``), the cases behind such
targets get more rounds, a few at a time, until the verdicts settle, a case reaches
`Settings.max_rounds`, `Settings.budget_s` seconds of extra measuring are spent, or the
interval is down to the resolution floor (more rounds cannot narrow it further).

Extra rounds go to the cases of UNSURE promises only: goals never fail ``--check``, and
some (a p99 under fast switching) never settle.  With `Settings.settle_goals`
(``--strict-check``), UNSURE goals get them once no promise is UNSURE.

After every round the runner counts the tasks the machine is running besides the benchmark
(`other_runnable`: Linux's instantaneous count of runnable tasks, whose average is the load
average; the benchmark's own threads are joined by then, so they do not count, as they would
in the load average).  A case whose rounds saw on average more other tasks than the CPUs it
leaves free (all but one for a single-threaded case, none for a threaded one), by more than
`LOAD_TOLERANCE`, is reported ``LOADED`` instead of judged, as is a figure whose baseline
varied by more than `bench._stats.LOADED_SPREAD` between rounds.  So one CPU-bound process
beside the benchmark on two CPUs leaves the single-threaded cases judged and the threaded
ones LOADED.

Progress goes through a callback, one line per step: a run is a minute or so, and a line
per step says enough without a progress-bar dependency.  Nothing here is thread-safe;
run one benchmark at a time.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np
import torch

from bench._cases import Case, DebugCase, TraceCase
from bench._compat import CompatCase
from bench._fills import FillsCase
from bench._floor import FloorCase
from bench._overhead import OverheadCase
from bench._parked import CollectCase, EventedCase, ParkedCase, ParkedStuckCase
from bench._sites import SiteCostCase
from bench._stats import RESOLUTION, Measurement
from bench._targets import TARGETS, Check, TargetSpec, check_targets
from bench._threads import SwitchCase, ThreadsCase
from bench._traces import CASE_KINDS, DEFAULT_OPS, QUICK_OPS, Trace

__all__ = [
    "CASE_KINDS",
    "LOAD_TOLERANCE",
    "BenchResult",
    "Progress",
    "Settings",
    "build_cases",
    "environment",
    "load_average",
    "other_runnable",
    "run_benchmark",
]

#: Called with one line before each step of a run.
Progress = Callable[[str], None]
_EXTRA_ROUNDS = 3  # rounds per UNSURE case between two judgements
_LOAD_SAMPLES = 5  # counts of runnable tasks after each round, 1 ms apart
#: Other tasks, on average, that a case's CPUs may share with before it is LOADED: a quiet
#: machine's own daemons average a few tenths.
LOAD_TOLERANCE = 0.5


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
        parked: handles parked in the ``parked-N`` case.
        stuck: buffers stuck parked in ``parked-stuck``, and parked in ``collect`` (which
            also times 1% of that).
        min_pass_ns: a fill batch or debug-level pass lasts at least this long.
        quick: whether ``--quick`` chose the defaults.
        seed: seeds the traces, the fill inputs and the bootstrap.
        settle_goals: whether UNSURE goals get extra rounds too (``--strict-check``).
    """

    rounds: int = 7
    max_rounds: int = 40
    budget_s: float = 40.0
    ops: int = DEFAULT_OPS
    thread_ops: int = 3_000
    parked: int = 10_000
    stuck: int = 100_000
    min_pass_ns: int = 5_000_000
    quick: bool = False
    seed: int = 0
    settle_goals: bool = False

    @classmethod
    def for_mode(
        cls,
        *,
        quick: bool,
        rounds: int | None = None,
        ops: int | None = None,
        budget_s: float | None = None,
        settle_goals: bool = False,
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
            settle_goals=settle_goals,
        )


def build_cases(settings: Settings, traces: Sequence[Trace], kinds: Iterable[str]) -> list[Case]:
    """Return the cases of a run: one per trace, then those of the named *kinds*.

    The kinds are those of `CASE_KINDS`; ``parked`` names four cases, ``threads`` two.
    """
    chosen = set(kinds)
    cases: list[Case] = [TraceCase(trace) for trace in traces]
    ops, min_pass_ns = settings.ops, settings.min_pass_ns
    makers: dict[str, Callable[[], Sequence[Case]]] = {
        "parked": lambda: (
            ParkedCase(ops, settings.parked),
            EventedCase(ops),
            ParkedStuckCase(ops, settings.stuck),
            CollectCase(settings.stuck),
        ),
        "threads": lambda: (ThreadsCase(settings.thread_ops), SwitchCase(settings.thread_ops)),
        "debug": lambda: (DebugCase(min_pass_ns, ops),),
        "fills": lambda: (FillsCase(min_pass_ns, settings.seed),),
        "overhead": lambda: (OverheadCase(),),
        "leak-site": lambda: (SiteCostCase(min_pass_ns, ops),),
        "floor": lambda: (FloorCase(min_pass_ns, ops),),
        "compat": lambda: (CompatCase(),),
    }
    assert tuple(makers) == CASE_KINDS, "every kind --trace names has its cases"
    for kind, make in makers.items():
        if kind in chosen:
            cases.extend(make())
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
        load: the mean count of other runnable tasks after each case's rounds.
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


def other_runnable() -> float:
    """Return how many tasks are runnable now besides the caller.

    Linux's instantaneous count (``/proc/loadavg``), less the caller; elsewhere the load
    average less one, which also counts the benchmark's recent threads.
    """
    try:
        with open("/proc/loadavg", encoding="ascii") as file:
            running = int(file.read().split()[3].partition("/")[0])
    except (OSError, ValueError, IndexError):
        return max(0.0, load_average() - 1)
    return float(max(0, running - 1))


def _busy_elsewhere() -> float:
    """The mean of a few `other_runnable` counts, 1 ms apart."""
    counts = []
    for _ in range(_LOAD_SAMPLES):
        counts.append(other_runnable())
        time.sleep(0.001)
    return statistics.fmean(counts)


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


def _pending(
    cases: Sequence[Case], checks: Iterable[Check], rounds: Mapping[str, int], settings: Settings
) -> list[Case]:
    """Cases with an UNSURE timed target that more rounds could still settle.

    Those with an UNSURE promise, if any; else, with `Settings.settle_goals`, those with an
    UNSURE goal.
    """
    unsure = [
        check
        for check in checks
        if check.measurement.timed
        and check.interval_verdict == "UNSURE"
        and not _at_resolution(check.measurement)
        and rounds[check.case] < settings.max_rounds
    ]
    names = {check.case for check in unsure if check.spec.kind == "promise"}
    if not names and settings.settle_goals:
        names = {check.case for check in unsure}
    return [case for case in cases if case.name in names]


def _cores(case: Case, cpus: int) -> int:
    """The CPUs *case* keeps busy: its ``cores`` attribute (threaded cases), else 1."""
    return max(1, min(int(getattr(case, "cores", 1)), cpus))


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
    busy: dict[str, list[float]] = {case.name: [] for case in cases}
    load: dict[str, float] = dict.fromkeys(busy, 0.0)

    def run_rounds(case: Case, count: int) -> None:
        if not case.samples:
            return  # an untimed case: its figures are exact
        for _ in range(count):
            case.round()
            rounds[case.name] += 1
            busy[case.name].append(_busy_elsewhere())
        load[case.name] = statistics.fmean(busy[case.name])

    def judge() -> tuple[dict[str, dict[str, Measurement]], tuple[Check, ...]]:
        figures = {case.name: case.measurements() for case in cases}
        loaded = frozenset(
            case.name
            for case in cases
            if load[case.name] + _cores(case, cpus) > cpus + LOAD_TOLERANCE
        )
        return figures, check_targets(figures, loaded, specs)

    try:
        for step, case in enumerate(cases, start=1):
            report(f"[{step}/{len(cases)}] {case.name}: set-up and {settings.rounds} rounds")
            case.setup()
            run_rounds(case, settings.rounds)
        figures, checks = judge()
        extra_start = time.perf_counter()
        while True:
            pending = _pending(cases, checks, rounds, settings)
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
