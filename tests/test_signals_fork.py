"""Signals, finalisers and fork: an interrupt, a collected generator or a fork loses nothing."""

from __future__ import annotations

import collections
import gc
import itertools
import os
import signal
import sys
import textwrap
import threading
import time
import types
import typing
import warnings
import weakref
from collections.abc import Callable, Generator, Sequence
from typing import Any, Literal

import pytest
from _events import FlagEvent, ScriptedEvent
from _helpers import (
    PACKAGE_DIR,
    TRIPLE_16,
    abandon_in_cycle,
    blocked_in_fork_handler,
    check_pool_consistent,
    exit_child,
    fork,
    in_finaliser,
    in_package,
    run_script,
    stack_in_package,
    thread_signals,
    wait_for_child,
    waiting_at,
)

from bucketpool import (
    BucketPool,
    BufferHandle,
    InFlightWriteError,
    LeakWarning,
    PoolError,
    ReleaseError,
    _lock,
)
from bucketpool._ledger import Ledger
from bucketpool._settings import DebugLevel
from bucketpool.compat import DescriptorBufferPool

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
needs_proc = pytest.mark.skipif(
    not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/status"),
    reason="needs Linux's /proc to see a thread's pending signals",
)
#: How long a helper thread waits for the situation a test needs: a failure guard only.
GUARD_S = 60.0


# -- calls from inside a move (a finaliser or a signal handler that interrupted one) -------


def test_acquire_from_inside_the_pool_raises_instead_of_deadlocking() -> None:
    pool = BucketPool()
    with _lock.LOCK, pytest.raises(PoolError, match="finaliser or signal handler"):
        pool.acquire(3)  # what a finaliser run under the lock would do
    with pool.acquire(3):
        pass
    assert pool.stats().active_requests.current == 0


@pytest.mark.parametrize(
    ("operation", "call"),
    [
        ("trim", lambda pool: pool.trim(0)),
        ("trim", lambda pool: pool.empty_cache()),
        ("reserve", lambda pool: pool.reserve(3)),
        ("collect", lambda pool: pool.collect()),
        ("synchronize", lambda pool: pool.synchronize()),
        ("stats", lambda pool: pool.stats()),
        ("outstanding", lambda pool: pool.outstanding()),
        ("reset_peak_stats", lambda pool: pool.reset_peak_stats()),
    ],
)
def test_every_operation_from_inside_the_pool_raises_and_changes_nothing(
    operation: str, call: Callable[[BucketPool], object]
) -> None:
    """A finaliser or signal handler that interrupted this thread inside the pool finds its
    records half-way through a change: trimming or reserving there corrupted them."""
    pool = BucketPool()
    for n in (3, 40, 3):
        with pool.acquire(n):
            pass
    handle = pool.acquire(3)
    before = pool.stats()
    with _lock.LOCK, pytest.raises(PoolError, match=f"^{operation} was called from a finaliser"):
        call(pool)
    assert pool.stats() == before
    handle.release()
    stats = pool.stats()
    assert stats.allocations.current == sum(b.cached + b.active + b.parked for b in stats.buckets)


def test_a_release_from_inside_the_pool_waits_in_the_inbox() -> None:
    pool = BucketPool()
    handle = pool.acquire(3)
    with _lock.LOCK:  # as a finaliser that interrupted this thread inside the pool
        handle.release()
        # queued: the lock is never waited for here
        assert sum(len(b.inbox) for b in pool._ledger.buckets) == 1
    assert pool.stats().active_requests.current == 0  # drained by the next operation
    assert handle.released
    assert pool.stats().cached_bytes == TRIPLE_16
    assert not any(b.inbox for b in pool._ledger.buckets)


def test_a_queued_release_is_taken_back_by_the_call_that_leaves_the_pool() -> None:
    pool = BucketPool(max_cached_bytes=0)  # a release keeps nothing
    queued = pool.acquire(1 << 12)
    memory = weakref.ref(queued.buffers[0]._base)
    other = pool.acquire(16)
    with _lock.LOCK:  # as a finaliser that ran inside a move of this thread
        queued.release()
    assert memory() is not None  # queued, not yet taken back
    other.release()  # any pool call's end takes it back: no later call needed
    assert memory() is None


def test_a_queued_release_keeps_no_dropped_pool_alive() -> None:
    pool = BucketPool()
    handle = pool.acquire(1 << 12)
    memory = weakref.ref(handle.buffers[0]._base)
    with _lock.LOCK:  # queued, as from a finaliser inside a move
        handle.release()
    dropped = weakref.ref(pool)
    del handle, pool
    assert dropped() is None
    assert memory() is None


def test_a_deferred_release_counts_as_released_at_once(pool: BucketPool) -> None:
    handle = pool.acquire(3)
    with _lock.LOCK:  # as a finaliser that interrupted this thread inside the pool
        handle.release()
    assert handle.released
    with pytest.raises(ReleaseError):
        handle.release()
    stats = pool.stats()  # drains the inbox
    assert stats.active_requests.current == 0
    assert [b.cached for b in stats.buckets] == [1]  # back in the cache, not lost


# -- with blocks closed by the garbage collector -------------------------------------------


def test_a_with_block_closed_by_gc_inside_the_pool_lock_does_not_deadlock() -> None:
    """Issue 10, case 3: a generator's with block, closed by the GC under the pool lock, blocked
    forever."""
    pool = BucketPool()
    queued: list[int] = []

    def collect_inside_the_lock() -> None:
        with _lock.LOCK:  # as an allocation under the lock in stats() or acquire can do
            gc.collect()
            queued.append(sum(len(b.inbox) for b in pool._ledger.buckets))

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
    with warnings.catch_warnings():
        # The collector may have finalised the handle before the generator's exit (its
        # order): then that hand-out is reported as a leak. The buffer comes back once.
        warnings.simplefilter("ignore", LeakWarning)
        stats = pool.stats()  # the next operation takes back what the exit queued
    assert stats.active_requests.current == 0
    assert stats.cached_bytes == TRIPLE_16
    assert pool.outstanding() == []


