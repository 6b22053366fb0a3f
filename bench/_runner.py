"""The runner: settings, the cases of a run, rounds until the verdicts settle, the result.

Every case is set up and runs `Settings.rounds` rounds; then, while a promise's interval
straddles its bound (``UNSURE``), its case gets 3 more rounds at a time, until the verdicts
settle, a case reaches `Settings.max_rounds`, `Settings.budget_s` seconds are spent, or
the interval is down to the resolution floor.  With `Settings.settle_goals`
(``--strict-check``) UNSURE goals get them too, once no promise is UNSURE.

After each round the runner counts the tasks runnable besides the benchmark (Linux's
instantaneous count, whose average is the load average).  A case whose rounds saw on
average more of them than the CPUs the benchmark leaves free, by more than
`LOAD_TOLERANCE`, is ``LOADED`` instead of judged, as is a figure whose baseline varied by
more than `bench._stats.LOADED_SPREAD` between rounds.
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

from bench._cases import Case, DebugCase, FillStepCase, TraceCase
from bench._compat import CompatCase
from bench._counts import ViewCacheCase
from bench._fills import FILL_SIZES, FillsCase
from bench._fork import ForkCase, forks_for
from bench._host_step import host_step_cases
from bench._kv_offload import KvOffloadCase
from bench._parked import CollectCase, EventedCase, ParkedCase, ParkedStuckCase
from bench._stats import RESOLUTION, Measurement
from bench._targets import TARGETS, Check, TargetSpec, check_targets
from bench._traces import (
    CASE_KINDS,
    DEFAULT_OPS,
    QUICK_OPS,
    SELECTIONS,
    TRACE_NAMES,
    Trace,
    select_traces,
)

__all__ = [
    "LOAD_TOLERANCE",
    "QUICK",
    "BenchResult",
    "Progress",
    "Settings",
    "build_cases",
    "environment",
    "other_runnable",
    "run_benchmark",
    "select_cases",
    "selections",
]

#: Called with one line before each step of a run.
Progress = Callable[[str], None]
_EXTRA_ROUNDS = 3
#: Other runnable tasks, on average, that a case's CPUs may share before it is LOADED.
LOAD_TOLERANCE = 0.5


@typing.final
@attrs.frozen
class Settings:
    """How a run is made.

    Attributes:
        rounds: rounds of every case before the first judgement.
        max_rounds: the most rounds a case gets.
        budget_s: seconds of extra rounds while a verdict is UNSURE.
        ops: steps per trace pass and per hot-loop pass.
        host_steps: interleaved steps of vLLM's workers per round of a host-step case.
        fill_step_ops: steps per pass of ``fill-step`` (at most *ops*).
        parked: handles parked in ``parked-N``.
        stuck: buffers stuck in ``parked-stuck``, and parked in ``collect``.
        min_pass_ns: a fill batch or debug-level pass lasts at least this long.
        quick: whether ``--quick`` chose the defaults.
        seed: seeds the traces, their ends, the copies and the bootstrap.
        settle_goals: whether UNSURE goals get extra rounds too (``--strict-check``).
    """

    rounds: int = 7
    max_rounds: int = 40
    budget_s: float = 40.0
    ops: int = DEFAULT_OPS
    host_steps: int = 300
    fill_step_ops: int = 1_000
    parked: int = 10_000
    stuck: int = 100_000
    min_pass_ns: int = 5_000_000
    quick: bool = False
    seed: int = 0
    settle_goals: bool = False


#: The ``--quick`` run's settings.
QUICK = Settings(
    rounds=4,
    max_rounds=12,
    budget_s=3.0,
    ops=QUICK_OPS,
    host_steps=100,
    fill_step_ops=300,
    min_pass_ns=1_000_000,
    quick=True,
)


def build_cases(settings: Settings, traces: Sequence[Trace], kinds: Iterable[str]) -> list[Case]:
    """Return the cases of a run: one per trace, then those of the named *kinds*."""
    chosen = set(kinds)
    s = settings
    makers: dict[str, Callable[[], Sequence[Case]]] = {
        "host-step": lambda: host_step_cases(s.host_steps),
        "view-cache": lambda: [ViewCacheCase(s.ops, s.seed)],
        "fills": lambda: [FillsCase(k, s.min_pass_ns, s.seed) for k in FILL_SIZES],
        "fill-step": lambda: [FillStepCase(min(s.ops, s.fill_step_ops), s.seed)],
        "parked": lambda: (
            ParkedCase(s.ops, s.parked),
            EventedCase(s.ops),
            ParkedStuckCase(s.ops, s.stuck),
            CollectCase(s.stuck),
        ),
        "debug": lambda: [DebugCase(s.min_pass_ns, s.ops)],
        "compat": lambda: [CompatCase()],
        "kv-offload": lambda: [KvOffloadCase(s.seed)],
        "fork": lambda: [ForkCase(forks_for(s.ops))],
    }
    assert tuple(makers) == CASE_KINDS, "every kind --trace names has its cases"
    cases: list[Case] = [TraceCase(trace) for trace in traces]
    for kind, make in makers.items():
        if kind in chosen:
            cases.extend(make())
    return cases


def select_cases(settings: Settings, traces: Sequence[Trace], chosen: Iterable[str]) -> list[Case]:
    """Return the cases of a run that *chosen* names, in run order.

    A name is a case's name as the report prints it, a family of traces (``repeated``,
    ``loguniform``) or a kind of cases (`CASE_KINDS`: all its cases).

    Raises:
        ValueError: a name selects no case; the message lists `selections`.
    """
    chosen = set(chosen)
    cases = build_cases(settings, select_traces(traces, chosen & set(SELECTIONS)), ())
    for kind in CASE_KINDS:
        made = build_cases(settings, (), [kind])
        cases += [case for case in made if kind in chosen or case.name in chosen]
    unknown = chosen - set(SELECTIONS) - {case.name for case in cases}
    if unknown:
        raise ValueError(
            f"no case named {', '.join(map(repr, sorted(unknown)))}; "
            f"choose from: {', '.join(selections(settings))}"
        )
    return cases


def selections(settings: Settings) -> list[str]:
    """What `select_cases` accepts: the families and traces, then each kind and its cases."""
    names = ["repeated", "loguniform", *TRACE_NAMES]
    for kind in CASE_KINDS:
        names += [kind, *(c.name for c in build_cases(settings, (), [kind]) if c.name != kind)]
    return names


@typing.final
@attrs.frozen
class BenchResult:
    """Everything one run measured: the report and the JSON come from it.

    Attributes:
        settings: how the run was made.
        environment: versions and machine (see `environment`).
        cases: the cases, with their samples.
        figures: case name to its figures.
        checks: the targets judged.
        rounds: case name to rounds run.
        load: case name to the mean count of other runnable tasks after its rounds.
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


