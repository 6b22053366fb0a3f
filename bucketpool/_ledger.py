"""The ledger: where every buffer of a pool is, the counters, and the moves between places.

A buffer's ``token`` says where it is: cached (0), held (> 0), parked (< 0), returning (in
its bucket's inbox) or freed.  Each change of place is a *move*: one locked section that
calls nothing (docs/design.md, "A buffer's life", "The locking rule").  A move that lets go
of a holder's events keeps them in a local (``_dropped``) until the lock is let go, so that
no event's finaliser runs under it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Final

from bucketpool._buffer import Bucket, Buffer
from bucketpool._copies import INDEX
from bucketpool._lock import LOCK, owned
from bucketpool._views import CompletionEvent

__all__ = [
    *("AS_RECORDED", "CACHE", "DROPPED", "EMPTY", "LEAK", "SETTLE", "SWEEP"),
    *("Entry", "Ledger"),
]

#: What `serve` says: settle the inbox first; nothing cached; served, and the sweep is due.
SETTLE, EMPTY, SWEEP = 1, 2, 4
CACHE: Final = "cache"  # the holder of a buffer `reserve` caches
LEAK: Final = "leak"  # queued by a dropped holder's finaliser in place of its events
AS_RECORDED: Final = "as recorded"  # a release queued in a move: parks on every event so far
DROPPED: Final = "dropped"  # `young_front`/`old_front` dropped or moved one, unasked: again
#: An inbox entry: buffer, token (< 0: parked), pending events (or a marker), views' bytes.
Entry = tuple[Buffer, int, "list[Any] | str | None", int]
Parking = list[Any]  # one parking: ``[buffer, events, tick, raised, turns]``; spent: no buffer
Leak = tuple[int, object, int, object]  # n, the acquire's code, lasti (~: an adapter's), site
TOTALS = (  # the ledger's totals, in the order `Ledger.snapshot` copies them
    *("active", "active_peak", "active_bytes", "active_bytes_peak", "allocations"),
    *("allocations_peak", "allocated_bytes", "allocated_bytes_peak", "allocations_total"),
    *("allocated_bytes_total", "parked_bytes", "requested", "leaks", "tick", "view_bytes"),
)


class Ledger:
    """The records of one pool's buffers.  Every field is guarded by the lock."""

    __slots__ = (  # plain slots: attrs' hooks would cost time on every move
        *TOTALS,
        *("allocated", "buckets", "cached", "changes", "max_cached_bytes", "misses", "old"),
        *("max_cached_per_bucket", "next_sweep", "parked", "parked_views", "plain"),
        *("__weakref__", "registry", "sweep_every", "takes", "verify", "young"),
    )

    def __init__(
        self,
        max_capacity: int,
        max_cached_bytes: int,
        max_cached_per_bucket: int,
        sweep_every: int,
        verify: Callable[[Buffer, int, bool], tuple[str | None, Any]] | None,
    ) -> None:
        self.buckets = [Bucket(k) for k in range(max_capacity.bit_length())]
        self.registry: dict[Buffer, Buffer] = {}  # every buffer not freed (by identity)
        self.young: collections.deque[Parking] = collections.deque()  # parking order
        self.old: collections.deque[Parking] = collections.deque()  # asked in turn
        self.max_cached_bytes, self.max_cached_per_bucket = max_cached_bytes, max_cached_per_bucket
        self.sweep_every = self.next_sweep = sweep_every
        self.verify, self.plain = verify, verify is None  # the debug levels' check, or None
        self.takes, self.misses, self.allocated, self.cached, self.parked = (  # per bucket
            [0] * len(self.buckets) for _ in range(5)
        )
        self.active = self.active_peak = self.active_bytes = self.active_bytes_peak = 0
        self.allocations = self.allocations_peak = self.allocations_total = 0
        self.allocated_bytes = self.allocated_bytes_peak = self.allocated_bytes_total = 0
        self.parked_bytes = self.requested = self.leaks = self.view_bytes = 0
        self.parked_views = 0  # the part of view_bytes that parked buffers keep
        self.tick = self.changes = 0  # hand-outs so far; moves that changed a parking queue

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
        """Hand *parked*'s buffer, else *fresh*, else the newest cached, to *holder*."""
        k = bucket.index
        with LOCK:
            if parked is not None:
                buffer = parked[0]
                if buffer is None or buffer.bucket is not bucket or not self.plain:
                    return EMPTY  # spent since (or not ours to take)
                _dropped = parked[1], buffer.events  # kept until the lock is let go (finalisers)
                parked[0] = parked[1] = None
                try:
                    if self.young[index] is parked:
                        del self.young[index]
                        self.changes += 1
                except IndexError:  # dropped at the front meanwhile
                    pass
                self.parked[k] -= 1
                self.parked_bytes -= bucket.nbytes
                self.view_bytes -= buffer.view_bytes
                self.parked_views -= buffer.view_bytes
                buffer.events = None
            elif fresh is not None:
                buffer, nbytes = fresh, bucket.nbytes
                if holder is CACHE and (
                    self.cached[k] >= self.max_cached_per_bucket
                    or self.allocated_bytes - self.active_bytes + nbytes + self.view_bytes
                    > self.max_cached_bytes
                ):
                    return EMPTY  # the caps no longer keep it (threads raced)
                self.registry[buffer] = buffer
                INDEX[buffer.key] = buffer.ref
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
                    bucket.last_tick = self.tick  # idle trimming leaves it be
                    bucket.free += (buffer,)
                    self.cached[k] += 1
                    return CACHE
                self.misses[k] += 1
            elif bucket.inbox:
                return SETTLE  # it may be this bucket's only buffer
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
            self.tick = token = bucket.last_tick = self.tick + 1
            self.takes[k] += 1
            self.requested += n
            buffer.token, buffer.n = token, n
            buffer.code, buffer.lasti = code, lasti
            holder._buffer, holder._token = buffer, token  # type: ignore[attr-defined]
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
        raised: bool = False,
    ) -> bool | None:
        """Held -> cached or parked; None: an event was recorded since *seen*; False: `settle`'s."""
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
            self.active, self.active_bytes = self.active - 1, active_bytes
            _dropped = buffer.events  # kept until the lock is let go (finalisers)
            buffer.view_bytes = cost  # counted while it is idle
            self.view_bytes += cost
            if pending:
                buffer.token, buffer.events = -token, pending
                self.young += ([buffer, pending, self.tick, raised, 0],)
                self.changes += 1
                self.parked[k] += 1
                self.parked_bytes += nbytes
                self.parked_views += cost
            else:
                buffer.token, buffer.events = 0, None
                bucket.free += (buffer,)
                self.cached[k] += 1
            return True

    def settle(
        self,
        bucket: Bucket,
        force: bool = False,
        entry: Entry | None = None,
        seen: int = -1,
        raised: bool = False,
    ) -> tuple[Buffer | None, str, Leak | None, str | None]:
        """Take back *entry*, else *bucket*'s oldest queued: park, cache or free it."""
        k = bucket.index
        with LOCK:
            inbox = bucket.inbox
            if entry is None:
                if not inbox:
                    return (None, "nothing", None, None)
                queued = inbox[0]
            else:
                queued = entry
            buffer, token, state, cost = queued
            _dropped = buffer.events  # kept until the lock is let go (finalisers)
            if buffer.token != token:
                if entry is None:
                    del inbox[0]
                return (None, "nothing", None, None)
            if seen != -1 and buffer.recorded != seen:
                return (None, "recorded", None, None)
            leaked = state is LEAK
            events = (
                None if token < 0 else buffer.events if leaked or state is AS_RECORDED else state
            )
            nbytes = bucket.nbytes
            parked = self.parked_bytes - nbytes if token < 0 else self.parked_bytes
            views = self.view_bytes + cost if token > 0 else self.view_bytes
            cached = self.cached[k]
            fixed = self.parked_views + cost if token > 0 else self.parked_views  # (not trimmed)
            keep = (  # would it fit once other buckets' cached buffers and views were freed
                not events
                and cached < self.max_cached_per_bucket
                and parked + (cached + 1) * nbytes + fixed <= self.max_cached_bytes
            )
            if keep and (
                self.allocated_bytes - self.active_bytes - self.parked_bytes + nbytes + parked
                > self.max_cached_bytes - views
            ):
                if not force:
                    return (buffer, "crowded", None, None)
                keep = False
            checked = None if self.verify is None else self.verify(buffer, token, not events)
            if entry is None:
                del inbox[0]
            leak = None
            if token > 0:  # a hand-out ends
                self.active -= 1
                self.active_bytes -= nbytes
                if leaked:
                    self.leaks += 1
                    leak = (buffer.n, buffer.code, buffer.lasti, buffer.site)
            else:  # a parked buffer retires
                self.parked[k] -= 1
                self.parked_bytes = parked
                self.parked_views -= buffer.view_bytes
            if events:
                buffer.token, buffer.events = -token, events
                self.young += ([buffer, events, self.tick, raised, 0],)
                self.changes += 1
                self.parked[k] += 1
                self.parked_bytes += nbytes
                self.parked_views += cost  # (only a hand-out that ends parks: token > 0)
                outcome = "parked"
            elif keep:
                buffer.token, buffer.events = 0, None
                bucket.free += (buffer,)
                self.cached[k] = cached + 1
                outcome = "cached"
            else:
                buffer.token, buffer.events = 0, None
                if buffer in self.registry:  # (adopt kept only the held ones)
                    del self.registry[buffer]
                if buffer.key in INDEX and INDEX[buffer.key] is buffer.ref:
                    del INDEX[buffer.key]
                self.allocated[k] -= 1
                self.allocations -= 1
                self.allocated_bytes -= nbytes
                outcome = "freed"
                views -= cost if token > 0 else buffer.view_bytes
            if token > 0:
                buffer.view_bytes = cost
            self.view_bytes = views
            problem = None
            if checked is not None:  # the debug levels' changes, with the move
                problem, poison = checked
                if token > 0 and buffer.own_views:  # the hand-out's own views end
                    buffer.views, buffer.version = {}, -1  # (the next one puts it back first)
                    buffer.ended = [*buffer.ended, buffer.handed]  # (strict) a new list
                    buffer.handed = []
                if poison is not None:  # a stale batched copy moves nothing
                    poison[: buffer.n] = 0
                    buffer.poisoned, buffer.checksum = buffer.n, None
        return (buffer, outcome, leak, problem)

    def uncache(self, bucket: Bucket, limit: int | None) -> Buffer | None:
        """Free *bucket*'s oldest cached buffer if idle bytes are over *limit* (None: the cap)."""
        k = bucket.index
        with LOCK:
            if not self.cached[k]:
                return None
            idle = self.allocated_bytes - self.active_bytes - self.parked_bytes + self.view_bytes
            if limit is None:  # the cap: every idle byte, parked ones and their views too
                limit = self.max_cached_bytes - self.parked_bytes
            else:  # trim: the cached buffers and their views only
                idle -= self.parked_views
            if idle <= limit:
                return None
            buffer = bucket.free[0]
            del bucket.free[0]
            self.cached[k] -= 1
            self.view_bytes -= buffer.view_bytes
            if buffer in self.registry:
                del self.registry[buffer]
            if buffer.key in INDEX and INDEX[buffer.key] is buffer.ref:
                del INDEX[buffer.key]
            self.allocated[k] -= 1
            self.allocations -= 1
            self.allocated_bytes -= bucket.nbytes
        return buffer

    def retire(self, record: Parking, index: int = 0) -> Bucket | None:
        """Parked -> cached (or returning): spend *record*; its bucket, or None if spent."""
        with LOCK:
            buffer: Buffer | None = record[0]
            try:
                if self.young[index] is record:
                    del self.young[index]
                    self.changes += 1
            except IndexError:  # dropped at the front meanwhile
                pass
            if buffer is None:
                return None
            _dropped = record[1], buffer.events  # kept until the lock is let go (finalisers)
            record[0] = record[1] = None
            bucket = buffer.bucket
            k = bucket.index
            if (
                self.plain
                and self.cached[k] < self.max_cached_per_bucket
                and self.allocated_bytes - self.active_bytes + self.view_bytes
                <= self.max_cached_bytes
            ):
                self.parked[k] -= 1  # idle bytes stay as they were, within the cap
                self.parked_bytes -= bucket.nbytes
                self.parked_views -= buffer.view_bytes
                buffer.token, buffer.events = 0, None
                bucket.free += (buffer,)
                self.cached[k] += 1
            else:
                bucket.inbox += ((buffer, buffer.token, None, buffer.view_bytes),)
            return bucket

    def young_front(self, oldest: int) -> Parking | str | None:
        """The oldest young record; `DROPPED` if it was spent or older than *oldest* (moved)."""
        with LOCK:
            if not self.young:
                return None
            record = self.young[0]
            if record[0] is not None and record[2] >= oldest:
                return record
            del self.young[0]
            self.changes += 1
            if record[0] is not None:
                self.old += (record,)
            return DROPPED

    def old_front(self) -> Parking | str | None:
        """Move the old queue's front record to its back; return it if it is to be asked.

        A record is asked on its 1st, 2nd, 4th, 8th... turn (a copy that keeps failing, less
        and less often); a turn it is not, and a spent one: `DROPPED`.
        """
        with LOCK:
            if not self.old:
                return None
            record = self.old[0]
            del self.old[0]
            self.changes += 1
            if record[0] is None:
                return DROPPED
            self.old += (record,)
            record[4] = turns = record[4] + 1
            return DROPPED if turns & (turns - 1) else record

    def forget_ended(self, buffer: Buffer, ended: list[Any]) -> None:
        """(strict) Forget *ended*, made read-only, unless a hand-out ended since it was read."""
        with LOCK:
            if buffer.ended is ended:  # (the moves never change a list: they make a new one)
                buffer.ended = []

    def report(self, record: Parking) -> bool:
        """Note that an error of *record*'s events reached a caller (raised); False: one had."""
        with LOCK:
            if record[0] is None or record[3]:
                return False
            record[3] = True
            return True

    def parked_records(self) -> tuple[list[Parking], list[Parking], int]:
        with LOCK:
            return [*self.young], [*self.old], self.changes

    def compact(self, young: list[Parking], old: list[Parking], seen: int) -> bool:
        """Make *young* and *old* (less spent records) the queues, if unchanged since *seen*."""
        with LOCK:
            if self.changes != seen:
                return False
            self.young *= 0  # in place: a poll reads the queue without the lock
            self.young += young
            self.old *= 0
            self.old += old
            self.changes = seen + 1
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
        """Add *event* to *token*'s events (*front* leaves if *done*, else goes last), or False."""
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
        with LOCK:
            self.active_peak, self.active_bytes_peak = self.active, self.active_bytes
            self.allocations_peak = self.allocations
            self.allocated_bytes_peak = self.allocated_bytes

    def snapshot(self) -> tuple[list[int] | tuple[int, ...], ...]:
        """Copy the counters: per-bucket lists, then `TOTALS`, in one locked section."""
        with LOCK:
            counts = (self.takes[:], self.misses[:], self.allocated[:], self.cached[:])
            active = (self.active, self.active_peak, self.active_bytes, self.active_bytes_peak)
            allocated = (self.allocations, self.allocations_peak, self.allocated_bytes)
            totals = (self.allocated_bytes_peak, self.allocations_total, self.allocated_bytes_total)
            more = (self.parked_bytes, self.requested, self.leaks, self.tick, self.view_bytes)
            return (*counts, self.parked[:], (*active, *allocated, *totals, *more))

    def cached_in(self, bucket: Bucket) -> list[Buffer]:
        with LOCK:
            return [*bucket.free]  # the most recently released last

    def refile(self, buffer: Buffer) -> None:
        """File *buffer* under the address a holder moved its memory to (`Buffer._repair`).

        From the verification, inside a move, the lock is this thread's already.
        """
        if owned():
            _file(buffer)
        else:
            self._refile(buffer)

    def _refile(self, buffer: Buffer) -> None:
        with LOCK:
            key = buffer.key  # (as `_file`: a move calls nothing)
            if key in INDEX and INDEX[key] is buffer.ref:
                del INDEX[key]
            INDEX[buffer.address] = buffer.ref
            buffer.key = buffer.address

    def buffers(self) -> dict[Buffer, Buffer]:
        """Every buffer not freed, each its own key (a copy)."""
        with LOCK:
            return {**self.registry}


def _file(buffer: Buffer) -> None:
    """File *buffer* in `INDEX` under its address, not its old one (locked)."""
    key = buffer.key
    if key in INDEX and INDEX[key] is buffer.ref:
        del INDEX[key]
    INDEX[buffer.address] = buffer.ref
    buffer.key = buffer.address
