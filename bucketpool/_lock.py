"""The one lock that guards every pool's ledger, and how it is held across ``os.fork()``.

The locking rule is stated once, in docs/design.md ("The locking rule"): one lock for every
pool, taken with ``with`` in the ledger's moves only, each a short locked section that runs
no user code and, at ``off``, calls nothing.
"""

from __future__ import annotations

import functools
import importlib
import operator
import os
import signal
import threading
from collections.abc import Callable

__all__ = ["LATE", "LOCK", "hold_across_forks", "owned"]

#: The lock.  An RLock only for its owner test (`owned`): it is never entered twice.
LOCK = threading.RLock()
#: Whether this thread is inside a move (a finaliser or signal handler interrupted it).
owned: Callable[[], bool] = LOCK._is_owned  # type: ignore[attr-defined]
#: Weak references to pools with releases queued from inside a move: the pool call that
#: made the move takes them back as it ends (`BucketPool` drains them).
LATE: list[Callable[[], object]] = []

_signal = importlib.import_module("_signal")  # its C functions: signal.py's wrap them in code
#: The ``os.register_at_fork`` calls that hold the lock across a fork: the first pool makes
#: them (`hold_across_forks`), so that importing the package changes nothing process-wide.
_HOOKS: list[Callable[[], None]] = []
# An RLock: a pool that a finaliser makes inside the first registration (a collection can
# run there) registers the rest itself rather than wait for its own thread.
_REGISTERING = threading.RLock()


def hold_across_forks() -> None:
    """Hold the lock across every later ``os.fork()`` (docs/design.md, "Fork").

    Every `BucketPool` calls it as it is made: the first registers the fork hooks, once.
    Thread-safe: a pool made meanwhile by another thread waits until they all are.
    """
    if _HOOKS:  # emptied once every hook is registered: later pools take no lock
        with _REGISTERING:
            for register in _HOOKS:
                register()
            _HOOKS.clear()


# Python runs the handler of a signal another thread caught during the wait at this thread's
# next bytecode: here, where what it raises harms nothing, not in the next library's fork
# hook (logging's, whose lock it would leave unbalanced).
def _after_the_wait() -> None:
    """Nothing: where that handler runs."""


def _note_mask() -> None:
    # A handler raising here leaves the empty mask (`_Own`'s, or the last fork's) put back.
    mask = _signal.pthread_sigmask(signal.SIG_BLOCK, ())
    _own.put_back = functools.partial(_signal.pthread_sigmask, signal.SIG_SETMASK, mask)


# Held across the fork by the lock's own C methods, waited for with every signal blocked;
# the thread's mask is put back by C calls once the lock is let go, so a handler for what
# arrived meanwhile never runs under the lock.  The mask is the thread's own (`_own`, read
# by the C calls as they run): other threads' forks never touch it.  It is forgotten after
# each fork, so a fork made inside another's hooks (by a handler or finaliser there)
# leaves that one's put back empty, never every signal blocked; so does a fork made while
# the first pool registers the hooks.  Before-hooks run in the reverse order of
# registration, after-hooks in order.
if hasattr(os, "register_at_fork"):
    _register = functools.partial(functools.partial, os.register_at_fork)  # made later
    _HOOKS.append(_register(before=_after_the_wait))
    _HOOKS.append(
        _register(before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=LOCK.release)
    )
    if hasattr(signal, "pthread_sigmask"):
        _none = functools.partial(_signal.pthread_sigmask, signal.SIG_SETMASK, ())

        class _Own(threading.local):
            put_back = staticmethod(_none)  # until the thread's first fork notes its mask

        _own = _Own()
        _put_back = functools.partial(operator.methodcaller("put_back"), _own)
        _forget = functools.partial(setattr, _own, "put_back", _none)
        _block = functools.partial(
            _signal.pthread_sigmask, signal.SIG_BLOCK, signal.valid_signals()
        )
        _HOOKS.append(_register(before=_block, after_in_parent=_put_back, after_in_child=_put_back))
        _HOOKS.append(_register(before=_note_mask, after_in_parent=_forget, after_in_child=_forget))
