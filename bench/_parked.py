"""The parked cases: handles parked on pending events must not slow the hot loop down.

``parked-10000``: the ``with`` loop with `PARKED` handles of another bucket parked on
events that never complete.  ``parked-stuck``: a steady loop with `WINDOW` handles in flight,
each recording an event that reports done `DELAY` ops after its release, plus one handle
parked at the start on an event that never completes, as with copies on several streams
or a hung copy.  A pool that polls parked buffers only from the oldest and stops at the
first not done leaves every later buffer parked, and allocates on every op.

``pool.collect()`` runs after each pass of ``parked-stuck`` (untimed), so that such a pool
holds at most one pass of parked buffers; that hides no allocation, since they are counted
from the end of the warm-up.
"""

from __future__ import annotations

import collections
import functools
import gc
import typing

from bench._cases import HOT_N, median_of, ratio_of
from bench._pools import handle_ops, memory_of, park
from bench._stats import Measurement, exact, time_ns
from bucketpool import BucketPool, BufferHandle

__all__ = [
    "DELAY",
    "PARKED",
    "STUCK_OPS",
    "WINDOW",
    "AfterOps",
    "OpClock",
    "ParkedCase",
    "ParkedStuckCase",
    "in_flight_ops",
]

PARKED = 10_000
_PARKED_N = 16  # another bucket than HOT_N's
#: ``parked-stuck``: handles in flight, and ops from a handle's release until its copy ends.
WINDOW = 4
DELAY = 4
#: ``parked-stuck`` passes are at most this long: a pool that fails the case allocates a
#: buffer (49,152 bytes at n = 1,196) on every op, and a longer pass churns more memory.
STUCK_OPS = 2_500


@typing.final
class ParkedCase:
    """The hot loop with `PARKED` handles parked on pending events in another bucket."""

    def __init__(self, ops: int, parked: int = PARKED) -> None:
        self.name = f"parked-{parked}"
        self.description = (
            f"with pool.acquire({HOT_N:,}) loop; {parked:,} handles of n = {_PARKED_N} parked "
            "on events whose query() is False, vs the same loop with none parked"
        )
        self.samples: dict[str, list[float]] = {"none parked": [], "parked": []}
        self._ops = ops
        self._parked = parked
        self._pools: dict[str, BucketPool] = {}

    def setup(self) -> None:
        """Make both pools, park the handles, warm both loops up."""
        self._pools = {"none parked": BucketPool(), "parked": BucketPool()}
        park(self._pools["parked"], _PARKED_N, self._parked)
        for pool in self._pools.values():
            handle_ops(pool, HOT_N, self._ops, None)
        gc.collect()

    def round(self) -> None:
        """One timed loop per pool: none parked first (the baseline), then parked."""
        for name, pool in self._pools.items():
            elapsed = time_ns(functools.partial(handle_ops, pool, HOT_N, self._ops, None))
            self.samples[name].append(elapsed / self._ops)

    def close(self) -> None:
        """Drop both pools, the parked handles with them."""
        self._pools = {}

    def measurements(self) -> dict[str, Measurement]:
        """The ratio parked / none parked, and each loop's ns per op."""
        return {
            "parked/none parked": ratio_of(self.samples, "parked", "none parked"),
            "none parked ns/op": median_of(self.samples["none parked"], "ns"),
            "parked ns/op": median_of(self.samples["parked"], "ns"),
        }


@typing.final
class OpClock:
    """The ops a loop has run: the time base of `AfterOps` events."""

    __slots__ = ("ops",)

    def __init__(self) -> None:
        self.ops = 0


@typing.final
class AfterOps:
    """An event whose copy is done once *clock* has reached *due* ops."""

    __slots__ = ("_clock", "_due")

    def __init__(self, clock: OpClock, due: int) -> None:
        self._clock = clock
        self._due = due

    def query(self) -> bool:
        """Return whether the clock has reached the due op."""
        return self._clock.ops >= self._due


def in_flight_ops(
    pool: BucketPool, n: int, ops: int, clock: OpClock, window: int = WINDOW, delay: int = DELAY
) -> None:
    """Run *ops* ops with *window* handles in flight, each copy ending *delay* ops after release.

    Each op acquires a handle, records an `AfterOps` event on it (a copy submitted while it
    is held) and releases the oldest handle once *window* are held; that handle's copy is
    done once *delay* more ops have run.  The last handles are released at the end; their
    copies end in the first ops of the next call.
    """
    acquire = pool.acquire
    held: collections.deque[BufferHandle] = collections.deque()
    for _ in range(ops):
        now = clock.ops
        handle = acquire(n)
        _src, _dst, _sizes = handle.buffers
        # Released in op now + window - 1: done once *delay* more ops have run after that one.
        handle.record_event(AfterOps(clock, now + window + delay))
        held.append(handle)
        if len(held) == window:
            held.popleft().release()
        clock.ops = now + 1
    while held:
        held.popleft().release()


@typing.final
class ParkedStuckCase:
    """A steady loop with handles in flight, with and without one handle stuck parked."""

    def __init__(self, ops: int) -> None:
        ops = min(ops, STUCK_OPS)
        self.name = "parked-stuck"
        self.description = (
            f"acquire({HOT_N:,}), record_event, release with {WINDOW} in flight, each copy done "
            f"{DELAY} ops after its release; plus one handle parked at the start on an event "
            f"that never completes, vs the same loop without it; {ops:,} ops per pass"
        )
        self.samples: dict[str, list[float]] = {"none stuck": [], "stuck": []}
        #: Handles parked in each pool at the end of its last pass, before ``collect()``.
        self.parked: dict[str, int] = {}
        self._ops = ops
        self._pools: dict[str, tuple[BucketPool, OpClock]] = {}
        self._warm: dict[str, int] = {}

    def setup(self) -> None:
        """Make both pools, park the stuck handle, warm both loops up."""
        self._pools = {name: (BucketPool(), OpClock()) for name in self.samples}
        park(self._pools["stuck"][0], HOT_N, 1)
        for name, (pool, clock) in self._pools.items():
            self._pass(name, pool, clock)
            self._warm[name] = memory_of(pool).allocations
        gc.collect()

    def _pass(self, name: str, pool: BucketPool, clock: OpClock) -> int:
        elapsed = time_ns(functools.partial(in_flight_ops, pool, HOT_N, self._ops, clock))
        self.parked[name] = pool.stats().parked
        pool.collect()
        return elapsed

    def round(self) -> None:
        """One timed pass per pool: none stuck first (the baseline), then stuck."""
        for name, (pool, clock) in self._pools.items():
            self.samples[name].append(self._pass(name, pool, clock) / self._ops)

    def close(self) -> None:
        """Nothing: the pools stay, since `measurements` reads their counters."""

    def measurements(self) -> dict[str, Measurement]:
        """The ratio stuck / none stuck, allocations after warm-up, parked, ns per op."""
        figures = {"stuck/none stuck": ratio_of(self.samples, "stuck", "none stuck")}
        for name, (pool, _) in self._pools.items():
            after = memory_of(pool).allocations - self._warm[name]
            figures[f"{name} allocations after warm-up"] = exact(after, "count")
            figures[f"{name} parked after a pass"] = exact(self.parked[name], "count")
            figures[f"{name} ns/op"] = median_of(self.samples[name], "ns")
        return figures
