"""The report of one tiny run: a one-screen summary, or (``verbose``) every figure and verdict."""

from __future__ import annotations

import _bench_case
import pytest

from bench import _report as report
from bench._cases import TraceCase
from bench._runner import BenchResult
from bench._stats import Measurement, exact
from bench._targets import exit_status

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
    assert report.format_value(2.75, "%") == "2.8%"
    assert report.format_value(31.2, "%") == "31%"
    timed = Measurement(0.3, 0.29, 0.31, "x")
    assert report.format_measurement(timed) == "0.3x [0.29x-0.31x]"
    assert report.format_measurement(exact(3, "count")) == "3"
    assert report.format_rate(232_000) == "232k/s"
    assert report.format_rate(1.514e9) == "1.51G/s"
    assert report.format_rate(160) == "160/s"


def sections(table: str) -> dict[str, list[str]]:
    """The promise and goal rows of a table, by kind."""
    promises, goals = table.index("\nPROMISES: "), table.index("\nGOALS: ")
    end = table.index("\npromises: ")
    return {
        "promise": table[promises:goals].splitlines(),
        "goal": table[goals:end].splitlines(),
    }


def test_table_shows_every_verdict(tiny_run: BenchResult) -> None:
    table = report.render_table(tiny_run, verbose=True)
    measured = tiny_run.figures["repeated-64"]["bucketpool/original"]
    assert report.format_measurement(measured) in table
    rows = sections(table)
    for check in tiny_run.checks:
        lines = rows[check.spec.kind]
        own = [line for line in lines if line.startswith(check.name + " ")]
        if check.verdict != "PASS" or check.measurement.timed:
            (row,) = own  # a timed figure or a verdict other than PASS has its own row
            assert row.endswith(check.verdict) or "LOADED" in row
        else:  # exact PASSes of one target share a row, unless it is the only one
            grouped = [line for line in lines if f" cases: {check.spec.figure} " in line]
            assert len(own) + len(grouped) == 1
            assert (own or grouped)[0].endswith("PASS")
    assert "handle.add_copies" in table
    assert "bucketpool bytes per cached buffer" in table
    for case in ("parked-stuck", "threads-8-switch", "leak-site", "compat", "normal-64"):
        assert f"\n{case} " in table


def test_promises_come_first_each_labelled(tiny_run: BenchResult) -> None:
    table = report.render_table(tiny_run, verbose=True)
    assert table.index("\nPROMISES: ") < table.index("\nGOALS: ")
    promise_rows, goal_rows = ("\n".join(rows) for rows in sections(table).values())
    assert "repeated-64: bucketpool/original " in promise_rows  # <= 1.0, the promise
    assert "<= 1x" in promise_rows
    assert "repeated-64: bucketpool/original " in goal_rows  # <= 0.40, the goal
    assert "<= 0.4x" in goal_rows
    assert "threads-8-switch: throughput at 100us / at default" in goal_rows
    assert "parked-stuck: stuck/none stuck" in promise_rows


def test_the_report_says_how_to_read_it_once(tiny_run: BenchResult) -> None:
    table = report.render_table(tiny_run, verbose=True)
    assert table.count("lower is better unless the bound says >=") == 1
    assert table.count("bench/_original.py") == 1
    assert "acquire, three [:n] slices, release" in table
    assert "promises: " in table
    assert "; goals: " in table
    assert "--check: exit" not in table  # without --check, no verdict of it


@pytest.mark.parametrize("verbose", [False, True])
def test_the_check_line_only_when_asked(tiny_run: BenchResult, verbose: bool) -> None:
    def check_lines(**flags: bool) -> list[str]:
        table = report.render_table(tiny_run, verbose=verbose, **flags)
        return [line.split(",")[0] for line in table.splitlines() if "-check: exit" in line]

    assert check_lines() == []
    assert check_lines(check=True) == [f"--check: exit {exit_status(tiny_run.checks)}"]
    strict = exit_status(tiny_run.checks, strict=True)
    assert check_lines(strict=True) == [f"--strict-check: exit {strict}"]


def test_the_summary_fits_one_screen(tiny_run: BenchResult) -> None:
    summary = report.render_table(tiny_run, check=True)
    lines = summary.splitlines()
    assert len(lines) <= SCREEN
    assert "PROMISES: " not in summary  # the verbose tables
    assert "GOALS: " not in summary
    assert summary.count("lower is better unless the bound says >=") == 1
    for case in tiny_run.cases:  # a row per trace
        if isinstance(case, TraceCase):
            assert sum(line.startswith(f"{case.name} ") for line in lines) == 1
    rows = [line for line in lines if line.startswith(("promise ", "goal "))]
    assert len(rows) == len({check.spec for check in tiny_run.checks})  # a row per target
    assert "copies per call: setitem " in summary


def test_matplotlib_available_sees_a_missing_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    assert not report.matplotlib_available()
