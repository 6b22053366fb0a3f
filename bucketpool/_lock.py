"""The one lock that guards every pool's ledger, and how it is held across ``os.fork()``.

The locking rule is stated once, in docs/design.md ("The locking rule"): one lock for every
pool, taken with ``with`` in the ledger's moves only, each a short locked section that runs
no user code and, at ``off``, calls nothing.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import threading
from collections.abc import Callable

__all__ = ["LATE", "LOCK", "owned"]

#: The lock.  An RLock only for its owner test (`owned`): it is never entered twice.
LOCK = threading.RLock()
#: Whether this thread is inside a move (a finaliser or signal handler interrupted it).
owned: Callable[[], bool] = LOCK._is_owned  # type: ignore[attr-defined]
#: Weak references to pools with releases queued from inside a move: the pool call that
#: made the move takes them back as it ends (`BucketPool` drains them).
LATE: list[Callable[[], object]] = []

_signal = importlib.import_module("_signal")  # its C functions: signal.py's wrap them in code
_noted: dict[int, set[int]] = {}  # each forking thread's own blocked signals
_MASK: set[int] = set()  # the forking thread's, put back by a C call (emptied after)


def _note_mask() -> None:
    # A handler raising here (or in `_publish_mask`) leaves the mask to be put back empty.
    _noted[threading.get_ident()] = _signal.pthread_sigmask(signal.SIG_BLOCK, ())


def _publish_mask() -> None:
    # Under the lock: a fork whose handler (run as its mask is put back) lets another thread
    # fork leaves its mask here until its `_MASK.clear`, which runs after that other fork.
    _MASK.clear()
    _MASK.update(_noted.pop(threading.get_ident(), ()))


# Held across the fork by the lock's own C methods, waited for with every signal blocked;
# the thread's mask is put back by C calls once the lock is let go, so a handler for what
# arrived meanwhile never runs under the lock (docs/design.md, "Fork").  Before-handlers
# run in the reverse order of registration, after-handlers in order.
if hasattr(os, "register_at_fork"):
    masks = hasattr(signal, "pthread_sigmask")
    if masks:
        os.register_at_fork(before=_publish_mask)
    os.register_at_fork(
        before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=LOCK.release
    )
    if masks:
        _restore = functools.partial(_signal.pthread_sigmask, signal.SIG_SETMASK, _MASK)
        os.register_at_fork(after_in_parent=_restore, after_in_child=_restore)
        os.register_at_fork(after_in_parent=_MASK.clear, after_in_child=_MASK.clear)
        _block = functools.partial(
            _signal.pthread_sigmask, signal.SIG_BLOCK, signal.valid_signals()
        )
        os.register_at_fork(before=_block)
        os.register_at_fork(before=_note_mask)
