"""The parked cases: parked handles must not slow the hot loop or the evented step down.

``parked-10000``: the ``with`` loop with `PARKED` handles of another bucket parked on
events that never complete.  ``evented``: the evented step, ``h = pool.acquire(64); with h:
h.record_event(ev)`` with ``ev`` done `DELAY` ops after its release, beside the plain step
``with pool.acquire(64): pass`` on a pool of the same settings, and beside the original pool
used by hand as vllm-ascend does: a list of (event, triple) asked before each acquire, a
triple released once its event is done, three ``[:n]`` slices.  ``parked-stuck``: the
evented step with `STUCK` buffers of its own bucket parked before it on events that never
complete (the front of the parking queue, as after a hung copy), vs a clean pool.  A pool
that polls parked buffers only from the oldest and stops at the first not done leaves every
later buffer parked, and allocates on every op.  ``collect``: ``pool.collect()`` per parked
buffer with `STUCK` parked over with 1% of that, every event pending (none retires) or every
event done (all retire).

``pool.collect()`` runs after each pass of ``parked-stuck`` (untimed), so that such a pool
holds at most one pass of parked buffers; that hides no allocation, since they are counted
from the end of the warm-up.  ``parked-stuck`` and ``collect`` give their pools cache room
for every parked buffer (parked buffers count against ``max_cached_bytes``).
"""

from __future__ import annotations

import functools
import gc
import typing
from collections.abc import Callable

from bench._cases import HOT_N, median_of, ratio_of
from bench._original import OriginalDescriptorBufferPool, OriginalDescriptorBuffers
from bench._pools import NeverDone, handle_ops, memory_of, park
from bench._stats import Measurement, exact, time_ns
from bucketpool import BucketPool, CompletionEvent

__all__ = [
    "DELAY",
    "EVENTED_N",
    "PARKED",
    "STUCK",
    "STUCK_OPS",
    "AfterOps",
    "CollectCase",
    "EventedCase",
    "OpClock",
    "ParkedCase",
    "ParkedStuckCase",
    "evented_ops",
    "hand_evented_ops",
]

PARKED = 10_000
_PARKED_N = 16  # another bucket than HOT_N's and EVENTED_N's, the smallest
#: The evented step's n, and ops from a handle's release until its copy is done.
EVENTED_N = 64
DELAY = 4
#: ``parked-stuck``: buffers stuck parked; ``collect``: its larger count of parked buffers.
STUCK = 100_000
#: ``parked-stuck`` passes are at most this long: a pool that fails the case allocates a
#: buffer on every op, and a longer pass churns more memory.
STUCK_OPS = 2_500
_COLLECT_REPEATS = 10  # collects of the smaller count per round, summed into one sample


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


def evented_ops(
    pool: BucketPool, n: int, ops: int, clock: OpClock | None, delay: int = DELAY
) -> None:
    """Run *ops* evented steps on *pool*; without a *clock*, *ops* plain steps.

    The evented step is ``h = pool.acquire(n); with h: h.record_event(ev)``, where ``ev``
    is done once *delay* more ops have run after this one; the plain step is
    ``with pool.acquire(n): pass``.
    """
    acquire = pool.acquire
    if clock is None:
        for _ in range(ops):
            with acquire(n):
                pass
        return
    for _ in range(ops):
        now = clock.ops
        handle = acquire(n)
        with handle:
            handle.record_event(AfterOps(clock, now + 1 + delay))
        clock.ops = now + 1


_Pending = list[tuple[AfterOps, OriginalDescriptorBuffers]]