# Issue 18 (the third hostile review), case 2.
def test_a_collected_with_exit_inside_one_pool_never_waits_for_another() -> None:
    # Thread T is inside pool B (as an allocation there can run the collector) and closes a
    # generator suspended in `with A.acquire(1):`; meanwhile thread M, inside pool A, uses
    # B (as a signal handler would).  With a lock per pool each waited for the other.
    # Forced: T closes the generator only once M is seen waiting to enter A (or inside it).
    a, b = BucketPool(), BucketPool()
    held_b = b.acquire(2)

    def suspended() -> Generator[None, None, None]:
        with a.acquire(1):
            yield

    generator = suspended()
    next(generator)
    t_inside = threading.Event()
    m_inside = threading.Event()
    closed_inside: list[bool] = []
    m_seen_waiting: list[bool] = []

    a_lock = b_lock = _lock.LOCK  # every pool's lock is the one lock

    def thread_t() -> None:
        with b_lock:
            t_inside.set()
            deadline = time.monotonic() + GUARD_S  # a failure guard only
            while not m_inside.is_set() and time.monotonic() < deadline:
                if waiting_at(threads[1], "with a_lock:"):
                    m_seen_waiting.append(True)  # with one lock M cannot get in: T goes on
                    break
                time.sleep(0)
            generator.close()
            closed_inside.append(True)

    def thread_m() -> None:
        t_inside.wait()
        with a_lock:
            m_inside.set()
            held_b.release()  # queued: it never waits for a lock

    threads = [threading.Thread(target=thread_t, daemon=True)]
    threads.append(threading.Thread(target=thread_m, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=GUARD_S)
    assert not any(thread.is_alive() for thread in threads), "the two pools deadlocked"
    assert m_seen_waiting == [True]  # the interleaving the test needs did happen
    assert closed_inside == [True]
    assert a.outstanding() == []
    assert b.outstanding() == []


# -- signals: a real SIGALRM storm -------------------------------------------------------------


class PoolInterrupts:
    """A SIGALRM handler that raises `KeyboardInterrupt` while armed, only inside the pool's
    own code, and never in a finaliser (where Python discards exceptions: see docs/design.md on
    signals), so the test's own bookkeeping is never interrupted.  ``sites`` counts where
    the interrupts landed (the innermost function of the package)."""

    def __init__(self) -> None:
        self.armed = False
        self.count = 0
        self.sites: collections.Counter[str] = collections.Counter()
        self.interval = 0.0  # the storm's timer: re-armed when this handler is done

    def __call__(self, signum: int, frame: types.FrameType | None) -> None:
        # One shot at a time, the next armed only as this handler ends: on a slow or busy
        # machine the next signal never lands inside this one (which walks the stack),
        # however long that took.
        try:
            if not self.armed or in_finaliser(frame) or not in_package(frame):
                return
            while frame is not None and not frame.f_code.co_filename.startswith(PACKAGE_DIR):
                frame = frame.f_back
            assert frame is not None
            self.count += 1
            self.sites[frame.f_code.co_name] += 1
            raise KeyboardInterrupt
        finally:
            if self.interval:
                signal.setitimer(signal.ITIMER_REAL, self.interval, 0)


#: A storm runs until this many interrupts have landed inside the pool's code...
STORM_INTERRUPTS = 1000
#: ... or fails after this many steps: a bound, so that a storm that misses fails, loudly.
STORM_MAX_STEPS = 400_000


def storm(interrupt: PoolInterrupts, step: Callable[[int], None], interval: float) -> int:
    """Run *step* (1, 2, ...) under a SIGALRM every *interval* seconds until
    `STORM_INTERRUPTS` interrupts landed inside the pool; return the steps it took.

    The storm is counted, not timed: however slow or loaded the machine, it ends when the
    interrupts it needs have happened, and fails if `STORM_MAX_STEPS` steps did not get
    them.  The collector is off meanwhile, so that no finaliser it runs is interrupted.
    """
    assert threading.current_thread() is threading.main_thread()
    gc.collect()
    gc.disable()
    previous = signal.signal(signal.SIGALRM, interrupt)
    interrupt.interval = interval
    signal.setitimer(signal.ITIMER_REAL, interval, 0)  # re-armed by the handler
    steps = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # leaks of interrupted acquires, stale writes
            while interrupt.count < STORM_INTERRUPTS and steps < STORM_MAX_STEPS:
                steps += 1
                step(steps)
            gc.enable()
            gc.collect()
    finally:
        interrupt.interval = 0.0
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
        gc.enable()
    assert interrupt.count >= STORM_INTERRUPTS, (
        f"only {interrupt.count} of {STORM_INTERRUPTS} interrupts landed inside the pool "
        f"in {steps:,} steps"
    )
    assert len(interrupt.sites) >= 3, interrupt.sites  # spread over the pool's code
    return steps


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def release_kept(handle: BufferHandle) -> None:
    """Release a handle an interrupt left holding its buffer (docs/design.md, "Signals")."""
    try:
        handle.release()
    except ReleaseError:  # its with block's end was stopped before it began: still bound
        handle.__exit__(None, None, None)


def test_keyboard_interrupts_inside_the_pool_never_leak_its_lock() -> None:
    """Issue 10, case 4: a signal handler's exception between taking the lock and `try`
    leaked the lock."""
    pool = BucketPool()
    interrupt = PoolInterrupts()
    kept: list[BufferHandle] = []  # handles whose release was interrupted

    def step(number: int) -> None:
        handle = None
        interrupt.armed = True
        try:
            handle = pool.acquire(number % 40)
            if number % 2:
                with handle:
                    pass
            else:
                handle.release()
        except KeyboardInterrupt:
            pass
        interrupt.armed = False
        if handle is not None and not handle.released:
            kept.append(handle)

    storm(interrupt, step, 1e-4)

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
        release_kept(handle)
    assert pool.stats().active_requests.current == 0


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
@pytest.mark.parametrize("mode", ["off", "checks", "strict", "compat"])
def test_a_signal_storm_loses_no_buffer(mode: DebugLevel | Literal["compat"]) -> None:
    """Issue 10, case 4: interrupts anywhere in the pool's code, also while parking,
    retiring, verifying and trimming: afterwards every buffer the pool counts is cached,
    held or parked, and every one comes back."""
    adapter = DescriptorBufferPool() if mode == "compat" else None
    level = "off" if mode == "compat" else mode
    pool = adapter.pool if adapter else BucketPool(debug=level, max_cached_per_bucket=2)
    interrupt = PoolInterrupts()
    kept: list[BufferHandle] = []

    def step(number: int) -> None:
        event = ScriptedEvent(False, False) if number % 3 == 0 else None  # done when asked thrice
        handle = None
        interrupt.armed = True
        try:
            if adapter is not None:
                bufs = adapter.acquire(number % 70)
                adapter.release(bufs, event=event)
            else:
                handle = pool.acquire(number % 70)
                if event is not None:
                    handle.record_event(event)
                if number % 2:
                    with handle:
                        pass
                else:
                    handle.release()
                if number % 50 == 0:
                    pool.collect()
        except KeyboardInterrupt:
            pass
        interrupt.armed = False
        if handle is not None and not handle.released:
            kept.append(handle)

    storm(interrupt, step, 5e-5)
    for handle in kept:
        release_kept(handle)
    kept.clear()
    pool.synchronize()
    stats = pool.stats()
    assert stats.allocations.current == sum(b.cached + b.active + b.parked for b in stats.buckets)
    assert stats.active_requests.current == 0
    assert stats.parked == 0
    assert pool.outstanding() == []
    assert stats.cached_bytes == sum(b.cached * b.capacity * 24 for b in stats.buckets)


def _interrupt_at_call(number: int) -> Callable[[types.FrameType, str, Any], Any]:
    """A tracer that raises KeyboardInterrupt when the *number*th Python call begins.

    A signal handler runs where a Python function begins, so this is where a Ctrl-C lands.
    """
    seen = [0]

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            seen[0] += 1
            if seen[0] == number:
                raise KeyboardInterrupt
        return None

    return tracer


# Issue 18 (the third hostile review), case 7; the fifth review: the verification's changes
# (poison, views dropped, strict arrays read-only) were made before the move, which an
# interrupt could then stop.
@pytest.mark.parametrize("level", ["checks", "strict"])
def test_an_interrupted_release_changes_nothing_the_holder_sees(level: DebugLevel) -> None:
    pool = BucketPool(debug=level)
    interrupted_held = 0
    for at in itertools.count(1):
        assert at < 2_000, "the release never ran to its end uninterrupted"
        handle = pool.acquire(4)
        handle.add_copies(0, [11, 12], [21, 22], [5, 6])
        bufs, arrays = handle.buffers, handle.arrays
        interrupt = InterruptAt(at)
        sys.setprofile(interrupt)
        try:
            handle.release()
        except InjectedInterrupt:
            pass
        finally:
            sys.setprofile(None)
        if interrupt.where is None:
            break  # no point left to interrupt
        if not handle.released:
            interrupted_held += 1
            assert arrays[2][:2].tolist() == [5, 6], interrupt.where  # not poisoned
            arrays[0][0] = 11  # still writable
            assert handle.buffers is bufs, interrupt.where  # its views kept
            assert bufs.sizes[:2].tolist() == [5, 6]
            handle.release()
        del bufs, arrays
        assert pool.stats().active_requests.current == 0
    assert interrupted_held > 0  # some interrupts did land before the release took effect


@pytest.mark.parametrize("level", ["checks", "strict"])
def test_an_interrupted_retire_keeps_the_in_flight_check(
    level: DebugLevel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt in the move that retires a buffer whose descriptors changed in flight
    leaves it parked with its checksum: the next collect still reports the write."""
    hook = sys.unraisablehook  # an interrupt injected into a message's generator: not ours

    def unraisable(info: typing.Any) -> None:
        if not isinstance(info.exc_value, InjectedInterrupt):
            hook(info)

    monkeypatch.setattr(sys, "unraisablehook", unraisable)
    interrupted_parked = 0
    for at in itertools.count(1):
        assert at < 2_000, "the collect never ran to its end uninterrupted"
        pool = BucketPool(debug=level)
        handle = pool.acquire(4)
        handle.add_copies(0, [11, 12], [21, 22], [5, 6])
        event = FlagEvent()
        handle.record_event(event)
        handle.add_copies(0, [13], [23], [7])  # rewritten while the copy may read it
        handle.release()
        event.done = True
        interrupt = InterruptAt(at)
        sys.setprofile(interrupt)
        try:
            pool.collect()
        except (InjectedInterrupt, InFlightWriteError):
            pass
        finally:
            sys.setprofile(None)
        if interrupt.where is None:
            break
        if pool._ledger.parked_bytes:  # (stats() would take the inbox back first)
            interrupted_parked += 1
            reports = []
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")  # an inbox taken back first warns instead
                try:
                    pool.collect()
                except InFlightWriteError as error:
                    reports.append(str(error))
            reports += [str(warning.message) for warning in caught]
            assert len(reports) == 1, (interrupt.where, reports)
            assert "changed between record_event()" in reports[0]
        assert pool.stats().parked == 0
    assert interrupted_parked > 0


# -- signals: an interrupt at each point where a handler can run, one by one ------------


class InjectedInterrupt(KeyboardInterrupt):
    """What a signal handler raised, injected at a chosen point of a pool call."""


def _package_code(frame: types.FrameType | None) -> bool:
    return frame is not None and frame.f_code.co_filename.startswith(PACKAGE_DIR)


class InterruptAt:
    """A profile function (`sys.setprofile`) that raises `InjectedInterrupt` at the *at*-th
    point of a pool call where CPython can run a signal handler: the entry of a function
    of the package or one the package calls, and the return of a call made from the
    package's code.  Points in finalisers are left out (Python discards what a handler
    raises there).  ``points`` counts the points passed; ``where`` names the one
    interrupted."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.points = 0
        self.where: str | None = None

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call":
            if not (_package_code(frame) or _package_code(frame.f_back)):
                return
        elif event != "c_return" or not _package_code(frame):
            return
        if in_finaliser(frame):
            return
        self.points += 1
        if self.points == self.at:
            self.where = f"{event} {frame.f_code.co_name}:{frame.f_lineno} ({arg!r})"
            sys.setprofile(None)
            raise InjectedInterrupt


Call: typing.TypeAlias = Callable[[], None]


def _with_block(level: DebugLevel) -> tuple[BucketPool, Call]:
    pool = BucketPool(debug=level, max_cached_per_bucket=2, idle_trim_acquires=4)

    def work() -> None:
        with pool.acquire(20) as bufs:
            bufs.sizes.fill_(1)

    return pool, work


def _parked_release(level: DebugLevel) -> tuple[BucketPool, Call]:
    pool = BucketPool(debug=level, max_cached_per_bucket=2, idle_trim_acquires=4)

    def work() -> None:
        handle = pool.acquire(20)
        handle.add_copies(0, [16], [32], 8)
        handle.record_event(ScriptedEvent(False, after=True))  # parks; done when asked again
        handle.release()
        pool.collect()

    return pool, work


def _miss_reserve_trim(level: DebugLevel) -> tuple[BucketPool, Call]:
    pool = BucketPool(debug=level, max_cached_per_bucket=2, idle_trim_acquires=4)

    def work() -> None:
        with pool.acquire(300):  # a bucket with nothing cached: allocates
            pass
        pool.reserve(40)
        pool.trim(0)

    return pool, work


def _compat(level: DebugLevel) -> tuple[BucketPool, Call]:
    adapter = DescriptorBufferPool()

    def work() -> None:
        bufs = adapter.acquire(20)
        adapter.release(bufs, event=ScriptedEvent(False, after=True))  # parks
        bufs = adapter.acquire(20)
        adapter.release(bufs)
        adapter.pool.collect()

    return adapter.pool, work


def _compat_after_a_write(level: DebugLevel) -> tuple[BucketPool, Call]:
    adapter = DescriptorBufferPool()

    def work() -> None:
        bufs = adapter.acquire(20)
        bufs.sizes[:4].fill_(8)  # a write through the views: the next acquire checks them
        adapter.release(bufs)
        again = adapter.acquire(20)  # binds a new tuple to the buffer, then lets go the old
        adapter.release(again)

    return adapter.pool, work


INTERRUPTED_CALLS: dict[str, Callable[[DebugLevel], tuple[BucketPool, Call]]] = {
    "with block": _with_block,
    "parked release": _parked_release,
    "miss, reserve, trim": _miss_reserve_trim,
    "compat": _compat,
    "compat after a write": _compat_after_a_write,
}


def check_nothing_lost(pool: BucketPool, where: str | None) -> None:
    """After an interrupted call (its dropped handles finalised): no lock held, every buffer
    in one place and back, and the pool still works."""
    assert not _lock.owned(), where
    assert _lock.LOCK.acquire(blocking=False), f"the lock is held after an interrupt at {where}"
    _lock.LOCK.release()
    pool.synchronize()
    stats = check_pool_consistent(pool)
    assert stats.active_requests.current == 0, where
    assert stats.parked == 0, where
    assert stats.allocations.current == sum(b.cached for b in stats.buckets), where
    assert pool.outstanding() == [], where
    with pool.acquire(20) as bufs:
        bufs.sizes.fill_(2)


@pytest.mark.parametrize(
    ("call", "level"),
    [
        (call, level)
        for call in INTERRUPTED_CALLS
        for level in typing.get_args(DebugLevel)
        if not call.startswith("compat") or level == "off"  # the adapter's pool: default level
    ],
)
def test_an_interrupt_at_any_point_of_a_pool_call_loses_nothing(
    call: str, level: DebugLevel
) -> None:
    """Deterministic: the call runs once for each point where a signal handler could raise
    inside it, interrupted there; every run must leave nothing lost and no lock held."""
    make = INTERRUPTED_CALLS[call]
    interrupted: list[str] = []
    for at in itertools.count(1):
        assert at < 20_000, "the call never ran to its end uninterrupted"
        pool, work = make(level)
        with pool.acquire(20):  # something cached: the call can hit
            pass
        inject = InterruptAt(at)
        gc.disable()  # what this run makes stays in the youngest generation...
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # leaks of interrupted acquires
                sys.setprofile(inject)
                try:
                    work()
                except InjectedInterrupt:
                    pass
                finally:
                    sys.setprofile(None)
                gc.collect(0)  # ... so a young collection finalises what the run dropped
        finally:
            gc.enable()
        if inject.where is None:
            break  # past the last point: the call ran to its end
        interrupted.append(inject.where)
        check_nothing_lost(pool, inject.where)
    assert len(interrupted) >= 10, interrupted  # the call did pass that many points


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


def test_an_interrupt_after_counting_an_allocation_keeps_stats_consistent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 10, case 4, a window in the miss path: the buffer is counted, then the interrupt
    lands."""
    pool = BucketPool()
    interrupt_allocation_accounting(monkeypatch, before=False)
    with pytest.raises(Interrupt):
        pool.acquire(8)
    with pool.acquire(8):
        pass
    stats = pool.stats()
    assert stats.allocations.current == sum(b.cached + b.active + b.parked for b in stats.buckets)


def test_an_interrupt_before_counting_an_allocation_keeps_hits_non_negative(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 10, case 4, a window in the miss path: the miss is counted, then the interrupt
    lands."""
    pool = BucketPool()
    interrupt_allocation_accounting(monkeypatch, before=True)
    with pytest.raises(Interrupt):
        pool.acquire(8)
    with pool.acquire(8):
        pass
    stats = pool.stats()
    assert stats.hits + stats.misses == 1
    assert stats.hits >= 0


# -- fork ------------------------------------------------------------------------------------


@needs_fork
def test_a_forked_child_gets_a_working_pool_with_the_parents_records() -> None:
    pool = BucketPool(trace=True)
    held = pool.acquire(40)
    with pool.acquire(8):
        pass

    def child() -> int:
        records = pool.outstanding()
        with pool.acquire(40) as bufs:
            fresh = bufs.src_ptrs.data_ptr() != held.buffers.src_ptrs.data_ptr()
        return 0 if fresh and [(r.n, r.capacity) for r in records] == [(40, 64)] else 2

    pid = fork()
    if pid == 0:
        exit_child(child)
    assert wait_for_child(pid) == 0
    held.release()


def _ignore_injected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python hands what an at-fork handler raised to ``sys.unraisablehook`` and forks on:
    an injected interrupt is expected there."""
    hook = sys.unraisablehook

    def unraisable(info: typing.Any) -> None:
        if not isinstance(info.exc_value, InjectedInterrupt):
            hook(info)

    monkeypatch.setattr(sys, "unraisablehook", unraisable)


def _fork_interrupted_at(at: int, child: Callable[[], int]) -> tuple[InterruptAt, int]:
    """Fork with an interrupt at the *at*-th point of the fork handlers a signal handler could
    reach; the child exits with what *child* returns.  The injection, and the child's code."""
    inject = InterruptAt(at)
    sys.setprofile(inject)
    try:
        pid = fork()
    finally:
        sys.setprofile(None)
    if pid == 0:
        exit_child(child)
    return inject, wait_for_child(pid)


def _lock_free_and_signals(mask: set[int | signal.Signals]) -> int:
    """(in a child, or the parent) 0 if no thread holds the lock and the signal mask is
    *mask*; else which was wrong."""
    if _lock.owned():
        return 2
    if not _lock.LOCK.acquire(blocking=False):  # held by a thread the child does not have
        return 3
    _lock.LOCK.release()
    return 0 if signal.pthread_sigmask(signal.SIG_BLOCK, ()) == mask else 4


@needs_fork
def test_an_interrupt_at_any_point_of_the_fork_handlers_keeps_the_lock_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deterministic: a fork, interrupted at each point of the pool's fork handlers where a
    signal handler could raise, one by one (the fifth review: between the acquire and its
    record the lock stayed held for ever).  Parent and child both end with the lock free,
    their signals as they were, and a working pool."""
    _ignore_injected(monkeypatch)
    pool = BucketPool()
    with pool.acquire(8):
        pass
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    interrupted: list[str] = []
    for at in itertools.count(1):
        assert at < 200, "the fork never ran through its handlers uninterrupted"
        inject, code = _fork_interrupted_at(
            at, lambda: _lock_free_and_signals(mask) or fork_child_work(pool)
        )
        assert (code, _lock_free_and_signals(mask)) == (0, 0), inject.where
        if inject.where is None:
            break
        interrupted.append(inject.where)
    assert len(interrupted) >= 2, interrupted  # the handlers' Python parts were passed


@needs_fork
@needs_proc
def test_a_signal_while_the_fork_waits_for_the_lock_never_forks_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fifth review: a signal handler's exception while the fork handler waited for the
    lock (another thread inside a move) forked without it, and the child inherited a lock
    held by a thread it does not have.  Forced: a helper holds the lock until the forking
    thread waits for it, signals that thread, and lets go once the signal is seen pending
    (blocked for the wait) or the fork is over."""
    _ignore_injected(monkeypatch)
    pool = BucketPool()
    main = threading.current_thread()
    ran_in_package: list[bool] = []

    def handler(signum: int, frame: types.FrameType | None) -> None:
        ran_in_package.append(_package_code(frame))
        if ran_in_package[-1]:
            raise InjectedInterrupt  # inside the pool's fork handler

    previous = signal.signal(signal.SIGUSR1, handler)
    holding, forked = threading.Event(), threading.Event()
    seen: list[str] = []

    def hold() -> None:
        with _lock.LOCK:  # as a move does
            holding.set()
            deadline = time.monotonic() + GUARD_S  # a failure guard only
            while not blocked_in_fork_handler(main) and time.monotonic() < deadline:
                time.sleep(0)
            seen.append("waiting" if blocked_in_fork_handler(main) else "never waited")
            signal.pthread_kill(main.ident or 0, signal.SIGUSR1)
            while time.monotonic() < deadline:
                if signal.SIGUSR1 in thread_signals(main, "SigPnd") or forked.is_set():
                    break
                time.sleep(0)

    holder = threading.Thread(target=hold, daemon=True)
    try:
        holder.start()
        assert holding.wait(GUARD_S)
        pid = fork()
        if pid == 0:
            exit_child(lambda: _lock_free_and_signals(set()) or fork_child_work(pool))
        forked.set()
        holder.join(GUARD_S)
        code = wait_for_child(pid)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen == ["waiting"]
    assert ran_in_package == [False]  # handled once the fork was over, not inside it
    assert code == 0  # the child's lock was free: the fork had it
    assert _lock_free_and_signals(set()) == 0


@needs_fork
def test_a_fork_leaves_a_signal_the_thread_blocked_pending() -> None:
    # docs/design.md, "Fork": "The forking thread waits with every signal blocked [...]
    # and its signal mask is then as it was."  A signal the thread itself blocked (to
    # sigwait() it, say) must stay pending across the fork: the after-fork handlers unblock
    # every signal before blocking the thread's own again, and deliver it in between (with
    # SIG_DFL, SIGUSR1 would end the process).
    BucketPool()  # the pool's fork handlers are registered
    handled: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        assert signal.SIGUSR1 in signal.sigpending()
        pid = fork()
        if pid == 0:
            exit_child(lambda: 0)
        assert wait_for_child(pid) == 0
        still_pending = signal.SIGUSR1 in signal.sigpending()
        assert (handled, still_pending) == ([], True)
    finally:
        signal.sigtimedwait({signal.SIGUSR1}, 0)  # consume it while blocked
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGUSR1, previous)


