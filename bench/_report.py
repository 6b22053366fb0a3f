"""The report printed on stdout: the figures, then the promises and the goals with verdicts.

By default a one-screen summary: the traces' figures, the fills' rates and one row per
target with its worst case; with ``verbose`` every figure of every case and every check.
The table, ``--json`` (``_json``) and ``--plot`` (``_plot``) all come from one
`bench._runner.BenchResult`, so they always agree.  Plain ``str`` formatting (it must read
the same in a CI log as in a terminal).
"""

from __future__ import annotations

import collections
import importlib
import typing
from collections.abc import Mapping, Sequence

from bench._cases import TraceCase
from bench._fills import FILL_COPIES, FillsCase
from bench._runner import BenchResult
from bench._stats import CONFIDENCE, RESOLUTION, Measurement, Unit, Verdict
from bench._targets import CHECK_FAILED, CHECK_UNSURE, Check, Kind, TargetSpec, exit_status

__all__ = [
    "ORIGINAL",
    "RATIOS",
    "format_bytes",
    "format_measurement",
    "format_rate",
    "format_value",
    "matplotlib_available",
    "render_table",
]

#: What "original" means, said once in every report.
ORIGINAL = (
    "original: vLLM's DescriptorBufferPool rebuilt in bench/_original.py, driven as its "
    "callers drive it: acquire, three [:n] slices, release; bucketpool: "
    "`with pool.acquire(n) as bufs:`; compat: the drop-in, driven as the original."
)
#: How to read a ratio, said once in every report.
RATIOS = (
    "Ratios a/b: a's time per op over b's, in the same round (bucketpool/original: the "
    "pool's over the original's); lower is better unless the bound says >= "
    "(throughputs, setitem/add_copies)."
)
_KINDS: tuple[Kind, ...] = ("promise", "goal")
#: Verdicts, worst first: the order of a summary row's counts and of its worst case.
_VERDICTS: tuple[Verdict, ...] = ("FAIL", "UNSURE", "LOADED", "PASS")
_PAIR = "(original / bucketpool)"
_HEADINGS: dict[Kind, str] = {
    "promise": "PROMISES: what the README claims; --check exits 1 when one FAILs, 3 when one is "
    "UNSURE or LOADED",
    "goal": "GOALS: speed aimed for; reported, never failing --check (--strict-check: judged)",
}
_TARGETS_HEADING = (
    "TARGETS, one row each with its worst case (--verbose: every case): --check judges the "
    "promises; goals are reported only"
)


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
    """Format a figure in its unit: ``0.38x``, ``1,234 ns``, ``1.5 KiB``, ``12``, ``2.5%``."""
    if unit == "x":
        return f"{value:,.3g}x" if value < 10 else f"{value:,.0f}x"
    if unit == "ns":
        return f"{value:,.0f} ns"
    if unit == "bytes":
        return format_bytes(value)
    if unit == "ops/s":
        return f"{value:,.0f} ops/s"
    if unit == "%":
        return f"{value:,.2g}%" if abs(value) < 10 else f"{value:,.0f}%"
    return f"{value:,.0f}"


def format_rate(per_s: float) -> str:
    """Format a rate with an SI prefix, 3 significant digits: ``230k/s``, ``1.51G/s``."""
    for prefix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if per_s >= scale:
            return f"{per_s / scale:.3g}{prefix}/s"
    return f"{per_s:.3g}/s"


def format_measurement(measurement: Measurement) -> str:
    """Format a figure with its interval: ``0.29x [0.28x-0.31x]`` (exact figures alone)."""
    text = format_value(measurement.value, measurement.unit)
    if not measurement.timed:
        return text
    low = format_value(measurement.low, measurement.unit)
    high = format_value(measurement.high, measurement.unit)
    return f"{text} [{low}-{high}]"


def _columns(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if align else cell.ljust(width)
            for cell, width, align in zip(row, widths, right, strict=True)
        ).rstrip()
        for row in rows
    ]


def _pair(figures: Mapping[str, Measurement], suffix: str) -> str:
    return " / ".join(
        format_value(figures[f"{impl} {suffix}"].value, figures[f"{impl} {suffix}"].unit)
        for impl in ("original", "bucketpool")
    )


def _compat_cell(figures: Mapping[str, Measurement]) -> str:
    if "compat/original" in figures:
        return format_measurement(figures["compat/original"])
    return f"not timed: refused {figures['compat refusals'].value:,.0f} calls"


