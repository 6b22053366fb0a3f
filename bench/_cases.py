"""The case interface and its base class; the cases of the traces, the fill step, debug.

A case holds its pools for the whole run.  `Case.setup` makes them and warms them up; each
`Case.round` runs every series of the case once, back to back, appending one sample to
each; `Case.measurements` turns the samples into figures.  The runner may call `Case.round`
again later to narrow an interval, so a round never depends on the rounds before it.
"""

from __future__ import annotations

import functools
import gc
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from bench._compat import compat_refusals
from bench._original import OriginalDescriptorBufferPool
from bench._pools import (
    IMPLEMENTATIONS,
    Driver,
    drivers,
    handle_ops,
    numpy_fill_steps,
    random_copies,
    setitem_fill_steps,
    with_fill_steps,
)
from bench._stats import Measurement, exact, median_of, ops_for, ratio_of, time_ns
from bench._targets import STEP
from bench._traces import Trace, builtin_traces, select_traces
from bucketpool import BucketPool, DebugLevel

__all__ = [
    "HOT_N",
    "Case",
    "DebugCase",
    "FillStepCase",
    "Series",
    "SeriesCase",
    "TraceCase",
    "timed",
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
        """One line for the report."""

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


#: A series: a call that runs one pass and returns its ns, and the steps in a pass.
Series = tuple[Callable[[], int], int]


def timed(per: int, run: Callable[..., object], *args: object) -> Series:
    """The series of ``run(*args)``, timed with `time_ns`, of *per* steps a pass."""
    return functools.partial(time_ns, functools.partial(run, *args)), per


class SeriesCase:
    """A case of named series (`make`), timed back to back in each round.

    Its figures: each of `ratios` (figure, numerator, denominator) whose series exist, and
    each series' ns per `per` (``step`` unless a case says otherwise).
    """

    per = "step"

    def __init__(self, name: str, description: str, ratios: Sequence[tuple[str, str, str]]) -> None:
        self.name = name
        self.description = description
        self.ratios = tuple(ratios)
        self.samples: dict[str, list[float]] = {}
        self._series: dict[str, Series] = {}

    def make(self) -> dict[str, Series]:
        """Make the pools; return the series, the baselines first."""
        raise NotImplementedError

    def setup(self) -> None:
        """Make the series and run each once, untimed."""
        self._series = self.make()
        self.samples = {name: [] for name in self._series}
        for run, _ in self._series.values():
            run()
        gc.collect()

    def round(self) -> None:
        """One timed pass per series."""
        for name, (run, per) in self._series.items():
            self.samples[name].append(run() / per)

    def close(self) -> None:
        """Drop the series (and the pools they hold)."""
        self._series = {}

    def measurements(self) -> dict[str, Measurement]:
        """The ratios, then each series' ns per step."""
        samples = self.samples
        figures = {
            figure: ratio_of(samples, num, den)
            for figure, num, den in self.ratios
            if num in samples and den in samples
        }
        figures.update({f"{name} ns/{self.per}": median_of(s) for name, s in samples.items()})
        return figures


@typing.final
class TraceCase(SeriesCase):
    """The three pools through one trace: ns per step, allocations, bytes, compat's refusals.

    Compat is first driven once through the trace as the original's callers drive it,
    counting the calls it refuses; if it refuses any, it is left out of the timed rounds.
    """

    def __init__(self, trace: Trace) -> None:
        ratios = [(STEP, "bucketpool", "original"), ("compat/original", "compat", "original")]
        super().__init__(trace.name, trace.description, ratios)
        self.trace = trace
        self.refusals = 0
        self._drivers: tuple[Driver, ...] = ()
        self._warm: dict[str, int] = {}

    def make(self) -> dict[str, Series]:
        """Count compat's refusals, make the pools."""
        self.refusals = compat_refusals(self.trace.events)
        names = [name for name in IMPLEMENTATIONS if name != "compat" or not self.refusals]
        self._drivers = drivers(self.trace, names)
        return {driver.name: timed(self.trace.ops, driver.run) for driver in self._drivers}

    def setup(self) -> None:
        """Make the pools, warm each up with one pass, note their allocations."""
        super().setup()
        self._warm = {driver.name: driver.memory().allocations for driver in self._drivers}

    def measurements(self) -> dict[str, Measurement]:
        """Ratios to the original, ns per step, allocations after warm-up, bytes held."""
        figures = super().measurements()
        figures["compat refusals"] = exact(self.refusals, "count")
        for driver in self._drivers:
            memory, name = driver.memory(), driver.name
            after = memory.allocations - self._warm[name]
            figures[f"{name} allocations after warm-up"] = exact(after, "count")
            figures[f"{name} final bytes"] = exact(memory.bytes_held, "bytes")
            figures[f"{name} peak bytes"] = exact(memory.peak_bytes, "bytes")
        ours = self._drivers[IMPLEMENTATIONS.index("bucketpool")].memory()
        cap = BucketPool().settings.max_cached_bytes
        bound = 2 * self.trace.peak_requested_bytes + cap
        figures["bucketpool peak bytes / (2 x peak live + cache cap)"] = exact(
            ours.peak_bytes / bound, "x"
        )
        figures["bucketpool final bytes / cache cap"] = exact(ours.bytes_held / cap, "x")
        return figures


@typing.final
class FillStepCase(SeriesCase):
    """The README's whole step, fill included, against the original filling as its callers do.

    bucketpool: ``with pool.acquire(n) as bufs: bufs.shrink(bufs.add_copies(0, src, dst,
    sizes))`` from numpy arrays; the original: acquire, ``t[i] = v`` per entry (setitem) or
    ``[:end]`` slices written through their ``.numpy()`` aliases (numpy), release.
    """

    def __init__(self, ops: int, seed: int = 0) -> None:
        (trace,) = select_traces(builtin_traces(ops, seed), ["normal-64"])  # its first steps
        ways = ("setitem", "numpy")
        super().__init__(
            "fill-step",
            f"{trace.name}'s first {trace.ops:,} steps with their copies: the with step and "
            "add_copies from arrays vs the original's setitem writes, and its numpy() aliases",
            [(f"{STEP} ({way})", "bucketpool", f"original {way}") for way in ways],
        )
        self.trace = trace
        self._seed = seed

    def make(self) -> dict[str, Series]:
        """Draw each step's copies, make the pools."""
        steps, ops = self.trace.steps, self.trace.ops
        assert steps is not None, "normal-64 releases each step at once"
        rng = np.random.default_rng(self._seed)
        copies = [random_copies(rng, end) for end in self.trace.ends]
        lists = [(s.tolist(), d.tolist(), z.tolist()) for s, d, z in copies]
        original = OriginalDescriptorBufferPool()
        return {
            "original setitem": timed(ops, setitem_fill_steps, original, steps, lists),
            "original numpy": timed(ops, numpy_fill_steps, original, steps, copies),
            "bucketpool": timed(ops, with_fill_steps, BucketPool(), steps, copies),
        }


@typing.final
class DebugCase(SeriesCase):
    """The bare ``with pool.acquire(HOT_N)`` step on pools of debug levels off, checks, strict."""

    def __init__(self, min_pass_ns: int, max_ops: int) -> None:
        super().__init__(
            "debug",
            f"with pool.acquire({HOT_N:,}): pass, on BucketPool(debug=...)",
            [(f"{level}/off", level, "off") for level in ("checks", "strict")],
        )
        self._min_pass_ns = min_pass_ns
        self._max_ops = max_ops

    def make(self) -> dict[str, Series]:
        """One pool per level, each pass sized to last long enough."""
        series = {}
        for level in typing.get_args(DebugLevel):
            run = functools.partial(_quiet_ops, BucketPool(debug=level))
            ops = ops_for(run, self._min_pass_ns, self._max_ops)
            series[level] = timed(ops, run, ops)
        return series


def _quiet_ops(pool: BucketPool, ops: int) -> None:
    with warnings.catch_warnings():  # the debug levels may warn; the benchmark times
        warnings.simplefilter("ignore")
        handle_ops(pool, HOT_N, ops)
