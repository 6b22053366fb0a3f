"""The ``--plot`` report: one PNG of a run, drawn with matplotlib (the ``plot`` extra).

Six panels: the traces' ratios to the original; the parked and debug cases; the threads
cases; the fills; bytes held over the recorded trace; and the verdicts in words.  Every
timed point carries its interval as an error bar; a promise's bound is a solid segment at
its case, a goal's a dashed one.  Uses matplotlib's Agg canvas directly, so no global
backend is changed.
"""

from __future__ import annotations

import datetime
import fnmatch
import typing
from collections.abc import Mapping, Sequence

from bench._cases import TraceCase
from bench._fills import FillsCase
from bench._runner import BenchResult
from bench._stats import Measurement
from bench._targets import Check, Kind

if typing.TYPE_CHECKING:
    import os

    from matplotlib.axes import Axes

__all__ = ["plot"]

#: Series to (colour, marker, line style): told apart in colour and in black and white.
_STYLES = {
    "bucketpool": ("tab:blue", "o", "-"),
    "compat": ("tab:orange", "s", "--"),
    "original": ("tab:grey", "^", ":"),
    "other": ("tab:green", "D", "-"),
}
#: A promise's bound is drawn solid, a goal's dashed.
_BOUND_STYLES: dict[Kind, typing.Literal["solid", "dashed"]] = {
    "promise": "solid",
    "goal": "dashed",
}
_PARKED_FIGURES = (
    ("parked-[0-9]*", "parked/none parked", "parked / none"),
    ("evented", "evented/plain", "evented / plain"),
    ("parked-stuck", "stuck/none stuck", "stuck / none"),
    ("debug", "checks/off", "debug checks / off"),
    ("debug", "strict/off", "debug strict / off"),
)
_THREAD_FIGURES = (
    ("threads-[0-9]", "bucketpool/original throughput", "throughput / original's"),
    ("threads-[0-9]", "bare acquire/release throughput ratio", "bare / original's"),
    ("threads-*-switch", "throughput at 100us / at default", "100 us / default"),
    (
        "threads-*-switch",
        "p99 op latency at 100us / single-thread median op",
        "p99 at 100 us / 1 thread",
    ),
)
_FILL_FIGURES = (
    ("setitem/add_copies", "setitem / add_copies"),
    ("add_copies/numpy", "add_copies / numpy"),
    ("add_block_copies-consecutive/add_copies", "blocks (consec.) / add_copies"),
    ("add_block_copies-shuffled/add_copies", "blocks (shuffled) / add_copies"),
)


_Bounds = dict[tuple[str, str], list[tuple[float, Kind]]]


def _bounds(checks: Sequence[Check]) -> _Bounds:
    """(case, figure) to the bounds on it, with their kinds."""
    bounds: _Bounds = {}
    for check in checks:
        bounds.setdefault((check.case, check.spec.figure), []).append(
            (check.spec.limit, check.spec.kind)
        )
    return bounds


def _errorbar(
    axes: Axes,
    xs: Sequence[float],
    figures: Sequence[Measurement],
    style: str,
    label: str,
    *,
    joined: bool = True,
) -> None:
    colour, marker, line = _STYLES[style]
    if not joined:  # separate cases: a line between them would suggest a trend
        line = "none"
    values = [m.value for m in figures]
    below = [m.value - m.low for m in figures]
    above = [m.high - m.value for m in figures]
    axes.errorbar(
        xs,
        values,
        yerr=[below, above],
        color=colour,
        marker=marker,
        linestyle=line,
        capsize=4,
        label=label,
    )


def _target_marks(
    axes: Axes,
    xs: Sequence[float],
    bounds: Sequence[Sequence[tuple[float, Kind]]],
    style: str,
    label: str,
) -> None:
    colour = _STYLES[style][0]
    labelled: set[Kind] = set()
    for x, marks in zip(xs, bounds, strict=True):
        for limit, kind in marks:
            axes.hlines(
                limit,
                x - 0.35,
                x + 0.35,
                colors=colour,
                linestyles=_BOUND_STYLES[kind],
                linewidth=2,
                label="_nolegend_" if kind in labelled else f"{label} ({kind})",
            )
            labelled.add(kind)


def _traces_panel(axes: Axes, result: BenchResult, traces: Sequence[TraceCase]) -> None:
    bounds = _bounds(result.checks)
    xs = list(range(len(traces)))
    for offset, impl in ((-0.1, "bucketpool"), (0.1, "compat")):
        figure = f"{impl}/original"
        timed = [
            (x, t.name) for x, t in zip(xs, traces, strict=True) if figure in result.figures[t.name]
        ]
        points = [x + offset for x, _ in timed]
        _errorbar(axes, points, [result.figures[name][figure] for _, name in timed], impl, impl)
        marks = [bounds.get((name, figure), []) for _, name in timed]
        _target_marks(axes, [x for x, _ in timed], marks, impl, f"{impl} bound")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(xs, [t.name for t in traces], rotation=40, ha="right")
    axes.set_ylabel("ns/op / original's (per-round ratio)")
    axes.set_title("traces: ratio to the original (lower is better)")
    axes.legend(fontsize="small")


