"""The report on stdout: vLLM's host step, the counts, the traces, the fills, the targets.

By default one tall screen: first what a vLLM user feels, a row per host-step case (vLLM's
worker step, its pool against ``install()``'s, with the control), then the view cache's
exact counts, a row per trace, a row per fill size, the fill step, and a row per other
target figure with its worst case; each ratio of two things says who wins in words
(`in_words`: ``1.3x slower``, ``2x faster``, ``cannot tell``).  ``verbose`` adds every
figure of every case and lists every check.  Plain text within `WIDTH` columns, so that it
reads the same in a CI log as in a terminal; its last line says what the promises came to
(or ``--check``'s status).
"""

from __future__ import annotations

import collections
import re
import textwrap
from collections.abc import Sequence

from bench._cases import FillStepCase, TraceCase
from bench._counts import ViewCacheCase
from bench._fills import SOURCES as _SOURCES
from bench._fills import FillsCase
from bench._host_step import CONTROL, EXTRA, HOST_RESOLUTION
from bench._runner import LOAD_TOLERANCE, BenchResult
from bench._stats import CONFIDENCE, RESOLUTION, Measurement, Unit, Verdict, exact
from bench._targets import (
    CHECK_FAILED,
    CHECK_UNSURE,
    HOST_STEP,
    PROMISES,
    STEP,
    Check,
    exit_status,
)

__all__ = [
    "WIDTH",
    "format_bytes",
    "format_measurement",
    "format_value",
    "in_words",
    "render_table",
]

#: The most columns a line of the report takes.
WIDTH = 99
#: How to read the figures, said once in every report.
_LEGEND = (
    f"Ratios a/b: a's time over b's per round, paired: their median [{CONFIDENCE:.0%} interval, "
    f"at least +-{RESOLUTION:.0%}, host steps +-{HOST_RESOLUTION:.0%}]; lower is better unless "
    'the bound says >=. In words: a is "1.3x slower" (1.3 times b\'s time), "2x faster" (half '
    'of it), "cannot tell" (the interval holds 1x); counts, bytes: "2x more", "2x less". '
    "Verdicts judge the whole interval: UNSURE when it straddles the bound."
)
#: What the host-step table times.
_HOST_LEGEND = (
    "host step: vLLM's worker step (host time) with its own pool (vllm) and install()'s (installed)"
)
#: What the trace table times.
_STEP_LEGEND = (
    "step: bucketpool `with pool.acquire(n) as bufs: views = bufs.shrink(end)`; the original "
    "(vLLM's, in bench/_original.py) and compat `bufs = pool.acquire(n)`, three [:end] slices, "
    "`pool.release(bufs)`; end = n in 3 steps of 4, else uniform in [n // 2, n)."
)
#: Verdicts, worst first.
_VERDICTS: tuple[Verdict, ...] = ("FAIL", "UNSURE", "LOADED", "PASS")
#: Promises the tables and the counts show with their verdicts: not repeated below them.
_SHOWN = (
    HOST_STEP,
    STEP,
    *(f"add_copies/numpy ({s})" for s in _SOURCES),
    "setitem/add_copies",
    *(s.figure for s in PROMISES if s.applies_to("view-cache")),
)