def _trace_table(result: BenchResult, traces: Sequence[TraceCase], *, verbose: bool) -> list[str]:
    rows: list[tuple[str, ...]] = [
        (
            "trace",
            "rounds",
            "original ns/op",
            "bucketpool / original",
            "compat / original",
            "allocs after warm-up",
            "peak bytes",
            "final bytes",
        ),
        ("", "", "", "", "", _PAIR, _PAIR, _PAIR),
    ]
    for case in traces:
        figures = result.figures[case.name]
        rows.append(
            (
                case.name,
                str(result.rounds[case.name]),
                format_value(figures["original ns/op"].value, "ns"),
                format_measurement(figures["bucketpool/original"]),
                _compat_cell(figures),
                _pair(figures, "allocations after warm-up"),
                _pair(figures, "peak bytes"),
                _pair(figures, "final bytes"),
            )
        )
    keep = range(8) if verbose else (0, 2, 3, 4, 6)  # the summary: no rounds, allocs, final
    return _columns([[row[i] for i in keep] for row in rows], [i > 0 for i in keep])


def _case_table(result: BenchResult, names: Sequence[str]) -> list[str]:
    rows: list[tuple[str, ...]] = [("case", "rounds", "figure", "value [95% interval]")]
    for name in names:
        for i, (figure, measurement) in enumerate(result.figures[name].items()):
            first = i == 0
            rounds = str(result.rounds[name]) if first and measurement.timed else ""
            rows.append((name if first else "", rounds, figure, format_measurement(measurement)))
    return _columns(rows, (False, True, False, True))


def _copies_per_s(result: BenchResult, fills: FillsCase, name: str) -> str:
    ns = result.figures[fills.name][f"{name} ns/call"].value
    return format_rate(FILL_COPIES * 1e9 / ns) if ns else "-"


def _fill_table(result: BenchResult, fills: FillsCase) -> list[str]:
    figures = result.figures[fills.name]
    header = ("fill", "descriptors", "ns/call [95% interval]", f"copies/s ({FILL_COPIES:,}/call)")
    rows: list[tuple[str, ...]] = [header]
    for name, label in fills.labels.items():
        measured = format_measurement(figures[f"{name} ns/call"])
        count = f"{fills.descriptors[name]:,}"
        rows.append((label, count, measured, _copies_per_s(result, fills, name)))
    return _columns(rows, (False, True, True, True))


def _fill_line(result: BenchResult, fills: FillsCase) -> str:
    rates = (f"{name} {_copies_per_s(result, fills, name)}" for name in fills.labels)
    return f"fills, {FILL_COPIES:,} copies per call: {', '.join(rates)}"


def _verdict_text(check: Check) -> str:
    if check.verdict == "LOADED":
        return f"LOADED (interval alone: {check.interval_verdict})"
    return check.verdict


def _target_rows(checks: Sequence[Check]) -> list[tuple[str, ...]]:
    """One row per check, except that one row stands for an exact figure's PASSes.

    A target on an exact figure (a count, bytes) checked on several cases that all PASS
    takes one row, with the worst value: the table stays readable, and every timed figure
    and every verdict other than PASS keeps a row of its own.
    """
    groups: dict[TargetSpec, list[Check]] = {}
    for check in checks:
        groups.setdefault(check.spec, []).append(check)
    rows: list[tuple[str, ...]] = []
    for spec, group in groups.items():
        unit = group[0].measurement.unit
        bound = f"{spec.op} {format_value(spec.limit, unit)}"
        if len(group) > 1 and all(c.verdict == "PASS" and not c.measurement.timed for c in group):
            values = [c.measurement.value for c in group]
            worst = group[values.index(max(values) if spec.op == "<=" else min(values))]
            value = f"worst {format_measurement(worst.measurement)} ({worst.case})"
            rows.append((f"{len(group)} cases: {spec.figure}", value, bound, "PASS"))
            continue
        rows.extend(
            (check.name, format_measurement(check.measurement), bound, _verdict_text(check))
            for check in group
        )
    return rows


def _target_table(checks: Sequence[Check], kind: Kind) -> list[str]:
    rows = _target_rows([check for check in checks if check.spec.kind == kind])
    if not rows:
        return [_HEADINGS[kind], "  (none applies to the cases run)"]
    header = (kind, "value [95% interval]", "bound", "verdict")
    return [_HEADINGS[kind], *_columns([header, *rows], (False, True, True, False))]


def _summary_table(checks: Sequence[Check]) -> list[str]:
    """One row per target: its worst case (worst verdict, then farthest past the bound)."""
    groups: dict[TargetSpec, list[Check]] = {}
    for check in checks:
        groups.setdefault(check.spec, []).append(check)
    header = ("", "figure", "worst case", "value [95% interval]", "bound", "verdicts")
    rows: list[tuple[str, ...]] = [header]
    for spec, group in groups.items():
        sign = 1 if spec.op == ">=" else -1
        worst = min(group, key=lambda c: (_VERDICTS.index(c.verdict), sign * c.measurement.value))
        counts = collections.Counter(check.verdict for check in group)
        verdicts = ", ".join(f"{counts[v]} {v}" for v in _VERDICTS if counts[v])
        bound = f"{spec.op} {format_value(spec.limit, worst.measurement.unit)}"
        measured = format_measurement(worst.measurement)
        rows.append((spec.kind, spec.figure, worst.case, measured, bound, verdicts))
    return _columns(rows, (False, False, False, True, True, False))


