"""The ``--plot`` report: one PNG of a run, drawn with matplotlib (the ``plot`` extra).

Four panels: the traces' ratios to the original, the other timed cases, the fills, and
bytes held over the recorded trace.  Every timed point carries its interval as an error
bar, and every target is a dashed segment at its case.  Uses matplotlib's Agg canvas
directly, so no global backend is changed.
"""

from __future__ import annotations

import datetime
import fnmatch
import typing
from collections.abc import Mapping, Sequence

from bucketpool.bench._cases import TraceCase
from bucketpool.bench._fills import FillsCase
from bucketpool.bench._runner import BenchResult
from bucketpool.bench._stats import Measurement
from bucketpool.bench._targets import Check

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
_OTHER_FIGURES = (
    ("parked-*", "parked/none parked", "parked / none"),
    ("threads-*", "bucketpool/original throughput", "8 threads: throughput"),
    ("threads-*", "bare acquire/release throughput ratio", "8 threads: bare"),
    ("debug", "checks/off", "debug checks / off"),
    ("debug", "strict/off", "debug strict / off"),
)
_FILL_FIGURES = (
    ("setitem/add_copies", "setitem / add_copies"),
    ("add_copies/numpy", "add_copies / numpy"),
    ("add_block_copies-consecutive/add_copies", "blocks (consec.) / add_copies"),
    ("add_block_copies-shuffled/add_copies", "blocks (shuffled) / add_copies"),
)


def _limits(checks: Sequence[Check]) -> dict[tuple[str, str], float]:
    return {(check.case, check.spec.figure): check.spec.limit for check in checks}


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
    axes: Axes, xs: Sequence[float], limits: Sequence[float | None], style: str, label: str
) -> None:
    colour = _STYLES[style][0]
    labelled = False
    for x, limit in zip(xs, limits, strict=True):
        if limit is None:
            continue
        axes.hlines(
            limit,
            x - 0.35,
            x + 0.35,
            colors=colour,
            linestyles="dashed",
            linewidth=2,
            label="_nolegend_" if labelled else label,
        )
        labelled = True


def _traces_panel(axes: Axes, result: BenchResult, traces: Sequence[TraceCase]) -> None:
    limits = _limits(result.checks)
    xs = list(range(len(traces)))
    for offset, impl in ((-0.1, "bucketpool"), (0.1, "compat")):
        figure = f"{impl}/original"
        points = [x + offset for x in xs]
        _errorbar(axes, points, [result.figures[t.name][figure] for t in traces], impl, impl)
        marks = [limits.get((t.name, figure)) for t in traces]
        _target_marks(axes, xs, marks, impl, f"{impl} target")
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
    limits = _limits(result.checks)
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
        axes, xs, [limits.get((case, figure)) for case, figure, _ in present], "original", "target"
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


def _title(result: BenchResult) -> str:
    env = result.environment
    machine = typing.cast("Mapping[str, object]", env["machine"])
    day = datetime.date.today().isoformat()
    mode = "quick" if result.settings.quick else "full"
    return (
        f"bucketpool {env['version']} benchmark ({mode}, {day}): {machine['platform']}, "
        f"{machine['cpus']} CPUs; Python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}\nerror bars: bootstrap 95% interval of the median per-round "
        "ratio; dashed: target"
    )


def plot(result: BenchResult, path: str | os.PathLike[str]) -> None:
    """Draw *result* to a PNG file at *path*.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'bucketpool[plot]'``).
        OSError: the file cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(15, 10), layout="constrained")
    FigureCanvasAgg(figure)
    (traces_axes, other_axes), (fills_axes, bytes_axes) = figure.subplots(2, 2)
    traces = [case for case in result.cases if isinstance(case, TraceCase)]
    if traces:
        _traces_panel(traces_axes, result, traces)
    _named_panel(other_axes, result, _OTHER_FIGURES, "parked, threads, debug levels")
    fills = [("fills", figure_name, label) for figure_name, label in _FILL_FIGURES]
    if any(isinstance(case, FillsCase) for case in result.cases):
        _named_panel(fills_axes, result, fills, "fills: ratios of ns per call")
    recorded = next((case for case in traces if case.series), None)
    _bytes_panel(bytes_axes, result, recorded)
    figure.suptitle(_title(result))
    figure.savefig(path, format="png", dpi=90)
