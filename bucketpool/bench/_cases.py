"""The benchmark's cases: what one round of each measures, and the figures it yields.

A case holds its pools for the whole run.  `Case.setup` makes them and runs the untimed
warm-up; each `Case.round` runs every series of the case once, back to back, and appends
one sample per series; `Case.measurements` turns the samples into figures with intervals
(see `bucketpool.bench._stats`).  The runner may call `Case.round` again later to narrow an
interval, so a round never depends on how many came before.

Kept custom: the cases interleave several pools in one process (pyperf would run each in
its own worker process, where pairing is lost), measure memory through the pools' own
counters and tracemalloc, and run eight threads on one shared pool.
"""

from __future__ import annotations

import functools
import gc
import math
import threading
import time
import tracemalloc
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from bucketpool import BucketPool, BufferHandle
from bucketpool.bench._original import OriginalDescriptorBufferPool
from bucketpool.bench._pools import (
    IMPLEMENTATIONS,
    Implementation,
    LockedOriginal,
    handle_ops,
    make_implementations,
    memory_of,
    park,
    sliced_ops,
)
from bucketpool.bench._stats import (
    Measurement,
    Unit,
    exact,
    paired_ratios,
    percentile,
    relative_spread,
    summarize,
    time_ns,
)
from bucketpool.bench._traces import Trace
from bucketpool.compat import DescriptorBufferPool

__all__ = [
    "BLOCK_BYTES",
    "FILL_COPIES",
    "HOT_N",
    "PARKED",
    "THREADS",
    "Case",
    "DebugCase",
    "FillsCase",
    "OverheadCase",
    "ParkedCase",
    "ThreadsCase",
    "TraceCase",
]

#: The hot loop's n: one image of a 7B vision model, in encoder-cache blocks.
HOT_N = 1_196
PARKED = 10_000
_PARKED_N = 16  # another bucket than HOT_N's
THREADS = 8
FILL_COPIES = 1_024
#: One encoder-cache block: one token's embedding row (3,584 bf16 values of a 7B model).
BLOCK_BYTES = 7_168
_OVERHEAD_BUFFERS = 31  # the default max_cached_per_bucket (32), less the warm-up buffer


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


def _ratio(
    samples: Mapping[str, Sequence[float]], num: str, den: str, unit: Unit = "x"
) -> Measurement:
    """The per-round paired ratio *num* / *den*; *den*'s spread is the load signal."""
    ratios = paired_ratios(samples[num], samples[den])
    return summarize(ratios, unit, spread=relative_spread(samples[den]))


def _median(samples: Sequence[float], unit: Unit) -> Measurement:
    return summarize(samples, unit, spread=relative_spread(samples))


# -- traces ---------------------------------------------------------------------------------


def _pass_of(impl: Implementation, trace: Trace) -> Callable[[], None]:
    if trace.cycle is not None:
        return functools.partial(impl.cycle, trace.cycle)
    return functools.partial(impl.replay, trace.events)


