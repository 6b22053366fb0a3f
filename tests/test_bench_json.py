"""``--json``: every figure with its interval and the verdicts on it."""

from __future__ import annotations

import json
from pathlib import Path

import _bench_case

from bench import _json
from bench._targets import exit_status


def test_json_structure(tmp_path: Path) -> None:
    run = _bench_case.tiny_run()
    path = tmp_path / "run.json"
    _json.write_json(run, path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema"] == _json.SCHEMA == 4
    assert list(data["cases"]) == [case.name for case in run.cases]
    repeated = data["cases"]["repeated-64"]
    assert repeated["rounds"] == 2
    assert len(repeated["samples"]["original"]) == 2
    ratio = repeated["figures"]["bucketpool/original"]
    assert ratio["low"] <= ratio["value"] <= ratio["high"]
    assert {t["kind"] for t in ratio["targets"]} == {"promise", "goal"}
    assert repeated["figures"]["original ns/step"]["targets"] == []
    verdicts = [
        (target["kind"], target["verdict"])
        for case in data["cases"].values()
        for figure in case["figures"].values()
        for target in figure["targets"]
    ]
    assert len(verdicts) == len(run.checks)
    assert sorted(verdicts) == sorted((c.spec.kind, c.verdict) for c in run.checks)
    assert data["exit_status"] == {
        "check": exit_status(run.checks),
        "strict_check": exit_status(run.checks, strict=True),
    }
    assert data["settings"]["ops"] == _bench_case.TOY.ops
    assert data["settings"]["resolution"] > 0
