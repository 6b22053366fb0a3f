"""The one lock that guards every pool's ledger, and how it is held across ``os.fork()``.

The locking rule is stated once, in docs/design.md ("The locking rule"): one lock for every
pool, taken with ``with`` in the ledger's moves only, each a short locked section that runs
no user code and, at ``off``, calls nothing.
"""

from __future__ import annotations

import os
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

_taken_for_fork: list[bool] = []  # whether `_before_fork` took the lock


def _before_fork() -> None:
    # The one place the lock is not taken with ``with``: a hold across the fork has no
    # block to live in.  Blocking is safe: a move waits for nothing.  A thread that forks
    # from inside a move (a finaliser that forks) forks with the lock as it is.
    taken = not owned()
    if taken:
        LOCK.acquire()
    _taken_for_fork.append(taken)


def _after_fork() -> None:
    if _taken_for_fork and _taken_for_fork.pop():
        LOCK.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
    )