@needs_fork
@needs_proc
def test_a_signal_during_the_forks_wait_is_reported_once_the_lock_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/design.md, "Fork": what arrives during the wait is handled as the lock is let go;
    # what its handler raises there is reported as unraisable, never lost, and the fork
    # had the lock.  Forced: a helper holds the lock until the forking thread waits for
    # it, signals it, and lets go once the signal is seen pending.
    BucketPool()
    discarded: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: discarded.append(info.exc_value))
    main = threading.current_thread()

    def handler(signum: int, frame: object) -> None:
        raise InjectedInterrupt

    previous = signal.signal(signal.SIGUSR1, handler)
    holding, forked = threading.Event(), threading.Event()
    read_end, write_end = os.pipe()

    def hold() -> None:
        with _lock.LOCK:  # as a move does
            holding.set()
            deadline = time.monotonic() + GUARD_S  # a failure guard only
            while not blocked_in_fork_handler(main) and time.monotonic() < deadline:
                time.sleep(0)
            signal.pthread_kill(main.ident or 0, signal.SIGUSR1)
            while time.monotonic() < deadline:
                if signal.SIGUSR1 in thread_signals(main, "SigPnd") or forked.is_set():
                    break
                time.sleep(0)

    holder = threading.Thread(target=hold, daemon=True)
    raised: BaseException | None = None
    try:
        holder.start()
        assert holding.wait(GUARD_S)
        try:
            if fork() == 0:
                exit_child(lambda: os.write(write_end, os.getpid().to_bytes(8, "big")) and 0)
        except InjectedInterrupt as error:
            raised = error
        forked.set()
        holder.join(GUARD_S)
        child = int.from_bytes(os.read(read_end, 8), "big")  # lost where os.fork() raised
        assert wait_for_child(child) == 0
    finally:
        signal.signal(signal.SIGUSR1, previous)
        os.close(read_end)
        os.close(write_end)
    assert (raised, [type(error) for error in discarded]) == (None, [InjectedInterrupt])


