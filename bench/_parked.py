"""The parked cases: parked handles and events must not slow the step down.

``parked-N``: the bare ``with`` step with N handles of another bucket parked on events that
never complete, against a pool with none.  ``evented``: ``h = pool.acquire(64); with h:
h.record_event(ev)``, ``ev`` done `DELAY` steps after, against the plain step, and against
the original used by hand as vllm-ascend does (a list of (event, triple) polled before each
acquire, three ``[:n]`` slices).  ``parked-stuck``: the evented step with N buffers of its
own bucket stuck parked before it (a hung copy), against a clean pool; ``pool.collect()``
runs after each pass, untimed; and, exact, the questions the stuck events get in the
passes (not the collects) per 1,000 steps.  ``collect``: ``pool.collect()`` per parked buffer with N
parked over with N / 100, every event pending (none retires) or done (all retire).
The pools of the last two get cache room for every parked buffer.
"""

from __future__ import annotations

import functools
import gc
import typing
from collections.abc import Callable, Iterable

from bench._cases import HOT_N, Series, SeriesCase, timed
from bench._original import OriginalDescriptorBufferPool, OriginalDescriptorBuffers
from bench._pools import handle_ops, memory_of
from bench._stats import Measurement, exact, time_ns
from bucketpool import BucketPool, CompletionEvent

__all__ = [
    "DELAY",
    "STUCK_ASKED",
    "AfterOps",
    "CollectCase",
    "Copies",
    "EventedCase",
    "NeverDone",
    "OpClock",
    "ParkedCase",
    "ParkedStuckCase",
    "evented_ops",
    "hand_evented_ops",
    "park",
]

_PARKED_N = 16  # another bucket than HOT_N's and EVENTED_N's
EVENTED_N = 64
#: Steps from a handle's release until its copy is done.
DELAY = 4
#: ``parked-stuck`` passes are at most this long (a failing pool allocates on every step).
STUCK_OPS = 2_500
#: ``parked-stuck``'s exact figure: what the stuck events cost the passes' steps.
STUCK_ASKED = "stuck events asked per 1,000 steps"
_COLLECT_REPEATS = 10  # collects of the smaller count per round, summed into one sample


@typing.final
class Copies:
    """What a case's stuck copies share: the questions their events got; whether they ended.

    A case ends them as it closes: a pool it drops keeps no buffer parked for ever.
    """

    __slots__ = ("asked", "ended")

    def __init__(self) -> None:
        self.asked = 0
        self.ended = False


@typing.final
class NeverDone:
    """An event whose copy never finishes while its case runs: what it guards stays parked."""

    __slots__ = ("_copies",)

    def __init__(self, copies: Copies | None = None) -> None:
        self._copies = copies

    def query(self) -> bool:
        """Return `False` (the copy is still running) until the case ends its *copies*."""
        copies = self._copies
        if copies is None:
            return False
        copies.asked += 1
        return copies.ended


def _end(pools: Iterable[BucketPool], copies: Copies | None = None) -> None:
    """(a case's close) End its copies, and retire what they kept parked."""
    if copies is not None:
        copies.ended = True
    for pool in pools:
        pool.collect()


@typing.final
class OpClock:
    """The steps a loop has run: the time base of `AfterOps` events."""

    __slots__ = ("ops",)

    def __init__(self) -> None:
        self.ops = 0


@typing.final
class AfterOps:
    """An event whose copy is done once *clock* has reached *due* steps."""

    __slots__ = ("_clock", "_due")

    def __init__(self, clock: OpClock, due: int) -> None:
        self._clock = clock
        self._due = due

    def query(self) -> bool:
        """Return whether the clock has reached the due step."""
        return self._clock.ops >= self._due


def park(
    pool: BucketPool, n: int, count: int, event: Callable[[], CompletionEvent] = NeverDone
) -> None:
    """Acquire *count* handles of *n*, record a new ``event()`` on each, release them all.

    Timed with the collector off (and the time discarded): three times as fast at 100,000.
    """

    def run() -> None:
        handles = [pool.acquire(n) for _ in range(count)]
        for handle in handles:
            handle.record_event(event())
            handle.release()

    time_ns(run)


def evented_ops(pool: BucketPool, n: int, ops: int, clock: OpClock) -> None:
    """Run *ops* evented steps, each ``ev`` done `DELAY` steps later."""
    acquire = pool.acquire
    for _ in range(ops):
        now = clock.ops
        handle = acquire(n)
        with handle:
            handle.record_event(AfterOps(clock, now + 1 + DELAY))
        clock.ops = now + 1