@typing.final
class TraceCase:
    """The three pools on one trace: ns per op, allocations and bytes held."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.name = trace.name
        self.description = trace.description
        self.samples: dict[str, list[float]] = {name: [] for name in IMPLEMENTATIONS}
        #: Implementation to bytes held after each op (recorded traces only).
        self.series: dict[str, tuple[int, ...]] = {}
        self._impls: tuple[Implementation, ...] = ()
        self._passes: list[Callable[[], None]] = []
        self._warm: list[int] = []

    def setup(self) -> None:
        """Record bytes held if the trace asks (fresh pools), then warm up fresh pools."""
        if self.trace.record_bytes:
            self.series = {i.name: i.record(self.trace.events) for i in make_implementations()}
        self._impls = make_implementations()
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
        figures = {
            "bucketpool/original": _ratio(self.samples, "bucketpool", "original"),
            "compat/original": _ratio(self.samples, "compat", "original"),
        }
        cap = BucketPool().max_cached_bytes
        for impl, warm in zip(self._impls, self._warm, strict=True):
            memory = impl.memory()
            figures[f"{impl.name} ns/op"] = _median(self.samples[impl.name], "ns")
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


# -- handles parked on pending events -------------------------------------------------------


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
            "parked/none parked": _ratio(self.samples, "parked", "none parked"),
            "none parked ns/op": _median(self.samples["none parked"], "ns"),
            "parked ns/op": _median(self.samples["parked"], "ns"),
        }


# -- threads --------------------------------------------------------------------------------


def _threaded(work: Callable[[list[int] | None], None], threads: int, record: bool) -> list[int]:
    """Run *work* in *threads* threads started together; return [elapsed ns, *latencies]."""
    barrier = threading.Barrier(threads + 1)
    latencies: list[list[int] | None] = [[] if record else None for _ in range(threads)]
    errors: list[BaseException] = []

    def body(mine: list[int] | None) -> None:
        barrier.wait()
        try:
            work(mine)
        except BaseException as error:  # re-raised in the main thread
            errors.append(error)

    workers = [threading.Thread(target=body, args=(mine,)) for mine in latencies]
    for worker in workers:
        worker.start()
    enabled = gc.isenabled()
    gc.disable()
    try:
        barrier.wait()
        start = time.perf_counter_ns()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter_ns() - start
    finally:
        if enabled:
            gc.enable()
    if errors:
        raise errors[0]
    return [elapsed, *(ns for mine in latencies if mine is not None for ns in mine)]


@typing.final
class ThreadsCase:
    """`THREADS` threads on one pool, each calling it as its callers do."""

    def __init__(self, ops_per_thread: int, threads: int = THREADS) -> None:
        self.name = f"threads-{threads}"
        self.description = (
            f"{threads} threads on one pool, n = {HOT_N:,}; original behind a lock (it is not "
            "thread-safe): acquire, three [:n] slices, release; bucketpool: with acquire(n)"
        )
        self._ops = ops_per_thread
        self._threads = threads
        self.samples: dict[str, list[float]] = {
            key: []
            for key in (
                "original ops/s",
                "bucketpool ops/s",
                "original bare ops/s",
                "bucketpool bare ops/s",
                "original p99 ns",
                "bucketpool p99 ns",
            )
        }
        self._runs: dict[str, Callable[[list[int] | None], None]] = {}

    def setup(self) -> None:
        """Make one pool of each kind and run each workload once, untimed."""
        original, pool = LockedOriginal(), BucketPool()
        ops, n = self._ops, HOT_N
        self._runs = {
            "original": functools.partial(_sliced_work, original, n, ops, False),
            "bucketpool": functools.partial(_handle_work, pool, n, ops, False),
            "original bare": functools.partial(_sliced_work, original, n, ops, True),
            "bucketpool bare": functools.partial(_handle_work, pool, n, ops, True),
        }
        for run in self._runs.values():
            _threaded(run, self._threads, record=False)

    def round(self) -> None:
        """Throughput of each workload (no clock per op), then per-op latencies."""
        total = self._ops * self._threads
        for name, run in self._runs.items():
            elapsed = _threaded(run, self._threads, record=False)[0]
            self.samples[f"{name} ops/s"].append(total * 1e9 / elapsed)
        for name in ("original", "bucketpool"):
            latencies = _threaded(self._runs[name], self._threads, record=True)[1:]
            self.samples[f"{name} p99 ns"].append(percentile(latencies, 99))

    def close(self) -> None:
        """Drop the pools."""
        self._runs = {}

    def measurements(self) -> dict[str, Measurement]:
        """Throughput ratios (higher is better) and p99 latencies.

        The original's throughput is the load signal of every figure here.
        """
        spread = relative_spread(self.samples["original ops/s"])

        def median(series: str, unit: Unit) -> Measurement:
            return summarize(self.samples[series], unit, spread=spread)

        return {
            "bucketpool/original throughput": _ratio(
                self.samples, "bucketpool ops/s", "original ops/s"
            ),
            "bare acquire/release throughput ratio": _ratio(
                self.samples, "bucketpool bare ops/s", "original bare ops/s"
            ),
            "original ops/s": median("original ops/s", "count"),
            "bucketpool ops/s": median("bucketpool ops/s", "count"),
            "bucketpool p99 latency": median("bucketpool p99 ns", "ns"),
            "original p99 latency": median("original p99 ns", "ns"),
        }


def _sliced_work(
    pool: LockedOriginal, n: int, ops: int, bare: bool, latencies: list[int] | None
) -> None:
    sliced_ops(pool, n, ops, latencies, bare=bare)


def _handle_work(
    pool: BucketPool, n: int, ops: int, bare: bool, latencies: list[int] | None
) -> None:
    handle_ops(pool, n, ops, latencies, bare=bare)


# -- debug levels ---------------------------------------------------------------------------


def _ops_for(run: Callable[[int], None], min_ns: int, max_ops: int) -> int:
    """How many ops make a timed pass of *run* last at least *min_ns* (at most *max_ops*)."""
    ops = 1
    while True:
        elapsed = time_ns(functools.partial(run, ops))
        if elapsed >= min_ns or ops >= max_ops:
            return ops
        ops = min(max_ops, max(ops * 2, math.ceil(ops * min_ns * 1.2 / max(elapsed, 1))))


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
            self._runs[level] = (run, _ops_for(run, self._min_pass_ns, self._max_ops))

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
            "checks/off": _ratio(self.samples, "checks", "off"),
            "strict/off": _ratio(self.samples, "strict", "off"),
            "off ns/op": _median(self.samples["off"], "ns"),
        }


def _quiet_ops(pool: BucketPool, ops: int) -> None:
    # The debug levels may warn about this loop's views; the benchmark times, not reports.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle_ops(pool, HOT_N, ops, None)


# -- fills ----------------------------------------------------------------------------------

_FILL_LABELS = {
    "setitem": "torch setitem loop (the original worker)",
    "add_copies": "handle.add_copies",
    "add_block_copies-consecutive": f"handle.add_block_copies, {FILL_COPIES:,} consecutive blocks",
    "add_block_copies-shuffled": f"handle.add_block_copies, {FILL_COPIES:,} shuffled blocks",
    "numpy": "bare numpy slice assignment",
}


def _fill_calls(handle: BufferHandle, seed: int) -> dict[str, Callable[[], int]]:
    """The fill methods, each a call that writes ``handle.n`` copies and returns descriptors."""
    copies = handle.n
    rng = np.random.default_rng(seed)
    src = rng.integers(1 << 12, 1 << 44, copies, dtype=np.int64) * 8
    dst = rng.integers(1 << 12, 1 << 44, copies, dtype=np.int64) * 8
    counts = rng.integers(1, 1 << 13, copies, dtype=np.int64) * 8
    src_list, dst_list, count_list = src.tolist(), dst.tolist(), counts.tolist()
    src_t, dst_t, size_t = OriginalDescriptorBufferPool().acquire(copies)
    src_a, dst_a, size_a = handle.arrays
    src_base, dst_base = (int(rng.integers(1 << 20, 1 << 30)) * 4096 for _ in range(2))
    consecutive: npt.NDArray[np.int64] = np.arange(copies, dtype=np.int64)
    shuffled = (rng.permutation(copies).astype(np.int64), rng.permutation(copies).astype(np.int64))

    def setitem() -> int:
        for i in range(copies):
            src_t[i] = src_list[i]
            dst_t[i] = dst_list[i]
            size_t[i] = count_list[i]
        return copies

    def bare_numpy() -> int:
        src_a[:copies] = src
        dst_a[:copies] = dst
        size_a[:copies] = counts
        return copies

    def blocks(src_blocks: npt.NDArray[np.int64], dst_blocks: npt.NDArray[np.int64]) -> int:
        return handle.add_block_copies(0, src_base, dst_base, src_blocks, dst_blocks, BLOCK_BYTES)

    return {
        "setitem": setitem,
        "add_copies": functools.partial(handle.add_copies, 0, src, dst, counts),
        "add_block_copies-consecutive": functools.partial(blocks, consecutive, consecutive),
        "add_block_copies-shuffled": functools.partial(blocks, *shuffled),
        "numpy": bare_numpy,
    }


def _repeat_call(call: Callable[[], int], calls: int) -> None:
    for _ in range(calls):
        call()


@typing.final
class FillsCase:
    """Ways of writing `FILL_COPIES` copies into descriptor buffers, ns per call."""

    def __init__(self, min_batch_ns: int, seed: int = 0) -> None:
        self.name = "fills"
        self.description = f"{FILL_COPIES:,} random 8-byte aligned copies per call"
        self.samples: dict[str, list[float]] = {name: [] for name in _FILL_LABELS}
        self.labels = dict(_FILL_LABELS)
        #: Method name to descriptors written per call.
        self.descriptors: dict[str, int] = {}
        self._min_batch_ns = min_batch_ns
        self._seed = seed
        self._batches: dict[str, tuple[Callable[[], None], int]] = {}
        self._handle: BufferHandle | None = None

    def setup(self) -> None:
        """Acquire the target buffers (held for the run), size each method's batch."""
        self._handle = BucketPool().acquire(FILL_COPIES)
        for name, call in _fill_calls(self._handle, self._seed).items():
            self.descriptors[name] = call()
            calls = _ops_for(functools.partial(_repeat_call, call), self._min_batch_ns, 1 << 20)
            self._batches[name] = (functools.partial(_repeat_call, call, calls), calls)

    def round(self) -> None:
        """One timed batch per method."""
        for name, (batch, calls) in self._batches.items():
            self.samples[name].append(time_ns(batch) / calls)

    def close(self) -> None:
        """Release the target buffers."""
        if self._handle is not None:
            self._handle.release()
            self._handle = None
        self._batches = {}

    def measurements(self) -> dict[str, Measurement]:
        """The targets' ratios, and each method's ns per call."""
        figures = {
            "setitem/add_copies": _ratio(self.samples, "setitem", "add_copies"),
            "add_copies/numpy": _ratio(self.samples, "add_copies", "numpy"),
            "add_block_copies-consecutive/add_copies": _ratio(
                self.samples, "add_block_copies-consecutive", "add_copies"
            ),
            "add_block_copies-shuffled/add_copies": _ratio(
                self.samples, "add_block_copies-shuffled", "add_copies"
            ),
        }
        for name in _FILL_LABELS:
            figures[f"{name} ns/call"] = _median(self.samples[name], "ns")
        return figures