def hold_the_lock_until_the_fork_waits(
    forker: threading.Thread,
    inside: Sequence[threading.Thread],
    holding: threading.Event,
    seen: dict[str, int],
) -> Callable[[], None]:
    """A thread's work: hold the pool's lock, as a move does (*holding* says so), until
    *forker* is seen blocked on it in the fork handler and every thread of *inside* is seen
    inside a pool call; then let go.  *seen* says what was seen."""

    def run() -> None:
        with _lock.LOCK:
            holding.set()
            deadline = time.monotonic() + GUARD_S  # a failure guard only
            while time.monotonic() < deadline:
                waiting = blocked_in_fork_handler(forker)
                busy = sum(stack_in_package(thread) for thread in inside)
                if waiting and busy == len(inside):
                    seen["forker waiting"], seen["inside"] = 1, busy
                    return
                time.sleep(0)  # let the other threads run into the lock
            seen["gave up"] = 1

    return run


def fork_child_work(pool: BucketPool) -> int:
    """(in a forked child) Real work: whole records, then hand-outs, a trim and a reserve."""
    before = check_pool_consistent(pool)
    if before.active_requests.current != len(pool.outstanding()):
        return 2
    for n in (3, 7, 8, 9, 100):
        with pool.acquire(n) as bufs:
            bufs.sizes.fill_(n)
            if bufs.sizes.tolist() != [n] * n:
                return 3
    held = [pool.acquire(5) for _ in range(3)]
    if len({handle.buffers.src_ptrs.data_ptr() for handle in held}) != 3:
        return 4
    for handle in held:
        handle.release()
    pool.trim(0)
    pool.reserve(16, count=1)
    after = check_pool_consistent(pool)
    # What the parent's threads held stays out in the child; nothing else is.
    return 0 if after.active_requests.current == before.active_requests.current else 5


