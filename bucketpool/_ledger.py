"""The ledger: where every buffer of a pool is, the counters, and the moves between places.

A buffer is, at every moment, in exactly one place, and its ``token`` says which:

* **cached** (token 0) -- in its bucket's free list, ready to hand out (the newest last);
* **held** (token > 0, the hand-out's) -- its holder, a `BufferHandle` (or a compat
  adapter's tuple, through `HELD`), carries the same token;
* **returning** (the hand-out's token still) -- released or dropped unreleased, waiting in
  its bucket's inbox, appended to without the lock (deque appends are thread-safe), so
  that a release never waits, also from a finaliser or a collected ``with`` block;
* **parked** (minus the hand-out's token) -- taken back while a recorded event was
  pending, with a *record* in the parking queues (see `Parking`); it returns through the
  inbox once every event reports done, by the one move that clears that record;
* **freed** -- dropped by a cap, a trim or idle trimming; its memory goes back at once.

Every change of place is a *move*: one method below, one locked section of straight-line
code that calls nothing (the rule is in `bucketpool._lock`; `tests/test_lock_rule.py`
checks it), so that a signal handler's exception lands before a move or after it:
`serve` (returning or cached -> held; new -> held or cached), `settle` (returning ->
cached, parked or freed), `uncache` (cached -> freed), `retire` (parked ->
returning), `attach_holder` (a cached buffer gets its next compat tuple) and `end_held`
(held by a compat tuple -> returning).

A token is never used twice, so a mismatch is final: a stale, copied or forged holder
moves nothing.  Counters that `stats()` can derive are not kept (hits are takes less
misses; cached bytes are allocated less active less parked bytes); peaks are exact.
"""

from __future__ import annotations

import collections
import typing
from collections.abc import Callable
from typing import Final

from bucketpool._buffer import HELD, LEAK, Bucket, Buffer, Entry
from bucketpool._lock import LOCK
from bucketpool._types import CompletionEvent

__all__ = [
    "CACHE",
    "DROPPED",
    "EMPTY",
    "HELD",
    "LEAK",
    "NEEDS_HOLDER",
    "SETTLE",
    "SWEEP",
    "TOTALS",
    "Leak",
    "Ledger",
    "Parking",
    "Settled",
]

#: `serve` could not serve: the bucket's inbox has something to settle first.
SETTLE: Final = 1
#: `serve` could not serve: the bucket has nothing cached.
EMPTY: Final = 2
#: `serve` could not serve a compat hand-out: the buffer has no tuple yet.
NEEDS_HOLDER: Final = 3
#: `serve` served, and the idle sweep is due: the caller runs it.
SWEEP: Final = 4
#: `serve`'s holder for a new buffer that is to be cached, not handed out (`reserve`).
CACHE: Final = "cache"
#: `young_front` and `old_front` dropped or moved a record: ask again.
DROPPED: Final = "dropped"

#: The ledger's totals, in the order `Ledger.snapshot` copies them.
TOTALS = (
    *("active", "active_peak", "active_bytes", "active_bytes_peak"),
    *("allocations", "allocations_peak", "allocated_bytes", "allocated_bytes_peak"),
    *("allocations_total", "allocated_bytes_total", "parked_bytes", "requested", "leaks"),
    *("tick", "view_bytes"),
)
#: A leak, as `settle` saw it: the hand-out's n, the acquire's code object and
#: instruction, and its traced site (or None).
Leak = tuple[int, object, int, object]
#: What `settle` did, for its caller's follow-up outside the lock: (the buffer or None,
#: what it did, the leak it took back or None, the verification's problem or None).
Settled = tuple["Buffer | None", str, "Leak | None", "str | None"]
_NOTHING: Final = (None, "nothing", None, None)
#: One parking of a buffer: ``[buffer, events, tick]`` -- the buffer, its pending events,
#: the ledger's tick when it parked.  The `retire` move clears the buffer and the events
#: (under the lock, once): a cleared record is spent, and whoever held a copy of it, a
#: poll that asked its events, say, can move nothing with it.  So a buffer is never
#: retired on an answer about an earlier parking: that parking's record is spent.
Parking = list[typing.Any]


