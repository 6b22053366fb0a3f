"""``--json``: schema 3, read back to the very checks of the run."""

from __future__ import annotations

import json
from pathlib import Path

import _bench_case
import pytest

from bench import _json
from bench._runner import BenchResult
from bench._targets import exit_status


@pytest.fixture(scope="module")
def tiny_run() -> BenchResult:
    return _bench_case.tiny_run()


def test_json_structure(tiny_run: BenchResult, tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    _json.write_json(tiny_run, path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema"] == _json.SCHEMA == 3
    assert list(data["cases"]) == [case.name for case in tiny_run.cases]
    repeated = data["cases"]["repeated-64"]
    assert repeated["rounds"] == 2
    assert len(repeated["samples"]["original"]) == 2
    ratio = repeated["figures"]["bucketpool/original"]
    assert ratio["low"] <= ratio["value"] <= ratio["high"]
    assert len(data["checks"]) == len(tiny_run.checks)
    kinds = [check["kind"] for check in data["checks"]]
    assert kinds == sorted(kinds, key=lambda kind: kind != "promise")  # promises first
    assert {"promise", "goal"} == set(kinds)
    assert {c["verdict"] for c in data["checks"]} <= {"PASS", "FAIL", "UNSURE", "LOADED"}
    assert data["exit_status"] == {
        "check": exit_status(tiny_run.checks),
        "strict_check": exit_status(tiny_run.checks, strict=True),
    }
    assert list(data["series"]) == ["spike"]
    assert data["settings"]["resolution"] > 0
    switch = data["cases"]["threads-8-switch"]["figures"]
    assert switch["100us ops/s"]["unit"] == "ops/s"
    assert data["cases"]["leak-site"]["figures"]["site cost / with-acquire op"]["unit"] == "%"


def test_round_trip(tiny_run: BenchResult, tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    _json.write_json(tiny_run, path)
    checks = _json.checks_from_json(_json.read_json(path))
    assert checks == tiny_run.checks
    assert exit_status(checks) == exit_status(tiny_run.checks)


def test_read_json_refuses_another_schema(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text('{"schema": 2, "checks": []}', encoding="utf-8")
    with pytest.raises(ValueError, match="expected benchmark JSON schema 3, got 2"):
        _json.read_json(path)
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(ValueError, match="got list"):
        _json.read_json(path)