def fork_while_threads_are_inside(pools: Sequence[BucketPool], forks: int) -> None:
    """Fork *forks* times while a thread per pool hammers it, each fork forced to happen
    with every hammering thread inside a pool call and the fork handler waiting for the
    lock; each child does real work with every pool and must exit 0."""
    stop = threading.Event()
    errors: list[str] = []
    operations = [0] * len(pools)

    def hammer(me: int) -> None:
        pool = pools[me]
        try:
            while not stop.is_set():
                with pool.acquire(7 + 20 * (me % 3)) as bufs:
                    bufs.sizes.fill_(1)
                pool.stats()
                pool.outstanding()
                operations[me] += 1
        except BaseException as error:  # reported below
            errors.append(repr(error))

    hammers = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(len(pools))]
    for thread in hammers:
        thread.start()
    codes: list[int] = []
    sightings: list[dict[str, int]] = []
    try:
        for _ in range(forks):
            seen: dict[str, int] = {}
            holding = threading.Event()
            work = hold_the_lock_until_the_fork_waits(
                threading.current_thread(), hammers, holding, seen
            )
            holder = threading.Thread(target=work, daemon=True)
            holder.start()
            assert holding.wait(GUARD_S)
            pid = fork()
            if pid == 0:
                exit_child(lambda: max(fork_child_work(pool) for pool in pools))
            holder.join(GUARD_S)
            sightings.append(seen)
            codes.append(wait_for_child(pid))
    finally:
        stop.set()
        for thread in hammers:
            thread.join(GUARD_S)
    assert sightings == [{"forker waiting": 1, "inside": len(pools)}] * forks
    assert codes == [0] * forks
    assert errors == []
    assert min(operations) > 0  # every pool was busy
    for pool in pools:
        assert check_pool_consistent(pool).active_requests.current == 0
        assert pool.outstanding() == []


