"""The report printed on stdout: the figures, then the promises and the goals with verdicts.

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
from bench._fills import FillsCase
from bench._runner import BenchResult
from bench._stats import CONFIDENCE, RESOLUTION, Measurement, Unit
from bench._targets import CHECK_FAILED, CHECK_UNSURE, Check, Kind, TargetSpec, exit_status

__all__ = [
    "ORIGINAL",
    "RATIOS",
    "format_bytes",
    "format_measurement",
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
_HEADINGS: dict[Kind, str] = {
    "promise": "PROMISES: what the README claims; --check exits 1 when one FAILs, 3 when one is "
    "UNSURE or LOADED",
    "goal": "GOALS: speed aimed for; reported, never failing --check (--strict-check: judged)",
}


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


def _trace_table(result: BenchResult, traces: Sequence[TraceCase]) -> list[str]:
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
        ("", "", "", "", "", "(original / bucketpool)", "", ""),
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
    return _columns(rows, (False, True, True, True, True, True, True, True))


def _case_table(result: BenchResult, names: Sequence[str]) -> list[str]:
    rows: list[tuple[str, ...]] = [("case", "rounds", "figure", "value [95% interval]")]
    for name in names:
        for i, (figure, measurement) in enumerate(result.figures[name].items()):
            first = i == 0
            rounds = str(result.rounds[name]) if first and measurement.timed else ""
            rows.append((name if first else "", rounds, figure, format_measurement(measurement)))
    return _columns(rows, (False, True, False, True))


def _fill_table(result: BenchResult, fills: FillsCase) -> list[str]:
    figures = result.figures[fills.name]
    rows: list[tuple[str, ...]] = [("fill", "descriptors", "ns/call [95% interval]", "desc/s")]
    for name, label in fills.labels.items():
        measured = figures[f"{name} ns/call"]
        count = fills.descriptors[name]
        rate = f"{count * 1e3 / measured.value:,.1f} M" if measured.value else "-"
        rows.append((label, f"{count:,}", format_measurement(measured), rate))
    return _columns(rows, (False, True, True, True))


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


def _counts(checks: Sequence[Check], kind: Kind) -> str:
    counts = collections.Counter(check.verdict for check in checks if check.spec.kind == kind)
    return ", ".join(f"{counts[v]} {v}" for v in ("PASS", "FAIL", "UNSURE", "LOADED"))


def _exit_line(checks: Sequence[Check]) -> str:
    status = exit_status(checks)
    promises = [check for check in checks if check.spec.kind == "promise"]
    if status == CHECK_FAILED:
        failed = ", ".join(c.name for c in promises if c.verdict == "FAIL")
        return f"--check: exit {status}, a promise FAILs: {failed}"
    if status == CHECK_UNSURE:
        unsure = ", ".join(c.name for c in promises if c.verdict in ("UNSURE", "LOADED"))
        return f"--check: exit {status}, no promise FAILs but some could not be judged: {unsure}"
    if not promises:
        return f"--check: exit {status}, no promise applies to the cases run"
    return f"--check: exit {status}, every promise holds"


def _summary(result: BenchResult) -> list[str]:
    checks = result.checks
    lines = [
        f"promises: {_counts(checks, 'promise')}; goals: {_counts(checks, 'goal')}; "
        f"run took {result.duration_s:.0f} s",
        _exit_line(checks),
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
    return lines


def render_table(result: BenchResult) -> str:
    """Render the report printed on stdout, as one string ending in a newline."""
    env = result.environment
    machine = typing.cast("Mapping[str, object]", env["machine"])
    lines = [
        f"bucketpool {env['version']} benchmark: Python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}, {machine['platform']}, {machine['cpus']} CPUs",
        ORIGINAL,
        RATIOS,
        "Rounds run each case's series back to back (original, bucketpool, compat for "
        "traces), after one warm-up; gc off while timing.",
        f"Figures: median over rounds of per-round (paired) values, with a bootstrap "
        f"{CONFIDENCE:.0%} interval of the median, at least +-{RESOLUTION:.0%}.",
    ]
    traces = [case for case in result.cases if isinstance(case, TraceCase)]
    fills = [case for case in result.cases if isinstance(case, FillsCase)]
    others = [case.name for case in result.cases if not isinstance(case, TraceCase | FillsCase)]
    if traces:
        lines += ["", *_trace_table(result, traces), ""]
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
    lines += ["", *_summary(result)]
    return "\n".join(lines) + "\n"


def matplotlib_available() -> bool:
    """Return whether matplotlib (the ``bucketpool[plot]`` extra) can be imported."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return False
    return True
