"""The one lock that guards every pool's ledger, and how it is held across ``os.fork()``.

The locking rule is stated once, in docs/design.md ("The locking rule"): one lock for every
pool, taken with ``with`` in the ledger's moves only, each a short locked section that runs
no user code and, at ``off``, calls nothing.
"""

from __future__ import annotations

import functools
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

_blocked: dict[int, set[int | signal.Signals]] = {}  # each forking thread's own blocked signals


def _note_mask() -> None:
    # Interrupted here, nothing is taken: the fork goes on blocking every signal anyway.
    _blocked[threading.get_ident()] = signal.pthread_sigmask(signal.SIG_BLOCK, ())


def _block_again() -> None:
    # Interrupted here, the lock is back and the thread's signals unblocked, as a thread's
    # usually are; only ones it had blocked itself would stay unblocked.
    if blocked := _blocked.pop(threading.get_ident(), None):
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)


# Held across the fork by the lock's own C methods, waited for with every signal blocked
# (docs/design.md, "Fork").  Before-handlers run in the reverse order of registration.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=LOCK.release
    )
    if hasattr(signal, "pthread_sigmask"):
        _every = signal.valid_signals()
        _unblock = functools.partial(signal.pthread_sigmask, signal.SIG_UNBLOCK, _every)
        os.register_at_fork(
            before=functools.partial(signal.pthread_sigmask, signal.SIG_BLOCK, _every),
            after_in_parent=_unblock,
            after_in_child=_unblock,
        )
        os.register_at_fork(
            before=_note_mask, after_in_parent=_block_again, after_in_child=_block_again
        )