def _counts(checks: Sequence[Check], kind: Kind) -> str:
    counts = collections.Counter(check.verdict for check in checks if check.spec.kind == kind)
    return ", ".join(f"{counts[v]} {v}" for v in ("PASS", "FAIL", "UNSURE", "LOADED"))


def _exit_line(checks: Sequence[Check], *, strict: bool) -> str:
    status = exit_status(checks, strict=strict)
    flag, what = ("--strict-check", "target") if strict else ("--check", "promise")
    judged = [check for check in checks if strict or check.spec.kind == "promise"]
    if status == CHECK_FAILED:
        failed = ", ".join(c.name for c in judged if c.verdict == "FAIL")
        return f"{flag}: exit {status}, a {what} FAILs: {failed}"
    if status == CHECK_UNSURE:
        unsure = ", ".join(c.name for c in judged if c.verdict in ("UNSURE", "LOADED"))
        return f"{flag}: exit {status}, no {what} FAILs but some could not be judged: {unsure}"
    if not judged:
        return f"{flag}: exit {status}, no {what} applies to the cases run"
    return f"{flag}: exit {status}, every {what} holds"


def _summary(result: BenchResult, *, check: bool, strict: bool) -> list[str]:
    """The counts, what LOADED or UNSURE means if any is, and what --check exits with, last."""
    checks = result.checks
    lines = [
        f"promises: {_counts(checks, 'promise')}; goals: {_counts(checks, 'goal')}; "
        f"run took {result.duration_s:.0f} s"
    ]
    cpus = typing.cast("Mapping[str, object]", result.environment["machine"])["cpus"]
    loaded = sorted({c.case for c in checks if c.verdict == "LOADED"})
    if loaded:
        peak = max(result.load[case] for case in loaded)
        lines.append(
            f"MACHINE LOOKS LOADED (up to {peak:.1f} other tasks runnable on average, on "
            f"{cpus} CPUs, or a baseline varying by more than a quarter between rounds) while "
            f"measuring {', '.join(loaded)}: those timing targets were not judged; rerun on a "
            "quiet machine."
        )
    if any(check.verdict == "UNSURE" for check in checks):
        lines.append(
            "UNSURE: the interval straddles the bound even after the extra rounds; the figure "
            "is too close to the bound to tell on this machine (more rounds: --budget)."
        )
    if check or strict:
        lines.append(_exit_line(checks, strict=strict))
    return lines


def render_table(
    result: BenchResult, *, verbose: bool = False, check: bool = False, strict: bool = False
) -> str:
    """Render the report printed on stdout, as one string ending in a newline.

    Args:
        result: the run.
        verbose: every figure of every case and every check, not the one-screen summary.
        check: end with the line that says what ``--check`` exits with, and why.
        strict: as *check*, for ``--strict-check``.
    """
    env = result.environment
    machine = typing.cast("Mapping[str, object]", env["machine"])
    lines = [
        f"bucketpool {env['version']} benchmark: Python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}, {machine['platform']}, {machine['cpus']} CPUs",
        ORIGINAL,
        RATIOS,
    ]
    traces = [case for case in result.cases if isinstance(case, TraceCase)]
    fills = [case for case in result.cases if isinstance(case, FillsCase)]
    if not verbose:
        if traces:
            lines += ["", *_trace_table(result, traces, verbose=False)]
        for case in fills:
            lines += ["", _fill_line(result, case)]
        if result.checks:
            lines += ["", _TARGETS_HEADING, *_summary_table(result.checks)]
        return "\n".join([*lines, "", *_summary(result, check=check, strict=strict)]) + "\n"
    lines += [
        "Rounds run each case's series back to back (original, bucketpool, compat for "
        "traces), after one warm-up; gc off while timing.",
        f"Figures: median over rounds of per-round (paired) values, with a bootstrap "
        f"{CONFIDENCE:.0%} interval of the median, at least +-{RESOLUTION:.0%}.",
    ]
    others = [case.name for case in result.cases if not isinstance(case, TraceCase | FillsCase)]
    if traces:
        lines += ["", *_trace_table(result, traces, verbose=True), ""]
        lines += [f"  {case.name}: {case.description}" for case in traces]
    if others:
        lines += ["", *_case_table(result, others), ""]
        lines += [
            f"  {case.name}: {case.description}" for case in result.cases if case.name in others
        ]
    for case in fills:
        lines += ["", *_fill_table(result, case)]
    for kind in _KINDS:
        lines += ["", *_target_table(result.checks, kind)]
    lines += ["", *_summary(result, check=check, strict=strict)]
    return "\n".join(lines) + "\n"


def matplotlib_available() -> bool:
    """Return whether matplotlib (the ``bucketpool[plot]`` extra) can be imported."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return False
    return True
