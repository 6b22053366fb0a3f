"""One test for each numbered case of issue 10: the ways the original core broke its promise.

Each test would have failed on the core before the rebuild (commit 8e2a490).
"""

from __future__ import annotations

import copy
import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Literal

import numpy as np
import pytest
import torch

import bucketpool
from bucketpool import BucketPool, LeakWarning, ReleaseError
from bucketpool._ledger import Ledger
from bucketpool._settings import DebugLevel
from bucketpool.compat import DescriptorBufferPool
from bucketpool.testing import assert_no_outstanding

PACKAGE_DIR = os.path.dirname(bucketpool.__file__) + os.sep
TRIPLE_16 = 16 * 8 * 3


class DeviceError(RuntimeError):
    """What a failing event's ``query()`` raises."""


class ScriptedEvent:
    """An event whose ``query()`` answers from a script, then *after* forever.

    Each script item is True, False or an exception to raise.
    """

    def __init__(self, *script: bool | Exception, after: bool | Exception = True) -> None:
        self.script = list(script)
        self.after = after
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        answer = self.script.pop(0) if self.script else self.after
        if isinstance(answer, Exception):
            raise answer
        return answer


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


def leak(pool: BucketPool, n: int, event: ScriptedEvent | None = None) -> None:
    handle = pool.acquire(n)
    if event is not None:
        handle.record_event(event)


# -- two holders of one buffer ---------------------------------------------------------------


def test_case_01_a_copied_handle_is_not_a_second_holder() -> None:
    """Case 1: copy.copy(handle) made a second live handle; both releases were accepted."""
    pool = BucketPool()
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


def test_case_02_a_tracer_during_import_does_not_make_a_held_handle_reusable() -> None:
    """Case 2: importing under a tracer that reads f_locals let a held handle be handed out."""
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
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=os.path.dirname(PACKAGE_DIR.rstrip(os.sep)),
    )
    assert result.returncode == 0, result.stderr


# -- deadlock ----------------------------------------------------------------------------------


def test_case_03_a_with_block_closed_by_gc_inside_the_pool_lock_does_not_deadlock() -> None:
    """Case 3: a generator's with block, closed by the GC under the pool lock, blocked forever."""
    pool = BucketPool()
    queued: list[int] = []

    def collect_inside_the_lock() -> None:
        with pool._lock:  # as an allocation under the lock in stats() or acquire can do
            gc.collect()
            queued.append(sum(len(b.inbox) for b in pool._buckets))

    thread = threading.Thread(target=collect_inside_the_lock, daemon=True)
    gc.collect()
    gc.disable()  # the collection must happen inside the lock, not at some allocation before
    try:
        abandon_in_cycle(pool, 8)
        assert pool.stats().active_requests.current == 1
        thread.start()
        thread.join(timeout=30)
    finally:
        gc.enable()
    assert not thread.is_alive(), "deadlock: the with block's exit waited for the pool lock"
    assert queued[0] > 0  # collected there: its release waited in the inbox
    stats = pool.stats()  # the next operation takes back what the exit queued
    assert stats.active_requests.current == 0
    assert stats.cached_bytes == TRIPLE_16
    assert pool.outstanding() == []


