"""Threads on one pool: handles handed between threads, parked buffers, stats read meanwhile."""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy.typing as npt
import pytest
from _events import FlagEvent, FlipEvent
from _helpers import (
    Pattern,
    check_stats_consistent,
    has_pattern,
    make_pattern,
    write_pattern,
)

from bucketpool import (
    BucketPool,
    BufferHandle,
    ReleaseError,
    Stat,
)

# -- threads share a pool ------------------------------------------------------------------


def test_threads_share_a_pool() -> None:
    pool = BucketPool()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(500):
                n = (seed * 7919 + i * 31) % 3000
                with pool.acquire(n) as bufs:
                    bufs.src_ptrs.fill_(seed)
                    assert bool((bufs.src_ptrs == seed).all())
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = pool.stats()
    assert stats.active_requests == Stat(0, stats.active_requests.peak, 2000, 2000)
    assert stats.hits + stats.misses == 2000


# -- stress: eight threads, 100,000 acquires -----------------------------------------------


THREADS = 8


ACQUIRES_PER_THREAD = 12_500  # 100,000 acquires (and as many releases) in all


COUNTS = (0, 1, 3, 4, 5, 8, 9, 16, 17, 31, 33, 64, 100)


@attrs.define(eq=False)
class InFlight:
    """A handle travelling between threads, with the canary it must still hold."""

    handle: BufferHandle = attrs.field(repr=False)
    pattern: Pattern = attrs.field(repr=False)
    owner: int


def run_threads(
    targets: Sequence[Callable[[], None]], pool: BucketPool, timeout: float = 120.0
) -> list[str]:
    """Run *targets* on threads started together; return the errors they raised.

    Meanwhile another thread, started with them, checks that every `BucketPool.stats`
    snapshot is consistent; at least one snapshot must have been taken while every target
    was still running, or the check proved nothing and the run fails.  *timeout* is a
    deadlock guard only.
    """
    errors: list[str] = []
    stop = threading.Event()
    finished = 0  # targets that have returned or raised
    during = 0  # snapshots begun and ended while no target had finished
    barrier = threading.Barrier(len(targets) + 1)

    def monitor() -> None:
        nonlocal during
        try:
            barrier.wait()
            while not stop.is_set():
                before = finished
                check_stats_consistent(
                    pool.stats(),
                    max_cached_bytes=pool.settings.max_cached_bytes,
                    per_bucket=pool.settings.max_cached_per_bucket,
                )
                during += before == finished == 0
                stop.wait(0.001)  # pacing only: each snapshot costs the workers a lock hold
        except BaseException as error:
            errors.append(f"monitor: {error!r}")

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            nonlocal finished
            try:
                barrier.wait()
                target()
            except BaseException as error:
                errors.append(f"{threading.current_thread().name}: {error!r}")
            finally:
                with lock:
                    finished += 1

        return run

    lock = threading.Lock()
    watcher = threading.Thread(target=monitor, name="monitor", daemon=True)
    threads = [
        threading.Thread(target=wrap(target), name=f"stress-{i}", daemon=True)
        for i, target in enumerate(targets)
    ]
    watcher.start()
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    watcher.join(10)
    stuck = [thread.name for thread in [*threads, watcher] if thread.is_alive()]
    assert not stuck, f"threads still running after {timeout} s (deadlock?): {stuck}"
    assert during > 0, "no stats snapshot was taken while the threads were running"
    return errors


def check_final_stats(pool: BucketPool, acquires: int) -> None:
    stats = pool.stats()
    check_stats_consistent(
        stats,
        max_cached_bytes=pool.settings.max_cached_bytes,
        per_bucket=pool.settings.max_cached_per_bucket,
    )
    assert stats.active_requests.current == 0
    assert stats.active_bytes.current == 0
    assert all(bucket.active == 0 for bucket in stats.buckets)
    assert stats.hits + stats.misses == acquires
    assert stats.active_requests.allocated == stats.active_requests.freed == acquires
    assert stats.allocations.current == sum(b.cached + b.parked for b in stats.buckets)
    assert stats.parked == 0
    assert pool.outstanding() == []


def threads_pool() -> BucketPool:
    """Small caps, so that the threads also race on eviction and idle trimming."""
    return BucketPool(
        min_capacity=4,
        max_capacity=1024,
        max_cached_per_bucket=4,
        max_cached_bytes=16_384,
        idle_trim_acquires=64,
    )


@pytest.mark.usefixtures("frequent_thread_switches")
def test_threads_hand_off_handles_without_corruption() -> None:
    pool = threads_pool()
    inboxes: list[queue.Queue[InFlight]] = [queue.Queue() for _ in range(THREADS)]
    corrupted: list[str] = []

    def worker(me: int) -> Callable[[], None]:
        outbox = inboxes[(me + 1) % THREADS]
        inbox = inboxes[me]

        def run() -> None:
            for seq in range(ACQUIRES_PER_THREAD):
                n = COUNTS[(seq * 7 + me) % len(COUNTS)]
                pattern = make_pattern((me << 20) | seq, n)
                if seq % 8 == 0:  # now and then a with block on one thread
                    with pool.acquire(n) as bufs:
                        arrays = [tensor.numpy() for tensor in bufs]
                        write_pattern(arrays, pattern)
                        if not has_pattern(arrays, pattern):
                            corrupted.append(f"thread {me} seq {seq} n={n}")
                        del arrays
                    continue
                handle = pool.acquire(n)
                write_pattern(handle.arrays, pattern)
                outbox.put(InFlight(handle, pattern, me))
                received = inbox.get(timeout=30)
                assert received.owner != me
                if not has_pattern(received.handle.arrays, received.pattern):
                    corrupted.append(f"thread {me}: a handle of thread {received.owner}")
                received.handle.release()

        return run

    start = time.perf_counter()
    errors = run_threads([worker(i) for i in range(THREADS)], pool)
    elapsed = time.perf_counter() - start
    assert errors == []
    assert corrupted == []
    assert all(inbox.empty() for inbox in inboxes)
    check_final_stats(pool, THREADS * ACQUIRES_PER_THREAD)
    print(f"{THREADS * ACQUIRES_PER_THREAD:,} acquires across {THREADS} threads: {elapsed:.2f} s")


