"""The exceptions a pool raises when it is misused."""

from __future__ import annotations

import typing

__all__ = [
    "CapacityError",
    "InFlightReleaseWarning",
    "InFlightWriteError",
    "LeakWarning",
    "PoolError",
    "ReleaseError",
    "UseAfterReleaseError",
]


class PoolError(RuntimeError):
    """Base of every error that reports a misuse of a pool's buffers.

    After any of these is raised the pool is consistent and has lost no buffer.
    """


@typing.final
class ReleaseError(PoolError):
    """A hand-out was released twice, into the wrong pool, or used after its release."""


@typing.final
class UseAfterReleaseError(PoolError):
    """A view was used after its hand-out ended (debug level ``strict``)."""


@typing.final
class InFlightWriteError(PoolError):
    """Descriptors were rewritten while a recorded copy could still read them.

    Raised (debug levels) from the owner's `record_event` when an earlier copy is still in
    flight, or from `collect` or `synchronize` when a parked buffer's events retire; an
    unrelated operation that retires it warns (`RuntimeWarning`) instead.
    """


@typing.final
class CapacityError(IndexError, ValueError):
    """Descriptors were written past the entries a buffer has.

    Both an `IndexError` (the entries ``[first, first + k)`` do not fit) and a `ValueError`,
    which is what the original pool's numpy slice assignment raised, so callers that catch
    either keep working.  Nothing was written.
    """


@typing.final
class InFlightReleaseWarning(UserWarning):
    """(``debug="checks"``) A hand-out was released while a copy of its descriptors ran.

    The copy began through bucketpool's integration (``bucketpool.vllm.install()``'s copy
    op, or `bucketpool.testing.HostDevice`), which recorded its end event: the buffer stays
    parked until the copy ends, at every level, so nothing is overwritten; the warning names
    where the copy began and where the release was.  ``"strict"`` raises `ReleaseError`.
    """


@typing.final
class LeakWarning(UserWarning):
    """A handle (or a compat triple) was dropped without being released.

    A `UserWarning`, so Python's default filters show it; silence or escalate it the usual
    way, e.g. ``warnings.simplefilter("error", bucketpool.LeakWarning)``.  Its buffer went
    back to the pool.
    """


def reentered(operation: str) -> PoolError:
    """The error for *operation* called from inside a move (a finaliser interrupted one)."""
    return PoolError(
        f"{operation} was called from a finaliser or signal handler that interrupted this "
        "thread inside a pool, whose records may be half-way through a change; call "
        f"{operation} outside finalisers and signal handlers (releases are fine there: they "
        "are queued)"
    )
