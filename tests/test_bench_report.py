"""The report of one tiny run: a one-screen summary, or (``verbose``) every figure and check."""

from __future__ import annotations

import _bench_case
import pytest

from bench import _report as report
from bench._runner import BenchResult
from bench._stats import Measurement, exact
from bench._traces import TRACE_NAMES

#: The most lines the summary may take: one screen.
SCREEN = 60


@pytest.fixture(scope="module")
def tiny_run() -> BenchResult:
    """Every trace and case at toy sizes: a report as long as a full run's."""
    return _bench_case.tiny_run(None)


def test_formatting() -> None:
    assert report.format_bytes(512) == "512 B"
    assert report.format_bytes(1536) == "1.5 KiB"
    assert report.format_bytes(24 << 20) == "24.0 MiB"
    assert report.format_value(0.294, "x") == "0.294x"
    assert report.format_value(2178.4, "x") == "2,178x"
    assert report.format_value(1234.4, "ns") == "1,234 ns"
    assert report.format_value(12, "count") == "12"
    assert report.format_value(812_345.6, "ops/s") == "812,346 ops/s"
    assert report.format_measurement(Measurement(0.3, 0.29, 0.31, "x")) == "0.3x [0.29x-0.31x]"
    assert report.format_measurement(exact(3, "count")) == "3"


def rows_of(table: str, first: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines() if line.split()[:1] == [first]]


def test_the_summary_fits_one_screen_and_says_each_headline(tiny_run: BenchResult) -> None:
    summary = report.render_table(tiny_run)
    assert len(summary.splitlines()) <= SCREEN
    for trace in TRACE_NAMES:  # a row per trace, with its step ratio and its interval
        (row,) = rows_of(summary, trace)
        measured = tiny_run.figures[trace]["bucketpool/original"]
        assert report.format_measurement(measured).split()[0] in row
    for k in ("16", "64", "256", "4,096", "65,536"):
        assert len(rows_of(summary, k)) == 1
    assert "fill-step (normal-64, 20 steps" in summary
    assert "-check: exit" not in summary
    promise_rows = {" ".join(row[1:3]) for row in rows_of(summary, "promise")}
    assert "add_copies/numpy (arrays)" in promise_rows  # one row per figure, its worst case
    assert len(rows_of(summary, "promise")) == len(
        {c.spec.figure for c in tiny_run.checks if c.spec.kind == "promise"}
    )


def test_verbose_has_every_figure_and_every_check(tiny_run: BenchResult) -> None:
    table = report.render_table(tiny_run, verbose=True)
    for case, figures in tiny_run.figures.items():
        assert f"  {case}: " in table  # described
        for figure in figures:
            assert figure in table
    rows = [line for line in table.splitlines() if line.startswith(("promise ", "goal "))]
    assert len(rows) == len(tiny_run.checks)
    for check, row in zip(tiny_run.checks, rows, strict=True):
        assert f" {check.case} " in row
        assert row.split()[-1] in (check.verdict, f"{check.interval_verdict})")


def test_the_exit_line_comes_last_with_check(tiny_run: BenchResult) -> None:
    checked = report.render_table(tiny_run, check=True).splitlines()
    assert checked[-1].startswith("--check: exit ")
    strict = report.render_table(tiny_run, check=True, strict=True).splitlines()
    assert strict[-1].startswith("--strict-check: exit ")
