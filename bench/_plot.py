"""``--plot FILE``: the timed ratios with their intervals and bounds, drawn (SVG or PNG).

One row per timed ratio that a promise or goal bounds, grouped by case, the host steps first
as in the report: a dot at the median, coloured by the verdict of its first target (the
promise where there is one), the interval as an error bar, the promise's bound as a bar and
a goal's as a hollow diamond; a dotted line at 1x, where a is as fast as b.  The scale is
logarithmic, so that 2x slower and 2x faster lie as far from 1x.  matplotlib is the ``plot``
extra, imported only here, only when asked for, and drawn without pyplot (no window, no
global state).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench._runner import BenchResult
from bench._stats import Measurement, Verdict
from bench._targets import HOST_STEP, Check

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["FORMATS", "INSTALL", "plot", "unavailable"]

#: What ``--plot`` writes, by the file's suffix.
FORMATS = (".svg", ".png")
#: How to get matplotlib, from a checkout.
INSTALL = "pip install '.[plot]'"
_COLOURS: dict[Verdict, str] = {
    "PASS": "tab:green",
    "FAIL": "tab:red",
    "UNSURE": "tab:orange",
    "LOADED": "tab:gray",
}
#: How a bound is marked, by its kind.
_BOUNDS: dict[str, dict[str, Any]] = {  # (matplotlib's keyword arguments)
    "promise": {"marker": "|", "markersize": 14, "markeredgewidth": 2.5, "color": "black"},
    "goal": {"marker": "D", "markersize": 6, "fillstyle": "none", "color": "black"},
}
_ROW_INCHES = 0.26


def unavailable() -> str | None:
    """Say why ``--plot`` cannot draw here (matplotlib is not installed), else None."""
    try:
        import matplotlib  # noqa: F401 (imported only when --plot asks)
    except ImportError:
        return f"needs matplotlib, the benchmark's plot extra: {INSTALL} in the checkout"
    return None


def _rows(result: BenchResult) -> list[tuple[str, str, Measurement, list[Check]]]:
    """(case, figure, its measurement, its checks) per bounded timed ratio, in run order."""
    rows: dict[tuple[str, str], list[Check]] = {}
    for check in result.checks:
        if check.measurement.timed and check.measurement.unit == "x":
            rows.setdefault((check.case, check.spec.figure), []).append(check)
    order = {case.name: i for i, case in enumerate(result.cases)}
    hosts = {case for case, figure in rows if figure == HOST_STEP}  # first, as in the report

    def place(key: tuple[str, str]) -> tuple[bool, int]:
        return key[0] not in hosts, order.get(key[0], len(order))

    keys = sorted(rows, key=place)  # (stable: a case's figures in target order)
    return [
        (case, figure, rows[case, figure][0].measurement, rows[case, figure])
        for case, figure in keys
    ]


def _title(result: BenchResult) -> str:
    env = result.environment
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"bucketpool {env['version']}: timed ratios a/b, {now}\n"
        f"{env['platform']}, {env['cpus']} CPUs; Python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}"
    )


def _draw(figure: Figure, rows: Sequence[tuple[str, str, Measurement, list[Check]]]) -> None:
    """Draw *rows* on *figure*, top to bottom."""
    from matplotlib.lines import Line2D  # (the extra: imported only when --plot asks)
    from matplotlib.ticker import FuncFormatter

    axes = figure.subplots()
    top = len(rows) - 1
    for i, (case, _, measured, checks) in enumerate(rows):
        y = top - i
        colour = _COLOURS[checks[0].verdict]
        error = [[measured.value - measured.low], [measured.high - measured.value]]
        axes.errorbar(measured.value, y, xerr=error, fmt="o", color=colour, capsize=3, zorder=3)
        for check in checks:
            axes.plot(check.spec.limit, y, linestyle="none", zorder=4, **_BOUNDS[check.spec.kind])
        if i and rows[i - 1][0] != case:
            axes.axhline(y + 0.5, color="lightgray", linewidth=0.8)  # a new case
    axes.axvline(1.0, color="black", linewidth=0.8, linestyle=":")
    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    axes.set_yticks(
        range(len(rows)), [f"{case}: {figure}" for case, figure, _, _ in reversed(rows)]
    )
    axes.set_ylim(-0.7, top + 0.7)
    axes.set_xlabel("a/b (log scale): left of 1x a is faster, right slower")
    axes.grid(axis="x", color="whitesmoke", zorder=0)
    handles = [
        Line2D([], [], marker="o", linestyle="none", color=colour, label=verdict)
        for verdict, colour in _COLOURS.items()
    ]
    handles += [
        Line2D([], [], linestyle="none", label=f"{kind} bound", **_BOUNDS[kind])
        for kind in ("promise", "goal")
    ]
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize="small")


def plot(result: BenchResult, path: str) -> None:
    """Draw *result*'s bounded timed ratios into *path*, SVG or PNG by its suffix.

    Raises:
        ValueError: the suffix is not one of `FORMATS`.
        ImportError: matplotlib is not installed (see `unavailable`).
    """
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"cannot draw {path!r}: its name must end in {' or '.join(FORMATS)}")
    import matplotlib  # (the extra: imported only when --plot asks)
    from matplotlib.figure import Figure

    rows = _rows(result)
    # Text as text in an SVG (searchable, small), not as paths.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure = Figure(figsize=(11, 1.8 + _ROW_INCHES * max(len(rows), 1)), layout="constrained")
        figure.suptitle(_title(result), fontsize="medium")
        if rows:
            _draw(figure, rows)
        else:
            figure.text(0.5, 0.5, "no timed ratio with a target in this run", ha="center")
        figure.savefig(path, format=suffix[1:], dpi=120)
