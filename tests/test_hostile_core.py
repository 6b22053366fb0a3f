"""A hostile review of the core changes since c744f96: each test is one bug, and fails on main."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import typing

import pytest
from _events import FlagEvent
from _helpers import blocked_in_fork_handler, exit_child, fork, thread_signals, wait_for_child

from bucketpool import BucketPool, BufferHandle, _debug, _lock
from bucketpool.compat import DescriptorBufferPool

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
needs_proc = pytest.mark.skipif(
    not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/status"),
    reason="needs Linux's /proc to see a thread's blocked signals",
)
GUARD_S = 60.0  # a failure guard only


class Boom(Exception):
    """What the tests' signal handlers raise."""


# -- fork -----------------------------------------------------------------------------------


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
def test_a_signal_during_the_forks_wait_raises_its_handlers_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/design.md, "Fork": "what arrives meanwhile is handled as the fork ends"; and
    # "nothing lost to a signal".  The after-fork handler that unblocks the signals runs
    # the Python handler inside the at-fork hook, where Python discards what it raises
    # (sys.unraisablehook): a Ctrl-C (KeyboardInterrupt) during the wait vanishes.
    # Forced: a helper holds the lock until the forking thread waits for it, signals it,
    # and lets go once the signal is seen pending.
    BucketPool()
    discarded: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: discarded.append(info.exc_value))
    main = threading.current_thread()

    def handler(signum: int, frame: object) -> None:
        raise Boom("the handler's exception")

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
        except Boom as error:
            raised = error
        forked.set()
        holder.join(GUARD_S)
        child = int.from_bytes(os.read(read_end, 8), "big")  # lost where os.fork() raised
        assert wait_for_child(child) == 0
    finally:
        signal.signal(signal.SIGUSR1, previous)
        os.close(read_end)
        os.close(write_end)
    assert (type(raised), discarded) == (Boom, [])


# -- strict: arrays made read-only ----------------------------------------------------------


def test_an_array_derived_as_the_release_ends_is_made_read_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/guide/debugging.md, strict: "`handle.arrays`, `view.numpy()` and every array numpy
    # derives from them (slices, `.view()`, reshapes) are made read-only at release".  The
    # move hands the guards' list of arrays over as a copy (`ended += handed`) and makes
    # them read-only after it, outside the lock: a slice another thread cuts from a stale
    # array in between joins only the old list, is never marked, and writes into the next
    # holder's buffer.  Forced: the slice is cut just before the pool marks the arrays.
    pool = BucketPool(debug="strict")
    end_arrays = _debug.end_arrays
    cut: list[typing.Any] = []

    def slice_then_end(buffer: typing.Any) -> None:
        cut.append(stale[1:])  # what another thread does at this moment
        end_arrays(buffer)

    monkeypatch.setattr(_debug, "end_arrays", slice_then_end)
    handle = pool.acquire(8)
    stale = handle.arrays[0]
    handle.release()
    monkeypatch.undo()
    assert len(cut) == 1
    assert not stale.flags.writeable
    assert not cut[0].flags.writeable  # else a stale write lands in the next holder's buffer


# -- compat: `_pool` ------------------------------------------------------------------------


def test_compat_pool_lists_the_tuple_released_last(monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/compat.md, `_pool`: "of the tuples last released for the buffers cached now".
    # `release` notes the tuple (`note_release`) only after the move cached the buffer:
    # another thread can acquire that buffer and release it as a new tuple in between, and
    # the late note then overwrites the newer one with the stale tuple.  Forced: the other
    # thread's acquire and release run as soon as the first release's move is over.
    adapter = DescriptorBufferPool()
    release = BufferHandle.release
    others: list[object] = []

    def then_another_thread(handle: BufferHandle) -> None:
        release(handle)
        if not others:
            others.append(again := adapter.acquire(8))  # the buffer just cached
            adapter.release(again)

    first = adapter.acquire(8)
    monkeypatch.setattr(BufferHandle, "release", then_another_thread)
    adapter.release(first)
    monkeypatch.undo()
    listed = adapter._pool
    assert len(listed) == 1
    assert listed[0] is others[0]


# -- add_copies(step=) ----------------------------------------------------------------------


def test_an_interleaved_fill_from_the_handles_own_column_reads_it_before_writing() -> None:
    # docs/guide/handles.md: "Every input is read and checked before the first entry is
    # written, so [...] a handle's own columns may be passed back"; `write`'s docstring:
    # "shared inputs copied first".  `write` copies a shared destinations or sizes column,
    # never the sources: numpy's `src[first:end:step] = sources` reads entries it has
    # already overwritten when the strided target overlaps them (entry 4 gets entry 2's new
    # value), and the copies move the wrong memory.
    pool = BucketPool()
    with pool.acquire(8) as bufs:
        bufs.add_copies(0, list(range(10, 18)), list(range(20, 28)), list(range(30, 38)))
        end = bufs.add_copies(0, bufs.src_ptrs[:4], bufs.dst_ptrs[:4], bufs.sizes[:4], step=2)
        assert end == 7
        assert bufs.src_ptrs.tolist() == [10, 11, 11, 13, 12, 15, 13, 17]
        assert bufs.dst_ptrs.tolist() == [20, 21, 21, 23, 22, 25, 23, 27]


# -- synchronize(timeout=) ------------------------------------------------------------------


def test_synchronize_takes_any_number_of_seconds() -> None:
    # BucketPool.synchronize: "timeout: seconds to wait in all, or `None`"; "Raises: [...]
    # TypeError, ValueError: *timeout* is not a number of seconds >= 0".  An int timeout
    # beyond a float's range raises OverflowError from `time.monotonic() + timeout`, an
    # error the docstring does not name (and nothing was waited for).
    pool = BucketPool()
    handle = pool.acquire(8)
    handle.record_event(FlagEvent(done=True))
    handle.release()
    pool.synchronize(timeout=10**400)  # as long as it takes: the event is done now
    assert pool.stats().parked == 0
