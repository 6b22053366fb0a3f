"""Timing and statistics: paired per-round ratios, their intervals, and verdicts.

In one round each series of a case runs once, back to back, so load that slows a round
slows its series alike; a ratio is taken per round (paired) and reported as the median of
those ratios with a bootstrap 95% interval of the median, never narrower than
±`RESOLUTION` (the drift between runs that pairing cannot cancel).  A verdict compares the
whole interval with the bound: ``PASS`` or ``FAIL`` when all of it is on one side,
``UNSURE`` when it straddles the bound.
"""

from __future__ import annotations

import functools
import gc
import math
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import attrs
import numpy as np

__all__ = [
    "CONFIDENCE",
    "LOADED_SPREAD",
    "RESOLUTION",
    "Measurement",
    "Op",
    "Unit",
    "Verdict",
    "exact",
    "judge",
    "median_of",
    "ops_for",
    "paired_ratios",
    "ratio_of",
    "relative_spread",
    "summarize",
    "time_ns",
]

#: Relative half-width below which no interval is claimed.
RESOLUTION = 0.07
CONFIDENCE = 0.95
_BOOTSTRAP = 2_000
#: A baseline whose interquartile range over rounds exceeds this share of its median says
#: the machine was too disturbed to judge.
LOADED_SPREAD = 0.25

Unit = Literal["x", "ns", "bytes", "count", "ops/s"]
Op = Literal["<=", ">="]
Verdict = Literal["PASS", "FAIL", "UNSURE", "LOADED"]


@typing.final
@attrs.frozen
class Measurement:
    """A figure with its interval.

    Attributes:
        value: the median over rounds (or the exact value).
        low: the interval's lower end.
        high: the interval's upper end.
        unit: what the value counts.
        timed: whether it depends on timing (and so on the machine's load).
        rounds: rounds it comes from (1 for exact values).
        spread: the baseline's relative interquartile range (0 for exact values).
    """

    value: float
    low: float
    high: float
    unit: Unit
    timed: bool = True
    rounds: int = 1
    spread: float = 0.0


def exact(value: float, unit: Unit) -> Measurement:
    """Return a figure without uncertainty (a count, bytes): its interval is a point."""
    return Measurement(value, value, value, unit, timed=False)


def relative_spread(values: Sequence[float]) -> float:
    """Return the interquartile range of *values* over their median (0 for one value)."""
    low, median, high = np.percentile(values, [25, 50, 75]) if len(values) > 1 else (0, 0, 0)
    return float((high - low) / abs(median)) if median else 0.0


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Return the per-round ratios ``numerators[i] / denominators[i]``.

    Raises:
        ValueError: the sequences differ in length or are empty.
    """
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError(
            f"paired ratios need rounds of equal, non-zero count: "
            f"{len(numerators)} and {len(denominators)}"
        )
    return [num / den for num, den in zip(numerators, denominators, strict=True)]


def summarize(
    values: Sequence[float],
    unit: Unit,
    *,
    spread: float = 0.0,
    seed: int = 0,
    resolution: float = RESOLUTION,
) -> Measurement:
    """Return the median of per-round *values* with a bootstrap interval of the median.

    The interval is at least ±*resolution* of the median; *spread* (the baseline's) is kept
    for the load check; *seed* makes one set of values give one interval.

    Raises:
        ValueError: *values* is empty.
    """
    if not values:
        raise ValueError("no rounds to summarize")
    data = np.asarray(values, dtype=np.float64)
    median = float(np.median(data))
    resamples = np.random.default_rng(seed).choice(data, size=(_BOOTSTRAP, data.size))
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(np.median(resamples, axis=1), [tail, 100 - tail])
    floor = abs(median) * resolution
    return Measurement(
        median,
        min(float(low), median - floor),
        max(float(high), median + floor),
        unit,
        rounds=data.size,
        spread=spread,
    )


def ratio_of(samples: Mapping[str, Sequence[float]], num: str, den: str) -> Measurement:
    """Return the paired ratio of series *num* over *den*; *den*'s spread is the load signal."""
    ratios = paired_ratios(samples[num], samples[den])
    return summarize(ratios, "x", spread=relative_spread(samples[den]))


def median_of(samples: Sequence[float], unit: Unit = "ns") -> Measurement:
    """Return the median of one series, its own spread as the load signal."""
    return summarize(samples, unit, spread=relative_spread(samples))


def judge(measurement: Measurement, op: Op, limit: float) -> Verdict:
    """Return PASS, FAIL or UNSURE: where the whole interval lies against ``op limit``."""
    low, high = measurement.low, measurement.high
    if op == "<=":
        return "PASS" if high <= limit else "FAIL" if low > limit else "UNSURE"
    return "PASS" if low >= limit else "FAIL" if high < limit else "UNSURE"


def time_ns(run: Callable[[], object]) -> int:
    """Time one call of *run* with the garbage collector off (as it was, after)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        run()
        return time.perf_counter_ns() - start
    finally:
        if enabled:
            gc.enable()


def ops_for(run: Callable[[int], object], min_ns: int, max_ops: int) -> int:
    """How many ops make a timed call ``run(ops)`` last at least *min_ns* (at most *max_ops*)."""
    ops = 1
    while True:
        elapsed = time_ns(functools.partial(run, ops))
        if elapsed >= min_ns or ops >= max_ops:
            return ops
        ops = min(max_ops, max(ops * 2, math.ceil(ops * min_ns * 1.2 / max(elapsed, 1))))
