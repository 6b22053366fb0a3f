"""The parking passes: asking parked buffers' events, and retiring the done ones.

Copies on one stream complete in order, so an acquire asks the young queue's front first
and usually finds its buffer there, done, with one question.  A record still parked `AGE`
hand-outs after it parked (a stuck copy) moves to the old queue unasked, so however many
are stuck they never stand in front of the buffers that come back; old records are asked
in turn, a few at a time, when the young ones gave an acquire nothing, and by the idle
sweep.  `collect` and `synchronize` ask every record once, from a copy of both queues.

Events are asked without the lock (``query()`` is user code); what a pass finds is
applied by `Ledger.retire`, which spends the record, so an answer about a record spent
since moves nothing.  ``query()`` may raise anything: a poll for an unrelated acquire
keeps the buffer parked and says nothing; `collect` and `synchronize` raise the first
error once done.  `KeyboardInterrupt` and `SystemExit` (a signal handler's) are raised at
once in the thread they interrupted, the buffer still parked.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from bucketpool._buffer import Bucket
from bucketpool._ledger import DROPPED, Ledger, Parking
from bucketpool._views import CompletionEvent

__all__ = [
    "AGE",
    "POLL_BUDGET",
    "all_done",
    "poll",
    "poll_old",
    "sweep",
    "wait",
]

#: Parked buffers an acquire asks before it allocates: enough to retire the buffers of the
#: steps that finished since the last look, and a bound on the cost whatever is parked.
POLL_BUDGET = 4
#: Hand-outs after which a record still parked leaves the young queue for the old one:
#: far more than the few steps a copy takes, far fewer than a stuck copy waits.
AGE = 256
_POLL_SECONDS = 0.0005


def all_done(events: Sequence[CompletionEvent]) -> bool:
    """Return whether every event reports done (user code: never under the lock)."""
    return all(event.query() for event in events)


def wait(events: Sequence[CompletionEvent]) -> bool:
    """Block until every event is done: ``synchronize()`` where it exists, else polling."""
    for event in events:
        synchronize = getattr(event, "synchronize", None)
        if callable(synchronize):
            synchronize()
        while not event.query():
            time.sleep(_POLL_SECONDS)
    return True


def poll(
    ledger: Ledger, bucket: Bucket | None = None, budget: int = POLL_BUDGET, take: bool = False
) -> tuple[int, bool, Parking | None, int]:
    """Ask up to *budget* parked buffers; retire the done ones.

    Returns how many retired, whether one went to an inbox (to drain) rather than straight
    into the cache, and, with *take* (at ``"off"``), the record of a done buffer of
    *bucket* left for the caller to hand out (`Ledger.serve`) and its index.  Stops once a
    buffer of *bucket* retired or was found (any bucket's, when None).  The young queue
    first, from its front; the old queue, in turn, only if that retired none (and the idle
    sweep asks it too: `poll_old`).  Errors from ``query()`` are swallowed: they are not
    this caller's.
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
        events = found[1]  # read once: `retire` may clear it meanwhile; the list stays
        if events is None:  # spent by `collect`: dropped, and not asked
            ledger.retire(found, index)
            continue
        asked += 1
        try:
            done = all(event.query() for event in events) if len(events) > 1 else events[0].query()
        except (KeyboardInterrupt, SystemExit):  # a signal handler's: this thread's
            raise
        except BaseException:  # user code, and not this caller's error
            done = False
        if done and take:
            buffer = found[0]
            if buffer is not None and buffer.bucket is bucket:
                return retired, queued, found, index
        retiring = ledger.retire(found, index) if done else None
        if retiring is None:
            index += 1
            continue
        retired += 1  # and the record left the queue: the next one is at *index*
        queued = queued or bool(retiring.inbox)
        if bucket is None or retiring is bucket:
            break
    if retired:
        return retired, queued, None, 0
    return poll_old(ledger, budget - asked)


def poll_old(ledger: Ledger, turns: int) -> tuple[int, bool, None, int]:
    """Ask up to *turns* old records, in turn; stop at the first that retires (as `poll`)."""
    for _ in range(turns):
        turn = ledger.old_front()
        if turn is None:
            break
        if isinstance(turn, str) or not _ask(turn, all_done)[0]:  # DROPPED, or not done
            continue
        retiring = ledger.retire(turn)
        if retiring is not None:
            return 1, bool(retiring.inbox), None, 0
    return 0, False, None, 0


def sweep(
    ledger: Ledger, finished: Callable[[Sequence[CompletionEvent]], bool]
) -> tuple[int, BaseException | None]:
    """Ask *finished* once about every buffer parked when called; retire the done ones.

    Returns how many retired (into the inboxes, for the caller to drain) and the first error
    an event raised (its buffer stays parked).  Each record costs the same however many
    are parked: the queues are copied once, and the old one is rebuilt without the records
    spent in its middle.
    """
    young, old, seen = ledger.parked_records()
    retired = 0
    first_error: BaseException | None = None
    try:
        for found in (*young, *old):
            done, error = _ask(found, finished)
            if error is not None and first_error is None:
                first_error = error
            if done and ledger.retire(found) is not None:
                retired += 1
        if old:
            ledger.compact_old(collections.deque([r for r in old if r[0] is not None]), seen)
        return retired, first_error
    finally:
        first_error = error = None  # no cycle through this frame (see `_ask`)


def _ask(
    found: Parking, finished: Callable[[Sequence[CompletionEvent]], bool]
) -> tuple[bool, BaseException | None]:
    """Ask *finished* about the events of the record *found*: whether done, and the error.

    A spent record is not asked (not done).
    """
    events = found[1]  # read once: `retire` may clear it meanwhile; the list stays as is
    if events is None:
        return False, None
    try:
        return bool(finished(events)), None
    except (KeyboardInterrupt, SystemExit):  # a signal handler's: this thread's
        raise
    except BaseException as caught:  # user code: the error is the asker's, if anyone's
        return False, caught