class PoolInterrupts:
    """A SIGALRM handler that raises `KeyboardInterrupt` while armed, only inside the pool's
    own code, and never in a finaliser (where Python discards exceptions: see the README on
    signals), so the test's own bookkeeping is never interrupted."""

    def __init__(self) -> None:
        self.armed = False
        self.count = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        inside = False
        depth = 0
        while self.armed and frame is not None and depth < 64:
            if frame.f_code.co_name == "__del__":
                return
            inside = inside or frame.f_code.co_filename.startswith(PACKAGE_DIR)
            frame, depth = frame.f_back, depth + 1
        if inside:
            self.count += 1
            raise KeyboardInterrupt


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_case_04_keyboard_interrupts_inside_the_pool_never_leak_its_lock() -> None:
    """Case 4: a signal handler's exception between taking the lock and `try` leaked the lock."""
    assert threading.current_thread() is threading.main_thread()
    pool = BucketPool()
    interrupt = PoolInterrupts()

    kept: list[bucketpool.BufferHandle] = []  # handles whose release was interrupted
    gc.collect()
    gc.disable()  # no collection-run finaliser (an unraisable context) is interrupted
    previous = signal.signal(signal.SIGALRM, interrupt)
    deadline = time.monotonic() + 1.0
    signal.setitimer(signal.ITIMER_REAL, 1e-4, 1e-4)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeakWarning)  # handles lost mid-acquire
            step = 0
            while time.monotonic() < deadline:
                step += 1
                handle = None
                interrupt.armed = True
                try:
                    handle = pool.acquire(step % 40)
                    if step % 2:
                        with handle:
                            pass
                    else:
                        handle.release()
                except KeyboardInterrupt:
                    interrupt.armed = False
                interrupt.armed = False
                if handle is not None and not handle.released:
                    kept.append(handle)
                del handle
            gc.collect()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
        gc.enable()
    assert interrupt.count > 50  # the interrupts did land inside the pool

    def use_from_another_thread() -> None:
        with pool.acquire(5) as bufs:
            bufs.sizes.fill_(1)

    thread = threading.Thread(target=use_from_another_thread, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "deadlock: an interrupt left the pool's lock held"
    stats = pool.stats()
    assert stats.active_requests.current == len(kept)
    assert sum(b.active for b in stats.buckets) == len(kept)
    assert len(pool.outstanding()) == len(kept)
    for handle in kept:
        handle.release()
    assert pool.stats().active_requests.current == 0


class SlowEvent:
    """Done on its third query: releases park, and later acquires retire them."""

    def __init__(self) -> None:
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.queries > 2


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
@pytest.mark.parametrize("mode", ["off", "checks", "strict", "compat"])
def test_case_04_a_signal_storm_loses_no_buffer(mode: DebugLevel | Literal["compat"]) -> None:
    """Interrupts anywhere in the pool's code, also while parking, retiring, verifying and
    trimming: afterwards every buffer the pool counts is cached, held or parked, and every
    one comes back."""
    assert threading.current_thread() is threading.main_thread()
    adapter = DescriptorBufferPool() if mode == "compat" else None
    level = "off" if mode == "compat" else mode
    pool = adapter.pool if adapter else BucketPool(debug=level, max_cached_per_bucket=2)
    interrupt = PoolInterrupts()

    kept: list[bucketpool.BufferHandle] = []
    gc.collect()
    gc.disable()
    previous = signal.signal(signal.SIGALRM, interrupt)
    deadline = time.monotonic() + 1.0
    signal.setitimer(signal.ITIMER_REAL, 5e-5, 5e-5)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # leaks of interrupted acquires, stale writes
            step = 0
            while time.monotonic() < deadline:
                step += 1
                event = SlowEvent() if step % 3 == 0 else None
                handle = bufs = None
                interrupt.armed = True
                try:
                    if adapter is not None:
                        bufs = adapter.acquire(step % 70)
                        adapter.release(bufs, event=event)
                    else:
                        handle = pool.acquire(step % 70)
                        if event is not None:
                            handle.record_event(event)
                        if step % 2:
                            with handle:
                                pass
                        else:
                            handle.release()
                        if step % 50 == 0:
                            pool.collect()
                except KeyboardInterrupt:
                    pass
                interrupt.armed = False
                if handle is not None and not handle.released:
                    kept.append(handle)
                del handle, bufs
            gc.enable()
            gc.collect()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
        gc.enable()
    assert interrupt.count > 100
    for handle in kept:
        handle.release()
    del kept
    pool.synchronize()
    stats = pool.stats()
    assert stats.allocations.current == sum(b.cached + b.active + b.parked for b in stats.buckets)
    assert stats.active_requests.current == 0
    assert stats.parked == 0
    assert pool.outstanding() == []
    assert stats.cached_bytes == sum(b.cached * b.capacity * 24 for b in stats.buckets)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_case_05_fork_while_another_thread_is_inside_the_pool() -> None:
    """Case 5: os.fork() while another thread was inside a pool call hung the child."""
    pool = BucketPool()
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            with pool.acquire(7) as bufs:
                bufs.sizes.fill_(1)
            pool.stats()
            pool.outstanding()

    thread = threading.Thread(target=hammer, daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the hammer is preempted often, also inside the pool
    thread.start()
    codes: list[int] = []
    try:
        for _ in range(20):
            time.sleep(0.001)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
                pid = os.fork()
            if pid == 0:  # the child: one acquire and release, then report by exit code
                code = 1
                try:
                    signal.alarm(10)  # a hung child dies of SIGALRM instead of hanging
                    with pool.acquire(3) as bufs:
                        bufs.sizes.fill_(2)
                    code = 0 if pool.stats().active_requests.current <= 1 else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            codes.append(os.waitstatus_to_exitcode(status))
    finally:
        stop.set()
        thread.join(timeout=30)
        sys.setswitchinterval(interval)
    assert codes == [0] * 20
    assert pool.stats().active_requests.current == 0


# -- lost buffers ------------------------------------------------------------------------------


def test_case_06_a_handle_after_a_gc_closed_with_block_still_reports_its_leak() -> None:
    """Case 6: after a GC-closed with block, a recycled handle that leaked was never returned."""
    pool = BucketPool()
    abandon_in_cycle(pool, 8)
    gc.collect()  # closes the with block: the buffer is released
    assert pool.stats().active_requests.current == 0
    with pytest.warns(LeakWarning, match="n=8 was never released"):
        leak(pool, 8)  # gets that buffer again, and drops the handle
    stats = pool.stats()
    assert stats.active_requests.current == 0
    assert stats.cached_bytes == TRIPLE_16
    assert stats.leaks == 1


def test_case_07_an_event_raising_in_acquires_poll_does_not_fail_the_acquire() -> None:
    """Case 7: an event raising once in acquire's sweep failed that acquire and lost a buffer."""
    pool = BucketPool(idle_trim_acquires=4)  # a sweep every acquire
    event = ScriptedEvent(False, DeviceError("once"), after=True)
    parked = pool.acquire(8)
    parked.record_event(event)
    parked.release()  # pending: parked
    assert pool.stats().parked == 1
    handles = [pool.acquire(8) for _ in range(6)]  # misses and sweeps poll the parked buffer
    assert event.queries >= 3  # the raise was seen by an acquire, and then "done"
    for handle in handles:
        handle.release()
    stats = pool.stats()
    assert stats.active_requests.current == 0
    assert stats.parked == 0
    assert stats.allocations.current == sum(b.cached for b in stats.buckets)


def test_case_08_a_leaked_handle_whose_event_raises_stays_parked_and_owned() -> None:
    """Case 8: a leaked handle whose event raised on adoption was lost, the error in stats()."""
    pool = BucketPool()
    event = ScriptedEvent(after=DeviceError("device lost"))
    with pytest.warns(LeakWarning):
        leak(pool, 8, event)
    stats = pool.stats()  # an unrelated call: no error here
    assert stats.active_requests.current == 0
    assert stats.parked == 1
    with pytest.raises(DeviceError):
        pool.collect()  # the call that asks about parked buffers gets the error
    assert pool.stats().parked == 1  # still owned by the pool
    event.after = True
    assert pool.collect() == 1
    assert pool.stats().cached_bytes == TRIPLE_16


def test_case_09_release_takes_effect_when_the_event_raises() -> None:
    """Case 9: release() with a raising event left the handle unreleased, then lost."""
    pool = BucketPool()
    event = ScriptedEvent(after=DeviceError("device lost"))
    handle = pool.acquire(8)
    handle.record_event(event)
    with pytest.raises(DeviceError):
        handle.release()
    assert handle.released
    del handle  # no leak warning (warnings are errors here): it was released
    stats = pool.stats()
    assert (stats.active_requests.current, stats.parked) == (0, 1)
    event.after = True
    assert pool.collect() == 1
    assert pool.stats().cached_bytes == TRIPLE_16


def test_case_10_compat_release_with_a_raising_event_loses_nothing() -> None:
    """Case 10: compat release(bufs, event=ev) with a raising query lost the buffer."""
    adapter = DescriptorBufferPool()
    bufs = adapter.acquire(8)
    event = ScriptedEvent(DeviceError("once"), after=True)
    with pytest.raises(DeviceError):
        adapter.release(bufs, event=event)
    stats = adapter.pool.stats()
    assert (stats.active_requests.current, stats.parked) == (0, 1)
    with pytest.raises(ReleaseError, match="already released"):
        adapter.release(bufs)  # the release took effect: a retry is a double release
    assert adapter.pool.collect() == 1
    again = adapter.acquire(8)  # back, and handed out again, as a new tuple
    assert again.src_ptrs.data_ptr() == bufs.src_ptrs.data_ptr()
    adapter.release(again)


# -- diagnostics, memory, data, cost -----------------------------------------------------------


def test_case_11_a_sparse_tensor_in_a_frame_does_not_break_with_exit_at_checks() -> None:
    """Case 11: at debug=checks a sparse tensor in a frame made the with exit raise."""
    pool = BucketPool(debug="checks")
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,), check_invariants=True
    )
    with pool.acquire(8) as bufs:
        bufs.sizes.fill_(1)
        local_sparse = sparse * 2
    assert local_sparse.is_sparse
    stats = pool.stats()
    assert stats.active_requests.current == 0
    assert stats.leaks == 0