def hand_evented_ops(
    pool: OriginalDescriptorBufferPool,
    n: int,
    ops: int,
    clock: OpClock,
    pending: _Pending,
    delay: int = DELAY,
) -> None:
    """Run *ops* evented steps on the original pool, by hand as vllm-ascend does.

    Before each acquire, every (event, triple) of *pending* is asked; a triple whose event
    is done is released.  Then acquire, three ``[:n]`` slices, and the triple goes on
    *pending* with an event done once *delay* more ops have run.
    """
    acquire, release = pool.acquire, pool.release
    for _ in range(ops):
        now = clock.ops
        kept: _Pending = []
        for item in pending:
            if item[0].query():
                release(item[1])
            else:
                kept.append(item)
        pending[:] = kept
        bufs = acquire(n)
        _src, _dst, _sizes = bufs.src_ptrs[:n], bufs.dst_ptrs[:n], bufs.sizes[:n]
        pending.append((AfterOps(clock, now + 1 + delay), bufs))
        clock.ops = now + 1


def _roomy(n: int, count: int, *, cached: bool = False) -> BucketPool:
    """A pool of the default settings with cache room for *count* more buffers of *n*.

    The room is in bytes (parked buffers count against ``max_cached_bytes``) and, where
    *cached*, in buffers per bucket too, so that retired buffers are kept for reuse.
    """
    default = BucketPool()
    settings = default.settings
    room = count * default.bucket_capacity(n) * 3 * settings.dtype.itemsize
    per_bucket = settings.max_cached_per_bucket + (count if cached else 0)
    return BucketPool(
        max_cached_bytes=settings.max_cached_bytes + room, max_cached_per_bucket=per_bucket
    )


def _park(
    pool: BucketPool, n: int, count: int, event: Callable[[], CompletionEvent] = NeverDone
) -> None:
    """`park` with the garbage collector off (`time_ns`'s time discarded): 3x as fast at 100k."""
    time_ns(functools.partial(park, pool, n, count, event))


@typing.final
class EventedCase:
    """The evented step beside the plain step, and beside the original pool used by hand."""

    def __init__(self, ops: int) -> None:
        self.name = "evented"
        self.description = (
            f"h = pool.acquire({EVENTED_N}); with h: h.record_event(ev), ev done {DELAY} ops "
            f"after release, vs with pool.acquire({EVENTED_N}): pass on a pool of the same "
            "settings, and vs the original with a list of (event, triple) asked before each "
            "acquire and three [:n] slices"
        )
        self.samples: dict[str, list[float]] = {"plain": [], "evented": [], "original by hand": []}
        self._ops = ops
        self._runs: dict[str, Callable[[], None]] = {}

    def setup(self) -> None:
        """Make the three pools and warm each loop up."""
        n, ops = EVENTED_N, self._ops
        original = OriginalDescriptorBufferPool()
        self._runs = {
            "plain": functools.partial(evented_ops, BucketPool(), n, ops, None),
            "evented": functools.partial(evented_ops, BucketPool(), n, ops, OpClock()),
            "original by hand": functools.partial(
                hand_evented_ops, original, n, ops, OpClock(), []
            ),
        }
        for run in self._runs.values():
            run()
        gc.collect()

    def round(self) -> None:
        """One timed pass per loop: plain (the baseline), evented, the original by hand."""
        for name, run in self._runs.items():
            self.samples[name].append(time_ns(run) / self._ops)

    def close(self) -> None:
        """Drop the pools."""
        self._runs = {}

    def measurements(self) -> dict[str, Measurement]:
        """The evented step over the plain one and over the original by hand; ns per op."""
        figures = {
            "evented/plain": ratio_of(self.samples, "evented", "plain"),
            "evented/original by hand": ratio_of(self.samples, "evented", "original by hand"),
        }
        for name, samples in self.samples.items():
            figures[f"{name} ns/op"] = median_of(samples, "ns")
        return figures


