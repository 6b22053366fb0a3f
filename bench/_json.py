"""``--json``: a run as JSON, every figure with its interval and the verdicts on it.

The structure (schema `SCHEMA`)::

    {"schema": 4, "version", "python", "torch", "numpy", "platform", "cpus",
     "settings": {Settings' fields, "confidence", "resolution"},
     "duration_s", "exit_status": {"check", "strict_check"},
     "cases": {case: {"description", "rounds", "load", "samples": {series: [...]},
                      "figures": {figure: {"value", "low", "high", "unit", "timed", "rounds",
                                           "spread", "targets": [TARGET, ...]}}}}}

    TARGET = {"kind": "promise" | "goal", "op", "limit", "why", "interval_verdict",
              "verdict"}

Times are ns, sizes bytes; a ratio's ``value`` is the median of per-round ratios, ``low``
and ``high`` its interval; ``load`` the mean count of other tasks runnable after its rounds.
"""

from __future__ import annotations

import json
import os

import attrs

from bench._runner import BenchResult
from bench._stats import CONFIDENCE, RESOLUTION
from bench._targets import exit_status

__all__ = ["SCHEMA", "to_json", "write_json"]

SCHEMA = 4


def to_json(result: BenchResult) -> dict[str, object]:
    """Return the run as JSON-ready data (the structure is in the module docstring)."""
    targets: dict[tuple[str, str], list[dict[str, object]]] = {}
    for check in result.checks:
        spec = check.spec
        targets.setdefault((check.case, spec.figure), []).append(
            {
                "kind": spec.kind,
                "op": spec.op,
                "limit": spec.limit,
                "why": spec.why,
                "interval_verdict": check.interval_verdict,
                "verdict": check.verdict,
            }
        )
    return {
        "schema": SCHEMA,
        **result.environment,
        "settings": {
            **attrs.asdict(result.settings),
            "confidence": CONFIDENCE,
            "resolution": RESOLUTION,
        },
        "duration_s": result.duration_s,
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
                "figures": {
                    figure: {**attrs.asdict(m), "targets": targets.get((case.name, figure), [])}
                    for figure, m in result.figures[case.name].items()
                },
            }
            for case in result.cases
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
