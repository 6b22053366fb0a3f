"""Helpers several test modules share: sizes, canaries, stats invariants, cycles, fork, scripts.

Fixtures are in ``conftest.py``; the fake completion events in ``_events.py``.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import signal
import subprocess
import sys
import threading
import traceback
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn, TypeAlias

import numpy as np
import numpy.typing as npt

import bucketpool
from bucketpool import BucketPool, BucketStats, DescriptorBuffers, PoolStats, Stat

KIB = 1024
ENTRY_BYTES = 8
FIELDS = 3
TRIPLE_16 = 16 * ENTRY_BYTES * FIELDS  # bytes of one buffer of the smallest default bucket
#: Where the package's own code lives: a frame from a file under it is inside the pool.
PACKAGE_DIR = os.path.dirname(bucketpool.__file__) + os.sep
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

U64Array: TypeAlias = npt.NDArray[np.uint64]
Pattern: TypeAlias = tuple[U64Array, U64Array, U64Array]
MAX_N = 1 << 10
_INDEX = np.arange(MAX_N + 1, dtype=np.uint64)


def data_ptrs(bufs: DescriptorBuffers) -> tuple[int, int, int]:
    return (bufs.src_ptrs.data_ptr(), bufs.dst_ptrs.data_ptr(), bufs.sizes.data_ptr())


def line_of(path: str, text: str) -> int:
    """The number of the first line of *path* that ends with *text*."""
    with open(path, encoding="utf-8") as source:
        lines = source.read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(text))


def in_package(frame: types.FrameType | None) -> bool:
    """Whether *frame* or any frame it was called from runs the package's code."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(PACKAGE_DIR):
            return True
        frame = frame.f_back
    return False