_Pending = list[tuple[AfterOps, OriginalDescriptorBuffers]]


def hand_evented_ops(
    pool: OriginalDescriptorBufferPool, n: int, ops: int, clock: OpClock, pending: _Pending
) -> None:
    """Run *ops* evented steps on the original, polling *pending* by hand before each acquire."""
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
        _views = bufs.src_ptrs[:n], bufs.dst_ptrs[:n], bufs.sizes[:n]
        pending.append((AfterOps(clock, now + 1 + DELAY), bufs))
        clock.ops = now + 1


def _roomy(n: int, count: int, *, cached: bool = False) -> BucketPool:
    """A pool of the default settings with cache room for *count* more buffers of *n*."""
    default = BucketPool()
    settings = default.settings
    room = count * default.bucket_capacity(n) * 3 * settings.dtype.itemsize
    per_bucket = settings.max_cached_per_bucket + (count if cached else 0)
    return BucketPool(
        max_cached_bytes=settings.max_cached_bytes + room, max_cached_per_bucket=per_bucket
    )


@typing.final
class ParkedCase(SeriesCase):
    """The bare ``with`` step with handles parked on pending events in another bucket."""

    def __init__(self, ops: int, parked: int) -> None:
        super().__init__(
            f"parked-{parked}",
            f"with pool.acquire({HOT_N:,}): pass; {parked:,} handles of n = {_PARKED_N} parked "
            "on events never done, vs none parked",
            [("parked/none parked", "parked", "none parked")],
        )
        self._ops, self._parked = ops, parked
        self._pools: list[BucketPool] = []
        self._copies = Copies()

    def make(self) -> dict[str, Series]:
        """Make both pools and park the handles."""
        pools = {"none parked": BucketPool(), "parked": BucketPool()}
        park(pools["parked"], _PARKED_N, self._parked, functools.partial(NeverDone, self._copies))
        self._pools, ops = [*pools.values()], self._ops
        return {k: timed(ops, handle_ops, p, HOT_N, ops) for k, p in pools.items()}

    def close(self) -> None:
        """End the copies; drop the pools."""
        _end(self._pools, self._copies)
        self._pools = []
        super().close()


@typing.final
class EventedCase(SeriesCase):
    """The evented step beside the plain step, and beside the original polled by hand."""

    def __init__(self, ops: int) -> None:
        super().__init__(
            "evented",
            f"h = pool.acquire({EVENTED_N}); with h: h.record_event(ev), ev done {DELAY} steps "
            "later, vs the plain with step, vs the original with (event, triple) polled by hand",
            [
                ("evented/plain", "evented", "plain"),
                ("evented/original by hand", "evented", "original by hand"),
            ],
        )
        self._ops = ops
        self._evented: tuple[BucketPool, OpClock] | None = None

    def make(self) -> dict[str, Series]:
        """Make the three pools."""
        n, ops = EVENTED_N, self._ops
        pending: _Pending = []
        original = OriginalDescriptorBufferPool()
        self._evented = evented = (BucketPool(), OpClock())
        return {
            "plain": timed(ops, handle_ops, BucketPool(), n, ops),
            "evented": timed(ops, evented_ops, evented[0], n, ops, evented[1]),
            "original by hand": timed(ops, hand_evented_ops, original, n, ops, OpClock(), pending),
        }

    def close(self) -> None:
        """Let the last copies end; drop the pools."""
        if self._evented is not None:
            pool, clock = self._evented
            clock.ops += DELAY + 1
            _end([pool])
        self._evented = None
        super().close()