@typing.final
class ParkedStuckCase:
    """The evented step, with and without buffers of its bucket stuck parked before it."""

    def __init__(self, ops: int, stuck: int = STUCK) -> None:
        ops = min(ops, STUCK_OPS)
        self.name = "parked-stuck"
        self.description = (
            f"the evented step at n = {EVENTED_N} ({DELAY} ops to done), with {stuck:,} buffers "
            f"of n = {EVENTED_N} parked before it on events that never complete, vs a clean "
            f"pool; {ops:,} ops per pass"
        )
        self.samples: dict[str, list[float]] = {"none stuck": [], "stuck": []}
        #: Handles parked in each pool at the end of its last pass, before ``collect()``.
        self.parked: dict[str, int] = {}
        self._ops = ops
        self._stuck = stuck
        self._pools: dict[str, tuple[BucketPool, OpClock]] = {}
        self._warm: dict[str, int] = {}

    def setup(self) -> None:
        """Make both pools (of the same settings), park the stuck buffers, warm both up."""
        self._pools = {name: (_roomy(EVENTED_N, self._stuck), OpClock()) for name in self.samples}
        _park(self._pools["stuck"][0], EVENTED_N, self._stuck)
        for name, (pool, clock) in self._pools.items():
            self._pass(name, pool, clock)
            self._warm[name] = memory_of(pool).allocations
        gc.collect()

    def _pass(self, name: str, pool: BucketPool, clock: OpClock) -> int:
        elapsed = time_ns(functools.partial(evented_ops, pool, EVENTED_N, self._ops, clock))
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


_STATES = ("pending", "done")


@typing.final
class CollectCase:
    """``pool.collect()`` per parked buffer with *parked* buffers parked, over with 1% of that."""

    def __init__(self, parked: int = STUCK) -> None:
        self._counts = (max(1, parked // 100), parked)
        self.name = "collect"
        self.description = (
            f"pool.collect() per parked buffer (n = {_PARKED_N}) with {parked:,} parked over "
            f"with {self._counts[0]:,}: every event pending (none retires), or every event "
            "done (all retire, then they are parked again, untimed)"
        )
        self.samples: dict[str, list[float]] = {
            f"{state} {count}": [] for count in self._counts for state in _STATES
        }
        self._pools: list[tuple[BucketPool, OpClock]] = []

    def setup(self) -> None:
        """Make a pool per count, park its buffers, run one untimed cycle."""
        self._pools = [(_roomy(_PARKED_N, count, cached=True), OpClock()) for count in self._counts]
        for (pool, clock), count in zip(self._pools, self._counts, strict=True):
            _park(pool, _PARKED_N, count, functools.partial(AfterOps, clock, clock.ops + 1))
            _collect_cycle(pool, clock, count)
        gc.collect()

    def round(self) -> None:
        """Cycles of the fewer buffers (summed), then one of the more."""
        for (pool, clock), count in zip(self._pools, self._counts, strict=True):
            repeats = _COLLECT_REPEATS if count < self._counts[-1] else 1
            cycles = [_collect_cycle(pool, clock, count) for _ in range(repeats)]
            for state, total in zip(_STATES, map(sum, zip(*cycles, strict=True)), strict=True):
                self.samples[f"{state} {count}"].append(total / (count * repeats))

    def close(self) -> None:
        """Drop the pools, the parked buffers with them."""
        self._pools = []

    def measurements(self) -> dict[str, Measurement]:
        """Per state: ns per buffer at the larger count over at the smaller; each's ns."""
        few, many = self._counts
        figures = {}
        for state in _STATES:
            ratio = ratio_of(self.samples, f"{state} {many}", f"{state} {few}")
            figures[f"{state}: per-buffer cost, 100x parked / 1x"] = ratio
        for name, samples in self.samples.items():
            figures[f"{name} ns/buffer"] = median_of(samples, "ns")
        return figures


def _collect_cycle(pool: BucketPool, clock: OpClock, count: int) -> tuple[int, int]:
    """Time ``collect()`` with every event pending, then done; park the buffers again."""
    pending = time_ns(pool.collect)
    clock.ops += 1
    done = time_ns(pool.collect)
    _park(pool, _PARKED_N, count, functools.partial(AfterOps, clock, clock.ops + 1))
    return pending, done
