"""The table and the JSON of one tiny run agree, and carry every interval and verdict."""

from __future__ import annotations

import json
from pathlib import Path

import _bench_case
import pytest

from bucketpool.bench import _report as report
from bucketpool.bench._runner import BenchResult
from bucketpool.bench._stats import Measurement, exact


@pytest.fixture(scope="module")
def tiny_run() -> BenchResult:
    return _bench_case.tiny_run()


def test_formatting() -> None:
    assert report.format_bytes(512) == "512 B"
    assert report.format_bytes(1536) == "1.5 KiB"
    assert report.format_bytes(24 << 20) == "24.0 MiB"
    assert report.format_value(0.294, "x") == "0.294x"
    assert report.format_value(2178.4, "x") == "2,178x"
    assert report.format_value(1234.4, "ns") == "1,234 ns"
    assert report.format_value(12, "count") == "12"
    timed = Measurement(0.3, 0.29, 0.31, "x")
    assert report.format_measurement(timed) == "0.3x [0.29x-0.31x]"
    assert report.format_measurement(exact(3, "count")) == "3"


def test_table_shows_intervals_and_verdicts(tiny_run: BenchResult) -> None:
    table = report.render_table(tiny_run)
    measured = tiny_run.figures["repeated-64"]["bucketpool/original"]
    assert report.format_measurement(measured) in table
    for check in tiny_run.checks:
        row = next(line for line in table.splitlines() if line.startswith(check.name + " "))
        assert check.verdict in row
    assert "verdicts: " in table
    assert "handle.add_copies" in table
    assert "bucketpool bytes per cached buffer" in table


def test_json_structure(tiny_run: BenchResult, tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    report.write_json(tiny_run, path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema"] == 2
    assert list(data["cases"]) == [case.name for case in tiny_run.cases]
    repeated = data["cases"]["repeated-64"]
    assert repeated["rounds"] == 2
    assert len(repeated["samples"]["original"]) == 2
    ratio = repeated["figures"]["bucketpool/original"]
    assert ratio["low"] <= ratio["value"] <= ratio["high"]
    assert len(data["checks"]) == len(tiny_run.checks)
    assert {c["verdict"] for c in data["checks"]} <= {"PASS", "FAIL", "UNSURE", "LOADED"}
    assert list(data["series"]) == ["spike"]
    assert data["settings"]["resolution"] > 0


def test_matplotlib_available_sees_a_missing_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    assert not report.matplotlib_available()