@typing.final
class ParkedStuckCase(SeriesCase):
    """The evented step with and without buffers of its bucket stuck parked before it."""

    def __init__(self, ops: int, stuck: int) -> None:
        self._ops, self._stuck = min(ops, STUCK_OPS), stuck
        super().__init__(
            "parked-stuck",
            f"the evented step at n = {EVENTED_N}, {stuck:,} buffers of its bucket parked "
            f"before it on events never done, vs a clean pool; {self._ops:,} steps per pass",
            [("stuck/none stuck", "stuck", "none stuck")],
        )
        self._pools: dict[str, BucketPool] = {}
        self._warm: dict[str, int] = {}
        self._copies = Copies()  # the stuck ones
        self._clocks = {name: OpClock() for name in ("none stuck", "stuck")}  # each pool's steps
        self._counted = [0, 0]  # questions they got in the timed passes since warm-up; steps

    def make(self) -> dict[str, Series]:
        """Make both pools and park the stuck buffers."""
        self._pools = {name: _roomy(EVENTED_N, self._stuck) for name in ("none stuck", "stuck")}
        asked = functools.partial(NeverDone, self._copies)
        park(self._pools["stuck"], EVENTED_N, self._stuck, asked)
        return {
            name: (functools.partial(self._pass, pool, self._clocks[name]), self._ops)
            for name, pool in self._pools.items()
        }

    def setup(self) -> None:
        """Make the pools, warm both up, note their allocations."""
        super().setup()
        self._warm = {name: memory_of(pool).allocations for name, pool in self._pools.items()}
        self._counted = [0, 0]

    def _pass(self, pool: BucketPool, clock: OpClock) -> int:
        asked = self._copies.asked
        elapsed = time_ns(functools.partial(evented_ops, pool, EVENTED_N, self._ops, clock))
        if pool is self._pools["stuck"]:
            self._counted[0] += self._copies.asked - asked
            self._counted[1] += self._ops
        pool.collect()
        return elapsed

    def measurements(self) -> dict[str, Measurement]:
        """Stuck / none stuck, ns per step, allocations after warm-up, questions per step."""
        figures = super().measurements()
        asked, steps = self._counted
        figures[STUCK_ASKED] = exact(1_000 * asked / max(steps, 1), "count")
        for name, pool in self._pools.items():
            after = memory_of(pool).allocations - self._warm[name]
            figures[f"{name} allocations after warm-up"] = exact(after, "count")
        return figures

    def close(self) -> None:
        """End the stuck copies; drop the pools."""
        for clock in self._clocks.values():  # the last steps' copies end too
            clock.ops += DELAY + 1
        _end(self._pools.values(), self._copies)
        self._pools = {}
        super().close()


@typing.final
class CollectCase(SeriesCase):
    """``pool.collect()`` per parked buffer with *parked* parked, over with 1% of that."""

    per = "buffer"

    def __init__(self, parked: int) -> None:
        few, many = self._counts = (max(1, parked // 100), parked)
        super().__init__(
            "collect",
            f"pool.collect() per parked buffer, {many:,} parked over {few:,}: every event "
            "pending, or every event done (parked again after, untimed)",
            [
                (f"{state}: per-buffer cost, 100x parked / 1x", f"{state} {many}", f"{state} {few}")
                for state in ("pending", "done")
            ],
        )
        self._pools: list[tuple[BucketPool, OpClock]] = []

    def setup(self) -> None:
        """Make a pool per count, park its buffers, run one untimed cycle."""
        self._pools = [(_roomy(_PARKED_N, count, cached=True), OpClock()) for count in self._counts]
        self.samples = {f"{s} {count}": [] for count in self._counts for s in ("pending", "done")}
        for (pool, clock), count in zip(self._pools, self._counts, strict=True):
            park(pool, _PARKED_N, count, functools.partial(AfterOps, clock, clock.ops + 1))
            _collect_cycle(pool, clock, count)
        gc.collect()

    def round(self) -> None:
        """Cycles of the fewer buffers (summed), then one of the more."""
        for (pool, clock), count in zip(self._pools, self._counts, strict=True):
            repeats = _COLLECT_REPEATS if count < self._counts[-1] else 1
            cycles = [_collect_cycle(pool, clock, count) for _ in range(repeats)]
            for state, total in zip(
                ("pending", "done"), map(sum, zip(*cycles, strict=True)), strict=True
            ):
                self.samples[f"{state} {count}"].append(total / (count * repeats))

    def close(self) -> None:
        """Let the copies end; drop the pools."""
        for pool, clock in self._pools:
            clock.ops += 1
            _end([pool])
        self._pools = []


def _collect_cycle(pool: BucketPool, clock: OpClock, count: int) -> tuple[int, int]:
    """Time ``collect()`` with every event pending, then done; park the buffers again."""
    pending = time_ns(pool.collect)
    clock.ops += 1
    done = time_ns(pool.collect)
    park(pool, _PARKED_N, count, functools.partial(AfterOps, clock, clock.ops + 1))
    return pending, done