# -- memory overhead per cached buffer ------------------------------------------------------


def _traced(make: Callable[[], object]) -> tuple[int, object]:
    """Bytes that tracemalloc sees allocated by *make*, and what it returned (kept alive)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = make()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def _cycle_original(pool: OriginalDescriptorBufferPool, count: int) -> object:
    held = [pool.acquire(HOT_N) for _ in range(count)]
    for bufs in held:
        pool.release(bufs)
    return None


def _cycle_compat(pool: DescriptorBufferPool, count: int) -> object:
    held = [pool.acquire(HOT_N) for _ in range(count)]
    for bufs in held:
        pool.release(bufs)
    return None


@typing.final
class OverheadCase:
    """Python-heap bytes per cached buffer beyond its tensor payload (tracemalloc; untimed)."""

    def __init__(self, buffers: int = _OVERHEAD_BUFFERS) -> None:
        self.name = "overhead"
        self.description = (
            f"tracemalloc bytes per cached buffer of n = {HOT_N:,} ({buffers} cached), less the "
            "tensor payload when tracemalloc sees it"
        )
        self.samples: dict[str, list[float]] = {}
        self._buffers = buffers
        self._figures: dict[str, Measurement] = {}

    def setup(self) -> None:
        """Measure each pool once: one buffer cached untraced, then *buffers* more traced."""
        count = self._buffers
        payload_seen = _traced(lambda: torch.empty(1 << 16, dtype=torch.int64))[0] >= 1 << 18
        pool = BucketPool()
        pool.reserve(HOT_N, 1)
        traced, _ = _traced(lambda: pool.reserve(HOT_N, count))
        capacity = pool.bucket_capacity(HOT_N)
        self._figures["bucketpool bytes per cached buffer"] = self._per_buffer(
            traced, count, capacity, payload_seen
        )
        original = OriginalDescriptorBufferPool()
        _cycle_original(original, 1)
        before = original.allocations
        traced, _ = _traced(lambda: _cycle_original(original, count + 1))
        self._figures["original bytes per cached buffer"] = self._per_buffer(
            traced, original.allocations - before, HOT_N, payload_seen
        )
        compat = DescriptorBufferPool()
        _cycle_compat(compat, 1)
        before = memory_of(compat.pool).allocations
        traced, _ = _traced(lambda: _cycle_compat(compat, count + 1))
        self._figures["compat bytes per cached buffer"] = self._per_buffer(
            traced, memory_of(compat.pool).allocations - before, capacity, payload_seen
        )

    @staticmethod
    def _per_buffer(traced: int, buffers: int, capacity: int, payload_seen: bool) -> Measurement:
        payload = 3 * capacity * 8 if payload_seen else 0
        return exact((traced - payload * buffers) / max(buffers, 1), "bytes")

    def round(self) -> None:
        """Nothing: the figures are exact, measured once in `setup`."""

    def close(self) -> None:
        """Nothing: the pools went at the end of `setup`."""

    def measurements(self) -> dict[str, Measurement]:
        """Bytes per cached buffer, per pool."""
        return dict(self._figures)
