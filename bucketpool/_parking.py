"""The parking passes: asking parked buffers' events, and retiring the done ones.

The queues' order is in docs/design.md ("Parking order").  Events are asked without the lock
(``query()`` is user code); `Ledger.retire` applies the answer, once.  An error from
``query()`` keeps the buffer parked: a poll swallows it, `sweep` returns the first one of a
parking whose errors reached no caller yet (`Ledger.report`: each parking's, once).
`KeyboardInterrupt` and `SystemExit` (a signal handler's) are raised at once.

A pool dropped while buffers are parked hands its ledger to `ORPHANS` (`adopt`): those
buffers' memory lives on until their events report done, since a copy may still read it.
Later pool calls ask them (`reap`): a new pool all, others a few; nothing else reaches it.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import time
from collections.abc import Callable, Sequence

from bucketpool import _debug
from bucketpool._buffer import Bucket, Buffer
from bucketpool._ledger import DROPPED, Ledger, Parking
from bucketpool._views import CompletionEvent

__all__ = [
    *("AGE", "ORPHANS", "POLL_BUDGET", "adopt", "all_done", "orphaned_buffers", "poll"),
    *("poll_old", "reap", "sweep", "wait"),
]

#: Parked buffers an acquire asks before it allocates: a bound whatever is parked.
POLL_BUDGET = 4
#: Hand-outs after which a record still parked moves to the old queue (a stuck copy).
AGE = 256
_POLL_SECONDS = 0.0005
#: The ledgers of dropped pools whose buffers wait parked (`adopt`): appended without a lock.
ORPHANS: collections.deque[Ledger] = collections.deque()


def all_done(events: Sequence[CompletionEvent]) -> bool:
    """Return whether every event reports done."""
    return all(event.query() for event in events)


def wait(events: Sequence[CompletionEvent], deadline: float | None = None) -> bool:
    """Block until every event is done: ``synchronize()`` where it exists, else polling.

    With a *deadline* (`time.monotonic`) only ``query()`` is polled; False once it passes.
    """
    for event in events:
        synchronize = getattr(event, "synchronize", None)
        if deadline is None and callable(synchronize):
            synchronize()
        while not event.query():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_SECONDS)
    return True


def poll(
    ledger: Ledger, bucket: Bucket | None = None, budget: int = POLL_BUDGET, take: bool = False
) -> tuple[int, bool, Parking | None, int]:
    """Ask up to *budget* parked buffers, young ones first; retire the done ones.

    Returns how many retired, whether one went to an inbox, and, with *take*, a done record
    of *bucket* for the caller to hand out, and its index.  Stops at *bucket*'s (any, if None).
    """
    young = ledger.young
    try:
        front = young[0]  # a hint: `young_front` decides
    except IndexError:
        pass
    else:
        if front[0] is None or ledger.tick - front[2] > AGE:
            oldest = ledger.tick - AGE
            while ledger.young_front(oldest) is DROPPED:  # drops or moves one a turn
                pass
    retired = 0
    queued = False
    index = 0
    asked = 0
    while asked < budget:
        try:
            found = young[index]  # a hint, read without the lock: `retire` decides
        except IndexError:
            break
        events = found[1]  # read once: `retire` may clear it meanwhile
        if events is None:  # spent by `collect`: dropped, not asked
            ledger.retire(found, index)
            continue
        asked += 1
        try:
            done = all(event.query() for event in events) if len(events) > 1 else events[0].query()
        except (KeyboardInterrupt, SystemExit):  # a signal handler's: this thread's
            raise
        except BaseException as error:  # user code, and not this caller's error
            _dropped(error)
            done = False
        if done and take:
            buffer = found[0]
            if buffer is not None and buffer.bucket is bucket:
                return retired, queued, found, index
        retiring = ledger.retire(found, index) if done else None
        if retiring is None:
            index += 1
            continue
        retired += 1  # the record left the queue: the next one is at *index*
        queued = queued or bool(retiring.inbox)
        if bucket is None or retiring is bucket:
            break
    if retired:
        return retired, queued, None, 0
    return poll_old(ledger, budget - asked)


def poll_old(ledger: Ledger, turns: int) -> tuple[int, bool, None, int]:
    """Take *turns* old records in turn, asking the due ones; stop at the first that retires."""
    for _ in range(turns):
        turn = ledger.old_front()
        if turn is None:
            break
        if isinstance(turn, str) or not _ask(turn, all_done)[0]:  # not asked, or not done
            continue
        retiring = ledger.retire(turn)
        if retiring is not None:
            return 1, bool(retiring.inbox), None, 0
    return 0, False, None, 0


def sweep(
    ledger: Ledger, finished: Callable[[Sequence[CompletionEvent]], bool], report: bool = True
) -> tuple[int, BaseException | None]:
    """Ask *finished* once about each parked buffer; return how many retired, and an error.

    The error (if *report*): the first of a parking whose events' errors reached no caller
    yet; now one has.
    """
    young, old, seen = ledger.parked_records()
    retired = 0
    first: tuple[Parking, Buffer, BaseException] | None = None
    try:
        for found in (*young, *old):
            buffer = found[0]  # read first: `retire` may spend it meanwhile
            done, error = _ask(found, finished, report and first is None and not found[3])
            if error is not None:  # the first of a parking none reached (`report` decides)
                first = (found, buffer, error)
            if done and ledger.retire(found) is not None:
                retired += 1
        young, old, seen = ledger.parked_records()  # spent ones dropped: a poll walks none
        ledger.compact(
            [r for r in young if r[0] is not None], [r for r in old if r[0] is not None], seen
        )
        if first is None or not ledger.report(first[0]):
            return retired, None
        if sys.version_info >= (3, 11):  # (3.10 has no notes)
            first[2].add_note(_raised_by(first[1]))
        return retired, first[2]
    finally:
        first = error = None  # no cycle through this frame (see `_ask`)


def _raised_by(buffer: Buffer) -> str:
    lasti = buffer.lasti if buffer.lasti >= 0 else ~buffer.lasti  # (~: an adapter's hand-out)
    line = _debug.line_of(buffer.site) or _debug.code_line(buffer.code, lasti)  # type: ignore[arg-type]
    at = "" if line is None else f", acquired at {line[0]}:{line[1]}"
    return (
        f"bucketpool: raised by query() of an event of a parked buffer (capacity "
        f"{buffer.bucket.capacity}, n={buffer.n}{at}); it stays parked, out of reuse, until its "
        "events report done, and neither collect() nor synchronize() raises this error again"
    )


def _ask(
    found: Parking, finished: Callable[[Sequence[CompletionEvent]], bool], keep: bool = False
) -> tuple[bool, BaseException | None]:
    """Whether *finished* says *found*'s events are done (a spent record's: no); its error.

    The error only if *keep*: else it is dropped, with its traceback (`_dropped`).
    """
    events = found[1]  # read once: `retire` may clear it meanwhile
    if events is None:
        return False, None
    try:
        return bool(finished(events)), None
    except (KeyboardInterrupt, SystemExit):  # a signal handler's: this thread's
        raise
    except BaseException as caught:  # user code: the error is the asker's, if anyone's
        if keep:
            return False, caught
        _dropped(caught)
        return False, None


def _dropped(error: BaseException) -> None:
    """Forget the traceback of *error*, an error no one is told of.

    An event that keeps the error it raised (to raise it again) would keep the frames of
    whoever asked, and all they hold: a reap's, another pool's call.
    """
    error.__traceback__ = None


def adopt(ledger: Ledger) -> bool:
    """(a dropped pool's finaliser) Keep *ledger* while buffers are parked or held; free the rest.

    Returns whether it was kept.  Nothing else reaches a dropped pool's ledger, so it is
    changed here without the lock: its cached buffers go, what retires is freed (caps below
    zero), and its young records join the old queue (its tick moves no more).
    """
    queued = [entry for bucket in ledger.buckets for entry in bucket.inbox if entry[1] > 0]
    events = [entry[0].events if isinstance(entry[2], str) else entry[2] for entry in queued]
    held = ledger.active - len(queued)  # (a holder dying with its pool may park: kept)
    if not (ledger.parked_bytes or held or [each for each in events if each]):
        return False
    ledger.max_cached_bytes = ledger.max_cached_per_bucket = -1
    ledger.old.extend(ledger.young)  # (here: a later call's few turns never pay for it)
    ledger.young.clear()
    ledger.registry = {key: buffer for key, buffer in ledger.registry.items() if buffer.token}
    ORPHANS.append(ledger)
    return True


def reap(every: bool = False) -> list[Ledger]:
    """Ask dropped pools' parked buffers; return the ledgers asked, what retired in their inboxes.

    A few of one dropped pool, the next in turn; with *every*, each of every one, once.  A
    ledger with nothing parked, held or queued left is let go.
    """
    asked = []
    for _ in range(len(ORPHANS) if every else 1):
        try:
            ledger = ORPHANS[0]
        except IndexError:  # another thread let the last one go
            break
        ORPHANS.rotate(-1)
        if not (ledger.parked_bytes or ledger.active or [b for b in ledger.buckets if b.inbox]):
            with contextlib.suppress(ValueError):  # another thread let it go
                ORPHANS.remove(ledger)
            continue
        if every:
            sweep(ledger, all_done, report=False)
        else:
            poll(ledger)
        asked.append(ledger)
    return asked


def orphaned_buffers() -> int:
    """Return how many buffers of dropped pools wait for their events, kept (process-wide).

    A pool dropped while buffers are parked keeps their memory until their events report
    done (a copy may still read it), asked by later calls of any pool: a new pool asks each
    once, an acquire's idle sweep, `collect` and `synchronize` a few.  An event that never
    completes, or whose ``query()`` keeps raising, keeps its buffer until the process exits:
    counted here.  Thread-safe.
    """
    while True:
        try:
            ledgers = [*ORPHANS]
        except RuntimeError:  # another thread changed it as it was copied: again
            continue
        return sum(sum(ledger.snapshot()[4]) for ledger in ledgers)
