"""The case interface, its helpers, and the cases of the traces and of the debug levels.

A case holds its pools for the whole run.  `Case.setup` makes them and runs the untimed
warm-up; each `Case.round` runs every series of the case once, back to back, and appends
one sample per series; `Case.measurements` turns the samples into figures with intervals
(see `bench._stats`).  The runner may call `Case.round` again later to narrow an
interval, so a round never depends on how many came before.

Cases here: one per trace and the debug levels; the others (parked handles, threads,
fills, memory overhead, the leak-site cost, the floor, compat's acceptance) live in their own
modules.  Kept custom: the cases interleave several pools in one process (pyperf would run
each in its own worker process, where pairing is lost).
"""

from __future__ import annotations

import functools
import gc
import math
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from bench._compat import compat_refusals
from bench._pools import IMPLEMENTATIONS, Implementation, handle_ops, make_implementations
from bench._stats import (
    Measurement,
    Unit,
    exact,
    paired_ratios,
    relative_spread,
    summarize,
    time_ns,
)
from bench._traces import Trace
from bucketpool import BucketPool

__all__ = [
    "HOT_N",
    "Case",
    "DebugCase",
    "TraceCase",
    "median_of",
    "ops_for",
    "ratio_of",
]

#: The hot loop's n: one image of a 7B vision model, in encoder-cache blocks.
HOT_N = 1_196


class Case(Protocol):
    """One thing the benchmark measures, with its pools and its samples."""

    @property
    def name(self) -> str:
        """The case's name in reports and targets."""

    @property
    def description(self) -> str:
        """One line for the report's legend."""

    @property
    def samples(self) -> Mapping[str, Sequence[float]]:
        """Series name to one sample per round so far (empty for untimed cases)."""

    def setup(self) -> None:
        """Make the pools and run the untimed warm-up."""

    def round(self) -> None:
        """Run every series once, back to back, and append a sample to each."""

    def measurements(self) -> dict[str, Measurement]:
        """Return the case's figures, by name."""

    def close(self) -> None:
        """Give back what the case holds (its figures stay readable)."""


def ratio_of(
    samples: Mapping[str, Sequence[float]], num: str, den: str, unit: Unit = "x"
) -> Measurement:
    """Return the per-round paired ratio *num* / *den*; *den*'s spread is the load signal."""
    ratios = paired_ratios(samples[num], samples[den])
    return summarize(ratios, unit, spread=relative_spread(samples[den]))


def median_of(samples: Sequence[float], unit: Unit) -> Measurement:
    """Return the median of one series, its own spread as the load signal."""
    return summarize(samples, unit, spread=relative_spread(samples))


def ops_for(run: Callable[[int], None], min_ns: int, max_ops: int) -> int:
    """How many ops make a timed pass of *run* last at least *min_ns* (at most *max_ops*)."""
    ops = 1
    while True:
        elapsed = time_ns(functools.partial(run, ops))
        if elapsed >= min_ns or ops >= max_ops:
            return ops
        ops = min(max_ops, max(ops * 2, math.ceil(ops * min_ns * 1.2 / max(elapsed, 1))))


# -- traces ---------------------------------------------------------------------------------


def _pass_of(impl: Implementation, trace: Trace) -> Callable[[], None]:
    if trace.cycle is not None:
        return functools.partial(impl.cycle, trace.cycle)
    return functools.partial(impl.replay, trace.events)


