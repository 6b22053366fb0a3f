"""The parking passes: asking parked buffers' events, and moving the done ones on.

Parked buffers wait in one queue in the order they parked.  A poll asks the front first
(copies on one stream complete in release order, so the oldest is the likeliest to be
done), then goes on from a cursor that moves past every buffer not yet done, wrapping
around: events may complete in any order, and a buffer whose event never completes (a
stuck copy, a stream that runs behind the others) costs its own memory and a question now
and then, and never holds up the buffers behind it.  Each poll asks a bounded number of
buffers, so what an acquire spends on parked buffers does not grow with how many there are;
`collect` and `synchronize` ask each parked buffer once.

Events are asked without the lock (``query()`` is user code); what a pass finds is applied
by the ledger's `Ledger.step_parked` move, which first checks that the buffer is still where
the pass saw it.  ``query()`` may raise anything: a poll for an unrelated acquire keeps the
buffer parked and says nothing (the error is not that caller's); `collect` and
`synchronize`, which ask about every parked buffer, raise the first error once they are
done.  A `KeyboardInterrupt` is taken to be a signal's, and is raised at once in the thread
it interrupted, the buffer still parked.
"""

from __future__ import annotations

import collections
import time
import typing
from collections.abc import Callable, Iterable, Sequence

from bucketpool import _verify
from bucketpool._buffer import Buffer
from bucketpool._errors import InFlightWriteError
from bucketpool._inbox import drain
from bucketpool._ledger import Ledger
from bucketpool._types import CompletionEvent

__all__ = ["POLL_BUDGET", "all_done", "poll", "record", "settle_parked", "sweep", "wait"]

#: Parked buffers an acquire asks before it allocates: enough to retire the buffers of the
#: steps that finished since the last look, and a bound on the cost whatever is parked.
POLL_BUDGET = 4
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


def poll(ledger: Ledger, budget: int = POLL_BUDGET) -> int:
    """Ask up to *budget* parked buffers; move the done ones on; return how many retired.

    The front first, then from the cursor on.  Errors from ``query()`` are swallowed.
    """
    queue = ledger.parked_queue
    retired = 0
    index = 0
    for _ in range(min(budget, len(queue))):  # no buffer asked twice in one poll
        moved, done = _ask(ledger, queue, index, all_done)[:2]  # its errors are not ours
        if moved is None:
            if index == 0:
                break
            index = 0  # past the end: wrap around
            continue
        if moved and done:
            retired += 1  # the next buffer slid into this place
        else:
            index = max(ledger.cursor, 1) if index == 0 else index + 1
    ledger.cursor = index  # a hint for the next poll: where it left off
    return retired


def settle_parked(
    ledger: Ledger, reported: set[object], finished: Callable[[Sequence[CompletionEvent]], bool]
) -> int:
    """`collect` and `synchronize`: ask every parked buffer, take the done ones back.

    Returns how many retired.  Raises, once every buffer was asked and every finished one
    taken back, the first error an event raised, else the first in-flight problem.
    """
    retired, error = sweep(ledger, finished)
    try:
        problems = drain(ledger, reported)
        if error is not None:
            raise error
    finally:
        error = None  # no cycle through this frame: its traceback holds the frame
    if problems:
        raise InFlightWriteError(problems[0])
    return retired


def sweep(
    ledger: Ledger, finished: Callable[[Sequence[CompletionEvent]], bool]
) -> tuple[int, BaseException | None]:
    """Ask *finished* about every parked buffer once, front to back; move the done ones on.

    Returns how many retired (into the inboxes, for the caller to drain) and the first error
    an event raised (its buffer stays parked).
    """
    queue = ledger.parked_queue
    retired = 0
    first_error: BaseException | None = None
    index = 0
    try:
        for _ in range(len(queue)):
            moved, done, error = _ask(ledger, queue, index, finished)
            if moved is None:
                break
            if error is not None and first_error is None:
                first_error = error
            if moved and done:
                retired += 1
            else:
                index += 1
        return retired, first_error
    finally:
        first_error = error = None  # no cycle through this frame (see `_ask`)


def _ask(
    ledger: Ledger,
    queue: typing.Any,
    index: int,
    finished: Callable[[Sequence[CompletionEvent]], bool],
) -> tuple[bool | None, bool, BaseException | None]:
    """Ask about the buffer at *index*; move it on if done.

    Returns whether it was still there (None past the end), whether done, and the error
    its events raised.
    """
    try:
        buffer = queue[index]  # read without the lock: `step_parked` checks it again
    except IndexError:
        return None, False, None
    events = buffer.events
    if not events or buffer.token >= 0:
        return False, False, None  # moved on by another thread since
    error = None
    try:
        done = finished(events)
    except KeyboardInterrupt:
        raise
    except BaseException as caught:  # user code: the error is the asker's, if anyone's
        done, error = False, caught
    try:
        return ledger.step_parked(buffer, index, done), done, error
    except IndexError:
        return False, done, error
    finally:
        # The error's traceback holds this frame and, through it, the callers' frames: a
        # local of any of them that held the error would keep them all (and what their
        # locals hold, a caller's buffers) alive until the collector runs.
        error = None


def record(buffer: Buffer, event: CompletionEvent, checking: bool) -> bool:
    """(the holder) Add *event* to the live hand-out's events; drop ones found done.

    Each record asks no more than two earlier events (amortised O(1): each event leaves
    once).  With *checking* (the debug levels), descriptors changed since the last record
    while an earlier event may still be running raise `InFlightWriteError`, the event
    recorded all the same; that costs asking the earlier events only when the descriptors
    did change.  Returns False, having recorded nothing, if the hand-out ended while an
    event's ``query()`` (user code) ran.
    """
    token = buffer.token
    # A held buffer's events are a deque (a parked buffer's, a list of those pending).
    events = typing.cast("collections.deque[CompletionEvent] | None", buffer.events)
    if events is None:
        events = collections.deque()
    else:
        for _ in range(min(2, len(events))):
            oldest = events[0]
            try:
                done = bool(oldest.query())  # its truth too: user code
            except KeyboardInterrupt:
                raise
            except BaseException:  # not this call's to report: kept, asked at release
                done = False
            # Only the event just asked moves, and only if it is still first (a query()
            # may have recorded or released): a done one leaves, a pending one goes last.
            if events and events[0] is oldest:
                if done:
                    events.popleft()
                else:
                    events.rotate(-1)
    in_flight = False
    if checking:
        current = _verify.checksum(buffer.arrays, buffer.span)
        earlier = buffer.checksum
        in_flight = earlier is not None and earlier != current and _any_pending(events)
    if buffer.token != token:
        return False
    if checking:
        buffer.checksum = current
    events.append(event)
    buffer.events = events
    if in_flight:
        raise InFlightWriteError(_verify.in_flight_problem(buffer))
    return True


def _any_pending(events: Iterable[CompletionEvent]) -> bool:
    """Whether an earlier event may still be running (one whose query raises may be)."""
    for event in events:
        try:
            if not event.query():
                return True
        except KeyboardInterrupt:
            raise
        except BaseException:  # not this call's to report: asked again at release
            return True
    return False
