"""Statistics of the benchmark: per-round paired ratios, their intervals, and verdicts.

Every timed figure comes from rounds: in one round each series of a case (the original,
bucketpool, compat, ...) runs one pass, back to back, so load that slows one round slows
its series alike.  A ratio is computed per round (paired), and reported as the median of
those ratios with a percentile-bootstrap 95% interval of the median.  Two things widen it:

* a floor of ±`RESOLUTION` around the median: a systematic shift that pairing cannot cancel
  (what else runs on the machine, CPU frequency, caches) moves a ratio's median between
  runs: by up to ±7% over eighteen full runs in one session on the 2-core development
  machine, some beside CPU-bound processes, so no ratio is claimed closer than that;
* nothing else: an interval that is too wide to decide gives ``UNSURE``, and the runner then
  measures more rounds within its time budget.

A verdict compares the whole interval with the target: ``PASS`` when all of it is on the
right side, ``FAIL`` when all of it is on the wrong side, ``UNSURE`` otherwise.

Kept custom (and numpy only): pyperf and pytest-benchmark time one function per process or
test, and neither pairs rounds of several pools in one process, which is what cancels load.
"""

from __future__ import annotations

import gc
import time
import typing
from collections.abc import Callable, Sequence
from typing import Literal

import attrs
import numpy as np

__all__ = [
    "BOOTSTRAP_SAMPLES",
    "CONFIDENCE",
    "LOADED_SPREAD",
    "RESOLUTION",
    "Measurement",
    "Op",
    "Unit",
    "Verdict",
    "exact",
    "judge",
    "paired_ratios",
    "percentile",
    "relative_spread",
    "summarize",
    "time_ns",
]

#: Relative half-width below which no interval is claimed.
RESOLUTION = 0.07
CONFIDENCE = 0.95
BOOTSTRAP_SAMPLES = 2_000
#: A baseline whose per-round interquartile range exceeds this share of its median says
#: the machine was too disturbed to judge.
LOADED_SPREAD = 0.25

Unit = Literal["x", "ns", "bytes", "count", "ops/s", "%"]
Op = Literal["<=", ">="]
Verdict = Literal["PASS", "FAIL", "UNSURE", "LOADED"]


@typing.final
@attrs.frozen
class Measurement:
    """A measured figure with its interval.

    Attributes:
        value: the median over rounds (or the exact value).
        low: the interval's lower end.
        high: the interval's upper end.
        unit: ``x`` (a ratio), ``ns``, ``bytes``, ``count``, ``ops/s`` or ``%``.
        timed: whether it depends on timing (and so on the machine's load).
        rounds: rounds it was computed from (1 for exact values).
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
    """Return a measurement without uncertainty (a count, bytes): its interval is a point."""
    return Measurement(value, value, value, unit, timed=False)


def percentile(values: Sequence[float], q: float) -> float:
    """Return the *q*-th percentile (0-100) of *values*, linearly interpolated."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def relative_spread(values: Sequence[float]) -> float:
    """Return the interquartile range of *values* over their median (0 for one value)."""
    if len(values) < 2:
        return 0.0
    median = percentile(values, 50)
    if median == 0:
        return 0.0
    return (percentile(values, 75) - percentile(values, 25)) / abs(median)


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
    """Return the median of per-round *values* with a bootstrap 95% interval of the median.

    Args:
        values: one value per round (a paired ratio, a latency, ...).
        unit: the unit of the values.
        spread: the baseline's relative spread, kept for the load check.
        seed: seeds the bootstrap, so one set of values always gives one interval.
        resolution: the interval is at least ±this share of the median.

    Returns:
        The measurement.

    Raises:
        ValueError: *values* is empty.
    """
    if not values:
        raise ValueError("no rounds to summarize")
    data = np.asarray(values, dtype=np.float64)
    median = float(np.median(data))
    rng = np.random.default_rng(seed)
    resamples = rng.choice(data, size=(BOOTSTRAP_SAMPLES, data.size), replace=True)
    medians = np.median(resamples, axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = (float(x) for x in np.percentile(medians, [tail, 100 - tail]))
    floor = abs(median) * resolution
    return Measurement(
        value=median,
        low=min(low, median - floor),
        high=max(high, median + floor),
        unit=unit,
        timed=True,
        rounds=data.size,
        spread=spread,
    )


def judge(measurement: Measurement, op: Op, limit: float) -> Verdict:
    """Compare the whole interval of *measurement* with a target.

    Args:
        measurement: the figure and its interval.
        op: ``<=`` (the figure must be at most *limit*) or ``>=`` (at least).
        limit: the target.

    Returns:
        ``PASS`` when the whole interval meets the target, ``FAIL`` when the whole interval
        misses it, ``UNSURE`` when the interval straddles it.
    """
    low, high = measurement.low, measurement.high
    if op == "<=":
        if high <= limit:
            return "PASS"
        return "FAIL" if low > limit else "UNSURE"
    if low >= limit:
        return "PASS"
    return "FAIL" if high < limit else "UNSURE"


def time_ns(run: Callable[[], object]) -> int:
    """Time one call of *run* with the garbage collector off, as it was after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        run()
        return time.perf_counter_ns() - start
    finally:
        if enabled:
            gc.enable()