def test_case_12_outstanding_sees_handles_after_gc_freeze() -> None:
    """Case 12: outstanding() and assert_no_outstanding missed handles after gc.freeze()."""
    pool = BucketPool()
    handle = pool.acquire(5)
    gc.freeze()
    try:
        assert [record.n for record in pool.outstanding()] == [5]
        with pytest.raises(AssertionError, match="n=5"):
            assert_no_outstanding(pool)
    finally:
        gc.unfreeze()
    handle.release()
    assert pool.outstanding() == []


def test_case_13_compat_frees_trimmed_buffers_without_the_gc() -> None:
    """Case 13: with the GC disabled, buffers the compat adapter freed stayed alive."""
    adapter = DescriptorBufferPool()
    n = 1 << 18  # 6 MiB a buffer: the default 64 MiB cache keeps 10 of 20
    gc.collect()
    gc.disable()
    try:
        held = [adapter.acquire(n) for _ in range(20)]
        tensors = [weakref.ref(bufs.src_ptrs) for bufs in held]
        for bufs in held:
            adapter.release(bufs)  # the byte cap frees some of them here
        del held, bufs
        stats = adapter.pool.stats()
        assert stats.allocations.freed > 0
        freed_on_release = sum(ref() is None for ref in tensors)
        assert freed_on_release == stats.allocations.freed
        assert adapter.pool.trim(0) > 0  # and the rest here
        alive = sum(ref() is not None for ref in tensors)
        assert alive == 0, f"{alive} freed buffers are still alive without the collector"
        assert adapter.pool.stats().allocated_bytes.current == 0
    finally:
        gc.enable()


