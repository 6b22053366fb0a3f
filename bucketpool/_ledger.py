"""The ledger: where every buffer of a pool is, the counters, and the moves between places.

A buffer is, at every moment, in exactly one place, and its ``token`` says which: cached
(0, in its bucket's free list), held (> 0, the hand-out's; its handle carries the same
token), parked (minus the hand-out's, with a record in the parking queues until its events
are done), returning (in its bucket's inbox, to be taken back by `settle`), or freed.
Every change of place is a *move*: one method below, one locked section of straight-line
code that calls nothing (docs/design.md, "The locking rule").  A token is never used
twice, so a mismatch is final: a stale, copied or forged holder moves nothing.

Parking records are ``[buffer, events, tick]``, spent (buffer None) by the move that
retires or hands out the buffer, once: whoever holds a copy of a spent record can move
nothing with it.  New records join the *young* queue; one still parked long after moves
to the *old* queue (`bucketpool._parking`).  Counters that `stats()` can derive are not
kept; peaks are exact.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Final

from bucketpool._buffer import Bucket, Buffer
from bucketpool._lock import LOCK
from bucketpool._views import CompletionEvent

__all__ = ["AS_RECORDED", "CACHE", "DROPPED", "EMPTY", "LEAK", "SETTLE", "SWEEP", "Entry", "Ledger"]

# What `serve` says: it could not serve, as the bucket's inbox has something to settle
# first, or it has nothing cached; it served, and the idle sweep is due.  CACHE: the
# holder of a buffer to cache (`reserve`).
SETTLE: Final = 1
EMPTY: Final = 2
SWEEP: Final = 4
CACHE: Final = "cache"
#: What a dropped holder's finaliser queues in place of pending events.
LEAK: Final = "leak"
#: What a release queued from inside a move parks on: every event recorded by then.
AS_RECORDED: Final = "as recorded"
#: `Ledger.young_front` and `Ledger.old_front` dropped or moved a record: ask again.
DROPPED: Final = "dropped"
#: An inbox entry: the buffer, the hand-out's token (minus it for a parked buffer whose
#: events are done), the events still pending (or None, `LEAK`, `AS_RECORDED`), and the
#: bytes of the views it keeps (`Buffer.views_cost`).
Entry = tuple[Buffer, int, "list[Any] | str | None", int]
#: One parking of a buffer: ``[buffer, events, tick]``; spent when the buffer is None.
Parking = list[Any]
#: A leak, as `settle` saw it: the hand-out's n, the acquire's code and instruction (its
#: complement when a compat adapter handed it out), the site.
Leak = tuple[int, object, int, object]
#: What `settle` did: the buffer, the outcome, the leak, the in-flight problem.
Settled = tuple["Buffer | None", str, "Leak | None", "str | None"]
_NOTHING: Final = (None, "nothing", None, None)
#: The ledger's totals, in the order `Ledger.snapshot` copies them.
TOTALS = (
    *("active", "active_peak", "active_bytes", "active_bytes_peak"),
    *("allocations", "allocations_peak", "allocated_bytes", "allocated_bytes_peak"),
    *("allocations_total", "allocated_bytes_total", "parked_bytes", "requested", "leaks"),
    *("tick", "view_bytes"),
)


class Ledger:
    """The records of one pool's buffers.  Every field is guarded by the lock."""

    # A plain __slots__ class: attrs' hooks would cost time on every move.
    __slots__ = (
        *TOTALS,  # the counters, then the records and the settings
        *("allocated", "buckets", "cached", "max_cached_bytes", "misses", "old", "old_changes"),
        *("max_cached_per_bucket", "next_sweep", "parked", "plain"),
        *("__weakref__", "registry", "sweep_every", "takes", "verify", "young"),
    )

    def __init__(
        self,
        max_capacity: int,
        max_cached_bytes: int,
        max_cached_per_bucket: int,
        sweep_every: int,
        verify: Callable[[Buffer, int, bool], str | None] | None,
    ) -> None:
        count = max_capacity.bit_length()
        self.buckets = [Bucket(k) for k in range(count)]
        self.registry: dict[Buffer, None] = {}  # every buffer not freed (outstanding())
        self.young: collections.deque[Parking] = collections.deque()  # parking order
        self.old: collections.deque[Parking] = collections.deque()  # asked in turn
        self.old_changes = 0  # moves that changed `old` (`compact_old` needs none since)
        self.max_cached_bytes = max_cached_bytes
        self.max_cached_per_bucket = max_cached_per_bucket
        self.sweep_every = sweep_every
        self.next_sweep = sweep_every
        #: The debug levels' check of a buffer taken back (run inside `settle`), or None.
        self.verify = verify
        self.plain = verify is None
        # Per bucket, indexed like `buckets`, so that a snapshot is a few slices.
        self.takes, self.misses, self.allocated, self.cached, self.parked = (
            [0] * count for _ in range(5)
        )
        self.tick = 0  # hand-outs so far: the last token given
        self.active = self.active_peak = self.active_bytes = self.active_bytes_peak = 0
        self.allocations = self.allocations_peak = 0
        self.allocated_bytes = self.allocated_bytes_peak = 0
        self.allocations_total = self.allocated_bytes_total = 0  # freed: these less current
        self.parked_bytes = self.requested = self.leaks = 0
        self.view_bytes = 0  # of the view sets idle buffers keep (each its `view_bytes`)

    def serve(
        self,
        bucket: Bucket,
        n: int,
        holder: object,
        code: object,
        lasti: int,
        fresh: Buffer | None = None,
        parked: Parking | None = None,
        index: int = 0,
    ) -> object:
        """Hand a buffer of *bucket* to *holder* (a `BufferHandle`): bind it, with its token.

        The record *parked*'s (events done, at *index* of the young queue), else *fresh*
        (cached if *holder* is `CACHE`), else the newest cached.  Returns the holder,
        `SWEEP`, or, having moved nothing, `SETTLE` or `EMPTY`.
        """
        k = bucket.index
        with LOCK:
            if parked is not None:
                buffer = parked[0]
                if buffer is None or buffer.bucket is not bucket or not self.plain:
                    return EMPTY  # spent by another thread since (or not ours to take)
                parked[0] = parked[1] = None
                try:
                    if self.young[index] is parked:
                        del self.young[index]
                except IndexError:  # the queue moved on meanwhile: dropped at the front
                    pass
                self.parked[k] -= 1
                self.parked_bytes -= bucket.nbytes
                self.view_bytes -= buffer.view_bytes
                buffer.events = None
            elif fresh is not None:
                buffer = fresh
                nbytes = bucket.nbytes
                if holder is CACHE and (
                    self.cached[k] >= self.max_cached_per_bucket
                    or self.allocated_bytes - self.active_bytes + nbytes + self.view_bytes
                    > self.max_cached_bytes
                ):
                    return EMPTY  # a reservation the caps no longer keep (threads raced)
                self.registry[buffer] = None
                self.allocated[k] += 1
                self.allocations = allocations = self.allocations + 1
                if allocations > self.allocations_peak:
                    self.allocations_peak = allocations
                self.allocated_bytes = allocated = self.allocated_bytes + nbytes
                if allocated > self.allocated_bytes_peak:
                    self.allocated_bytes_peak = allocated
                self.allocations_total += 1
                self.allocated_bytes_total += nbytes
                if holder is CACHE:
                    bucket.last_tick = self.tick  # just used: idle trimming leaves it be
                    bucket.free += (buffer,)
                    self.cached[k] += 1
                    return CACHE
                self.misses[k] += 1
            elif bucket.inbox:
                return SETTLE  # what waits there first: it may be this bucket's only buffer
            else:
                free = bucket.free
                if not free:
                    return EMPTY
                buffer = free[-1]
                del free[-1]
                self.cached[k] -= 1
                self.view_bytes -= buffer.view_bytes
            self.active = active = self.active + 1
            if active > self.active_peak:
                self.active_peak = active
            self.active_bytes = live = self.active_bytes + bucket.nbytes
            if live > self.active_bytes_peak:
                self.active_bytes_peak = live
            self.tick = token = self.tick + 1
            bucket.last_tick = token
            self.takes[k] += 1
            self.requested += n
            buffer.token = token
            buffer.n = n
            buffer.code = code
            buffer.lasti = lasti
            holder._buffer = buffer  # type: ignore[attr-defined]
            holder._token = token  # type: ignore[attr-defined]
            if token >= self.next_sweep:
                self.next_sweep = token + self.sweep_every
                return SWEEP
            return holder

    def give_back(
        self,
        buffer: Buffer,
        token: int,
        pending: list[CompletionEvent] | None,
        cost: int,
        seen: int,
    ) -> bool | None:
        """Held -> cached, or parked on *pending*: a release at ``"off"`` the caps keep.

        None (nothing moved) if an event was recorded since the releaser saw *seen*
        (`Buffer.recorded`); False where `settle` has more to do.
        """
        bucket = buffer.bucket
        k = bucket.index
        with LOCK:
            if buffer.recorded != seen and buffer.token == token:
                return None
            nbytes = bucket.nbytes
            active_bytes = self.active_bytes - nbytes
            if (
                buffer.token != token
                or not self.plain
                or self.cached[k] >= self.max_cached_per_bucket
                or self.allocated_bytes - active_bytes + self.view_bytes + cost
                > self.max_cached_bytes
            ):
                return False
            self.active -= 1
            self.active_bytes = active_bytes
            buffer.view_bytes = cost  # its views' bytes (*cost*), counted while it is idle
            self.view_bytes += cost
            if pending:
                buffer.token = -token
                buffer.events = pending
                self.young += ([buffer, pending, self.tick],)
                self.parked[k] += 1
                self.parked_bytes += nbytes
            else:
                buffer.token = 0
                buffer.events = None
                bucket.free += (buffer,)
                self.cached[k] += 1
            return True

    def settle(
        self, bucket: Bucket, force: bool = False, entry: Entry | None = None, seen: int = -1
    ) -> Settled:
        """Take back *entry*, else the oldest of *bucket*'s inbox: park, cache or free it.

        Parked if events are pending, else cached if the caps keep it, else freed; the
        debug levels' `verify` runs first.  Returns the buffer, the outcome, the leak, the
        problem.  Nothing moves on ``"crowded"`` (the caller makes room, then *force*) or
        ``"recorded"`` (as `give_back`'s None, for *seen* other than -1).
        """
        k = bucket.index
        with LOCK:
            inbox = bucket.inbox
            if entry is None:
                if not inbox:
                    return _NOTHING
                queued = inbox[0]
            else:
                queued = entry
            buffer, token, state, cost = queued
            if buffer.token != token:
                if entry is None:
                    del inbox[0]
                return _NOTHING
            if seen != -1 and buffer.recorded != seen:
                return (None, "recorded", None, None)
            leaked = state is LEAK
            events = (
                None if token < 0 else buffer.events if leaked or state is AS_RECORDED else state
            )
            nbytes = bucket.nbytes
            parked = self.parked_bytes - nbytes if token < 0 else self.parked_bytes
            # The view sets of every idle buffer, this one's included (a parked one's are).
            views = self.view_bytes + cost if token > 0 else self.view_bytes
            cached = self.cached[k]
            keep = (
                not events
                and cached < self.max_cached_per_bucket
                and parked + (cached + 1) * nbytes + views <= self.max_cached_bytes
            )
            if keep and (
                self.allocated_bytes - self.active_bytes - self.parked_bytes + nbytes + parked
                > self.max_cached_bytes - views
            ):
                if not force:
                    return (buffer, "crowded", None, None)
                keep = False
            problem = None
            if self.verify is not None:
                problem = self.verify(buffer, token, not events)
            if entry is None:
                del inbox[0]
            leak = None
            if token > 0:  # a hand-out ends (a dropped holder's views, too)
                self.active -= 1
                self.active_bytes -= nbytes
                if leaked:
                    self.leaks += 1
                    leak = (buffer.n, buffer.code, buffer.lasti, buffer.site)
            else:  # a parked buffer retires: its events are done
                self.parked[k] -= 1
                self.parked_bytes = parked
            if events:
                buffer.token = -token
                buffer.events = events  # type: ignore[assignment]
                self.young += ([buffer, events, self.tick],)
                self.parked[k] += 1
                self.parked_bytes += nbytes
                outcome = "parked"
            elif keep:
                buffer.token, buffer.events = 0, None
                bucket.free += (buffer,)
                self.cached[k] = cached + 1
                outcome = "cached"
            else:
                buffer.token = 0
                buffer.events = None
                del self.registry[buffer]
                self.allocated[k] -= 1
                self.allocations -= 1
                self.allocated_bytes -= nbytes
                outcome = "freed"
                views -= cost if token > 0 else buffer.view_bytes
            if token > 0:
                buffer.view_bytes = cost
            self.view_bytes = views
        return (buffer, outcome, leak, problem)

    def uncache(self, bucket: Bucket, newest: bool, limit: int | None) -> Buffer | None:
        """Free *bucket*'s newest (or oldest) cached one past *limit* idle bytes; return it.

        *limit* None: the byte cap less parked bytes; -1: any.  The caller scraps it.
        """
        k = bucket.index
        with LOCK:
            if not self.cached[k]:
                return None
            cached_bytes = self.allocated_bytes - self.active_bytes - self.parked_bytes
            if limit is None:
                limit = self.max_cached_bytes - self.parked_bytes
            if cached_bytes + self.view_bytes <= limit:
                return None
            free = bucket.free
            end = -1 if newest else 0
            buffer = free[end]
            del free[end]
            self.cached[k] -= 1
            self.view_bytes -= buffer.view_bytes
            del self.registry[buffer]
            self.allocated[k] -= 1
            self.allocations -= 1
            self.allocated_bytes -= bucket.nbytes
        return buffer

    def retire(self, record: Parking, index: int = 0) -> Bucket | None:
        """Parked -> cached (or returning, for `settle`): spend *record*, its events done.

        Drops it from the young queue if at *index* there.  Returns the buffer's bucket, or
        None if the record was spent already.
        """
        with LOCK:
            buffer: Buffer | None = record[0]
            try:
                if self.young[index] is record:
                    del self.young[index]
            except IndexError:  # the queue moved on meanwhile: dropped at the front
                pass
            if buffer is None:
                return None
            record[0] = record[1] = None
            bucket = buffer.bucket
            k = bucket.index
            if (
                self.plain
                and self.cached[k] < self.max_cached_per_bucket
                and self.allocated_bytes - self.active_bytes + self.view_bytes
                <= self.max_cached_bytes
            ):
                # Parked -> cached at once: idle bytes, parked and cached, stay as they
                # were, and within the cap.  The rest (a cap to make room for) is `settle`'s.
                self.parked[k] -= 1
                self.parked_bytes -= bucket.nbytes
                buffer.token = 0
                buffer.events = None
                bucket.free += (buffer,)
                self.cached[k] += 1
            else:
                bucket.inbox += ((buffer, buffer.token, None, buffer.view_bytes),)
            return bucket

    # -- the parking queues: these moves only reorder and drop records ---------------------

    def young_front(self, oldest: int) -> Parking | str | None:
        """The oldest young record, None if none; `DROPPED` (ask again) if the front was
        spent (dropped) or parked before tick *oldest* (moved to the old queue).
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
        """Move the old queue's front record to its back and return it (None: empty);
        a spent one is dropped instead (`DROPPED`).
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
        """Copies of both queues, and `old_changes`, in one locked section."""
        with LOCK:
            return [*self.young], [*self.old], self.old_changes

    def compact_old(self, live: collections.deque[Parking], seen: int) -> bool:
        """Make *live* (the old queue less spent records) the old queue, if unchanged since."""
        with LOCK:
            if self.old_changes != seen:
                return False
            self.old = live
            self.old_changes = seen + 1
            return True

    def add_event(
        self,
        buffer: Buffer,
        token: int,
        event: CompletionEvent,
        fresh: collections.deque[Any] | None,
        front: CompletionEvent | None,
        done: bool,
        checksum: int | None,
    ) -> bool:
        """(`_parking.record`) Add *event* to hand-out *token*'s events, or False if over.

        *fresh*: their deque if none yet; the oldest, *front*, leaves if *done*, else goes last.
        """
        with LOCK:
            if token <= 0 or buffer.token != token:
                return False
            events: collections.deque[Any] | None = buffer.events  # type: ignore[assignment]  # a held one's
            if events is None:
                buffer.events = events = fresh
            elif front is not None and events and events[0] is front:
                del events[0]
                if not done:
                    events += (front,)
            events += (event,)  # type: ignore[operator]  # (None: never, while held)
            buffer.recorded += 1
            buffer.checksum = checksum
            return True

    def reset_peaks(self) -> None:
        """Set every peak to its current value."""
        with LOCK:
            self.active_peak = self.active
            self.active_bytes_peak = self.active_bytes
            self.allocations_peak = self.allocations
            self.allocated_bytes_peak = self.allocated_bytes

    def snapshot(self) -> tuple[list[int] | tuple[int, ...], ...]:
        """Copy the counters: per-bucket lists, then `TOTALS`, in one locked section."""
        with LOCK:  # slices and loads: no call, so no signal handler runs in here
            counts = (self.takes[:], self.misses[:], self.allocated[:], self.cached[:])
            active = (self.active, self.active_peak, self.active_bytes, self.active_bytes_peak)
            allocated = (self.allocations, self.allocations_peak, self.allocated_bytes)
            totals = (self.allocated_bytes_peak, self.allocations_total)
            more = (self.allocated_bytes_total, self.parked_bytes, self.requested)
            every = (*active, *allocated, *totals, *more, self.leaks, self.tick, self.view_bytes)
            return (*counts, self.parked[:], every)

    def buffers(self) -> list[Buffer]:
        """Every buffer not freed, oldest first, copied in one locked section."""
        with LOCK:
            return [*self.registry]
