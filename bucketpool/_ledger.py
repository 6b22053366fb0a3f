"""The ledger: where every buffer of a pool is, the counters, and the moves between places.

The life of a buffer
--------------------
A buffer is, at every moment, in exactly one place, and its ``token`` says which:

* **cached** (token 0) -- in its bucket's free list, ready to hand out (the newest last);
* **held** (token > 0, the hand-out's token) -- handed out.  Its holder (a `BufferHandle`,
  or a compat adapter's tuple) carries the same token;
* **returning** (still the hand-out's token) -- released, or dropped unreleased, and
  waiting in its bucket's inbox for the next operation on that bucket (or the next drain)
  to take it back.  A release appends to the inbox without taking the lock (a deque's
  appends are thread-safe), so releasing never waits, also from a finaliser or a collected
  ``with`` block.  Each bucket has its own inbox, so a return never stands in the way of
  a hand-out of another size;
* **parked** (minus the hand-out's token) -- taken back while an event recorded on it was
  pending; it waits in the parked queue until every event reports done, then returns
  through the inbox once more;
* **freed** -- dropped by a cap, a trim or idle trimming; its memory goes back at once.

Every change of place is a *move*: one method below, one locked section, straight-line
code that calls nothing (see `bucketpool._lock`), so that a signal handler's exception
lands before a move or after it and a buffer is never in two places or in none.  Each move
is written once and every path uses it:

* `serve` -- cached or returning -> held (the hot path: the oldest return, when it is the
  only one and of the bucket asked for, goes straight to the new holder), and a new
  buffer -> held (a miss) or -> cached (a reservation);
* `settle` -- returning -> cached, parked or freed (a bucket inbox's oldest entry);
* `uncache` -- cached -> freed;
* `step_parked` -- parked -> returning, once its events are done;
* `attach_holder` -- gives a cached buffer the tuple its next compat hand-out gets.

A token is never used twice, so a mismatch is final: a stale, copied or forged holder names
a hand-out that is over, and moves nothing.  A compat tuple, which has no slot for a token,
holds its buffer through `HELD`.  Counters that `stats()` can derive when asked
are not kept: hits are takes less misses, cached bytes are allocated less active less
parked bytes.  Peaks are kept exactly.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Final

from bucketpool._buffer import Bucket, Buffer
from bucketpool._lock import LOCK
from bucketpool._types import CompletionEvent

__all__ = [
    "CACHE",
    "EMPTY",
    "HELD",
    "LEAK",
    "NEEDS_HOLDER",
    "SETTLE",
    "SWEEP",
    "Entry",
    "Leak",
    "Ledger",
    "Settled",
]

#: What a dropped holder's finaliser queues in place of pending events.
LEAK: Final = "leak"
#: The compat tuples out: ``id()`` of the tuple -> (its buffer, the hand-out's token).  A
#: tuple holds its buffer while its entry is here: `Ledger.serve` puts it in; the tuple's
#: release or finaliser takes it out with one ``dict.pop``, so that of two releases of one
#: tuple exactly one reports success.  The buffer itself is moved only by the ledger,
#: under the lock, on the hand-out's token.
HELD: dict[int, tuple[Buffer, int]] = {}
#: An entry of the inbox: the buffer, the token of the hand-out (minus it for a parked
#: buffer whose events are done), and None, the events still pending, or `LEAK`.
Entry = tuple[Buffer, int, "list[CompletionEvent] | str | None"]

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

#: A leak, as `settle` saw it: the hand-out's n, the acquire's code object and
#: instruction, and its traced site (or None).
Leak = tuple[int, object, int, object]
#: What `settle` did, for its caller's follow-up outside the lock: (the buffer or None,
#: what it did, the leak it took back or None, the verification's problem or None).
Settled = tuple["Buffer | None", str, "Leak | None", "str | None"]
_NOTHING: Final = (None, "nothing", None, None)


class Ledger:
    """The records of one pool's buffers.  Every field is guarded by the lock."""

    # A plain __slots__ class: attrs' hooks would cost time on every move.
    __slots__ = (
        "active",
        "active_bytes",
        "active_bytes_peak",
        "active_peak",
        "allocated",
        "allocated_bytes",
        "allocated_bytes_peak",
        "allocated_bytes_total",
        "allocations",
        "allocations_peak",
        "allocations_total",
        "buckets",
        "cached",
        "cursor",
        "leaks",
        "max_cached_bytes",
        "max_cached_per_bucket",
        "misses",
        "next_sweep",
        "parked",
        "parked_bytes",
        "parked_queue",
        "plain",
        "registry",
        "requested",
        "sweep_every",
        "takes",
        "tick",
        "verify",
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
        #: Parked buffers in the order they parked (see `bucketpool._parking`).
        self.parked_queue: collections.deque[Buffer] = collections.deque()
        self.cursor = 0  # where the next poll goes on asking, after the front (a hint)
        self.max_cached_bytes = max_cached_bytes
        self.max_cached_per_bucket = max_cached_per_bucket
        self.sweep_every = sweep_every
        self.next_sweep = sweep_every
        #: The debug levels' check of a buffer taken back (numpy on the pool's own memory,
        #: run inside `settle`), or None at level off, where a plain return needs no check.
        self.verify = verify
        self.plain = verify is None
        self.tick = 0  # hand-outs so far: the last token given
        # Per bucket, indexed like `buckets`, so that a snapshot is a few slices.
        self.takes = [0] * count
        self.misses = [0] * count
        self.allocated = [0] * count
        self.cached = [0] * count
        self.parked = [0] * count
        self.active = self.active_peak = 0
        self.active_bytes = self.active_bytes_peak = 0
        self.allocations = self.allocations_peak = 0
        self.allocated_bytes = self.allocated_bytes_peak = 0
        self.allocations_total = self.allocated_bytes_total = 0  # freed: these less current
        self.parked_bytes = 0
        self.requested = 0
        self.leaks = 0

    # -- the moves ----------------------------------------------------------------------------

    def serve(
        self,
        bucket: Bucket,
        n: int,
        holder: object,
        code: object,
        lasti: int,
        fresh: Buffer | None = None,
    ) -> object:
        """Hand a buffer of *bucket* to *holder*; return the holder, or why it could not.

        Returns `SWEEP` instead of a handle once every sweep interval, having served it:
        the caller sweeps.

        The buffer is the one that the bucket's inbox holds, when that is one plain return
        (it goes straight to the new holder); else the newest cached; else *fresh*, a new
        buffer, counted here (and cached instead when *holder* is `CACHE`).  *holder* is
        a `BufferHandle`, bound here, or None for a compat hand-out, which gets the tuple
        kept with the buffer.  Returns `SETTLE`,
        `EMPTY` or `NEEDS_HOLDER`, having moved nothing, when it could not serve.
        """
        k = bucket.index
        with LOCK:
            recycled = False
            if fresh is not None:
                buffer = fresh
                nbytes = bucket.nbytes
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
                inbox = bucket.inbox
                entry = inbox[0]
                buffer, token, state = entry
                if (
                    state is not None
                    or token <= 0  # a parked buffer retiring: settle counts it out
                    or inbox[-1] is not entry
                    or buffer.bucket is not bucket
                    or buffer.token != token
                    or not self.plain
                    or (holder is None and buffer.next_holder is None)
                ):
                    return SETTLE
                del inbox[0]
                recycled = True  # its release and this hand-out cancel out in the counts
            else:
                free = bucket.free
                if not free:
                    return EMPTY
                buffer = free[-1]
                if holder is None and buffer.next_holder is None:
                    return NEEDS_HOLDER
                del free[-1]
                self.cached[k] -= 1
            if not recycled:
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

    def settle(self, bucket: Bucket, force: bool = False) -> Settled:
        """Take back the oldest entry of *bucket*'s inbox: park it, cache it, or free it.

        A buffer whose hand-out ends with events pending is parked; a parked buffer whose
        events are done, or a return with none pending, is cached if the caps keep it
        (parked bytes count against the byte cap), else freed.  At the debug levels the
        buffer is verified first (`verify`), before anything moves.  When caching it fits
        its bucket but would take the cache over the byte cap, nothing moves and the
        outcome is ``"crowded"``: the caller makes room in other buckets and calls again
        with *force*, which frees the buffer if there is still no room.  Returns the
        buffer, the outcome (``"parked"``, ``"cached"``, ``"freed"``, ``"crowded"``, or
        ``"nothing"`` for an empty inbox or a hand-out that was over already), the leak it
        took back, and the verification's problem.
        """
        k = bucket.index
        with LOCK:
            inbox = bucket.inbox
            if not inbox:
                return _NOTHING
            buffer, token, state = inbox[0]
            if buffer.token != token:
                del inbox[0]
                return _NOTHING
            leaked = state is LEAK
            events = None if token < 0 else buffer.events if leaked else state
            nbytes = bucket.nbytes
            parked = self.parked_bytes - nbytes if token < 0 else self.parked_bytes
            cached = self.cached[k]
            keep = (
                not events
                and cached < self.max_cached_per_bucket
                and parked + (cached + 1) * nbytes <= self.max_cached_bytes
            )
            if keep and (
                self.allocated_bytes - self.active_bytes - self.parked_bytes + nbytes + parked
                > self.max_cached_bytes
            ):
                if not force:
                    return (buffer, "crowded", None, None)
                keep = False
            problem = None
            if self.verify is not None:
                problem = self.verify(buffer, token, not events)
            del inbox[0]
            leak = None
            if token > 0:  # a hand-out ends
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
                self.parked_queue += (buffer,)
                self.parked[k] += 1
                self.parked_bytes += nbytes
                outcome = "parked"
            elif keep:
                buffer.token = 0
                buffer.events = None
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
        return (buffer, outcome, leak, problem)

    def uncache(self, bucket: Bucket, newest: bool, limit: int | None) -> Buffer | None:
        """Free one cached buffer of *bucket* (the newest, or the least recently released).

        Only while the cached bytes exceed *limit*: None means the byte cap (parked bytes
        count against it), -1 frees whatever the bytes.  Returns the freed buffer, for the
        caller to `Buffer.scrap` outside the lock, or None.
        """
        k = bucket.index
        with LOCK:
            if not self.cached[k]:
                return None
            cached_bytes = self.allocated_bytes - self.active_bytes - self.parked_bytes
            if limit is None:
                limit = self.max_cached_bytes - self.parked_bytes
            if cached_bytes <= limit:
                return None
            free = bucket.free
            end = -1 if newest else 0
            buffer = free[end]
            del free[end]
            self.cached[k] -= 1
            del self.registry[buffer]
            self.allocated[k] -= 1
            self.allocations -= 1
            self.allocated_bytes -= bucket.nbytes
        return buffer

    def step_parked(self, buffer: Buffer, index: int, done: bool) -> bool:
        """Move *buffer*, parked at *index*, to its bucket's inbox if *done*.

        Returns whether it is still at *index* (False: another thread moved the queue on
        first, and nothing moved).  Raises `IndexError` past the queue's end.
        """
        with LOCK:
            queue = self.parked_queue
            if queue[index] is not buffer or buffer.token >= 0:
                return False
            if done:
                del queue[index]
                buffer.bucket.inbox += ((buffer, buffer.token, None),)
            return True

    def attach_holder(self, buffer: Buffer, holder: object, holder_id: int) -> bool:
        """Give cached *buffer* the tuple its next compat hand-out gets, if it has none."""
        with LOCK:
            if buffer.token or buffer.next_holder is not None or buffer not in self.registry:
                return False
            buffer.next_holder = holder
            buffer.next_id = holder_id
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

    def snapshot(self) -> tuple[list[int], ...]:
        """Copy the counters in one locked section: per-bucket lists, then the totals."""
        with LOCK:
            return (
                self.takes[:],
                self.misses[:],
                self.allocated[:],
                self.cached[:],
                self.parked[:],
                [
                    self.active,
                    self.active_peak,
                    self.active_bytes,
                    self.active_bytes_peak,
                    self.allocations,
                    self.allocations_peak,
                    self.allocated_bytes,
                    self.allocated_bytes_peak,
                    self.allocations_total,
                    self.allocated_bytes_total,
                    self.parked_bytes,
                    self.requested,
                    self.leaks,
                    self.tick,
                ],
            )

    def buffers(self) -> list[Buffer]:
        """Every buffer not freed, oldest first, copied in one locked section."""
        with LOCK:
            return [*self.registry]
