"""What the hostile review of the rebuilt package (issue 23) found, kept as tests."""

from __future__ import annotations

import inspect
import sys
import threading
import types
import warnings

import numpy as np
import pytest
import torch

from bucketpool import BucketPool, BufferHandle, PoolError, ReleaseError, _lock


class Pending:
    def query(self) -> bool:
        return False


# -- _inputs._to_array: the list fast path runs sum() on unchecked items -------------------


def test_numpy_int_items_whose_sum_overflows_fill_without_a_warning() -> None:
    pool = BucketPool()
    with pool.acquire(3) as bufs, warnings.catch_warnings():
        warnings.simplefilter("error")  # pytest -W error, or filterwarnings = error
        end = bufs.add_copies(0, [np.int64(2**62)] * 3, [1, 2, 3], 8)
        assert bufs.shrink(end).src_ptrs.tolist() == [2**62] * 3


def test_numpy_int_items_whose_sum_overflows_under_errstate_raise() -> None:
    pool = BucketPool()
    with pool.acquire(3) as bufs, np.errstate(over="raise"):
        end = bufs.add_copies(0, [np.int64(2**62)] * 3, [1, 2, 3], 8)  # FloatingPointError
        assert end == 3


def test_a_list_of_tensors_is_a_type_error() -> None:
    pool = BucketPool()
    with pool.acquire(3) as bufs, pytest.raises(TypeError):
        bufs.add_copies(
            0,
            [torch.ones(2, dtype=torch.int64), torch.ones(3, dtype=torch.int64)],  # type: ignore[list-item]
            [1, 2],
            8,
        )


class FloatLike:
    """Not an integer (no __index__): 7.9 that lets sum() and numpy read it as 7."""

    def __radd__(self, other: int) -> int:
        return other + 7

    def __int__(self) -> int:
        return 7

    def __float__(self) -> float:
        return 7.9


def test_a_non_integer_item_is_a_type_error() -> None:
    pool = BucketPool()
    with pool.acquire(3) as bufs, pytest.raises(TypeError):
        bufs.add_copies(0, [FloatLike(), 5], [1, 2], 8)  # type: ignore[list-item]


# -- record_event from inside a move (finaliser / signal handler) --------------------------


@pytest.mark.parametrize("level", ["off", "checks"])
def test_record_event_from_inside_a_move_is_refused(level: str) -> None:
    pool = BucketPool(debug=level)  # type: ignore[arg-type]
    handle = pool.acquire(8)
    bufs = handle.buffers
    before = handle._buffer.recorded
    with _lock.LOCK:  # as a finaliser or signal handler that interrupted a move (the tests' way)
        with pytest.raises(PoolError):
            bufs.record_event(Pending())
    assert handle._buffer.recorded == before
    handle.release()


# -- a queued release asks events under the lock -------------------------------------------


def test_a_release_queued_inside_a_move_asks_no_event_under_the_lock() -> None:
    pool = BucketPool()
    asked_under_lock: list[bool] = []

    class Watched:
        def query(self) -> bool:
            asked_under_lock.append(_lock.owned())
            return True

    handle = pool.acquire(8)
    handle.record_event(Watched())
    with _lock.LOCK:  # as a finaliser inside a move: the release is queued
        handle.release()
    pool.stats()
    assert not any(asked_under_lock)


# -- view bytes at the debug levels -------------------------------------------------------


@pytest.mark.parametrize("level", ["checks", "strict"])
def test_view_bytes_count_only_sets_an_idle_buffer_keeps(level: str) -> None:
    pool = BucketPool(debug=level)  # type: ignore[arg-type]
    with pool.acquire(8) as bufs:
        bufs.shrink(4)
    (buffer,) = pool._ledger.buffers().values()
    assert pool.stats().view_bytes == len(buffer.views) * 2048  # 4096 reported, 0 kept