def in_finaliser(frame: types.FrameType | None) -> bool:
    """Whether *frame* or any frame it was called from is a ``__del__``."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


# -- canaries -------------------------------------------------------------------------------


def make_pattern(key: int, n: int) -> Pattern:
    """Return the canary of handle *key*: every entry of every field names the handle.

    The source pointers have the top bit set, so that an int64 pool stores them as their
    uint64 bit pattern, as it does for real device addresses.
    """
    assert 0 <= key < 1 << 32
    idx = _INDEX[:n]
    src = np.uint64((0xA5 << 56) | (key << 24)) + idx
    dst = ~src
    sizes = idx * np.uint64(8) + np.uint64(key & 0xFFFF)
    return src, dst, sizes


def write_pattern(arrays: Sequence[npt.NDArray[Any]], pattern: Pattern) -> None:
    for array, values in zip(arrays, pattern, strict=True):
        array.view(np.uint64)[:] = values


def has_pattern(arrays: Sequence[npt.NDArray[Any]], pattern: Pattern) -> bool:
    return all(
        np.array_equal(array.view(np.uint64), values)
        for array, values in zip(arrays, pattern, strict=True)
    )


def field_addresses(arrays: Sequence[npt.NDArray[Any]]) -> tuple[int, int, int]:
    """Base addresses of the three fields (numpy keeps them for n == 0, torch reports 0)."""
    src, dst, sizes = (int(array.ctypes.data) for array in arrays)
    return src, dst, sizes


# -- stats ----------------------------------------------------------------------------------


def bucket_map(stats: PoolStats) -> dict[int, BucketStats]:
    return {bucket.capacity: bucket for bucket in stats.buckets}


def check_stats_consistent(stats: PoolStats, *, max_cached_bytes: int, per_bucket: int) -> None:
    """Invariants any snapshot satisfies, whatever happened before, from any thread."""
    stats_fields: Iterable[Stat] = (
        stats.allocations,
        stats.allocated_bytes,
        stats.active_requests,
        stats.active_bytes,
    )
    for stat in stats_fields:
        assert min(stat.current, stat.peak, stat.allocated, stat.freed) >= 0, stat
        assert stat.allocated - stat.freed == stat.current, stat
        assert stat.peak >= stat.current, stat
    assert min(stats.cached_bytes, stats.parked_bytes, stats.parked, stats.hits) >= 0
    assert min(stats.misses, stats.requested_entries, stats.rounded_entries) >= 0
    capacities = [bucket.capacity for bucket in stats.buckets]
    assert capacities == sorted(set(capacities))
    for bucket in stats.buckets:
        assert min(bucket.hits, bucket.misses, bucket.cached, bucket.active, bucket.parked) >= 0
        assert bucket.cached <= per_bucket, bucket
    nbytes = {bucket.capacity: bucket.capacity * ENTRY_BYTES * FIELDS for bucket in stats.buckets}
    b = stats.buckets
    assert stats.allocations.current == sum(x.active + x.cached + x.parked for x in b)
    assert stats.allocated_bytes.current == sum(
        (x.active + x.cached + x.parked) * nbytes[x.capacity] for x in b
    )
    assert stats.active_requests.current == sum(x.active for x in b)
    assert stats.active_bytes.current == sum(x.active * nbytes[x.capacity] for x in b)
    assert stats.cached_bytes == sum(x.cached * nbytes[x.capacity] for x in b)
    assert stats.cached_bytes <= max_cached_bytes
    assert stats.view_bytes >= 0
    assert stats.parked == sum(x.parked for x in b)
    assert stats.parked_bytes == sum(x.parked * nbytes[x.capacity] for x in b)
    assert stats.hits == sum(x.hits for x in b)
    assert stats.misses == sum(x.misses for x in b)
    assert stats.active_requests.allocated == stats.hits + stats.misses
    assert stats.rounded_entries == sum((x.hits + x.misses) * x.capacity for x in b)
    assert stats.rounded_entries >= stats.requested_entries
    # Every allocation is a miss or a reservation, never fewer than the misses.
    assert stats.allocations.allocated >= stats.misses
    assert str(stats)


def check_pool_consistent(pool: BucketPool) -> PoolStats:
    """Check `check_stats_consistent` on *pool* under its own caps; return the snapshot."""
    stats = pool.stats()
    check_stats_consistent(
        stats,
        max_cached_bytes=pool.settings.max_cached_bytes,
        per_bucket=pool.settings.max_cached_per_bucket,
    )
    return stats


# -- with blocks the garbage collector closes ---------------------------------------------------


def suspended_in_with(pool: BucketPool, n: int, cycle: list[object]) -> Iterator[None]:
    with pool.acquire(n) as bufs:
        cycle.append(bufs)
        yield


def abandon_in_cycle(pool: BucketPool, n: int) -> None:
    """Leave a generator suspended inside ``with pool.acquire(n)``, reachable only from a cycle."""
    cycle: list[object] = []
    generator = suspended_in_with(pool, n, cycle)
    next(generator)
    cycle.append(generator)  # generator -> frame -> cycle -> generator


# -- subprocesses and forks ---------------------------------------------------------------------


def run_script(script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run *script* in a fresh interpreter from the checkout's root; return what it did."""
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def fork() -> int:
    """``os.fork()``, without Python's warning about forking a process with threads."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def exit_child(work: Callable[[], int], alarm: int = 30) -> NoReturn:
    """(in a forked child) Exit with *work*'s code; never return into pytest.

    An exception exits 98 with its traceback on stderr; a child still running after *alarm*
    seconds dies of SIGALRM.
    """
    code = 99
    try:
        signal.alarm(alarm)
        code = work()
    except BaseException:
        traceback.print_exc()
        code = 98
    finally:
        os._exit(code)


def wait_for_child(pid: int, bound: float = 60.0) -> int:
    """Return the exit code of the forked child *pid*.

    *bound* is a failure guard only: a child that has not ended after that many seconds
    (a hang) is killed and the test fails, instead of hanging the run.
    """
    statuses: list[int] = []
    waiter = threading.Thread(target=lambda: statuses.append(os.waitpid(pid, 0)[1]), daemon=True)
    waiter.start()
    waiter.join(bound)
    if not statuses:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        waiter.join()
        raise AssertionError(f"the forked child did not end within {bound} s (a hang?)")
    return os.waitstatus_to_exitcode(statuses[0])


def stack_in_package(thread: threading.Thread) -> bool:
    """Whether *thread* is inside a call of the package now."""
    assert thread.ident is not None
    return in_package(sys._current_frames().get(thread.ident))


def blocked_in_fork_handler(thread: threading.Thread) -> bool:
    """Whether *thread* is inside `fork` (``os.fork()``), waiting for the pool's lock in its
    fork handlers: in ``os.fork()`` itself past the handlers that block every signal (the
    wait is C), or (as the handlers once were) on a package line that acquires a lock."""
    assert thread.ident is not None
    frame = sys._current_frames().get(thread.ident)
    if frame is not None and frame.f_code is fork.__code__:
        return signal.SIGUSR1 in thread_signals(thread, "SigBlk")
    if frame is None or not frame.f_code.co_filename.startswith(PACKAGE_DIR):
        return False
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    caller = frame.f_back
    return ".acquire(" in line and caller is not None and caller.f_code is fork.__code__


def thread_signals(thread: threading.Thread, field: str) -> set[int]:
    """The signals in *thread*'s mask *field* (``SigBlk``: blocked, ``SigPnd``: pending for
    it), from Linux's ``/proc``; every signal where there is none (as if always so)."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/status") as status:
            mask = next(int(line.split()[1], 16) for line in status if line.startswith(field))
    except (OSError, StopIteration):
        return set(signal.valid_signals())
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


def waiting_at(thread: threading.Thread, line: str) -> bool:
    """Whether *thread* is running (or blocked in) the source line *line* now."""
    if thread.ident is None:  # not started yet
        return False
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return False
    return linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip() == line
