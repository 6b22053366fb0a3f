"""The ``kv-offload`` case: descriptor memory of vLLM's KV-offload worker, lists vs bucketpool.

vLLM's ``CPUOffloadingWorker`` has a store and a load handler
(``SingleDirectionOffloadingHandler``), each with its own list of triples: it pops one per
transfer (dropping it, and making one of exactly ``n``, when it is too small) and appends it
back once the copy's end event is done; `OriginalDescriptorBufferPool` is that pattern
exactly.  Against them, what ``install(kv_offload=True)`` puts there, through the public
API it is built on: one pool, a whole bucket per transfer, released when the handler gives
it back (``tests/test_kv_offload.py`` drives the adapter itself in vLLM's handler).
One trace of `JOBS` transfers, log-uniform sizes, stores and loads at random, 1-3 copies in
flight on one device, each handler polling its own in order before each submission (its
``get_finished()``); then the same with one spike of `SPIKE_N` descriptors early in a
trace of `SPIKE_JOBS`.  Untimed: the figures are exact.

Two more runs measure a caller that releases at submission, ``release(event=end_event)``,
and recycles its end events as vLLM's handlers do (``_event_pool``): a re-recorded event
keeps a buffer parked on it until the later copy; ``pool.collect()`` before giving the
events back retires the buffers first (docs/guide/events.md).
"""

from __future__ import annotations

import collections
import typing
from collections.abc import Callable

import attrs
import numpy as np

from bench._original import OriginalDescriptorBufferPool, OriginalDescriptorBuffers
from bench._pools import Memory, memory_of
from bench._stats import Measurement, exact
from bucketpool import BucketPool, BufferHandle

__all__ = ["JOBS", "KvOffloadCase", "kv_trace"]

#: Transfers in the trace.
JOBS = 600
#: The spike's size, and the length of its trace (past the pool's idle trimming).
SPIKE_N, SPIKE_JOBS = 1 << 20, 2_000
_SMALLEST, _LARGEST = 16, 16_384  # descriptors per transfer, log-uniform between
_Step = tuple[int, int, int]  # n, copies left in flight after it, handler (0 store, 1 load)


def kv_trace(seed: int, jobs: int = JOBS, spike: bool = False) -> list[_Step]:
    """Return the transfers: log-uniform n, 1-3 in flight, store or load; the spike at 50."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(_SMALLEST), np.log(_LARGEST), jobs)).astype(int)
    steps = zip(sizes, rng.integers(1, 4, jobs), rng.integers(0, 2, jobs), strict=True)
    trace = [(int(n), int(k), int(h)) for n, k, h in steps]
    if spike:
        trace[50] = (SPIKE_N, *trace[50][1:])
    return trace


class _Device:
    """Copies run in submission order; an event is done once the copies before it ran."""

    def __init__(self) -> None:
        self.submitted = self.done = 0


class _Event:
    """``torch.Event`` on `_Device`: ``record`` moves it to the latest copy, as CUDA's."""

    def __init__(self, device: _Device) -> None:
        self.device, self.position = device, 0

    def record(self) -> None:
        self.position = self.device.submitted

    def query(self) -> bool:
        return self.device.done >= self.position


_Take = Callable[[int], object]  # the transfer's descriptors, taken before its events


@attrs.define
class _Handler:
    """One handler: how it takes and gives back descriptors, its events, its transfers."""

    take: _Take
    finish: Callable[[object], None]
    queued: Callable[[object, _Event], None] = lambda taken, end: None  # after end.record()
    events: list[_Event] = attrs.field(factory=list)  # its _event_pool, re-recorded
    in_flight: collections.deque[tuple[_Event, _Event, object]] = attrs.field(
        factory=collections.deque
    )

    def poll(self) -> None:
        """``get_finished()``: give back each transfer done, in order, and its events."""
        while self.in_flight and self.in_flight[0][1].query():
            start, end, taken = self.in_flight.popleft()
            self.finish(taken)
            self.events += [end, start]


def _run(trace: list[_Step], handlers: tuple[_Handler, _Handler]) -> None:
    """Drive the worker through *trace*.

    Each step, its handler polls, takes descriptors and two events and submits; then the
    device runs copies until at most the step's count is in flight.
    """
    device = _Device()
    for n, limit, which in trace:
        handler = handlers[which]
        handler.poll()
        taken = handler.take(n)
        events = handler.events
        start, end = (events.pop() if events else _Event(device) for _ in range(2))
        start.record()
        device.submitted += 1  # the copy
        end.record()
        handler.queued(taken, end)
        handler.in_flight.append((start, end, taken))
        device.done = max(device.done, device.submitted - limit)
    device.done = device.submitted
    for handler in handlers:
        handler.poll()