def test_a_buffer_that_fits_the_cap_at_checks_is_cached() -> None:
    pool = BucketPool(debug="checks", max_cached_bytes=384)  # exactly one 16-entry buffer
    for _ in range(2):
        with pool.acquire(8):
            pass
    assert pool.stats().misses == 1  # 2: freed for view sets it no longer has


# -- trim counts parked buffers' view sets as cached bytes ---------------------------------


def test_trim_keeps_cached_buffers_that_fit_max_bytes() -> None:
    pool = BucketPool()
    with pool.acquire(16):
        pass
    handle = pool.acquire(1000)
    for count in range(10):
        handle.shrink(count)
    handle.record_event(Pending())
    handle.release()
    stats = pool.stats()
    cached_views = stats.view_bytes - 10 * 2048  # the parked buffer's 10 sets (shrink alone)
    assert pool.trim(stats.cached_bytes + cached_views) == 0


# -- a late second releaser never asks the next hand-out's events --------------------------


def test_a_late_releaser_never_asks_the_next_hand_outs_events() -> None:
    pool = BucketPool()
    handle = pool.acquire(8)
    asked_by: list[str] = []

    class Failing:  # the next holder's copy event, whose device reports an error
        def query(self) -> bool:
            asked_by.append(threading.current_thread().name)
            raise RuntimeError("the next holder's device error")

    paused, resume = threading.Event(), threading.Event()
    code = BufferHandle.__exit__.__code__
    lines, first = inspect.getsourcelines(BufferHandle.__exit__)
    pause = first + next(i for i, line in enumerate(lines) if "pool = self._pool" in line)

    def tracer(frame: types.FrameType, event: str, arg: object) -> object:
        if frame.f_code is not code:
            return None

        def local(frame: types.FrameType, event: str, arg: object) -> object:
            if event == "line" and frame.f_lineno == pause and not paused.is_set():
                paused.set()  # past the token check: the other release lands now
                resume.wait(30)
            return local

        return local

    result: list[str] = []

    def late_releaser() -> None:
        sys.settrace(tracer)  # type: ignore[arg-type]
        try:
            handle.release()
            result.append("returned")
        except ReleaseError:
            result.append("ReleaseError")
        except RuntimeError as error:
            result.append(f"RuntimeError: {error}")
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=late_releaser, name="late")
    thread.start()
    assert paused.wait(30)
    handle.release()  # the release that takes effect
    following = pool.acquire(8)  # the same buffer, a new hand-out
    following.record_event(Failing())
    resume.set()
    thread.join(30)
    assert result in (["ReleaseError"], ["returned"])
    assert asked_by == []
    with pytest.raises(RuntimeError):
        following.release()  # its own releaser gets its event's error; parked meanwhile


# -- a release that crowds the cap frees the least recently used buffers first -----------


def _cached_capacities(pool: BucketPool) -> list[int]:
    return sorted(b.bucket.capacity for b in pool._ledger.buffers().values() if b.token == 0)


def test_a_crowding_release_frees_the_lru_buffer_though_a_parked_one_keeps_views() -> None:
    pool = BucketPool(max_cached_bytes=60000, idle_trim_acquires=0)
    pool.acquire(512).release()  # cached, the least recently used
    parked = pool.acquire(1024)
    for count in range(9):
        parked.shrink(count)  # ten view sets, kept while parked
    parked.record_event(Pending())
    parked.release()
    pool.acquire(256).release()  # crowds the cap: room is made in the other buckets
    assert _cached_capacities(pool) == [256]


def test_a_crowding_release_counts_its_own_view_set() -> None:
    pool = BucketPool(max_cached_bytes=19000, idle_trim_acquires=0)
    pool.acquire(512).release()  # 12,288 bytes, no view set, the least recently used
    with pool.acquire(256):  # 6,144 bytes and one view set (2,048): 20,480 with the 512
        pass
    assert _cached_capacities(pool) == [256]