def _named_panel(
    axes: Axes,
    result: BenchResult,
    entries: Sequence[tuple[str, str, str]],
    title: str,
) -> None:
    bounds = _bounds(result.checks)
    present = []
    for pattern, figure, label in entries:
        for case, figures in result.figures.items():
            if fnmatch.fnmatchcase(case, pattern) and figure in figures:
                present.append((case, figure, label))
    if not present:
        axes.text(0.5, 0.5, "not run", ha="center", transform=axes.transAxes)
        axes.set_title(title)
        return
    xs = list(range(len(present)))
    measured = [result.figures[case][figure] for case, figure, _ in present]
    _errorbar(axes, xs, measured, "other", "measured", joined=False)
    _target_marks(
        axes,
        xs,
        [bounds.get((case, figure), []) for case, figure, _ in present],
        "original",
        "bound",
    )
    verdicts = {(check.case, check.spec.figure): check.verdict for check in result.checks}
    for x, (case, figure, _), point in zip(xs, present, measured, strict=True):
        verdict = verdicts.get((case, figure), "report only")
        axes.annotate(
            verdict, (x, point.value), xytext=(8, 0), textcoords="offset points", fontsize="small"
        )
    axes.set_yscale("log")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(xs, [label for _, _, label in present], rotation=25, ha="right")
    axes.set_ylabel("ratio (log scale)")
    axes.set_title(title)
    axes.legend(fontsize="small")


def _bytes_panel(axes: Axes, result: BenchResult, recorded: TraceCase | None) -> None:
    if recorded is None:
        axes.text(0.5, 0.5, "no trace recorded bytes (run spike)", ha="center")
        return
    for index, (impl, held) in enumerate(recorded.series.items()):
        colour, marker, line = _STYLES.get(impl, _STYLES["other"])
        step = max(len(held) // 12, 1)
        label = f"{impl} (a BucketPool inside)" if impl == "compat" else impl
        axes.plot(
            [count / (1 << 20) for count in held],
            linestyle=line,
            marker=marker,
            markevery=(index * step // 3, step),  # staggered: overlapping lines stay apart
            color=colour,
            label=label,
        )
    measured = result.figures[recorded.name]
    ours = measured["bucketpool final bytes"].value
    ratio = measured["bucketpool final bytes / cache cap"].value
    if ratio:
        cap = ours / ratio / (1 << 20)
        axes.axhline(cap, color="black", linewidth=0.8, linestyle="-.", label="cache cap")
    axes.set_yscale("symlog", linthresh=0.1)
    axes.set_xlabel("op index")
    axes.set_ylabel("MiB held (cached + handed out)")
    axes.set_title(f"bytes held over {recorded.name}")
    axes.legend(fontsize="small")


def _verdicts_panel(axes: Axes, result: BenchResult) -> None:
    """The verdicts in words: counts per kind, and every target that did not PASS."""
    lines = []
    for kind in ("promise", "goal"):
        checks = [check for check in result.checks if check.spec.kind == kind]
        passed = sum(check.verdict == "PASS" for check in checks)
        lines.append(f"{kind}s: {passed} of {len(checks)} PASS")
        missed = [f"  {c.verdict}: {c.name}" for c in checks if c.verdict != "PASS"]
        lines += missed[:12]
        if len(missed) > 12:
            lines.append(f"  ... and {len(missed) - 12} more (see the table)")
    site = result.figures.get("leak-site", {}).get("site cost per call")
    if site is not None:
        share = result.figures["leak-site"]["site cost / with-acquire op"]
        lines.append(f"leak site: {site.value:,.0f} ns per call, {share.value:.1f}% of the op")
    axes.axis("off")
    axes.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize="small")
    axes.set_title("verdicts (--check judges the promises)")


def _title(result: BenchResult) -> str:
    env = result.environment
    machine = typing.cast("Mapping[str, object]", env["machine"])
    day = datetime.date.today().isoformat()
    mode = "quick" if result.settings.quick else "full"
    return (
        f"bucketpool {env['version']} benchmark ({mode}, {day}): {machine['platform']}, "
        f"{machine['cpus']} CPUs; Python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}\nratios: time per op over the baseline's in the same round, "
        "lower is better unless the bound says >=; error bars: bootstrap 95% interval of "
        "the median; bounds: solid a promise, dashed a goal"
    )


def plot(result: BenchResult, path: str | os.PathLike[str]) -> None:
    """Draw *result* to a PNG file at *path*.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'bucketpool[plot]'``).
        OSError: the file cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(20, 11), layout="constrained")
    FigureCanvasAgg(figure)
    (traces_axes, parked_axes, threads_axes), (fills_axes, bytes_axes, verdict_axes) = (
        figure.subplots(2, 3)
    )
    traces = [case for case in result.cases if isinstance(case, TraceCase)]
    if traces:
        _traces_panel(traces_axes, result, traces)
    _named_panel(parked_axes, result, _PARKED_FIGURES, "parked handles, debug levels: ratios")
    _named_panel(
        threads_axes,
        result,
        _THREAD_FIGURES,
        "threads: throughput ratios (higher is better), p99 ratio (lower)",
    )
    fills = [("fills", figure_name, label) for figure_name, label in _FILL_FIGURES]
    if any(isinstance(case, FillsCase) for case in result.cases):
        _named_panel(fills_axes, result, fills, "fills: ratios of ns per call")
    recorded = next((case for case in traces if case.series), None)
    _bytes_panel(bytes_axes, result, recorded)
    _verdicts_panel(verdict_axes, result)
    figure.suptitle(_title(result))
    figure.savefig(path, format="png", dpi=90)
