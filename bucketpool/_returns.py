"""What comes back: the inboxes taken back, leaks reported, and what the caps free.

Everything here runs outside the lock, one `Ledger` move at a time (docs/design.md).  A leak
is warned about once per acquire site, at that site's file and line.
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
    """Take back every entry of *ledger*'s inboxes (or *only*'s); return the problems found."""
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
    raised: bool = False,
) -> bool | None:
    """Take back *entry* (else *bucket*'s oldest queued), adding a problem to *problems*.

    False: its hand-out was over already; None: an event was recorded since *seen*.
    *raised*: its events' error reached the releaser (`Ledger.report`).
    """
    buffer, outcome, leak, problem = ledger.settle(bucket, False, entry, seen, raised)
    if outcome == "recorded":
        return None
    if outcome == "crowded" and buffer is not None:
        # Room first, in other buckets: the cache never shows more than the cap.  trim_to's
        # limit counts cached buffers and their views: the rest of the cap is for the parked
        # ones, theirs, and this buffer with its views (a parked one's are counted already).
        try:
            queued = entry if entry is not None else bucket.inbox[0]  # (a hint: settle decides)
        except IndexError:
            queued = None
        own = bucket.nbytes + queued[3] if queued is not None and queued[1] > 0 else 0
        room = ledger.max_cached_bytes - ledger.parked_bytes - ledger.parked_views - own
        kept = sum(bucket.nbytes + cached.view_bytes for cached in bucket.free)  # (hints)
        if kept <= room:  # else room elsewhere would not fit it: it is freed, nothing more
            trim_to(ledger, room, keep=bucket)
        buffer, outcome, leak, problem = ledger.settle(bucket, True, entry, seen, raised)
        if outcome == "recorded":
            return None
    if buffer is None:
        return False
    if buffer.ended:
        _debug.end_arrays(buffer)
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

    A filter that makes it an error must not raise it in the wrong place (a finaliser, another
    caller's operation), nor hide it: the error goes to ``sys.unraisablehook``.
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
    """Made and dropped at once: its finaliser hands *error* to ``sys.unraisablehook``."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __del__(self) -> None:
        raise self.error


def trim_to(ledger: Ledger, limit: int | None, keep: Bucket | None = None) -> int:
    """Free LRU cached buffers, not *keep*'s, to *limit* (None: the cap); return bytes freed."""
    freed = 0
    for bucket in sorted(ledger.buckets, key=lambda b: b.last_tick):
        if bucket is keep or not bucket.free:  # a hint, read without the lock: uncache checks
            continue
        while (buffer := ledger.uncache(bucket, limit)) is not None:
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
            while (buffer := ledger.uncache(bucket, -1)) is not None:  # -1: whatever is idle
                buffer.scrap()


def check_reserve(ledger: Ledger, bucket: Bucket, size: int, number: int) -> None:
    """Raise ValueError if the caps would not keep *number* more buffers of *bucket*."""
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