def other_runnable() -> float:
    """Return how many tasks are runnable now besides the caller (Linux), else load - 1."""
    try:
        with open("/proc/loadavg", encoding="ascii") as file:
            return float(max(0, int(file.read().split()[3].partition("/")[0]) - 1))
    except (OSError, ValueError, IndexError):
        try:
            return max(0.0, os.getloadavg()[0] - 1)
        except (AttributeError, OSError):
            return 0.0


def _busy_elsewhere() -> float:
    """The mean of five `other_runnable` counts, 1 ms apart."""
    counts = []
    for _ in range(5):
        counts.append(other_runnable())
        time.sleep(0.001)
    return statistics.fmean(counts)


def environment() -> dict[str, object]:
    """Return the versions and the machine: what a figure depends on."""
    try:
        version = importlib.metadata.version("bucketpool")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    return {
        "version": version,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def _pending(
    cases: Sequence[Case], checks: Iterable[Check], rounds: Mapping[str, int], settings: Settings
) -> list[Case]:
    """Cases with an UNSURE timed promise (or goal, if settling them) more rounds may settle."""
    unsure = [
        check
        for check in checks
        if check.measurement.timed
        and check.interval_verdict == "UNSURE"
        and check.measurement.high - check.measurement.low
        > 2 * RESOLUTION * abs(check.measurement.value) * (1 + 1e-9)
        and rounds[check.case] < settings.max_rounds
    ]
    names = {check.case for check in unsure if check.spec.kind == "promise"}
    if not names and settings.settle_goals:
        names = {check.case for check in unsure}
    return [case for case in cases if case.name in names]


def run_benchmark(
    settings: Settings,
    cases: Sequence[Case],
    *,
    progress: Progress | None = None,
    specs: Sequence[TargetSpec] = TARGETS,
) -> BenchResult:
    """Set up and run *cases*, add rounds while a verdict is UNSURE, judge *specs*."""
    report = progress or (lambda message: None)
    start = time.perf_counter()
    free = (os.cpu_count() or 1) - 1 + LOAD_TOLERANCE  # other tasks that leave a CPU free
    rounds = dict.fromkeys((case.name for case in cases), 0)
    busy: dict[str, list[float]] = {case.name: [] for case in cases}

    def run_rounds(case: Case, count: int) -> None:
        for _ in range(count if case.samples else 0):  # an untimed case: exact figures
            case.round()
            rounds[case.name] += 1
            busy[case.name].append(_busy_elsewhere())

    def judge() -> tuple[dict[str, dict[str, Measurement]], tuple[Check, ...]]:
        figures = {case.name: case.measurements() for case in cases}
        loaded = frozenset(c.name for c in cases if statistics.fmean(busy[c.name] or [0]) > free)
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
    finally:  # the last set up first: each undoes its patches over the state it found
        for case in reversed(cases):
            case.close()
    return BenchResult(
        settings=settings,
        environment=environment(),
        cases=tuple(cases),
        figures=figures,
        checks=checks,
        rounds=rounds,
        load={name: statistics.fmean(b or [0.0]) for name, b in busy.items()},
        duration_s=time.perf_counter() - start,
    )
