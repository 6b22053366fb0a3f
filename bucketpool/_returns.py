"""What comes back: the inbox taken back, leaks reported, and what the caps free.

Releases from finalisers and signal handlers, and dropped holders, append to their
bucket's inbox without the lock; `drain` takes each entry back with the ledger's `settle`
move and applies the caps outside the lock.  A dropped holder is reported with a
`LeakWarning`, once per acquire site, at that site's file and line (as
`warnings.warn_explicit` does), so an IDE, ``-W error`` or pytest points at the code that
acquired.  The trims choose and loop here, outside the lock, freeing one buffer per
`Ledger.uncache` move, so a trim of many buffers never holds the lock for long.
"""

from __future__ import annotations

import contextlib
import warnings

from bucketpool import _debug
from bucketpool._buffer import Bucket
from bucketpool._errors import LeakWarning
from bucketpool._ledger import Entry, Leak, Ledger

__all__ = ["check_reserve", "drain", "sweep_idle", "take_back", "trim_to", "warn"]


def drain(ledger: Ledger, reported: set[object], only: Bucket | None = None) -> list[str]:
    """Take back every entry of *ledger*'s inboxes; return the in-flight problems found.

    Only bucket *only*'s inbox, if given.  Leaks are warned about here, once per site in
    *reported* (the pool's set of sites).
    """
    problems: list[str] = []
    for bucket in ledger.buckets if only is None else (only,):
        while bucket.inbox:
            take_back(ledger, bucket, reported, problems)
    return problems


def take_back(
    ledger: Ledger,
    bucket: Bucket,
    reported: set[object],
    problems: list[str],
    entry: Entry | None = None,
    seen: int = -1,
) -> bool | None:
    """Take back *entry* (else the oldest of *bucket*'s inbox): park, cache or free it.

    Appends the in-flight problem found, if any, to *problems*.  Returns False, having
    moved nothing, if *entry*'s hand-out was over already; None if an event was recorded
    since its releaser read them (*seen*: see `Ledger.give_back`).
    """
    buffer, outcome, leak, problem = ledger.settle(bucket, entry=entry, seen=seen)
    if outcome == "recorded":
        return None
    if outcome == "crowded" and buffer is not None:
        # Room first, in other buckets, least recently used first: the cache never shows
        # more than the cap, not even for a moment.
        room = ledger.max_cached_bytes - ledger.parked_bytes - bucket.nbytes
        trim_to(ledger, room, keep=bucket)
        buffer, outcome, leak, problem = ledger.settle(bucket, force=True, entry=entry, seen=seen)
        if outcome == "recorded":
            return None
    if buffer is None:
        return False
    if outcome == "freed":
        buffer.scrap()
    if leak is not None:
        _report_leak(leak, reported)
    if problem is not None:
        problems.append(problem)
    return True


def _report_leak(leak: Leak, reported: set[object]) -> None:
    n, code, lasti, where = leak
    adapted = lasti < 0  # a compat adapter's hand-out: its advice differs
    lasti = ~lasti if adapted else lasti
    line = _debug.line_of(where) or _debug.code_line(code, lasti)  # type: ignore[arg-type]
    key: object = line or n
    if key in reported:
        return
    reported.add(key)
    at = _debug.format_site(where if where is not None else line)  # type: ignore[arg-type]
    advice = (
        "Call pool.release(bufs) on every triple acquire() returned"
        if adapted
        else "Use 'with pool.acquire(n) as bufs:' or call handle.release()"
    )
    warn(
        f"a bucketpool buffer of n={n} was never released; acquired at {at}. {advice}; the "
        "buffer went back to the pool (reported once per acquire site)",
        LeakWarning,
        line,
    )


def warn(message: str, category: type[Warning], line: tuple[str, int] | None = None) -> None:
    """Warn, at *line* (a user's file and line) when known; never raise from here.

    Warnings here report what some earlier code did (a leak, a stale write) and may run in
    a finaliser or in another caller's operation.  A filter that turns the warning into an
    error (``-W error``, ``simplefilter("error", LeakWarning)``) must not raise it in the
    wrong place, nor hide it: the error goes to ``sys.unraisablehook``, as an exception
    raised in a finaliser does (printed as "Exception ignored", and reported by pytest).
    """
    try:
        if line is None:
            warnings.warn(message, category, stacklevel=3)
        else:
            warnings.warn_explicit(message, category, line[0], line[1], module="bucketpool")
    except Exception as error:
        with contextlib.suppress(Exception):
            _Unraisable(error)


class _Unraisable:
    """Hand *error* to ``sys.unraisablehook``.

    Made and dropped at once: its finaliser raises the error, and the interpreter reports an
    exception raised in a finaliser there.
    """

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __del__(self) -> None:
        raise self.error


def trim_to(ledger: Ledger, limit: int | None, keep: Bucket | None = None) -> int:
    """Free cached buffers, least recently used bucket first; return the bytes freed.

    Until at most *limit* bytes stay cached (None: until the cache fits the byte cap);
    never *keep*'s.
    """
    freed = 0
    for bucket in sorted(ledger.buckets, key=_last_use):
        if bucket is keep or not bucket.free:  # a hint, read without the lock: uncache checks
            continue
        while (buffer := ledger.uncache(bucket, False, limit)) is not None:
            freed += bucket.nbytes
            buffer.scrap()
    return freed


def sweep_idle(ledger: Ledger, idle: int) -> None:
    """Free every cached buffer of the buckets unused for *idle* acquires or more (0: none)."""
    if not idle:
        return
    tick = ledger.tick
    for bucket in ledger.buckets:
        if bucket.free and tick - bucket.last_tick >= idle:
            while (buffer := ledger.uncache(bucket, False, -1)) is not None:
                buffer.scrap()


def _last_use(bucket: Bucket) -> int:
    return bucket.last_tick


def check_reserve(ledger: Ledger, bucket: Bucket, size: int, number: int) -> None:
    """Refuse to reserve *number* buffers of *bucket* (for *size*) that the caps would not keep.

    Raises:
        ValueError: they would take the bucket over ``max_cached_per_bucket`` or the idle
            bytes (cached and parked) over ``max_cached_bytes``; nothing was allocated.
    """
    cached = ledger.cached[bucket.index] + number
    idle_bytes = ledger.allocated_bytes - ledger.active_bytes + number * bucket.nbytes
    idle_bytes += ledger.view_bytes
    per_bucket, max_bytes = ledger.max_cached_per_bucket, ledger.max_cached_bytes
    if number and (cached > per_bucket or idle_bytes > max_bytes):
        raise ValueError(
            f"reserve({size}, count={number}) would cache {cached} buffers ({idle_bytes:,} "
            f"bytes) but max_cached_per_bucket={per_bucket} and max_cached_bytes="
            f"{max_bytes:,}; reserve fewer or raise the caps"
        )
