"""The report on stdout: the traces' step ratios, the fills, the targets with their verdicts.

By default one screen: a row per trace, a row per fill size, the fill step, and a row per
target figure with its worst case; ``verbose`` adds every figure of every case and every
check.  Plain text, so that it reads the same in a CI log as in a terminal.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from bench._cases import FillStepCase, TraceCase
from bench._fills import SOURCES as _SOURCES
from bench._fills import FillsCase
from bench._runner import BenchResult
from bench._stats import CONFIDENCE, RESOLUTION, Measurement, Unit, Verdict
from bench._targets import CHECK_FAILED, CHECK_UNSURE, STEP, Check, exit_status

__all__ = ["format_bytes", "format_measurement", "format_value", "render_table"]

#: What is timed, said once in every report.
_LEGEND = (
    "step: bucketpool `with pool.acquire(n) as bufs: views = bufs.shrink(end)`; the original\n"
    "(vLLM's pool, rebuilt in bench/_original.py) and compat: `bufs = pool.acquire(n)`, three\n"
    "[:end] slices, `pool.release(bufs)`; end = n in 3 steps of 4, else uniform in [n // 2, n).\n"
    f"Ratios a/b: per-round (paired) medians [{CONFIDENCE:.0%} interval, at least "
    f"+-{RESOLUTION:.0%}]; lower is better unless the bound says >=."
)
#: Verdicts, worst first.
_VERDICTS: tuple[Verdict, ...] = ("FAIL", "UNSURE", "LOADED", "PASS")


def format_bytes(count: float) -> str:
    """Format a byte count with binary units: ``512 B``, ``1.5 KiB``, ``24.0 MiB``."""
    if abs(count) < 1024:
        return f"{count:,.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        count /= 1024
        if abs(count) < 1024 or unit == "GiB":
            break
    return f"{count:,.1f} {unit}"


def format_value(value: float, unit: Unit) -> str:
    """Format a figure in its unit: ``0.38x``, ``1,234 ns``, ``1.5 KiB``, ``12``."""
    if unit == "x":
        return f"{value:,.3g}x" if value < 10 else f"{value:,.0f}x"
    if unit == "bytes":
        return format_bytes(value)
    suffix = {"ns": " ns", "ops/s": " ops/s"}.get(unit, "")
    return f"{value:,.0f}{suffix}"


def format_measurement(measurement: Measurement) -> str:
    """Format a figure with its interval: ``0.29x [0.28x-0.31x]`` (exact figures alone)."""
    text = format_value(measurement.value, measurement.unit)
    if not measurement.timed:
        return text
    low, high = (format_value(v, measurement.unit) for v in (measurement.low, measurement.high))
    return f"{text} [{low}-{high}]"


def _columns(rows: Sequence[Sequence[str]], align: str) -> list[str]:
    """Rows as aligned columns, each left (``l`` in *align*) or right (``r``) aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(align))]
    return [
        "  ".join(
            cell.ljust(width) if side == "l" else cell.rjust(width)
            for cell, width, side in zip(row, widths, align, strict=True)
        ).rstrip()
        for row in rows
    ]


def _verdicts(checks: Sequence[Check]) -> str:
    """``PASS``, or the verdicts counted (``1 FAIL, 2 PASS``); ``-`` for none."""
    counts = collections.Counter(check.verdict for check in checks)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{counts[v]} {v}" for v in _VERDICTS if counts[v]) or "-"


def _bound(checks: Sequence[Check], *, kind: bool = False) -> str:
    """The bound of the first check, in its figure's unit; with *kind*, a goal's says so."""
    if not checks:
        return ""
    spec = checks[0].spec
    goal = " (goal)" if kind and spec.kind == "goal" else ""
    return f"{spec.op} {format_value(spec.limit, checks[0].measurement.unit)}{goal}"


def _trace_table(result: BenchResult, traces: Sequence[TraceCase]) -> list[str]:
    rows = [
        (
            "trace",
            "original ns/step",
            f"{STEP} [interval]",
            "bound",
            "verdict",
            "compat/original",
            "peak bytes: original / ours",
        )
    ]
    for case in traces:
        figures = result.figures[case.name]
        step = _of(result, case.name, STEP)[:1]  # the promise, else the first goal
        compat = figures.get("compat/original")
        rows.append(
            (
                case.name,
                format_value(figures["original ns/step"].value, "ns"),
                format_measurement(figures[STEP]),
                _bound(step, kind=True),
                _verdicts(step),
                format_measurement(compat) if compat else f"{case.refusals} refused",
                " / ".join(
                    format_bytes(figures[f"{pool} peak bytes"].value)
                    for pool in ("original", "bucketpool")
                ),
            )
        )
    return _columns(rows, "lrrrlrr")


def _fill_table(result: BenchResult, fills: Sequence[FillsCase]) -> list[str]:
    rows = [("fills: k", "add_copies ns", "bound", *(f"add_copies/numpy ({s})" for s in _SOURCES))]
    rows[0] += ("setitem/add_copies (>= 100x)",)
    for case in fills:
        cells = []
        for figure in (*(f"add_copies/numpy ({s})" for s in _SOURCES), "setitem/add_copies"):
            measured = result.figures[case.name].get(figure)
            checks = [c for c in _of(result, case.name, figure) if c.spec.kind == "promise"]
            text = format_measurement(measured) if measured else "-"
            cells.append(f"{text} {_verdicts(checks)}" if checks else text)
        ns = result.figures[case.name]["add_copies (arrays) ns/call"].value
        bound = _bound(_of(result, case.name, "add_copies/numpy (arrays)"))
        rows.append((f"{case.k:,}", format_value(ns, "ns"), bound, *cells))
    return _columns(rows, "rrrrrr")


