"""The threads case: `THREADS` threads on one shared pool, throughput and latency per op.

Each thread calls the pool as its callers do (the original behind a lock, since it is not
thread-safe; `BucketPool` with ``with pool.acquire(n) as bufs:``), all released together by
a barrier.  Throughput runs keep no clock per op; separate runs record each op's latency
for the p99.  Kept custom: no benchmarking library runs threads against one shared object.
"""

from __future__ import annotations

import functools
import gc
import threading
import time
import typing
from collections.abc import Callable

from bucketpool import BucketPool
from bucketpool.bench._cases import HOT_N, ratio_of
from bucketpool.bench._pools import LockedOriginal, handle_ops, sliced_ops
from bucketpool.bench._stats import Measurement, Unit, percentile, relative_spread, summarize

__all__ = ["THREADS", "ThreadsCase", "threaded"]

THREADS = 8


def threaded(work: Callable[[list[int] | None], None], threads: int, record: bool) -> list[int]:
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