@pytest.mark.usefixtures("frequent_thread_switches")
def test_threads_never_reuse_a_parked_buffer() -> None:
    pool = threads_pool()
    lock = threading.Lock()
    in_flight: Counter[int] = Counter()  # address -> parked buffers there (must stay 0 or 1)
    to_complete: queue.Queue[tuple[FlipEvent, tuple[npt.NDArray[Any], ...], Pattern, int] | None]
    to_complete = queue.Queue()
    inboxes: list[queue.Queue[InFlight]] = [queue.Queue() for _ in range(THREADS)]
    problems: list[str] = []
    parked_seen = 0

    def worker(me: int) -> Callable[[], None]:
        outbox = inboxes[(me + 1) % THREADS]
        inbox = inboxes[me]

        def run() -> None:
            nonlocal parked_seen
            for seq in range(ACQUIRES_PER_THREAD):
                n = COUNTS[(seq * 5 + me) % len(COUNTS)]
                handle = pool.acquire(n)
                address = int(handle.arrays[0].ctypes.data)
                with lock:
                    if in_flight[address]:
                        problems.append(f"thread {me} got a parked buffer at {address:#x}")
                pattern = make_pattern((me << 20) | seq, n)
                write_pattern(handle.arrays, pattern)
                outbox.put(InFlight(handle, pattern, me))
                received = inbox.get(timeout=30)
                arrays = received.handle.arrays
                if not has_pattern(arrays, received.pattern):
                    problems.append(f"thread {me}: canary of thread {received.owner} changed")
                if seq % 3:
                    received.handle.release()
                    continue
                # "Upload" the descriptors, record the end event, release: parked.
                event = FlipEvent(done=seq % 9 == 0)  # some are done already
                received.handle.record_event(event)
                address = int(arrays[0].ctypes.data)
                if not event.done:
                    with lock:
                        in_flight[address] += 1
                        parked_seen += 1
                received.handle.release()
                if not event.done:
                    to_complete.put((event, tuple(arrays), received.pattern, address))

        return run

    def completer() -> None:
        """The device: completes events in order, a while after they were recorded."""
        window: list[tuple[FlipEvent, tuple[npt.NDArray[Any], ...], Pattern, int]] = []
        finished = False
        while not finished or window:
            item = None if finished else to_complete.get(timeout=60)
            if item is None:
                finished = True
            else:
                window.append(item)
            if len(window) > 24 or (finished and window):
                event, arrays, pattern, address = window.pop(0)
                if not has_pattern(arrays, pattern):
                    problems.append(f"a parked buffer at {address:#x} was written in flight")
                with lock:
                    in_flight[address] -= 1
                event.done = True

    completer_thread = threading.Thread(target=completer, name="completer", daemon=True)
    completer_thread.start()
    start = time.perf_counter()
    errors = run_threads([worker(i) for i in range(THREADS)], pool)
    to_complete.put(None)
    completer_thread.join(60)
    elapsed = time.perf_counter() - start
    assert not completer_thread.is_alive()
    assert errors == []
    assert problems == []
    assert parked_seen > 1_000
    assert all(count == 0 for count in in_flight.values())
    retired = pool.collect()
    assert retired <= parked_seen
    check_final_stats(pool, THREADS * ACQUIRES_PER_THREAD)
    print(f"{parked_seen:,} parked of {THREADS * ACQUIRES_PER_THREAD:,} acquires: {elapsed:.2f} s")


def _race_handle_release_at_line(line: int) -> bool:
    """Release a handle while, before its *line*th line, another thread releases it too.

    That thread then acquires the buffer again and records a pending event, as a second
    holder would.  Returns False once the release has fewer lines.
    """
    exit_code = BufferHandle.__exit__.__code__
    pool = BucketPool()
    handle = pool.acquire(8)
    seen = [0]
    second: list[BufferHandle] = []
    copy = FlagEvent()

    def at_line(frame: types.FrameType, what: str, arg: object) -> Any:
        if what == "line":
            seen[0] += 1
            if seen[0] == line and not second:
                sys.settrace(None)
                with contextlib.suppress(ReleaseError):
                    handle.release()
                again = pool.acquire(8)
                again.record_event(copy)  # its copy is in flight
                second.append(again)
        return at_line

    def tracer(frame: types.FrameType, what: str, arg: object) -> Any:
        return at_line if frame.f_code is exit_code and not second else None

    sys.settrace(tracer)
    try:
        with contextlib.suppress(ReleaseError):
            handle.release()
    finally:
        sys.settrace(None)
    if not second:
        return False
    (again,) = second
    assert not again.released, line
    again.release()
    assert pool.stats().parked == 1, line  # the new holder's event was kept: still in flight
    copy.done = True
    assert pool.collect() == 1, line
    assert pool.stats().active_requests.current == 0, line
    return True


def test_a_late_second_release_of_a_handle_leaves_the_next_hand_out_alone() -> None:
    # Two threads releasing one handle (free-threaded CPython lets them meet anywhere): the
    # late one must not clear what the next hand-out of the buffer recorded.
    line = 1
    while _race_handle_release_at_line(line):
        line += 1
    assert line > 5  # the release's lines were stepped through