def _of(result: BenchResult, case: str, figure: str) -> list[Check]:
    return [c for c in result.checks if c.case == case and c.spec.figure == figure]


def _excess(check: Check) -> float:
    """How far past its bound a check's value is, relative to the bound (higher: worse)."""
    over = check.measurement.value - check.spec.limit
    return (over if check.spec.op == "<=" else -over) / (abs(check.spec.limit) or 1)


def _target_rows(checks: Sequence[Check], *, every: bool) -> list[str]:
    """One row per (kind, figure) with its worst case; with *every*, one row per check."""
    groups: dict[tuple[str, str], list[Check]] = {}
    for check in checks:
        groups.setdefault((check.spec.kind, check.spec.figure), []).append(check)
    rows = [("target", "figure", "case" if every else "worst case", "value", "bound", "")]
    for group in [[c] for c in checks] if every else list(groups.values()):
        worst = min(group, key=lambda c: (_VERDICTS.index(c.verdict), -_excess(c)))
        verdict = _verdicts(group)
        if every and worst.verdict == "LOADED":
            verdict += f" (interval: {worst.interval_verdict})"
        measured = format_measurement(worst.measurement)
        spec = worst.spec
        rows.append((spec.kind, spec.figure, worst.case, measured, _bound([worst]), verdict))
    return _columns(rows, "lllrrl")


def _counts(checks: Sequence[Check], kind: str) -> str:
    counts = collections.Counter(check.verdict for check in checks if check.spec.kind == kind)
    return ", ".join(f"{counts[v]} {v}" for v in ("PASS", "FAIL", "UNSURE", "LOADED"))


def _exit_line(checks: Sequence[Check], *, strict: bool) -> str:
    status = exit_status(checks, strict=strict)
    flag, what = ("--strict-check", "target") if strict else ("--check", "promise")
    judged = [check for check in checks if strict or check.spec.kind == "promise"]
    if status == CHECK_FAILED:
        names = ", ".join(c.name for c in judged if c.verdict == "FAIL")
        return f"{flag}: exit {status}, a {what} FAILs: {names}"
    if status == CHECK_UNSURE:
        names = ", ".join(c.name for c in judged if c.verdict in ("UNSURE", "LOADED"))
        return f"{flag}: exit {status}, no {what} FAILs but some could not be judged: {names}"
    if not judged:
        return f"{flag}: exit {status}, no {what} applies to the cases run"
    return f"{flag}: exit {status}, every {what} holds"


def _closing(result: BenchResult, *, check: bool, strict: bool) -> list[str]:
    checks = result.checks
    lines = [
        f"promises: {_counts(checks, 'promise')}; goals: {_counts(checks, 'goal')}; "
        f"run took {result.duration_s:.0f} s"
    ]
    loaded = sorted({c.case for c in checks if c.verdict == "LOADED"})
    if loaded:
        peak = max(result.load[case] for case in loaded)
        lines.append(
            f"MACHINE LOOKS LOADED (up to {peak:.1f} other tasks runnable on "
            f"{result.environment['cpus']} CPUs, or a baseline varying by over a quarter) "
            f"while measuring {', '.join(loaded)}: not judged; rerun on a quiet machine."
        )
    if any(c.verdict == "UNSURE" for c in checks):
        lines.append("UNSURE: the interval straddles the bound after the extra rounds (--budget).")
    if check or strict:
        lines.append(_exit_line(checks, strict=strict))
    return lines


def _case_table(result: BenchResult, names: Sequence[str]) -> list[str]:
    rows = [("case", "rounds", "figure", "value [interval]")]
    for name in names:
        for i, (figure, measured) in enumerate(result.figures[name].items()):
            rounds = str(result.rounds[name]) if i == 0 else ""
            rows.append((name if i == 0 else "", rounds, figure, format_measurement(measured)))
    return _columns(rows, "lrlr")


def render_table(
    result: BenchResult, *, verbose: bool = False, check: bool = False, strict: bool = False
) -> str:
    """Return the report, ending in a newline; with *check* or *strict*, its exit line last."""
    env = result.environment
    lines = [
        f"bucketpool {env['version']} benchmark: Python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}, {env['platform']}, {env['cpus']} CPUs",
        _LEGEND,
    ]
    traces = [case for case in result.cases if isinstance(case, TraceCase)]
    fills = [case for case in result.cases if isinstance(case, FillsCase)]
    if traces:
        lines += ["", *_trace_table(result, traces)]
    if fills:
        lines += ["", *_fill_table(result, fills)]
    for case in result.cases:
        if isinstance(case, FillStepCase):
            ratios = result.figures[case.name]
            lines += [
                "",
                f"fill-step ({case.trace.name}, {case.trace.ops:,} steps, add_copies from arrays): "
                + ", ".join(
                    f"bucketpool/original ({way}) {format_measurement(ratios[f'{STEP} ({way})'])}"
                    for way in ("setitem", "numpy")
                ),
            ]
    if verbose:
        lines += ["", *_case_table(result, [case.name for case in result.cases]), ""]
        lines += [f"  {case.name}: {case.description}" for case in result.cases]
    if result.checks:
        lines += ["", *_target_rows(result.checks, every=verbose)]
    return "\n".join([*lines, "", *_closing(result, check=check, strict=strict)]) + "\n"