def _lists(trace: list[_Step]) -> Memory:
    """Return what vLLM's own lists, one per handler, held together."""
    lists = [OriginalDescriptorBufferPool() for _ in range(2)]
    peak = 0

    def taker(own: OriginalDescriptorBufferPool) -> _Take:
        def take(n: int) -> object:
            nonlocal peak
            bufs = own.acquire(n)  # the lists allocate only here: their joint peak is here
            peak = max(peak, sum(each.bytes_held for each in lists))
            return bufs

        return take

    def giver(own: OriginalDescriptorBufferPool) -> Callable[[object], None]:
        return lambda bufs: own.release(typing.cast("OriginalDescriptorBuffers", bufs))

    _run(
        trace,
        (_Handler(taker(lists[0]), giver(lists[0])), _Handler(taker(lists[1]), giver(lists[1]))),
    )
    held = sum(each.bytes_held for each in lists)
    return Memory(sum(each.allocations for each in lists), held, peak)


def _installed(trace: list[_Step]) -> Memory:
    """Return what ``install(kv_offload=True)`` held, through the public API it is built on.

    One pool; a transfer takes a whole bucket of at least n, released once polled done.
    """
    pool = BucketPool()

    def take(n: int) -> object:
        return pool.acquire(pool.bucket_capacity(n))

    def give_back(handle: object) -> None:
        typing.cast("BufferHandle", handle).release()

    _run(trace, (_Handler(take, give_back), _Handler(take, give_back)))
    return memory_of(pool)


def _evented(trace: list[_Step], collect: bool) -> Memory:
    """Release at submission, parked on the end event; `pool.collect()` before recycling?"""
    pool = BucketPool()

    def queued(handle: object, end: _Event) -> None:
        typing.cast("BufferHandle", handle).record_event(end)
        typing.cast("BufferHandle", handle).release()

    def finish(_: object) -> None:
        if collect:
            pool.collect()

    def take(n: int) -> object:
        return pool.acquire(pool.bucket_capacity(n))

    _run(trace, (_Handler(take, finish, queued), _Handler(take, finish, queued)))
    return memory_of(pool)


@typing.final
class KvOffloadCase:
    """The KV-offload handler's list against ``install(kv_offload=True)``, exact counts."""

    def __init__(self, seed: int) -> None:
        self.name = "kv-offload"
        self.description = (
            f"vLLM's KV-offload lists vs install(kv_offload=True), {JOBS} log-uniform "
            "transfers; a spike; recycled end events"
        )
        self.samples: dict[str, list[float]] = {}
        self._seed = seed
        self._figures: dict[str, Measurement] = {}

    def setup(self) -> None:
        """Run the traces: the figures are exact."""
        trace, spiked = kv_trace(self._seed), kv_trace(self._seed, SPIKE_JOBS, spike=True)
        listed, pooled = _lists(trace), _installed(trace)
        spike_listed, spike_pooled = _lists(spiked), _installed(spiked)
        recycled, collected = _evented(trace, False), _evented(trace, True)
        per_1000 = 1_000 / JOBS
        f = self._figures
        f["allocations per 1,000 jobs, lists"] = exact(listed.allocations * per_1000, "count")
        f["allocations per 1,000 jobs, bucketpool"] = exact(pooled.allocations * per_1000, "count")
        f["allocations bucketpool/lists"] = exact(pooled.allocations / listed.allocations, "x")
        f["peak bytes, lists"] = exact(listed.peak_bytes, "bytes")
        f["peak bytes, bucketpool"] = exact(pooled.peak_bytes, "bytes")
        f["retained bytes, lists"] = exact(listed.bytes_held, "bytes")
        f["retained bytes, bucketpool"] = exact(pooled.bytes_held, "bytes")
        f["retained bytes bucketpool/lists"] = exact(pooled.bytes_held / listed.bytes_held, "x")
        f["spike: retained bytes, lists"] = exact(spike_listed.bytes_held, "bytes")
        f["spike: retained bytes, bucketpool"] = exact(spike_pooled.bytes_held, "bytes")
        spike_ratio = spike_pooled.bytes_held / spike_listed.bytes_held
        f["spike: retained bytes bucketpool/lists"] = exact(spike_ratio, "x")
        for name, memory in (("events recycled", recycled), ("collect() first", collected)):
            f[f"allocations per 1,000 jobs, {name}"] = exact(memory.allocations * per_1000, "count")

    def round(self) -> None:
        """Nothing: the figures are exact."""

    def close(self) -> None:
        """Nothing: the pools went at the end of `setup`."""

    def measurements(self) -> dict[str, Measurement]:
        """The counts and bytes, and their ratios."""
        return dict(self._figures)