def test_case_14_acquire_polls_a_bounded_number_of_parked_buffers() -> None:
    """Case 14: with 10,000 parked, every sweep and miss polled all of them."""
    pool = BucketPool(idle_trim_acquires=8, max_cached_per_bucket=0)
    event = ScriptedEvent(after=False)  # one stream, never done: every parked one waits
    for _ in range(10_000):
        handle = pool.acquire(8)
        handle.record_event(event)
        handle.release()
    assert pool.stats().parked == 10_000
    event.queries = 0
    acquires = 0
    for _ in range(50):  # misses of the same bucket, and sweeps
        with pool.acquire(8):
            acquires += 1
    held = [pool.acquire(8) for _ in range(50)]
    acquires += len(held)
    for handle in held:
        handle.release()
    assert event.queries <= 4 * acquires + 10
    assert pool.stats().parked == 10_000


def test_case_15_add_copies_from_the_handles_own_columns_swaps_directions() -> None:
    """Case 15: add_copies(0, dst_col, src_col, sizes_col) wrote before reading all inputs."""
    pool = BucketPool()
    handle = pool.acquire(4)
    src, dst, sizes = handle.arrays
    src[:] = [1, 2, 3, 4]
    dst[:] = [10, 20, 30, 40]
    sizes[:] = [5, 6, 7, 8]
    assert handle.add_copies(0, dst, src, sizes) == 4
    assert src.tolist() == [10, 20, 30, 40]
    assert dst.tolist() == [1, 2, 3, 4]
    assert sizes.tolist() == [5, 6, 7, 8]
    reversed_sources = np.asarray(src)[::-1]
    assert handle.add_copies(0, reversed_sources, dst, sizes) == 4  # overlapping, reversed
    assert src.tolist() == [40, 30, 20, 10]
    handle.release()


class Interrupt(KeyboardInterrupt):
    """A signal handler's exception, raised at a chosen point inside the pool."""


def interrupt_allocation_accounting(monkeypatch: pytest.MonkeyPatch, *, before: bool) -> None:
    """Raise `Interrupt` in the miss path: at the entry of the accounting (*before*), or
    right after the new buffer was made and before it is accounted.

    In CPython 3.11 a signal handler runs at a function's entry and after calls, so both
    points are ones a real signal can reach; the accounting itself calls nothing.
    """
    owner: type = Ledger if before else BucketPool
    name = "serve" if before else "_new_buffer"
    real = getattr(owner, name)

    def interrupted(self: object, *args: object, **kwargs: object) -> object:
        if before and kwargs.get("fresh", args[5] if len(args) > 5 else None) is None:
            return real(self, *args, **kwargs)  # not the move that counts the new buffer
        monkeypatch.setattr(owner, name, real)  # once
        if not before:
            real(self, *args, **kwargs)
        raise Interrupt

    monkeypatch.setattr(owner, name, interrupted)


def test_case_04_an_interrupt_after_counting_an_allocation_keeps_stats_consistent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Case 4, a window in the miss path: the buffer is counted, then the interrupt lands."""
    pool = BucketPool()
    interrupt_allocation_accounting(monkeypatch, before=False)
    with pytest.raises(Interrupt):
        pool.acquire(8)
    with pool.acquire(8):
        pass
    stats = pool.stats()
    assert stats.allocations.current == sum(b.cached + b.active + b.parked for b in stats.buckets)


def test_case_04_an_interrupt_before_counting_an_allocation_keeps_hits_non_negative(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Case 4, a window in the miss path: the miss is counted, then the interrupt lands."""
    pool = BucketPool()
    interrupt_allocation_accounting(monkeypatch, before=True)
    with pytest.raises(Interrupt):
        pool.acquire(8)
    with pool.acquire(8):
        pass
    stats = pool.stats()
    assert stats.hits + stats.misses == 1
    assert stats.hits >= 0
