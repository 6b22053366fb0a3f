"""Hand-out and release: handles, the ``with`` form, double, foreign and stale releases."""

from __future__ import annotations

import copy
import pickle
import sys
import textwrap
import types
from collections.abc import Callable

import numpy as np
import pytest
from _helpers import TRIPLE_16, data_ptrs, run_script

from bucketpool import (
    BucketPool,
    BufferHandle,
    DescriptorBuffers,
    ReleaseError,
    _pool,
)

# -- hand-out ------------------------------------------------------------------------------


def test_capacity_and_n(pool: BucketPool) -> None:
    handle = pool.acquire(np.int64(1196))
    assert handle.n == 1196
    assert type(handle.n) is int
    assert handle.capacity == 2048
    handle.release()


def test_live_handles_never_share_storage(pool: BucketPool) -> None:
    handles = [pool.acquire(n) for n in (5, 5, 16, 3, 40, 33)]
    ptrs = [p for handle in handles for p in data_ptrs(handle.buffers)]
    assert len(set(ptrs)) == len(ptrs)
    for handle in handles:
        handle.release()


def test_every_acquire_makes_a_new_handle(
    pool: BucketPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[type] = []
    real = _pool._new

    def counting(cls: type[BufferHandle]) -> BufferHandle:
        made.append(cls)
        return real(cls)

    monkeypatch.setattr(_pool, "_new", counting)
    for _ in range(3):
        with pool.acquire(5):
            pass
    assert len(made) == 3  # no handle is recycled, whatever refers to it
    handle = pool.acquire(5)
    handle.release()
    with pool.acquire(5):
        pass
    assert len(made) == 5
    assert handle.released


def test_a_handle_someone_holds_is_never_reused(pool: BucketPool) -> None:
    kept = pool.acquire(5)
    with kept as bufs:
        ptr = bufs.src_ptrs.data_ptr()
    fresh = pool.acquire(5)
    assert fresh is not kept
    assert fresh.buffers.src_ptrs.data_ptr() == ptr
    with pytest.raises(ReleaseError):
        kept.release()  # still the old, released handle: fresh is untouched
    with pytest.raises(ReleaseError):
        _ = kept.buffers
    assert not fresh.released
    fresh.release()


def test_released_follows_the_hand_out(pool: BucketPool) -> None:
    handle = pool.acquire(20)
    assert (handle.n, handle.capacity, handle.released) == (20, 32, False)
    handle.release()
    assert handle.released
    again = pool.acquire(20)  # the same buffer again: the old handle stays released
    assert handle.released
    assert not again.released
    again.release()


def test_repr_live_and_released(pool: BucketPool) -> None:
    handle = pool.acquire(5)
    assert repr(handle) == "<BufferHandle n=5 capacity=16 live>"
    handle.release()
    assert repr(handle) == "<BufferHandle n=5 capacity=16 released>"


def test_repr_of_a_released_handle() -> None:
    handle = BucketPool().acquire(1)
    assert isinstance(handle, BufferHandle)
    handle.release()
    assert repr(handle) == "<BufferHandle n=1 capacity=16 released>"


# -- with blocks ---------------------------------------------------------------------------


def test_with_releases_on_exit(pool: BucketPool) -> None:
    handle = pool.acquire(8)
    with handle as bufs:
        assert bufs is handle.buffers
        assert not handle.released
    assert handle.released
    assert pool.stats().active_requests.current == 0


def test_with_releases_when_the_block_raises(pool: BucketPool) -> None:
    handle = pool.acquire(8)
    with pytest.raises(KeyError, match="boom"), handle:
        raise KeyError("boom")
    assert handle.released
    assert pool.stats().cached_bytes == TRIPLE_16


def test_with_binds_the_views(pool: BucketPool) -> None:
    handle = pool.acquire(6)
    with handle as bufs:
        assert isinstance(bufs, DescriptorBuffers)
        assert bufs is handle.buffers
        assert [view.numel() for view in bufs] == [6, 6, 6]
    assert handle.released


def test_a_handle_whose_exit_is_called_by_hand_is_not_reused(pool: BucketPool) -> None:
    held = pool.acquire(5)
    held.__enter__()
    held.__exit__(None, None, None)  # as a fixture or a hand-written manager would
    other = pool.acquire(5)
    assert other is not held
    with pytest.raises(ReleaseError):
        held.release()
    assert not other.released
    other.release()
    assert pool.stats().active_requests.current == 0


def test_double_release_through_with_raises(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    with pytest.raises(ReleaseError), handle:
        handle.release()
    assert pool.stats().cached_bytes == TRIPLE_16


def test_a_release_inside_its_with_block_is_refused_where_it_happens(pool: BucketPool) -> None:
    # Issue 33: it took effect, and the block's end raised; now the call itself is refused.
    handle = pool.acquire(3)
    with handle:
        with pytest.raises(ReleaseError, match=r"release: .* is bound by a with block"):
            handle.release()
        with pytest.raises(ReleaseError, match="bound by a with block"):
            pool.release(handle)
        assert not handle.released
    assert handle.released  # the block's end released it, once
    assert pool.stats().buckets[0].cached == 1


def test_a_handle_entered_twice_is_refused_where_it_happens(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    with handle as bufs:
        with pytest.raises(ReleaseError, match=r"with: .* already bound by a with block"):
            with handle:
                pass
        assert bufs.add_copies(0, [1], [2], 3) == 1  # still the block's, and live
    assert handle.released
    again = pool.acquire(3)  # the same buffer, a new hand-out: its own with block
    with again:
        pass
    assert pool.stats().active_requests.current == 0


def test_exit_after_the_handle_was_released_meanwhile_raises(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    with pytest.raises(ReleaseError, match="end of with block: this handle"):
        with handle:
            handle.__exit__(None, None, None)  # released some other way (an exit by hand)
    assert pool.stats().active_requests.current == 0
    assert pool.stats().buckets[0].cached == 1  # released once, cached once


def acquire_release_inside_then_raise(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    with handle:
        handle.__exit__(None, None, None)  # released some other way (an exit by hand)
        raise KeyError("mine")


def test_release_inside_a_raising_block_keeps_the_blocks_exception(pool: BucketPool) -> None:
    with pytest.raises(KeyError, match="mine") as caught:
        acquire_release_inside_then_raise(pool)
    if sys.version_info >= (3, 11):  # exception notes are new in 3.11
        notes: list[str] = getattr(caught.value, "__notes__", [])
        assert any("already released" in note for note in notes)
    assert pool.stats().cached_bytes == TRIPLE_16


def release_inside_then_raise(handle: BufferHandle) -> None:
    with handle:
        handle.__exit__(None, None, None)  # released some other way (an exit by hand)
        raise KeyError("mine")


def test_exit_after_a_release_inside_a_raising_block_keeps_its_exception(
    pool: BucketPool,
) -> None:
    handle = pool.acquire(3)
    with pytest.raises(KeyError, match="mine") as caught:
        release_inside_then_raise(handle)
    if sys.version_info >= (3, 11):
        notes: list[str] = getattr(caught.value, "__notes__", [])
        assert any("end of with block" in note for note in notes)
    assert pool.stats().active_requests.current == 0


def test_enter_after_release_is_refused(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    handle.release()
    with pytest.raises(ReleaseError, match="with: this handle"):
        with handle:
            pass


# -- release -------------------------------------------------------------------------------


def test_pool_release_is_handle_release(pool: BucketPool) -> None:
    handle = pool.acquire(8)
    pool.release(handle)
    assert handle.released
    assert pool.stats().active_requests.current == 0


def test_double_release_raises_and_changes_nothing(pool: BucketPool) -> None:
    handle = pool.acquire(8)
    handle.release()
    before = pool.stats()
    with pytest.raises(
        ReleaseError, match=r"this handle \(n=8, capacity 16\) was already released"
    ):
        handle.release()
    with pytest.raises(ReleaseError, match="already released"):
        pool.release(handle)
    assert pool.stats() == before
    # The buffer is in the pool once: two live handles get two buffers.
    first, second = pool.acquire(8), pool.acquire(8)
    assert first.buffers.src_ptrs.data_ptr() != second.buffers.src_ptrs.data_ptr()
    first.release()
    second.release()


def test_release_after_release_raises_and_changes_nothing(pool: BucketPool) -> None:
    handle = pool.acquire(9)
    handle.release()
    before = pool.stats()
    with pytest.raises(ReleaseError, match=r"release: this handle \(n=9, capacity 16\)"):
        handle.release()
    assert pool.stats() == before


def test_foreign_release_raises_and_changes_nothing(pool: BucketPool) -> None:
    other = BucketPool()
    handle = other.acquire(8)
    before = pool.stats()
    with pytest.raises(ReleaseError, match="handed out by another pool"):
        pool.release(handle)
    assert pool.stats() == before
    assert not handle.released
    other.release(handle)


def test_release_of_something_else_is_a_type_error(pool: BucketPool) -> None:
    with pool.acquire(3) as bufs:
        with pytest.raises(TypeError, match="release takes a BufferHandle"):
            pool.release(bufs)  # type: ignore[arg-type]


@pytest.mark.parametrize("attribute", ["buffers", "arrays"])
def test_views_after_release_raise(pool: BucketPool, attribute: str) -> None:
    handle = pool.acquire(8)
    handle.release()
    with pytest.raises(ReleaseError, match=f"{attribute}: this handle"):
        getattr(handle, attribute)
    with pytest.raises(ReleaseError), handle:
        pass
    with pytest.raises(ReleaseError):
        handle.add_copies(0, [1], [2], 3)


def test_views_after_release_are_refused(pool: BucketPool) -> None:
    handle = pool.acquire(9)
    handle.release()
    with pytest.raises(ReleaseError, match="buffers: "):
        _ = handle.buffers
    with pytest.raises(ReleaseError, match="arrays: "):
        _ = handle.arrays
    with pytest.raises(ReleaseError, match="add_copies: "):
        handle.add_copies(0, [1], [2], 3)
    with pytest.raises(ReleaseError, match="add_block_copies: "):
        handle.add_block_copies(0, 0, 0, [0], [1], 8)
    with pytest.raises(ReleaseError, match="shrink: "):
        handle.shrink(0)


def test_releasing_a_handle_never_handed_out_is_a_release_error(pool: BucketPool) -> None:
    forged = object.__new__(BufferHandle)
    assert repr(forged) == "<BufferHandle never handed out>"
    with pytest.raises(ReleaseError, match="never handed out"):
        pool.release(forged)


def test_a_forged_handle_releases_nothing(pool: BucketPool) -> None:
    stale = pool.acquire(8)
    stale.release()
    holder = pool.acquire(8)  # the same buffer, a new hand-out
    forged = object.__new__(BufferHandle)
    for name in ("_pool", "_buffer", "_token", "_n"):
        setattr(forged, name, getattr(stale, name))
    before = pool.stats()
    with pytest.raises(ReleaseError, match="already released"):
        forged.release()
    assert forged.released
    assert pool.stats() == before
    assert not holder.released
    holder.release()


# Issue 18 (the third hostile review), case 6.
def test_a_handle_whose_event_releases_it_is_released_once() -> None:
    pool = BucketPool()
    handle = pool.acquire(8)

    class Releasing:
        asked = False

        def query(self) -> bool:
            if not self.asked:  # the first ask releases; the release's own ask does not
                self.asked = True
                handle.release()
            return False

    handle.record_event(Releasing())
    with pytest.raises(ReleaseError):
        handle.release()  # the query() released it first; that release stands
    stats = pool.stats()
    assert (stats.active_requests.current, stats.parked) == (0, 1)  # released once, parked


# -- no second holder ----------------------------------------------------------------------


DUPLICATORS: dict[str, Callable[[object], object]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": pickle.dumps,
    "pickle-0": lambda obj: pickle.dumps(obj, protocol=0),
}


@pytest.mark.parametrize("how", sorted(DUPLICATORS))
def test_a_handle_cannot_be_copied_or_pickled(pool: BucketPool, how: str) -> None:
    handle = pool.acquire(8)
    before = pool.stats()
    with pytest.raises(TypeError, match="a BufferHandle cannot be copied or pickled") as caught:
        DUPLICATORS[how](handle)
    assert "the one holder of its buffer" in str(caught.value)
    assert "tensor.clone()" in str(caught.value)  # says what to do instead
    assert pool.stats() == before
    assert not handle.released
    handle.release()


def test_copying_a_request_that_holds_a_handle_is_refused(pool: BucketPool) -> None:
    class Request:
        def __init__(self, handle: BufferHandle) -> None:
            self.handle = handle

    request = Request(pool.acquire(8))
    with pytest.raises(TypeError, match="cannot be copied"):
        copy.deepcopy(request)
    request.handle.release()


@pytest.mark.parametrize("how", sorted(DUPLICATORS))
def test_a_pool_cannot_be_copied_or_pickled(how: str) -> None:
    with pytest.raises(TypeError, match="a BucketPool cannot be copied or pickled"):
        DUPLICATORS[how](BucketPool())


def test_handles_are_not_built_by_hand() -> None:
    with pytest.raises(TypeError, match=r"comes from BucketPool.acquire\(n\)"):
        BufferHandle()


def test_a_copied_handle_is_not_a_second_holder(pool: BucketPool) -> None:
    """Issue 10, case 1: copy.copy(handle) made a second live handle; both releases were
    accepted."""
    handle = pool.acquire(8)
    for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be copied or pickled"):
            duplicate(handle)
    handle.release()
    with pytest.raises(ReleaseError):
        handle.release()
    assert pool.stats().active_requests.current == 0
    first, second = pool.acquire(8), pool.acquire(8)
    assert first.buffers.src_ptrs.data_ptr() != second.buffers.src_ptrs.data_ptr()
    assert pool.stats().active_requests.current == 2
    first.release()
    second.release()


def test_a_tracer_during_import_does_not_make_a_held_handle_reusable() -> None:
    """Issue 10, case 2: importing under a tracer that reads f_locals let a held handle be handed
    out."""
    script = textwrap.dedent(
        """
        import sys

        def tracer(frame, event, arg):
            frame.f_locals  # what a debugger stepping through imports does
            return tracer

        sys.settrace(tracer)
        import bucketpool
        sys.settrace(None)

        pool = bucketpool.BucketPool()
        held = pool.acquire(8)
        with held:
            pass
        fresh = pool.acquire(8)
        assert fresh is not held, "the held handle was handed out again"
        try:
            held.release()
        except bucketpool.ReleaseError:
            pass
        else:
            raise AssertionError("a stale handle released the new holder's buffer")
        assert not fresh.released
        fresh.release()
        assert pool.stats().active_requests.current == 0
        """
    )
    result = run_script(script)
    assert result.returncode == 0, result.stderr


# -- counts --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [True, 1.0, "3", None, [3]])
def test_non_integer_n_is_type_error_and_pool_keeps_working(pool: BucketPool, bad: object) -> None:
    with pytest.raises(
        TypeError,
        match=r"^acquire: n must be an integer count of descriptors, not .*; pass len\(\.\.\.\)",
    ):
        pool.acquire(bad)  # type: ignore[arg-type]
    with pool.acquire(3) as bufs:
        assert bufs.sizes.numel() == 3
    assert pool.stats().active_requests.current == 0


def test_negative_n_is_value_error(pool: BucketPool) -> None:
    with pytest.raises(ValueError, match=r"^acquire: n must be >= 0, got -1"):
        pool.acquire(-1)
    assert pool.stats().misses == 0


@pytest.mark.parametrize(
    ("call", "operation"),
    [
        (lambda pool: pool.reserve(-3), "reserve"),
        (lambda pool: pool.bucket_capacity(-3), "bucket_capacity"),
        (lambda pool: pool.acquire(-3), "acquire"),
    ],
)
def test_count_errors_name_the_operation(
    pool: BucketPool, call: Callable[[BucketPool], object], operation: str
) -> None:
    with pytest.raises(ValueError, match=f"^{operation}: n must be >= 0, got -3"):
        call(pool)


@pytest.mark.pool(max_capacity=1024)
def test_n_above_max_capacity_names_the_limit(pool: BucketPool) -> None:
    with pytest.raises(ValueError, match=r"n=1025 is above the pool's max_capacity=1024"):
        pool.acquire(1025)
    with pool.acquire(1024) as bufs:
        assert bufs.src_ptrs.numel() == 1024
    assert pool.bucket_capacity(1024) == 1024


def test_default_max_capacity_refuses_a_huge_request(pool: BucketPool) -> None:
    with pytest.raises(ValueError, match="max_capacity=16777216"):
        pool.acquire(10**10)


def _depth() -> int:
    frame: types.FrameType | None = sys._getframe(1)
    depth = 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def test_a_release_that_runs_out_of_stack_loses_nothing() -> None:
    # At each depth near the recursion limit the release fails somewhere else: wherever it
    # does, it took effect or the handle still holds the buffer.
    def at_depth(depth: int, call: Callable[[], None]) -> None:
        if depth > 0:
            at_depth(depth - 1, call)
        else:
            call()

    room = sys.getrecursionlimit() - _depth()
    failed = 0
    for depth in range(room - 40, room):
        pool = BucketPool()
        handle = pool.acquire(4)
        try:
            at_depth(depth, handle.release)
        except RecursionError:
            failed += 1
        if not handle.released:
            handle.release()
        stats = pool.stats()
        assert (stats.active_requests.current, stats.buckets[0].cached) == (0, 1), depth
    assert failed  # some depths did run out of stack inside the release