@needs_fork
@pytest.mark.usefixtures("frequent_thread_switches")
def test_fork_while_other_threads_are_inside_the_pool() -> None:
    """Issue 10, case 5: os.fork() while another thread was inside a pool call hung the child.

    Forced, never hoped for: a helper thread holds the pool's lock, as a move does, until
    the forking thread is seen waiting for it in the fork handler and each hammering thread
    is seen inside a pool call; the fork happens with all of them inside the pool."""
    pool = BucketPool(max_cached_per_bucket=2, trace=True)
    fork_while_threads_are_inside([pool, pool, pool], forks=3)


@needs_fork
def test_fork_finishes_with_twelve_busy_pools() -> None:
    """Issue 18 (the third hostile review), case 1: a fork retried every pool's lock with a
    short timeout, and never finished with twelve busy pools; one lock, taken blocking, is
    had as soon as a move ends.  In a fresh interpreter, whose timeout guards a hang."""
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, "tests")
        sys.setswitchinterval(1e-4)
        from test_signals_fork import fork_while_threads_are_inside
        from bucketpool import BucketPool
        fork_while_threads_are_inside([BucketPool() for _ in range(12)], forks=5)
        print("ok")
        """
    )
    result = run_script(script, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@needs_fork
def test_fork_while_a_thread_inside_the_pool_drops_a_leaked_handle() -> None:
    """A thread inside a move of pool B drops a leaked handle of pool A while the fork
    handler waits for the lock: the handle's finaliser must not wait for the lock too (it
    queues the release), or both hang.  In a fresh interpreter, whose timeout guards a hang."""
    script = textwrap.dedent(
        """
        import sys, threading, time, warnings
        sys.path.insert(0, "tests")
        from _helpers import blocked_in_fork_handler, exit_child, fork, wait_for_child
        from bucketpool import BucketPool
        from bucketpool._lock import LOCK
        warnings.simplefilter("ignore")
        a, b = BucketPool(), BucketPool()
        leaked = [a.acquire(3)]
        inside = threading.Event()
        main = threading.main_thread()
        seen = []

        def inside_b():
            with LOCK:  # as in a pool call of B, where a collection runs A's finaliser
                inside.set()
                deadline = time.monotonic() + 60  # a failure guard only
                while not blocked_in_fork_handler(main) and time.monotonic() < deadline:
                    time.sleep(0)
                seen.append(blocked_in_fork_handler(main))
                leaked.clear()  # A's handle is finalised here, the fork handler waiting
            b.stats()

        thread = threading.Thread(target=inside_b)
        thread.start()
        inside.wait()
        pid = fork()
        if pid == 0:
            exit_child(lambda: 0 if a.stats().active_requests.current == 0 else 3)
        code = wait_for_child(pid)
        thread.join()
        assert seen == [True], "the fork handler was never seen waiting for the lock"
        assert code == 0, code
        assert a.stats().active_requests.current == 0  # drained by this call
        print("ok")
        """
    )
    result = run_script(script, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@needs_fork
def test_an_interrupt_in_the_fork_handlers_puts_back_the_threads_mask_or_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/design.md, "Fork": one C call puts the thread's own signal mask back; a handler
    # that raises in the Python steps that note it leaves it to be put back empty, never
    # every signal blocked, and the lock right either way.
    _ignore_injected(monkeypatch)
    BucketPool()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    wrong: list[tuple[str | None, int]] = []
    try:
        own = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        for at in itertools.count(1):
            assert at < 200, "the fork never ran through its handlers uninterrupted"
            inject, code = _fork_interrupted_at(at, lambda: _own_mask_or_none(own))
            codes = (code, _own_mask_or_none(own))
            if codes != (0, 0) or (inject.where is None and _lock_free_and_signals(own)):
                wrong.append((inject.where, codes[1]))
            signal.pthread_sigmask(signal.SIG_SETMASK, own)
            if inject.where is None:
                break
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert wrong == []


def _own_mask_or_none(own: set[int | signal.Signals]) -> int:
    code = _lock_free_and_signals(own)
    return 0 if code == 4 and not signal.pthread_sigmask(signal.SIG_BLOCK, ()) else code


@needs_fork
def test_a_signal_another_thread_caught_during_the_forks_wait_keeps_the_forkers_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/design.md, "Fork": the thread's own mask is put back.  A process-directed signal
    # (Ctrl-C) during the wait is caught by a thread that does not block it; Python runs
    # the handler in the main thread at its next bytecode.  That was once `_publish_mask`'s,
    # under the lock, where its exception left a mask shared by every fork as the previous
    # fork (another thread's) left it (SIGUSR2 blocked in the main thread for good); with
    # no Python step of the pool's after the wait, it was logging's fork hook, whose lock
    # it left unbalanced.  Forced: the lock holder catches SIGUSR1 itself once the fork waits.
    _ignore_injected(monkeypatch)
    BucketPool()
    main = threading.current_thread()
    handled: list[int] = []

    def handler(signum: int, frame: types.FrameType | None) -> None:
        handled.append(signum)
        raise InjectedInterrupt

    previous = signal.signal(signal.SIGUSR1, handler)

    def fork_from_a_thread_with_usr2_blocked() -> None:  # the previous fork: another mask
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
        pid = fork()
        if pid == 0:
            exit_child(lambda: 0)
        codes.append(wait_for_child(pid))

    codes: list[int] = []
    other = threading.Thread(target=fork_from_a_thread_with_usr2_blocked, daemon=True)
    other.start()
    other.join(GUARD_S)
    assert codes == [0]
    holding = threading.Event()

    def hold() -> None:
        with _lock.LOCK:  # as a move does
            holding.set()
            deadline = time.monotonic() + GUARD_S  # a failure guard only
            while not blocked_in_fork_handler(main) and time.monotonic() < deadline:
                time.sleep(0)
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # caught here, in C

    holder = threading.Thread(target=hold, daemon=True)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        holder.start()
        assert holding.wait(GUARD_S)
        pid = fork()
        if pid == 0:
            exit_child(lambda: _lock_free_and_signals(mask))
        holder.join(GUARD_S)
        after = (wait_for_child(pid), signal.pthread_sigmask(signal.SIG_BLOCK, ()))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGUSR1, previous)
    assert (handled, after) == ([signal.SIGUSR1], (0, mask))


@needs_fork
def test_an_interrupt_as_the_fork_puts_the_mask_back_leaves_no_signal_blocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/design.md, "Fork": C calls put the thread's own signal mask back.  The
    # after-fork put-back (and the before-fork `_block`) were once partials of
    # `signal.pthread_sigmask`, which is Python (signal.py wraps `_signal`'s): a handler's
    # exception at its first line (a signal another thread caught during the fork) left
    # every signal blocked in the forking thread for good.  `InterruptAt` never counts this
    # point (its caller is the fork, not the package).  Forced: the interrupt lands there.
    _ignore_injected(monkeypatch)
    BucketPool()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    code = signal.pthread_sigmask.__code__

    def at_restore(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is code and frame.f_locals["how"] == signal.SIG_SETMASK:
            sys.setprofile(None)
            raise InjectedInterrupt

    sys.setprofile(at_restore)
    try:
        pid = fork()
    finally:
        sys.setprofile(None)
        after = signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (for the tests that follow)
    if pid == 0:
        exit_child(lambda: 0)
    assert wait_for_child(pid) == 0
    assert after == mask


@needs_fork
@needs_proc
def test_an_interrupt_before_the_fork_blocks_signals_never_forks_without_the_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/design.md, "Fork": "The forking thread waits with every signal blocked, so no
    # handler can interrupt the wait and fork without the lock."  `_block` is a partial of
    # `signal.pthread_sigmask`, Python: an interrupt at its first line leaves the signals
    # unblocked, and the next one interrupts the lock's wait (the fifth review's bug): the
    # child inherits the lock held.  Forced: one interrupt lands there, then a helper that
    # holds the lock signals the waiting thread and lets go once the wait was interrupted.
    unraisable: list[str] = []  # what the fork's handlers raised, the injected aside

    def hook(info: typing.Any) -> None:
        if not isinstance(info.exc_value, InjectedInterrupt):
            unraisable.append(repr(info.exc_value))

    monkeypatch.setattr(sys, "unraisablehook", hook)
    pool = BucketPool()
    main = threading.current_thread()
    code, every = signal.pthread_sigmask.__code__, signal.valid_signals()

    def waiting_in_fork() -> bool:  # (its signals unblocked: `blocked_in_fork_handler` waits)
        frame = sys._current_frames().get(main.ident or 0)
        with open(f"/proc/self/task/{main.native_id}/status") as status:
            state = next(line for line in status if line.startswith("State:"))
        return frame is not None and frame.f_code is fork.__code__ and "S" in state.split()[1]

    def at_block(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is code and frame.f_locals["mask"] == every:
            sys.setprofile(None)
            raise InjectedInterrupt

    def handler(signum: int, frame: types.FrameType | None) -> None:
        handled.append(signum)
        raise InjectedInterrupt

    previous = signal.signal(signal.SIGUSR1, handler)
    holding, forked = threading.Event(), threading.Event()
    seen: list[bool] = []
    handled: list[int] = []

    def hold() -> None:
        with _lock.LOCK:  # as a move does
            holding.set()
            deadline = time.monotonic() + GUARD_S  # a failure guard only
            while not waiting_in_fork() and time.monotonic() < deadline:
                time.sleep(0)
            seen.append(waiting_in_fork())
            signal.pthread_kill(main.ident or 0, signal.SIGUSR1)
            while time.monotonic() < deadline:
                if handled or signal.SIGUSR1 in thread_signals(main, "SigPnd") or forked.is_set():
                    break
                time.sleep(0)

    holder = threading.Thread(target=hold, daemon=True)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        holder.start()
        assert holding.wait(GUARD_S)
        sys.setprofile(at_block)
        try:
            pid = fork()
        finally:
            sys.setprofile(None)
        if pid == 0:
            exit_child(lambda: _lock_free_and_signals(mask) or fork_child_work(pool))
        forked.set()
        holder.join(GUARD_S)
        code_of_child = wait_for_child(pid)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [True]
    assert unraisable == []  # RuntimeError: the parent released a lock it had not taken
    assert code_of_child == 0  # 3: the child's lock was held by a thread it does not have
    assert _lock_free_and_signals(mask) == 0


def test_a_fork_made_while_another_puts_its_mask_back_keeps_its_own_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/design.md, "Fork": each forking thread gets its own mask back.  Forced: the main
    # thread (SIGUSR2 blocked) forks; a signal from its wait is handled as its mask is put
    # back, after the lock is let go, and the handler has a second thread (nothing blocked)
    # fork then.  That thread's mask must stay empty, not take the first one's SIGUSR2.
    BucketPool()
    main = threading.current_thread()
    other_mask: list[set[int]] = []

    def fork_elsewhere() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if fork() == 0:
            os._exit(0)
        other_mask.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, ())))

    def handler(signum: int, frame: object) -> None:
        other = threading.Thread(target=fork_elsewhere, daemon=True)
        other.start()
        other.join(GUARD_S)

    def hold() -> None:
        with _lock.LOCK:
            deadline = time.monotonic() + GUARD_S  # a failure guard only
            while not blocked_in_fork_handler(main) and time.monotonic() < deadline:
                time.sleep(0)
            signal.pthread_kill(main.ident or 0, signal.SIGUSR1)
            while signal.SIGUSR1 not in thread_signals(main, "SigPnd"):
                if time.monotonic() > deadline:
                    break
                time.sleep(0)

    previous = signal.signal(signal.SIGUSR1, handler)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    holder = threading.Thread(target=hold, daemon=True)
    try:
        holder.start()
        if (child := fork()) == 0:
            os._exit(0)
        holder.join(GUARD_S)
        assert wait_for_child(child) == 0
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGUSR1, previous)
    assert other_mask == [set()]


@needs_fork
def test_two_threads_forking_at_once_each_get_their_own_mask_back() -> None:
    # docs/design.md, "Fork": each forking thread gets its own mask back, whatever other
    # threads fork meanwhile.  Forced: the main thread (nothing blocked) forks; a signal
    # sent to it under the lock is handled as its mask is put back, after the lock is let
    # go, and the handler has a second thread (SIGUSR2 blocked) fork, which waits in a
    # fork hook that runs after the pool's (as logging's does) until the first fork is
    # over.  A mask shared between forks was emptied there by the first one's cleanup: the
    # second thread and its child came out with every signal unblocked.  In a fresh
    # interpreter: a fork hook stays for good, and this one must come before the pool's.
    script = textwrap.dedent(
        """
        import os, signal, sys, threading
        USR2 = {signal.SIGUSR2}
        published, first_done = threading.Event(), threading.Event()
        seen, got = [], []

        def after_the_pools_hooks():  # (registered first, so run last)
            if threading.current_thread() is second:
                published.set()
                seen.append(("second, under the lock", _lock.owned(), first_done.wait(60)))
            elif not seen:  # the first fork: handled as its mask is put back
                seen.append(("first, under the lock", _lock.owned()))
                signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

        def handler(signum, frame):
            back = frame.f_code is fork.__code__ and not _lock.owned()  # in the C after-hooks
            second.start()
            seen.append(("first, putting its mask back", back, published.wait(60)))

        def fork_with_usr2_blocked():
            signal.pthread_sigmask(signal.SIG_BLOCK, USR2)
            if (pid := fork()) == 0:
                exit_child(lambda: 0 if signal.pthread_sigmask(signal.SIG_BLOCK, ()) == USR2 else 4)
            got.append(signal.pthread_sigmask(signal.SIG_BLOCK, ()) == USR2)
            got.append(wait_for_child(pid))

        os.register_at_fork(before=after_the_pools_hooks)
        sys.path.insert(0, "tests")
        from _helpers import exit_child, fork, wait_for_child
        from bucketpool import BucketPool, _lock
        BucketPool()
        second = threading.Thread(target=fork_with_usr2_blocked)
        signal.signal(signal.SIGUSR1, handler)
        if (pid := fork()) == 0:
            exit_child(lambda: 0)
        first_done.set()
        second.join(60)
        print(seen)
        print(got, wait_for_child(pid), signal.pthread_sigmask(signal.SIG_BLOCK, ()))
        """
    )
    result = run_script(script, timeout=300)
    assert result.returncode == 0, result.stderr
    situation, outcome = result.stdout.splitlines()
    assert situation == str(
        [
            ("first, under the lock", True),
            ("first, putting its mask back", True, True),
            ("second, under the lock", True, True),
        ]
    )
    assert outcome == "[True, 0] 0 set()"  # the second thread's mask, its child's, the first's


@needs_fork
def test_a_fork_inside_another_forks_hooks_leaves_no_signal_blocked() -> None:
    # docs/design.md, "Fork": a fork made inside another's hooks (by a handler or finaliser
    # there) keeps every signal blocked while the outer fork holds the lock, and leaves the
    # outer one's mask to be put back empty, never every signal blocked.  Forced: a fork
    # hook that runs after the pool's forks once more.  In a fresh interpreter: a fork hook
    # stays for good, and this one must come after the hooks of what torch imports (a fork
    # inside those waits for their locks) and before the pool's.
    script = textwrap.dedent(
        """
        import os, signal, sys
        import torch
        EVERY = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
        inner = []

        def fork_inside():
            if not inner:
                inner.append(_lock.owned())
                if (pid := fork()) == 0:
                    exit_child(lambda: 0)
                inner.append(signal.pthread_sigmask(signal.SIG_BLOCK, ()) == EVERY)
                inner.append(wait_for_child(pid))

        os.register_at_fork(before=fork_inside)
        sys.path.insert(0, "tests")
        from _helpers import exit_child, fork, wait_for_child
        from bucketpool import BucketPool, _lock
        BucketPool()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
        if (pid := fork()) == 0:
            exit_child(lambda: 0)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        print(inner, wait_for_child(pid), mask <= {signal.SIGUSR2}, _lock.owned())
        """
    )
    result = run_script(script, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[True, True, 0] 0 True False"


#: (a script's start) Every ``os.register_at_fork`` call the package makes, by module.
_RECORD_FORK_HOOKS = """
import os, signal, sys, threading, time
registered, real = [], os.register_at_fork

