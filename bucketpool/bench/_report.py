"""The reports of a run: the table on stdout and ``--json`` (``--plot`` is in ``_plot``).

All three come from one `bucketpool.bench._runner.BenchResult`, so they always agree.
Plain ``str`` formatting for the table (it must read the same in a CI log as in a
terminal); matplotlib, an optional extra, for the plot.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import typing
from collections.abc import Mapping, Sequence

from bucketpool.bench._cases import TraceCase
from bucketpool.bench._fills import FillsCase
from bucketpool.bench._pools import IMPLEMENTATIONS
from bucketpool.bench._runner import BenchResult
from bucketpool.bench._stats import CONFIDENCE, RESOLUTION, Measurement, Unit
from bucketpool.bench._targets import Check

__all__ = [
    "format_bytes",
    "format_measurement",
    "format_value",
    "matplotlib_available",
    "render_table",
    "to_json",
    "write_json",
]

_CAP_FIGURE = "bucketpool final bytes / cache cap"


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
    if unit == "ns":
        return f"{value:,.0f} ns"
    if unit == "bytes":
        return format_bytes(value)
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
                format_measurement(figures["compat/original"]),
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


def _target_table(checks: Sequence[Check]) -> list[str]:
    rows: list[tuple[str, ...]] = [("target", "value [95% interval]", "goal", "verdict")]
    rows.extend(
        (
            check.name,
            format_measurement(check.measurement),
            f"{check.spec.op} {format_value(check.spec.limit, check.measurement.unit)}",
            _verdict_text(check),
        )
        for check in checks
    )
    return _columns(rows, (False, True, True, False))


def _summary(result: BenchResult) -> list[str]:
    counts = collections.Counter(check.verdict for check in result.checks)
    lines = [
        "verdicts: "
        + ", ".join(f"{counts[v]} {v}" for v in ("PASS", "FAIL", "UNSURE", "LOADED"))
        + f"; run took {result.duration_s:.0f} s"
    ]
    cpus = typing.cast("Mapping[str, object]", result.environment["machine"])["cpus"]
    loaded = sorted({c.case for c in result.checks if c.verdict == "LOADED"})
    if loaded:
        peak = max(result.load.values(), default=0.0)
        lines.append(
            f"MACHINE LOOKS LOADED (load average up to {peak:.1f} on {cpus} CPUs, or a "
            f"baseline varying by more than a quarter between rounds) while measuring "
            f"{', '.join(loaded)}: those timing targets were not judged; rerun on a quiet machine."
        )
    if counts["UNSURE"]:
        lines.append(
            "UNSURE: the interval straddles the goal even after the extra rounds; the figure "
            "is too close to the goal to tell on this machine (more rounds: --budget)."
        )
    return lines


def render_table(result: BenchResult) -> str:
    """Render the report printed on stdout, as one string ending in a newline."""
    env = result.environment
    machine = typing.cast("Mapping[str, object]", env["machine"])
    lines = [
        f"bucketpool {env['version']} benchmark: Python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}, {machine['platform']}, {machine['cpus']} CPUs",
        f"Rounds run each case's series back to back ({', '.join(IMPLEMENTATIONS)} for traces), "
        "after one warm-up; gc off while timing.",
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
    if result.checks:
        lines += ["", *_target_table(result.checks)]
    lines += ["", *_summary(result)]
    return "\n".join(lines) + "\n"


def _measurement_json(measurement: Measurement) -> dict[str, object]:
    return {
        "value": measurement.value,
        "low": measurement.low,
        "high": measurement.high,
        "unit": measurement.unit,
        "timed": measurement.timed,
        "rounds": measurement.rounds,
        "spread": measurement.spread,
    }


def to_json(result: BenchResult) -> dict[str, object]:
    """Return the run as JSON-ready data.

    The structure (``schema`` 2)::

        {"schema": 2, "version", "python", "torch", "numpy",
         "machine": {"platform", "machine", "processor", "cpus"},
         "settings": {"rounds", "max_rounds", "budget_s", "ops", "thread_ops", "parked",
                      "min_pass_ns", "quick", "seed", "confidence", "resolution"},
         "duration_s": float, "loaded": bool,
         "cases": {case: {"description", "rounds", "load", "samples": {series: [...]},
                          "figures": {figure: {"value", "low", "high", "unit", "timed",
                                               "rounds", "spread"}}}},
         "checks": [{"case", "figure", "op", "limit", "why", "value", "low", "high",
                     "unit", "interval_verdict", "verdict"}],
         "series": {trace: {impl: [bytes held after each op]}}}

    Times are ns, sizes bytes; a ratio's ``value`` is the median of per-round ratios.
    """
    settings = result.settings
    return {
        "schema": 2,
        **result.environment,
        "settings": {
            "rounds": settings.rounds,
            "max_rounds": settings.max_rounds,
            "budget_s": settings.budget_s,
            "ops": settings.ops,
            "thread_ops": settings.thread_ops,
            "parked": settings.parked,
            "min_pass_ns": settings.min_pass_ns,
            "quick": settings.quick,
            "seed": settings.seed,
            "confidence": CONFIDENCE,
            "resolution": RESOLUTION,
        },
        "duration_s": result.duration_s,
        "loaded": result.loaded,
        "cases": {
            case.name: {
                "description": case.description,
                "rounds": result.rounds[case.name],
                "load": result.load[case.name],
                "samples": {name: list(values) for name, values in case.samples.items()},
                "figures": {
                    name: _measurement_json(m) for name, m in result.figures[case.name].items()
                },
            }
            for case in result.cases
        },
        "checks": [
            {
                "case": check.case,
                "figure": check.spec.figure,
                "op": check.spec.op,
                "limit": check.spec.limit,
                "why": check.spec.why,
                "value": check.measurement.value,
                "low": check.measurement.low,
                "high": check.measurement.high,
                "unit": check.measurement.unit,
                "interval_verdict": check.interval_verdict,
                "verdict": check.verdict,
            }
            for check in result.checks
        ],
        "series": {
            case.name: {impl: list(held) for impl, held in case.series.items()}
            for case in result.cases
            if isinstance(case, TraceCase) and case.series
        },
    }


def write_json(result: BenchResult, path: str | os.PathLike[str]) -> None:
    """Write `to_json` of *result* to *path*, indented.

    Raises:
        OSError: the file cannot be written.
    """
    with open(path, "w", encoding="utf-8") as file:
        json.dump(to_json(result), file, indent=1)
        file.write("\n")


def matplotlib_available() -> bool:
    """Return whether matplotlib (the ``bucketpool[plot]`` extra) can be imported."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return False
    return True
