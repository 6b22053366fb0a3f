"""``--json``: a run as JSON (schema `SCHEMA`), and the checks read back from it.

The structure::

    {"schema": 3, "version", "python", "torch", "numpy",
     "machine": {"platform", "machine", "processor", "cpus"},
     "settings": {"rounds", "max_rounds", "budget_s", "ops", "thread_ops", "parked",
                  "stuck", "min_pass_ns", "quick", "seed", "settle_goals", "confidence",
                  "resolution"},
     "duration_s": float, "loaded": bool,
     "exit_status": {"check": int, "strict_check": int},
     "cases": {case: {"description", "rounds", "load", "samples": {series: [...]},
                      "figures": {figure: MEASUREMENT}}},
     "checks": [{"kind": "promise" | "goal", "case", "cases": [pattern, ...], "figure",
                 "op", "limit", "why", "measurement": MEASUREMENT,
                 "interval_verdict", "verdict"}],
     "series": {trace: {impl: [bytes held after each op]}}}

    MEASUREMENT = {"value", "low", "high", "unit", "timed", "rounds", "spread"}

``checks`` lists the promises first, then the goals.  A case's ``load`` is the mean count of
other tasks runnable after its rounds (see `bench._runner`).  Times are ns, sizes bytes; a ratio's
``value`` is the median of per-round ratios, ``low`` and ``high`` its 95% interval.
Schema 3 (this one) added ``kind``, ``cases``, ``exit_status`` and the nested
``measurement`` to schema 2, whose ``load`` was the highest 1-minute load average.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from bench._cases import TraceCase
from bench._runner import BenchResult
from bench._stats import CONFIDENCE, RESOLUTION, Measurement
from bench._targets import Check, TargetSpec, exit_status

__all__ = ["SCHEMA", "checks_from_json", "read_json", "to_json", "write_json"]

SCHEMA = 3


def _measurement(measurement: Measurement) -> dict[str, object]:
    return {
        "value": measurement.value,
        "low": measurement.low,
        "high": measurement.high,
        "unit": measurement.unit,
        "timed": measurement.timed,
        "rounds": measurement.rounds,
        "spread": measurement.spread,
    }


def _check(check: Check) -> dict[str, object]:
    spec = check.spec
    return {
        "kind": spec.kind,
        "case": check.case,
        "cases": list(spec.cases),
        "figure": spec.figure,
        "op": spec.op,
        "limit": spec.limit,
        "why": spec.why,
        "measurement": _measurement(check.measurement),
        "interval_verdict": check.interval_verdict,
        "verdict": check.verdict,
    }


def to_json(result: BenchResult) -> dict[str, object]:
    """Return the run as JSON-ready data (the structure is in the module docstring)."""
    settings = result.settings
    return {
        "schema": SCHEMA,
        **result.environment,
        "settings": {
            "rounds": settings.rounds,
            "max_rounds": settings.max_rounds,
            "budget_s": settings.budget_s,
            "ops": settings.ops,
            "thread_ops": settings.thread_ops,
            "parked": settings.parked,
            "stuck": settings.stuck,
            "min_pass_ns": settings.min_pass_ns,
            "quick": settings.quick,
            "seed": settings.seed,
            "settle_goals": settings.settle_goals,
            "confidence": CONFIDENCE,
            "resolution": RESOLUTION,
        },
        "duration_s": result.duration_s,
        "loaded": result.loaded,
        "exit_status": {
            "check": exit_status(result.checks),
            "strict_check": exit_status(result.checks, strict=True),
        },
        "cases": {
            case.name: {
                "description": case.description,
                "rounds": result.rounds[case.name],
                "load": result.load[case.name],
                "samples": {name: list(values) for name, values in case.samples.items()},
                "figures": {name: _measurement(m) for name, m in result.figures[case.name].items()},
            }
            for case in result.cases
        },
        "checks": [_check(check) for check in result.checks],
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


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file `write_json` wrote.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON, or not of schema `SCHEMA`.
    """
    with open(path, encoding="utf-8") as file:
        data = json.load(file)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{os.fspath(path)}: expected benchmark JSON schema {SCHEMA}, got {found}")
    return data


def _measurement_from(data: Mapping[str, Any]) -> Measurement:
    return Measurement(
        value=data["value"],
        low=data["low"],
        high=data["high"],
        unit=data["unit"],
        timed=data["timed"],
        rounds=data["rounds"],
        spread=data["spread"],
    )


def checks_from_json(data: Mapping[str, Any]) -> tuple[Check, ...]:
    """Return the checks of a run read back from `to_json`'s data, equal to the run's own.

    With `bench._targets.exit_status`, this gives a saved run's ``--check`` status.
    """
    return tuple(
        Check(
            case=entry["case"],
            spec=TargetSpec(
                tuple(entry["cases"]),
                entry["figure"],
                entry["op"],
                entry["limit"],
                entry["why"],
                kind=entry["kind"],
            ),
            measurement=_measurement_from(entry["measurement"]),
            interval_verdict=entry["interval_verdict"],
            verdict=entry["verdict"],
        )
        for entry in data["checks"]
    )