def recording(**hooks):
    caller = sys._getframe(1).f_globals["__name__"]
    if caller.startswith("bucketpool"):
        registered.append(caller)
        on_register(len(registered))
    real(**hooks)

def on_register(count):
    pass

os.register_at_fork = recording
"""


@needs_fork
def test_importing_the_package_changes_no_fork() -> None:
    # docs/design.md, "Fork": a process that never makes a pool pays nothing for one: no
    # fork hook, so its forks neither wait for the pool's lock nor block any signal.  The
    # first pool registers them.  Forced: a thread holds the lock as the process forks; it
    # lets go once the fork is seen waiting for it, or over.  In a fresh interpreter.
    script = _RECORD_FORK_HOOKS + textwrap.dedent(
        """
        import bucketpool, bucketpool.compat, bucketpool.testing, bucketpool.vllm
        from bucketpool import _lock
        sys.path.insert(0, "tests")
        from _helpers import blocked_in_fork_handler, exit_child, fork, wait_for_child
        main, mask = threading.current_thread(), signal.pthread_sigmask(signal.SIG_BLOCK, ())

        def fork_while_the_lock_is_held():
            held, forked, waited = threading.Event(), threading.Event(), []

            def hold():
                with _lock.LOCK:
                    held.set()
                    deadline = time.monotonic() + 60  # a failure guard only
                    while not (forked.is_set() or blocked_in_fork_handler(main)):
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0)
                    waited.append(blocked_in_fork_handler(main))

            holder = threading.Thread(target=hold)
            holder.start()
            held.wait()
            if (pid := fork()) == 0:
                exit_child(lambda: 0 if signal.pthread_sigmask(signal.SIG_BLOCK, ()) == mask else 4)
            forked.set()
            holder.join()
            after = signal.pthread_sigmask(signal.SIG_BLOCK, ()) == mask
            return (len(registered), waited[0], wait_for_child(pid), after)

        print(fork_while_the_lock_is_held())
        bucketpool.BucketPool()
        print(fork_while_the_lock_is_held())
        """
    )
    result = run_script(script, timeout=300)
    assert result.returncode == 0, result.stderr
    # (hooks registered, the fork waited for the lock, the child's mask, the parent's)
    assert result.stdout.splitlines() == ["(0, False, 0, True)", "(4, True, 0, True)"]


@needs_fork
def test_two_threads_making_their_first_pools_at_once_register_the_fork_hooks_once() -> None:
    # Forced: the first pool's thread is held inside its first registration until the
    # other thread is seen waiting to register (or a failure guard's deadline passes).
    # Before the last registration it forks: with some hooks registered, and not others,
    # that fork must still leave no signal blocked.
    script = _RECORD_FORK_HOOKS + textwrap.dedent(
        """
        sys.path.insert(0, "tests")
        from _helpers import exit_child, fork, wait_for_child, waiting_at
        from bucketpool import BucketPool
        first_in, seen, made = threading.Event(), [], []

        def blocks_usr1():
            return signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, ())

        def on_register(count):
            if count == 4:
                if (pid := fork()) == 0:
                    exit_child(lambda: blocks_usr1())
                seen.append(("forked half-registered", blocks_usr1(), wait_for_child(pid)))
            if count == 1:
                first_in.set()
                deadline = time.monotonic() + 60  # a failure guard only
                while not waiting_at(second, "with _REGISTERING:"):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0)
                seen.append(waiting_at(second, "with _REGISTERING:"))

        def make_a_pool():
            BucketPool()
            made.append(len(registered))

        first, second = (threading.Thread(target=make_a_pool) for _ in range(2))
        first.start()
        first_in.wait(60)
        second.start()
        for thread in (first, second):
            thread.join(60)
        BucketPool()
        print(seen, made, len(registered), set(registered))
        """
    )
    result = run_script(script, timeout=300)
    assert result.returncode == 0, result.stderr
    # Each pool was made once every hook was registered: by the first of them, once.
    assert result.stdout.strip() == (
        "[True, ('forked half-registered', False, 0)] [4, 4] 4 {'bucketpool._lock'}"
    )