def _wrap(text: str, indent: str = "  ") -> list[str]:
    """*text* in lines of at most `WIDTH` columns, the later ones indented by *indent*."""
    return textwrap.wrap(
        text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
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
    """Format a figure in its unit: ``0.38x``, ``1,234 ns``, ``1.5 KiB``, ``12``, ``0.57``."""
    if unit == "x":
        return f"{value:,.3g}x" if value < 10 else f"{value:,.0f}x"
    if unit == "bytes":
        return format_bytes(value)
    if unit == "count" and abs(value) < 100 and not float(value).is_integer():
        return f"{value:.3g}"  # a mean count: 0.57 view sets a step, not 1
    suffix = {"ns": " ns", "ops/s": " ops/s"}.get(unit, "")
    return f"{value:,.0f}{suffix}"


def format_measurement(measurement: Measurement) -> str:
    """Format a figure with its interval: ``0.29x [0.28x-0.31x]`` (exact figures alone)."""
    text = format_value(measurement.value, measurement.unit)
    if not measurement.timed:
        return text
    low, high = (format_value(v, measurement.unit) for v in (measurement.low, measurement.high))
    return f"{text} [{low}-{high}]"


def _factor(value: float) -> str:
    """A factor above 1 as the report writes it (``1.3x``, ``2x``), never as ``1x``."""
    text = format_value(value, "x")
    return f"{value:.4g}x" if text == "1x" else text


def in_words(measurement: Measurement) -> str:
    """Say in words how a ratio a/b's *a* compares with *b*.

    Of times: ``1.3x slower`` (a takes 1.3 times b's time), ``2x faster`` (a ratio of 0.5),
    or ``cannot tell`` when the interval holds 1.  Exact ratios (counts, bytes): ``2x more``,
    ``2x less``, ``the same`` or ``none``.

    Raises:
        ValueError: the figure is not a ratio (its unit is not ``x``).
    """
    if measurement.unit != "x":
        raise ValueError(f"not a ratio: {measurement.unit}")
    value = measurement.value
    if measurement.timed:
        if measurement.low <= 1 <= measurement.high:
            return "cannot tell"
        return f"{_factor(value)} slower" if value > 1 else f"{_factor(1 / value)} faster"
    if value == 1 or value <= 0:
        return "the same" if value == 1 else "none"
    return f"{_factor(value)} more" if value > 1 else f"{_factor(1 / value)} less"


def _compares(figure: str, measurement: Measurement) -> bool:
    """Whether *figure* compares two things, so that words can say which wins.

    Timed ratios do; an exact ratio does where its name says ``a/b`` (two pools' counts),
    not ``a / b`` (a figure over its bound: ``final bytes / cache cap``).
    """
    return measurement.unit == "x" and (
        measurement.timed or re.search(r"\S/\S", figure) is not None
    )


def _columns(rows: Sequence[Sequence[str]], align: str, wrap: int | None = None) -> list[str]:
    """Rows as aligned columns, each left (``l`` in *align*) or right (``r``) aligned.

    The column *wrap* (left aligned) takes what `WIDTH` leaves it; longer cells continue on
    the next lines.
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(align))]
    if wrap is not None:
        room = WIDTH - sum(widths) + widths[wrap] - 2 * (len(align) - 1)
        widths[wrap] = min(widths[wrap], max(room, 12))
        lines: list[Sequence[str]] = []
        for row in rows:
            parts = textwrap.wrap(row[wrap], widths[wrap], subsequent_indent=" ") or [""]
            lines.append([*row[:wrap], parts[0], *row[wrap + 1 :]])
            lines += [[""] * wrap + [part] + [""] * (len(align) - wrap - 1) for part in parts[1:]]
        rows = lines
    return [
        "  ".join(
            cell.ljust(width) if side == "l" else cell.rjust(width)
            for cell, width, side in zip(row, widths, align, strict=True)
        ).rstrip()
        for row in rows
    ]


def _verdicts(checks: Sequence[Check], *, short: bool = False) -> str:
    """``PASS``, or the verdicts counted (``1 FAIL, 2 PASS``); ``-`` for none.

    With *short*, mixed verdicts give the worst one's count only: ``1/3 FAIL``.
    """
    counts = collections.Counter(check.verdict for check in checks)
    if len(counts) == 1:
        return next(iter(counts))
    if short and counts:
        worst = next(v for v in _VERDICTS if counts[v])
        return f"{counts[worst]}/{len(checks)} {worst}"
    return ", ".join(f"{counts[v]} {v}" for v in _VERDICTS if counts[v]) or "-"


def _bound(checks: Sequence[Check], *, kind: bool = False) -> str:
    """The bound of the first check, in its figure's unit; with *kind*, a goal's says so."""
    if not checks:
        return ""
    spec = checks[0].spec
    goal = " (goal)" if kind and spec.kind == "goal" else ""
    return f"{spec.op} {format_value(spec.limit, checks[0].measurement.unit)}{goal}"


def _micros(ns: float, *, sign: bool = False) -> str:
    """*ns* in µs: ``176.9``, ``2,130``; with *sign*, ``+30`` or ``-4.2``."""
    digits = 1 if abs(ns) < 10_000 else 0
    return f"{ns / 1000:{'+' if sign else ''},.{digits}f}"


def _host_table(result: BenchResult, cases: Sequence[str]) -> list[str]:
    """A row per host-step case: vLLM's step, ``install()``'s ratio to it in words, control."""
    rows = [
        ("", "vLLM's", HOST_STEP, "install() makes", "", "", "control"),
        (
            "host step",
            "µs/step",
            f"[{CONFIDENCE:.0%} interval]",
            "vLLM's step",
            "bound",
            "verdict",
            CONTROL,
        ),
    ]
    for name in cases:
        figures = result.figures[name]
        step = _of(result, name, HOST_STEP)
        extra = _micros(figures[EXTRA].value, sign=True)
        rows.append(
            (
                name,
                _micros(figures["vllm ns/step"].value),
                format_measurement(figures[HOST_STEP]),
                f"{in_words(figures[HOST_STEP])}, {extra} µs",
                _bound(step),
                _verdicts(step),
                format_value(figures[CONTROL].value, "x"),
            )
        )
    return _columns(rows, "lrrlrlr")


def _count_table(result: BenchResult, case: str) -> list[str]:
    """The checked counts of *case*: each with its bound and verdict (exact: no interval)."""
    rows = [(f"{case}, counted exactly (the same on any machine)", "", "bound", "verdict")]
    for check in (c for c in result.checks if c.case == case):
        measured = check.measurement
        rows.append(
            (
                check.spec.figure,
                format_value(measured.value, measured.unit),
                _bound([check]),
                check.verdict,
            )
        )
    return _columns(rows, "lrrl")


def _trace_table(result: BenchResult, traces: Sequence[TraceCase]) -> list[str]:
    """A row per trace: the step's ratio and its words, bound, verdict; peak bytes in words."""
    rows = [
        ("", "original", STEP, "bucketpool", "", "", "peak bytes"),
        (
            "trace",
            "ns/step",
            f"[{CONFIDENCE:.0%} interval]",
            "in words",
            "bound",
            "verdict",
            "in words",
        ),
    ]
    for case in traces:
        figures = result.figures[case.name]
        step = _of(result, case.name, STEP)[:1]  # the promise, else the first goal
        original, ours = (
            figures[f"{pool} peak bytes"].value for pool in ("original", "bucketpool")
        )
        rows.append(
            (
                case.name,
                format_value(figures["original ns/step"].value, "count"),
                format_measurement(figures[STEP]),
                in_words(figures[STEP]),
                _bound(step, kind=True),
                _verdicts(step),
                in_words(exact(ours / original, "x")) if original else "-",
            )
        )
    return _columns(rows, "lrrlrll")


def _fill_table(result: BenchResult, fills: Sequence[FillsCase]) -> list[str]:
    """A row per k: each ratio in words (a of a/b is), with its verdict."""
    figures = (*(f"add_copies/numpy ({s})" for s in _SOURCES), "setitem/add_copies")
    setitem = _bound(_of(result, fills[0].name, "setitem/add_copies")) or ">= 100x"
    rows = [("", "add_copies", "", *("add_copies/numpy" for _ in _SOURCES), figures[-1])]
    rows.append(("fills: k", "ns/call", "bound", *(f"({s})" for s in _SOURCES), f"({setitem})"))
    for case in fills:
        cells = []
        for figure in figures:
            measured = result.figures[case.name].get(figure)
            checks = [c for c in _of(result, case.name, figure) if c.spec.kind == "promise"]
            text = in_words(measured) if measured else "-"
            cells.append(f"{text} {_verdicts(checks)}" if checks else text)
        ns = result.figures[case.name]["add_copies (arrays) ns/call"].value
        bound = _bound(_of(result, case.name, "add_copies/numpy (arrays)"))
        rows.append((f"{case.k:,}", format_value(ns, "count"), bound, *cells))
    return _columns(rows, "rrrrrr")


def _of(result: BenchResult, case: str, figure: str) -> list[Check]:
    return [c for c in result.checks if c.case == case and c.spec.figure == figure]


def _excess(check: Check) -> float:
    """How far past its bound a check's value is, relative to the bound (higher: worse)."""
    over = check.measurement.value - check.spec.limit
    return (over if check.spec.op == "<=" else -over) / (abs(check.spec.limit) or 1)


def _worst(checks: Sequence[Check]) -> Check:
    return min(checks, key=lambda c: (_VERDICTS.index(c.verdict), -_excess(c)))


def _groups(checks: Sequence[Check]) -> list[list[Check]]:
    """The checks by (kind, figure), in first-seen order."""
    groups: dict[tuple[str, str], list[Check]] = {}
    for check in checks:
        groups.setdefault((check.spec.kind, check.spec.figure), []).append(check)
    return list(groups.values())


def _target_rows(checks: Sequence[Check]) -> list[str]:
    """One row per (kind, figure) with its worst case, but the promises the tables judge.

    The promises, then the goals under a heading of their own; a figure comparing a with b
    (a/b) says in words how a compares.
    """
    heads = {
        "promise": ("promises (--check fails on them)", "bound", "worst case", "value", "in words"),
        "goal": ("goals (never fail --check)", "", "", "", ""),
    }
    rows: list[tuple[str, ...]] = []
    for group in _groups(checks):
        spec = group[0].spec
        if spec.kind == "promise" and spec.figure in _SHOWN:
            continue  # in the tables above, case by case
        if spec.kind in heads:
            rows.append((*heads.pop(spec.kind), "verdict" if rows == [] else ""))
        worst = _worst(group)
        measured = worst.measurement
        value = format_value(measured.value, measured.unit)
        words = in_words(measured) if _compares(spec.figure, measured) else ""
        verdict = _verdicts(group, short=True)
        rows.append((spec.figure, _bound([worst]), worst.case, value, words, verdict))
    return _columns(rows, "lrlrll", wrap=0) if rows else []  # (every one shown above)


def _every_check(checks: Sequence[Check]) -> list[str]:
    """Every check, under its kind and figure."""
    lines = []
    for group in _groups(checks):
        lines.append(f"{group[0].spec.kind} {group[0].spec.figure}:")
        rows = []
        for check in group:
            verdict: str = check.verdict
            if verdict == "LOADED":
                verdict += f" (interval: {check.interval_verdict})"
            measured = check.measurement
            words = in_words(measured) if _compares(check.spec.figure, measured) else ""
            text = format_measurement(measured)
            rows.append(("", check.case, text, words, _bound([check]), verdict))
        lines += _columns(rows, "llrlrl")
    return lines


def _counts(checks: Sequence[Check], kind: str) -> str:
    counts = collections.Counter(check.verdict for check in checks if check.spec.kind == kind)
    return ", ".join(f"{counts[v]} {v}" for v in ("PASS", "FAIL", "UNSURE", "LOADED"))


def _named(start: str, checks: Sequence[Check]) -> str:
    """*start* and the *checks*' names if they fit in `WIDTH` columns, else their cases'."""
    line = f"{start}: {'; '.join(check.name for check in checks)}"
    cases = list(dict.fromkeys(check.case for check in checks))
    for shown in range(len(cases), 0, -1):
        if len(line) <= WIDTH:
            break
        more = f" and {len(cases) - shown} more" if shown < len(cases) else ""
        line = f"{start}, on {', '.join(cases[:shown])}{more} (see above)"
    return line


def _verdict_line(checks: Sequence[Check], *, strict: bool) -> str:
    """What the judged targets (promises; with *strict*, every target) came to."""
    what = "target" if strict else "promise"
    judged = [check for check in checks if strict or check.spec.kind == "promise"]
    failed = [check for check in judged if check.verdict == "FAIL"]
    unsure = [check for check in judged if check.verdict in ("UNSURE", "LOADED")]
    if failed:
        return _named(f"{len(failed)} {what}{'s' * (len(failed) > 1)} FAILED", failed)
    if unsure:
        return _named(f"no {what} FAILED; not judged (UNSURE or LOADED)", unsure)
    if not judged:
        return f"no {what} applies to the cases run"
    return f"every {what} held ({len(judged)} PASS)"


def _exit_line(checks: Sequence[Check], *, strict: bool) -> str:
    status = exit_status(checks, strict=strict)
    flag, what = ("--strict-check", "target") if strict else ("--check", "promise")
    if status == CHECK_FAILED:
        return f"{flag}: exit {status}, a {what} FAILs"
    if status == CHECK_UNSURE:
        return f"{flag}: exit {status}, no {what} FAILs but some could not be judged"
    if not any(strict or check.spec.kind == "promise" for check in checks):
        return f"{flag}: exit {status}, no {what} applies to the cases run"
    return f"{flag}: exit {status}, every {what} holds"


def _loaded(result: BenchResult, *, verbose: bool) -> list[str]:
    """Say once, before the figures, that load left timing verdicts unjudged, and what to do."""
    loaded = [check for check in result.checks if check.verdict == "LOADED"]
    if not loaded:
        return []
    timed = [c for c in result.checks if c.measurement.timed or c.verdict == "LOADED"]
    cases = list(dict.fromkeys(check.case for check in loaded))
    cpus = result.environment["cpus"]
    free = (cpus if isinstance(cpus, int) else 1) - 1 + LOAD_TOLERANCE
    where = f" ({', '.join(cases)})" if verbose else ""
    return _wrap(
        f"MACHINE LOOKS LOADED: {len(loaded)} of {len(timed)} timing verdicts are LOADED, not "
        f"judged{where}: other work ran (up to {max(result.load[c] for c in cases):.1f} other "
        f"tasks runnable on {cpus} CPUs), or a baseline's rounds varied by over a quarter. "
        "Their figures are printed as measured, but may be off. To judge them, rerun on a quiet "
        f"machine: stop other work and check that `uptime` shows a load average under {free:g} "
        "(`top` shows what runs).",
        "",
    )


def _closing(result: BenchResult, *, check: bool, strict: bool) -> list[str]:
    checks = result.checks
    lines = [
        f"run took {result.duration_s:.0f} s; promises: {_counts(checks, 'promise')}",
        f"goals (never failing --check): {_counts(checks, 'goal')}",
    ]
    if any(c.verdict == "UNSURE" for c in checks):
        lines.append("UNSURE: the interval straddles the bound after the extra rounds (--budget).")
    lines.append(_verdict_line(checks, strict=strict))
    if check or strict:
        lines.append(_exit_line(checks, strict=strict))
    return lines


def _case_blocks(result: BenchResult) -> list[str]:
    """Every case: its name, rounds and description, then each figure, its interval, words."""
    lines = []
    for case in result.cases:
        lines += _wrap(f"{case.name} ({result.rounds[case.name]} rounds): {case.description}")
        rows = [
            ("", figure, format_measurement(m), in_words(m) if _compares(figure, m) else "")
            for figure, m in result.figures[case.name].items()
        ]
        lines += _columns(rows, "llrl", wrap=1) if rows else []
    return lines


def render_table(
    result: BenchResult, *, verbose: bool = False, check: bool = False, strict: bool = False
) -> str:
    """Return the report, ending in a newline, every line within `WIDTH` columns.

    Its last line says what the promises came to (with *strict*: every target), or with
    *check* or *strict* the exit status.
    """
    env = result.environment
    lines = _wrap(
        f"bucketpool {env['version']} benchmark: Python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}, {env['cpus']} CPUs, {env['platform']}"
    )
    lines += _wrap(_LEGEND, "")
    if advice := _loaded(result, verbose=verbose):
        lines += ["", *advice]
    hosts = [case.name for case in result.cases if HOST_STEP in result.figures[case.name]]
    if hosts:
        lines += ["", *_wrap(_HOST_LEGEND, ""), *_host_table(result, hosts)]
    for case in result.cases:
        if isinstance(case, ViewCacheCase) and result.figures[case.name]:
            lines += ["", *_count_table(result, case.name)]
    traces = [case for case in result.cases if isinstance(case, TraceCase)]
    fills = [case for case in result.cases if isinstance(case, FillsCase)]
    if traces:
        lines += ["", *_wrap(_STEP_LEGEND, ""), *_trace_table(result, traces)]
    if fills:
        lines += ["", *_fill_table(result, fills)]
    for case in result.cases:
        if isinstance(case, FillStepCase):
            ratios = result.figures[case.name]
            text = ", ".join(
                f"{format_measurement(ratios[f'{STEP} ({way})'])} against {way} "
                f"({in_words(ratios[f'{STEP} ({way})'])})"
                for way in ("setitem", "numpy")
            )
            lines += [
                "",
                *_wrap(
                    f"fill-step ({case.trace.name}, {case.trace.ops:,} steps, add_copies from "
                    f"arrays), {STEP}: {text}"
                ),
            ]
    if verbose:
        lines += ["", *_case_blocks(result)]
    targets = (_every_check if verbose else _target_rows)(result.checks)
    lines += ["", *targets] if targets else []
    closing = _closing(result, check=check, strict=strict)
    return "\n".join([*lines, "", *closing]) + "\n"
