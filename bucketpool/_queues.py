"""The parking records of a pool: which buffers wait for events, in which order.

A record is ``[buffer, events, tick]``: the buffer, its pending events, the ledger's tick
when it parked.  The ledger's moves make a record (`Ledger.settle`, `Ledger.give_back`)
and spend it (`Ledger.retire`, `Ledger.serve`), clearing the buffer and the events under
the lock, once: whoever holds a copy of a spent record -- a poll that asked its events,
say -- can move nothing with it, so a buffer is never retired on an answer about an
earlier parking.  The moves here only reorder and drop records; they follow the locking
rule of `bucketpool._lock` (no call, no loop).

New records join the *young* queue, in the order they park.  One still parked long after
moves to the *old* queue, asked in turn (see `bucketpool._parking`).  Both may hold spent
records: those at a front are dropped as they come to it, and `compact_old` drops the
rest of the old queue's at once.
"""

from __future__ import annotations

import collections
import typing
from typing import Final

from bucketpool._lock import LOCK

__all__ = ["DROPPED", "Parking", "Queues"]

#: One parking of a buffer: ``[buffer, events, tick]``; spent when the buffer is None.
Parking = list[typing.Any]
#: `Queues.young_front` and `Queues.old_front` dropped or moved a record: ask again.
DROPPED: Final = "dropped"


class Queues:
    """The young and old parking queues of one pool.  Guarded by the lock."""

    __slots__ = ("old", "old_changes", "young")

    def __init__(self) -> None:
        self.young: collections.deque[Parking] = collections.deque()
        self.old: collections.deque[Parking] = collections.deque()
        self.old_changes = 0  # moves that changed `old` (`compact_old` needs none since)

    def young_front(self, oldest: int) -> Parking | str | None:
        """The oldest recent record: None if there is none.

        A spent record at the front is dropped, and one parked at a tick before *oldest*
        moves to the old queue: then `DROPPED` (call again).
        """
        with LOCK:
            young = self.young
            if not young:
                return None
            record = young[0]
            if record[0] is not None and record[2] >= oldest:
                return record
            del young[0]
            if record[0] is not None:
                self.old += (record,)
                self.old_changes += 1
            return DROPPED

    def old_front(self) -> Parking | str | None:
        """Move the old queue's front record to its back and return it (None: empty).

        A spent record is dropped instead: then `DROPPED`.
        """
        with LOCK:
            old = self.old
            if not old:
                return None
            record = old[0]
            del old[0]
            self.old_changes += 1
            if record[0] is None:
                return DROPPED
            old += (record,)
            return record

    def parked_records(self) -> tuple[list[Parking], list[Parking], int]:
        """Copies of both parking queues, and `old_changes`, in one locked section."""
        with LOCK:
            return [*self.young], [*self.old], self.old_changes

    def compact_old(self, live: collections.deque[Parking], seen: int) -> bool:
        """Make *live* the old queue, if nothing changed it since it read *seen* changes.

        *live* is a copy of the old queue less spent records: dropping them all at once
        keeps the queue from growing with the records `collect` spent in its middle.
        """
        with LOCK:
            if self.old_changes != seen:
                return False
            self.old = live
            self.old_changes = seen + 1
            return True
