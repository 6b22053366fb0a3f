"""The one lock that guards every pool's records, and how it is held across ``os.fork()``.

The locking rule
----------------
One `threading.RLock`, shared by every pool in the process, guards every pool's ledger
(`bucketpool._ledger`): its buckets, free lists, inbox, parking queues, counters, and each
buffer's ``token``.  It is taken only in the moves, the ledger's and the parking queues'
(`bucketpool._queues`), always with ``with``, and a thread holds it for one move at a
time: no code path holds it while it waits for anything else.  A locked section runs no
user code (no ``event.query()``, no warning, no finaliser of ours), and at the default
debug level it calls nothing and loops
nowhere: it is subscripts, attribute stores, arithmetic and comparisons, so that in CPython
no signal handler can run inside it and the thread cannot give up the GIL in the middle of
it.  (At the debug levels, the verification of a returned buffer -- numpy on the pool's own
memory -- runs inside the move that caches it.)  Correctness rests on the lock, never on the
GIL, reference counts or the garbage collector: the pool stays correct on a free-threaded
build.

Code that the garbage collector or a signal handler may run at any moment (a handle's
finaliser, the exit of a ``with`` block in a collected generator) never waits for the lock:
releases are appended to the inbox of the buffer's bucket (a `collections.deque`, whose
appends are thread-safe), and the next operation takes them back.  Any other call made while
this thread is inside a move (a finaliser run by a collection that an allocation in the move
started; at the debug levels, a signal handler during a verification) raises `PoolError`:
`inside` says when.

One lock for every pool, not one per pool: a thread can then never hold one pool's lock
while it waits for another's, so no two pools can deadlock, and ``os.fork()`` takes a single
lock, blocking, which cannot livelock however many pools are busy.  The moves are short, so
threads working on different pools rarely meet on it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from bucketpool._errors import PoolError

__all__ = ["LATE", "LOCK", "inside", "owned", "reentered"]

#: The lock.  An RLock only for its owner test (`inside`): it is never entered twice.
LOCK = threading.RLock()
#: `inside` without the Python call, for the hot paths: the lock's own C method.
owned = LOCK._is_owned  # type: ignore[attr-defined]
_is_owned = owned

#: Weak references to the pools with releases queued by a finaliser or handler that ran
#: inside a move: the pool call that made the move takes them back as it ends
#: (`BucketPool._drain`), so no later call is needed.  Weak: a pool dropped meanwhile
#: goes, and its queue with it.
LATE: list[Callable[[], object]] = []

# Whether `_before_fork` took the lock (it does not when the forking thread holds it).
_taken_for_fork: list[bool] = []


def inside() -> bool:
    """Return whether this thread is inside a move (a finaliser or handler interrupted it)."""
    return bool(_is_owned())


def reentered(operation: str) -> PoolError:
    """The error for *operation* called from inside a move (a finaliser interrupted one)."""
    return PoolError(
        f"{operation} was called from a finaliser or signal handler that interrupted this "
        "thread inside a pool, whose records may be half-way through a change; call "
        f"{operation} outside finalisers and signal handlers (releases are fine there: they "
        "are queued)"
    )


def _before_fork() -> None:
    """Hold the lock across ``os.fork()``, so no child inherits a move half-made.

    Blocking is safe: whoever holds the lock is inside a move, which waits for nothing.
    This and `_after_fork` are the one place the lock is not taken with ``with``: a hold
    across the fork has no block to live in.  A thread that forks from inside a move (a
    finaliser that forks) cannot wait for itself: it forks with the lock as it is.
    """
    if _is_owned():
        _taken_for_fork.append(False)
        return
    LOCK.acquire()
    _taken_for_fork.append(True)


def _after_fork() -> None:
    """Let go of what `_before_fork` took, in the parent and in the child."""
    if _taken_for_fork and _taken_for_fork.pop():
        LOCK.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
    )