class Ledger:
    """The records of one pool's buffers.  Every field is guarded by the lock."""

    # A plain __slots__ class: attrs' hooks would cost time on every move.
    __slots__ = (
        *TOTALS,  # the counters, then the records and the settings
        *("allocated", "buckets", "cached", "max_cached_bytes", "misses", "old"),
        *("max_cached_per_bucket", "next_sweep", "old_changes", "parked", "plain"),
        *("registry", "sweep_every", "takes", "verify", "young"),
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
        self.buckets = [Bucket(k, 1 << k) for k in range(count)]
        self.registry: dict[Buffer, None] = {}  # every buffer not freed (outstanding())
        #: The parking records (see `bucketpool._parking`): the recent ones in the order
        #: they parked, and those still parked long after, asked in turn.  Both may hold
        #: spent records, dropped when they come to the front.
        self.young: collections.deque[Parking] = collections.deque()
        self.old: collections.deque[Parking] = collections.deque()
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
        #: Bytes of the view sets that idle (cached and parked) buffers keep: they count
        #: against the byte cap as the buffers do.  Each buffer's share is its
        #: ``view_bytes``, set by its last holder when the hand-out ended.
        self.view_bytes = 0

    # -- the moves ----------------------------------------------------------------------------

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
        """Hand a buffer of *bucket* to *holder* (a `BufferHandle`, or None for compat).

        The oldest plain return in the bucket's inbox, else the newest cached, else
        *fresh* (counted here; cached if *holder* is `CACHE` and the caps keep it), else
        the buffer of the record *parked* (its events done, found at *index* of the young
        queue; a handle's, at ``"off"``: spent here, as `retire` would).  Returns the
        holder (compat: the tuple kept with the buffer), `SWEEP` when the idle sweep is
        due, or, having moved nothing, `SETTLE`, `EMPTY` or `NEEDS_HOLDER`.
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
                buffer.events = buffer.current = None
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
                if holder is None and buffer.next_holder is None:
                    return NEEDS_HOLDER
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
            if holder is None:  # a compat tuple: `claim_sweep` tells its caller about sweeps
                holder = buffer.next_holder
                buffer.next_holder = None
                HELD[buffer.next_id] = (buffer, token)
                return holder
            holder._buffer = buffer  # type: ignore[attr-defined]
            holder._token = token  # type: ignore[attr-defined]
            if token >= self.next_sweep:
                self.next_sweep = token + self.sweep_every
                return SWEEP
            return holder

    def give_back(
        self, buffer: Buffer, token: int, pending: list[CompletionEvent] | None, cost: int
    ) -> bool:
        """Held -> cached, or parked on *pending*: a release at ``"off"`` that the caps keep.

        Returns False, having moved nothing, where `settle` has more to do: a cap that
        does not keep the buffer, a debug level, a hand-out over already.
        """
        bucket = buffer.bucket
        k = bucket.index
        with LOCK:
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
            buffer.current = None
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

    def settle(self, bucket: Bucket, force: bool = False, entry: Entry | None = None) -> Settled:
        """Take back *entry*, else the oldest of *bucket*'s inbox: park, cache or free it.

        Events pending: parked.  Else cached if the caps keep it (parked bytes count), else
        freed.  The debug levels' `verify` runs first, before anything moves.  If caching
        fits the bucket but not the byte cap, nothing moves (``"crowded"``): the caller
        makes room elsewhere and calls again with *force*, which frees it if there is
        still none.  Returns the buffer, the outcome (``"parked"``, ``"cached"``,
        ``"freed"``, ``"crowded"``, ``"nothing"``), the leak taken back, the problem.
        An *entry* whose hand-out is over already moves nothing (``"nothing"``).
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
            leaked = state is LEAK
            events = None if token < 0 else buffer.events if leaked else state
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
                buffer.current = None
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
        """Free *bucket*'s newest (or oldest) cached buffer if cached bytes exceed *limit*.

        *limit* None is the byte cap (less parked bytes); -1 frees whatever the bytes.
        Returns the freed buffer (the caller scraps it outside the lock), or None.
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
        """Parked -> returning: queue *record*'s buffer, its events done, in its inbox.

        Spends the record, and drops it from the young queue if it is at *index* there
        (a poll's index, near the front, so the drop is cheap; a spent record is dropped
        too).  Returns the buffer's bucket, or None, having moved nothing else, if the
        record was spent already (another thread retired the buffer first).
        """
        with LOCK:
            buffer: Buffer | None = record[0]
            young = self.young
            if buffer is None:  # spent: dropped from *index* all the same
                try:
                    if young[index] is record:
                        del young[index]
                except IndexError:
                    pass
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
            try:
                if young[index] is record:
                    del young[index]
            except IndexError:  # the queue moved on meanwhile: dropped at the front
                pass
            return bucket

    def young_front(self, age: int) -> Parking | str | None:
        """The oldest recent record: None if there is none.

        A spent record at the front is dropped, and one parked more than *age* hand-outs
        ago moves to the old queue: then `DROPPED` (call again).
        """
        with LOCK:
            young = self.young
            if not young:
                return None
            record = young[0]
            if record[0] is not None and self.tick - record[2] <= age:
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

    def attach_holder(self, buffer: Buffer, holder: object, holder_id: int) -> bool:
        """Give cached *buffer* the tuple its next compat hand-out gets, if it has none."""
        with LOCK:
            if buffer.token or buffer.next_holder is not None or buffer not in self.registry:
                return False
            buffer.next_holder = holder
            buffer.next_id = holder_id
            return True

    def end_held(
        self,
        buffer: Buffer,
        token: int,
        holder_id: int,
        pending: list[CompletionEvent] | None,
        following: tuple[object, int],
        marks: tuple[object, int | None] | None,
        cost: int,
    ) -> bool:
        """End the compat hand-out *token* of *buffer* held by the tuple *holder_id*.

        Held -> returning, with the *pending* events, the tuple *following* for the next
        hand-out and, when the pool watches, the release's site and checksum (*marks*).
        Returns False, having moved nothing, if that hand-out was over already.
        """
        with LOCK:
            if buffer.token != token or holder_id not in HELD:
                return False
            buffer.bucket.inbox += ((buffer, token, pending, cost),)  # first: it alone may fail
            del HELD[holder_id]
            buffer.next_holder, buffer.next_id = following
            if marks is not None:
                buffer.released_at, checksum = marks
                if checksum is not None:
                    buffer.checksum = checksum
            return True

    # -- maintenance, not moves -----------------------------------------------------------------

    def claim_sweep(self) -> bool:
        """Return True once per sweep interval, to the thread that is to sweep (compat)."""
        with LOCK:
            if self.tick < self.next_sweep:
                return False
            self.next_sweep = self.tick + self.sweep_every
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