@typing.final
class TraceCase:
    """The three pools on one trace: ns per op, allocations, bytes held, compat's refusals.

    Before any timing, the compat drop-in is driven once through the trace as the original's
    callers drive it, counting the calls it refuses; if it refuses any, it is left out of the
    timed rounds (a refusal would end the run), and the promise on its refusals FAILs.
    """

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.name = trace.name
        self.description = trace.description
        self.samples: dict[str, list[float]] = {name: [] for name in IMPLEMENTATIONS}
        #: Implementation to bytes held after each op (recorded traces only).
        self.series: dict[str, tuple[int, ...]] = {}
        #: Calls of the trace that compat refused (or answered with a short triple).
        self.refusals = 0
        self._impls: tuple[Implementation, ...] = ()
        self._passes: list[Callable[[], None]] = []
        self._warm: list[int] = []

    def setup(self) -> None:
        """Count compat's refusals, record bytes held if asked (fresh pools), warm up."""
        self.refusals = compat_refusals(self.trace.events)
        names = [name for name in IMPLEMENTATIONS if name != "compat" or not self.refusals]
        self.samples = {name: [] for name in names}
        if self.trace.record_bytes:
            self.series = {i.name: i.record(self.trace.events) for i in make_implementations(names)}
        self._impls = make_implementations(names)
        self._passes = [_pass_of(impl, self.trace) for impl in self._impls]
        for run in self._passes:
            run()
        self._warm = [impl.memory().allocations for impl in self._impls]
        gc.collect()

    def round(self) -> None:
        """One timed pass of the trace per pool: original, bucketpool, compat."""
        for impl, run in zip(self._impls, self._passes, strict=True):
            self.samples[impl.name].append(time_ns(run) / self.trace.ops)

    def close(self) -> None:
        """Nothing: the pools stay, since `measurements` reads their counters."""

    def measurements(self) -> dict[str, Measurement]:
        """Ratios to the original, ns per op, allocations after warm-up and bytes held."""
        figures = {"bucketpool/original": ratio_of(self.samples, "bucketpool", "original")}
        if "compat" in self.samples:
            figures["compat/original"] = ratio_of(self.samples, "compat", "original")
        figures["compat refusals"] = exact(self.refusals, "count")
        cap = BucketPool().settings.max_cached_bytes
        for impl, warm in zip(self._impls, self._warm, strict=True):
            memory = impl.memory()
            figures[f"{impl.name} ns/op"] = median_of(self.samples[impl.name], "ns")
            after = memory.allocations - warm
            figures[f"{impl.name} allocations after warm-up"] = exact(after, "count")
            figures[f"{impl.name} final bytes"] = exact(memory.bytes_held, "bytes")
            figures[f"{impl.name} peak bytes"] = exact(memory.peak_bytes, "bytes")
        ours = self._impls[IMPLEMENTATIONS.index("bucketpool")].memory()
        bound = 2 * self.trace.peak_requested_bytes + cap
        figures["bucketpool peak bytes / (2 x peak live + cache cap)"] = exact(
            ours.peak_bytes / bound, "x"
        )
        figures["bucketpool final bytes / cache cap"] = exact(ours.bytes_held / cap, "x")
        return figures


# -- debug levels ---------------------------------------------------------------------------


@typing.final
class DebugCase:
    """The ``with`` loop at n = `HOT_N` on pools of debug levels off, checks and strict."""

    LEVELS: typing.ClassVar[tuple[typing.Literal["off", "checks", "strict"], ...]] = (
        "off",
        "checks",
        "strict",
    )

    def __init__(self, min_pass_ns: int, max_ops: int) -> None:
        self.name = "debug"
        self.description = (
            f"with pool.acquire({HOT_N:,}) on BucketPool(debug=...) checks and strict, "
            "as ratios to debug='off'"
        )
        self.samples: dict[str, list[float]] = {level: [] for level in self.LEVELS}
        self._min_pass_ns = min_pass_ns
        self._max_ops = max_ops
        self._runs: dict[str, tuple[Callable[[int], None], int]] = {}

    def setup(self) -> None:
        """Make one pool per level and size each level's pass to last long enough."""
        for level in self.LEVELS:
            pool = BucketPool(debug=level)
            run = functools.partial(_quiet_ops, pool)
            self._runs[level] = (run, ops_for(run, self._min_pass_ns, self._max_ops))

    def round(self) -> None:
        """One timed pass per level: off, checks, strict."""
        for level, (run, ops) in self._runs.items():
            self.samples[level].append(time_ns(functools.partial(run, ops)) / ops)

    def close(self) -> None:
        """Drop the pools."""
        self._runs = {}

    def measurements(self) -> dict[str, Measurement]:
        """Each level's ns per op over debug='off''s, and off's own ns per op."""
        return {
            "checks/off": ratio_of(self.samples, "checks", "off"),
            "strict/off": ratio_of(self.samples, "strict", "off"),
            "off ns/op": median_of(self.samples["off"], "ns"),
        }


def _quiet_ops(pool: BucketPool, ops: int) -> None:
    # The debug levels may warn about this loop's views; the benchmark times, not reports.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle_ops(pool, HOT_N, ops, None)
