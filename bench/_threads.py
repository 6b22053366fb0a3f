"""The threads cases: `THREADS` threads on one shared pool, throughput and latency per op.

``threads-8``: each thread calls its pool as its callers do (the original behind a lock,
since it is not thread-safe; `BucketPool` with ``with pool.acquire(n) as bufs:``).
``threads-8-switch``: `BucketPool` alone, at the default switch interval and at
`FAST_SWITCH` (``sys.setswitchinterval``), where the interpreter hands the GIL from thread to
thread fifty times as often, so a thread is more often stopped inside the pool.

Threads are released together by a barrier.  Throughput runs keep no clock per op;
separate runs record each op's latency for the p99.  Kept custom: no benchmarking library
runs threads against one shared object.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import threading
import time
import typing
from collections.abc import Callable, Iterator

from bench._cases import HOT_N, ratio_of
from bench._pools import LockedOriginal, handle_ops, sliced_ops
from bench._stats import Measurement, Unit, percentile, relative_spread, summarize
from bucketpool import BucketPool

__all__ = [
    "FAST_SWITCH",
    "THREADS",
    "SwitchCase",
    "ThreadsCase",
    "Work",
    "switch_interval",
    "threaded",
]

THREADS = 8
#: The fast switch interval of ``threads-8-switch``, in seconds.
FAST_SWITCH = 1e-4
#: One thread's work: it runs its ops, appending each op's ns to the list when given one.
Work = Callable[[list[int] | None], None]


def threaded(work: Work, threads: int, record: bool) -> list[int]:
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
        #: CPUs the case keeps busy, for the runner's load check.
        self.cores = threads
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
        self._runs: dict[str, Work] = {}

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
            threaded(run, self._threads, record=False)

    def round(self) -> None:
        """Throughput of each workload (no clock per op), then per-op latencies."""
        total = self._ops * self._threads
        for name, run in self._runs.items():
            elapsed = threaded(run, self._threads, record=False)[0]
            self.samples[f"{name} ops/s"].append(total * 1e9 / elapsed)
        for name in ("original", "bucketpool"):
            latencies = threaded(self._runs[name], self._threads, record=True)[1:]
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
            "bucketpool/original throughput": ratio_of(
                self.samples, "bucketpool ops/s", "original ops/s"
            ),
            "bare acquire/release throughput ratio": ratio_of(
                self.samples, "bucketpool bare ops/s", "original bare ops/s"
            ),
            "original ops/s": median("original ops/s", "ops/s"),
            "bucketpool ops/s": median("bucketpool ops/s", "ops/s"),
            "bucketpool p99 latency": median("bucketpool p99 ns", "ns"),
            "original p99 latency": median("original p99 ns", "ns"),
        }


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """Set ``sys.setswitchinterval(seconds)`` for the block; restore it after, also on error."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@typing.final
class SwitchCase:
    """`THREADS` threads on one `BucketPool` at the default and at the fast switch interval."""

    def __init__(self, ops_per_thread: int, threads: int = THREADS) -> None:
        self.name = f"threads-{threads}-switch"
        self._default = sys.getswitchinterval()
        self.description = (
            f"{threads} threads on one BucketPool, with pool.acquire({HOT_N:,}) loops, at the "
            f"default switch interval ({self._default * 1e6:,.0f} us) and at "
            f"{FAST_SWITCH * 1e6:,.0f} us; the single-thread op from one thread, same round"
        )
        self._ops = ops_per_thread
        self._threads = threads
        #: CPUs the case keeps busy, for the runner's load check.
        self.cores = threads
        self.samples: dict[str, list[float]] = {
            key: []
            for key in ("single-thread op ns", "default ops/s", "100us ops/s", "100us p99 ns")
        }
        self._work: Work | None = None

    def setup(self) -> None:
        """Make the pool and run the workload once at each interval, untimed."""
        self._work = functools.partial(_handle_work, BucketPool(), HOT_N, self._ops, False)
        for seconds in (self._default, FAST_SWITCH):
            with switch_interval(seconds):
                threaded(self._work, self._threads, record=False)

    def round(self) -> None:
        """One thread's op latencies, then throughput at each interval, then p99 at the fast."""
        work, threads = self._work, self._threads
        assert work is not None, "setup() first"
        total = self._ops * threads
        with switch_interval(self._default):
            single = threaded(work, 1, record=True)[1:]
            default = threaded(work, threads, record=False)[0]
        with switch_interval(FAST_SWITCH):
            fast = threaded(work, threads, record=False)[0]
            latencies = threaded(work, threads, record=True)[1:]
        self.samples["single-thread op ns"].append(percentile(single, 50))
        self.samples["default ops/s"].append(total * 1e9 / default)
        self.samples["100us ops/s"].append(total * 1e9 / fast)
        self.samples["100us p99 ns"].append(percentile(latencies, 99))

    def close(self) -> None:
        """Drop the pool."""
        self._work = None

    def measurements(self) -> dict[str, Measurement]:
        """Throughput at the fast interval over the default's, and p99 over one thread's op.

        The default interval's throughput is the load signal of every figure here.
        """
        spread = relative_spread(self.samples["default ops/s"])

        def median(series: str, unit: Unit) -> Measurement:
            return summarize(self.samples[series], unit, spread=spread)

        ratio = functools.partial(ratio_of, self.samples)
        return {
            "throughput at 100us / at default": ratio("100us ops/s", "default ops/s"),
            "p99 op latency at 100us / single-thread median op": ratio(
                "100us p99 ns", "single-thread op ns"
            ),
            "default ops/s": median("default ops/s", "ops/s"),
            "100us ops/s": median("100us ops/s", "ops/s"),
            "100us p99 latency": median("100us p99 ns", "ns"),
            "single-thread median op": median("single-thread op ns", "ns"),
        }


def _sliced_work(
    pool: LockedOriginal, n: int, ops: int, bare: bool, latencies: list[int] | None
) -> None:
    sliced_ops(pool, n, ops, latencies, bare=bare)


def _handle_work(
    pool: BucketPool, n: int, ops: int, bare: bool, latencies: list[int] | None
) -> None:
    handle_ops(pool, n, ops, latencies, bare=bare)
