"""Parked buffers: released while a recorded copy may still read them.

A parked buffer waits in one FIFO, in release order: copies on one stream complete in
order, so the head is the first to finish and polling can stop at the first buffer that is
not done.  That bounds what an acquire spends on parked buffers, however many there are.
`collect` and `synchronize` look at every parked buffer instead, since copies on different
streams finish in any order.

This module keeps the FIFO; the pool keeps the lock and moves buffers in and out of it.
Methods marked "(lock held)" run under the pool's lock and call no user code; `all_done` and
`wait` call ``query()`` and ``synchronize()``, and are only called without it.
"""

from __future__ import annotations

import collections
import time
import typing
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bucketpool._buffer import Buffer
    from bucketpool._handle import CompletionEvent

__all__ = ["Entry", "ParkingLot", "all_done", "wait"]

_POLL_SECONDS = 0.0005

#: One parking: the buffer and the events it waits for.  The events list is the parking's
#: identity: a buffer parked again later waits on another list.
Entry = tuple["Buffer", list["CompletionEvent"]]


@typing.final
class ParkingLot:
    """The parked buffers of one pool, oldest first."""

    __slots__ = ("count", "queue")

    def __init__(self) -> None:
        #: Parkings in release order; the pool's moves append and end them (an ended one,
        #: whose buffer is no longer parked on that events list, stays until `prune`).
        self.queue: collections.deque[Entry] = collections.deque()
        self.count = 0  # parkings in effect

    def prune(self) -> None:
        """(lock held) Drop ended parkings from the head of the queue."""
        queue = self.queue
        while queue and not _live(queue[0]):
            queue.popleft()

    def compact(self) -> None:
        """(lock held) Drop every ended parking from the queue (after `collect`)."""
        self.queue = collections.deque(entry for entry in self.queue if _live(entry))

    def heads(self, limit: int) -> list[Entry]:
        """(lock held) The oldest *limit* parkings still in effect."""
        heads: list[Entry] = []
        for entry in self.queue:
            if len(heads) == limit:
                break
            if _live(entry):
                heads.append(entry)
        return heads

    def __iter__(self) -> Iterator[Entry]:
        """(lock held) Every parking still in effect, oldest first."""
        return (entry for entry in list(self.queue) if _live(entry))


def _live(entry: Entry) -> bool:
    return entry[0].parked and entry[0].events is entry[1]


def all_done(events: Sequence[CompletionEvent]) -> bool:
    """Return whether every event reports done (user code: never under the lock)."""
    return all(event.query() for event in events)


def wait(events: Sequence[CompletionEvent]) -> None:
    """Block until every event is done: ``synchronize()`` where it exists, else polling."""
    for event in events:
        synchronize = getattr(event, "synchronize", None)
        if callable(synchronize):
            synchronize()
        while not event.query():
            time.sleep(_POLL_SECONDS)
