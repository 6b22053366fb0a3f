"""Buckets and buffers: a buffer's memory, and the view sets it keeps for its holders."""

from __future__ import annotations

import collections
import weakref
from typing import Any

import torch

from bucketpool import _debug
from bucketpool._errors import InFlightWriteError
from bucketpool._views import DescriptorArrays, Views

__all__ = ["VIEW_SETS", "VIEW_SET_BYTES", "Bucket", "Buffer", "new_tensor"]

VIEW_SET_BYTES = 2048  # what one cached view set counts against max_cached_bytes (torch 2.13)
VIEW_SETS = 32  # view sets cached per buffer, one per recent n (the trade: docs/design.md)
ENTRY_BYTES = 8
_empty = torch.empty  # bound at import: a test that patches torch.empty does not reach us


def new_tensor(size: int, dtype: torch.dtype, pin_memory: bool = False) -> torch.Tensor:
    """A plain CPU tensor of *size* entries, made outside inference mode (vLLM's)."""
    with torch.inference_mode(False):
        return _empty(size, dtype=dtype, device="cpu", pin_memory=pin_memory)


class Bucket:
    """The buffers of one capacity (guarded by the lock); its counters are the ledger's."""

    __slots__ = ("capacity", "free", "inbox", "index", "last_tick", "nbytes")

    def __init__(self, index: int) -> None:
        self.index = index  # log2 of the capacity: its place in the ledger's counters
        self.capacity = 1 << index
        self.nbytes = self.capacity * ENTRY_BYTES * 3
        self.free: list[Buffer] = []  # cached, the most recently released last
        self.inbox: collections.deque[tuple[Any, ...]] = collections.deque()  # `Entry`s back
        self.last_tick = 0  # the tick of its last hand-out (or reservation)


class Buffer:
    """One buffer: its memory, its cached views, and the records of its hand-out."""

    __slots__ = (
        *("address", "arrays_", "base", "bucket", "checksum", "code", "dtype", "dtype_np"),
        *("ended", "entered", "events", "handed", "key", "lasti", "lent", "lent_mode"),
        *("lent_sets", "ledger"),
        *("n", "poisoned", "ref"),
        *("recorded", "released_at", "own_views", "site", "storage", "strict", "token"),
        *("version", "view_bytes", "views", "__weakref__"),
    )

    def __init__(
        self, bucket: Bucket, dtype: torch.dtype, pin_memory: bool, ledger: Any, level: int
    ) -> None:
        self.bucket = bucket
        self.ledger = weakref.ref(ledger)  # its ledger, weakly: strongly, a cycle with its registry
        self.dtype = dtype
        self.base = new_tensor(3 * bucket.capacity, dtype, pin_memory)
        self.storage = self.base.untyped_storage()
        self.address = self.key = self.base.data_ptr()  # key: where it is filed (`_copies`)
        self.ref = weakref.ref(self)  # what the index of buffers by address holds
        self.arrays_ = _fields(self.base)  # the pool's own arrays: fills write through these
        self.dtype_np = self.arrays_[0].dtype
        self.views: dict[int, Views] = {}
        self.lent: list[tuple[Any, ...] | None] = [None, None]  # adapters': plain, inference
        self.lent_mode = False  # which of the two the last adapter hand-out had
        self.lent_sets = 0  # how many of the two are cached (each counts as a view set)
        self.view_bytes = 0  # what the views counted against the cap when it went idle
        self.own_views = level > 0  # debug levels: each hand-out has view sets of its own
        self.strict = level == 2  # (guarded ones)
        # torch's version counter (shared by the fields' views) decides only which cached
        # views to trust, never who holds the buffer (tokens, under the lock, do); the
        # tensor is always a plain one (`new_tensor`), whose counter never raises.
        self.version = self.base._version
        self.token = 0  # (the lock's) > 0: held by that hand-out; 0: cached or freed; < 0: parked
        self.entered = 0  # (the holder's) the hand-out a with block binds now (its token)
        self.n = 0  # the live hand-out's n
        self.events: collections.deque[Any] | list[Any] | None = None
        self.recorded = 0  # events ever recorded on it: a release tells a new one by this
        self.code: object = None  # the acquire's code object and instruction (leak warnings)
        self.lasti = 0  # (~lasti: handed out through a compat adapter)
        self.site: object = None  # where the hand-out was acquired and released (tracing)
        self.released_at: object = None
        self.checksum: int | None = None  # debug levels: of the first n entries
        self.poisoned = 0  # debug levels: entries holding the poison
        self.handed: list[Any] = []  # strict: (weak references to) the hand-out's arrays
        self.ended: list[Any] = []  # strict: the lists of ended hand-outs (each move: a new list)

    @property
    def arrays(self) -> DescriptorArrays:
        """The pool's numpy arrays of the whole fields, made anew if the memory moved."""
        if self.storage.data_ptr() != self.address:
            self._repair()
        return self.arrays_

    def check_views(self) -> None:
        """(the holder) Put the buffer back as the pool made it if a holder changed it."""
        if self.base._version != self.version:  # (views to trust only: see __init__)
            self._repair()

    def views_for(self, n: int) -> Views:
        """The view set of *n* entries for the live hand-out (its holder alone calls this)."""
        if self.base._version != self.version:  # (views to trust only: see __init__)
            self._repair()
        views = self.views.get(n)
        if views is None:
            views = self.cut(n)
        views._token = self.token
        return views

    def cut(self, n: int) -> Views:
        """A cached view set of *n* entries; once full, the oldest not this hand-out's is reused."""
        views, token = self.views, self.token
        if len(views) >= VIEW_SETS:
            for key, found in views.items():
                if found._token != token:
                    del views[key]
                    if not self.own_views:
                        base = self.base
                        ours = base._version == self.version  # no holder's change (views only)
                        src, dst, sizes = found
                        try:
                            src.resize_(n)
                            dst.resize_(n)
                            sizes.resize_(n)
                        except RuntimeError:  # a holder put it on memory that cannot grow
                            pass
                        else:
                            if ours:
                                self.version = base._version  # our own change
                            views[n] = found
                            return found
                    break
        base, capacity = self.base, self.bucket.capacity
        if self.strict:  # guarded views, this hand-out's own: dropped as it ends
            fields = _debug.guarded_views(self, token, n)
        else:
            fields = (
                base[:n],
                base[capacity : capacity + n],
                base[2 * capacity : 2 * capacity + n],
            )
        found = tuple.__new__(Views, fields)
        found._buffer = self
        found._token = 0
        if len(views) < VIEW_SETS:  # (full of this hand-out's own sets: not cached)
            views[n] = found
        return found

    def _repair(self) -> None:
        """Put the buffer's tensor back on its memory as the pool made it; drop every view set."""
        base, size = self.base, 3 * self.bucket.capacity
        made = (torch.Tensor, self.dtype, False, False)
        if (type(base), base.dtype, base.is_neg(), base.is_conj()) != made:
            self.base = base = new_tensor(0, self.dtype).set_(self.storage, 0, (size,), (1,))
        elif (
            base.untyped_storage()._cdata != self.storage._cdata
            or base.shape != (size,)
            or base.stride() != (1,)
            or base.storage_offset()
        ):
            base.set_(self.storage, 0, (size,), (1,))
        if self.storage.nbytes() != size * ENTRY_BYTES:
            self.storage.resize_(size * ENTRY_BYTES)  # grown through a view: given back
        if base.data_ptr() != self.address:
            self.address = base.data_ptr()
            self.arrays_ = _fields(base)
            ledger = self.ledger()
            if ledger is not None:  # filed by address: what a copy op is given is found
                ledger.refile(self)
        self.views, self.lent, self.lent_sets = {}, [None, None], 0
        self.version = base._version  # (views to trust only: see __init__)

    def lend(self, inference: bool) -> tuple[Any, ...]:
        """(the holder) The whole fields and their arrays, for an adapter's hand-out.

        At ``off`` the same objects for every hand-out in one mode (*inference*: tensors made
        in inference mode); at the debug levels made anew, as view sets are.  The tensors
        alias the arrays through numpy, so no holder can resize the buffer's memory.
        """
        found = self.lent[inference]
        if found is None or self.own_views or self.storage.data_ptr() != self.address:
            arrays = self.arrays  # (put back where a holder of views moved the memory)
            found = self.lent[inference]
            if self.strict:
                capacity = self.bucket.capacity
                fields = _debug.guarded_views(self, self.token, capacity)
                found = (*fields, *_debug.guarded_arrays(self, capacity))
            elif found is None or self.own_views:
                found = (*map(torch.from_numpy, arrays), *arrays)
                if not self.own_views:
                    self.lent[inference] = found
                    self.lent_sets += 1
        self.lent_mode = inference
        return found

    def record(self, token: int, event: Any) -> bool:
        """(the holder) Add *event* to hand-out *token*'s events; False if it is over."""
        events: collections.deque[Any] | None = self.events  # type: ignore[assignment]
        ledger = self.ledger()
        if ledger is None:  # its pool is gone
            return False
        if events is None and ledger.verify is None:  # the first, at off: one move
            return bool(
                ledger.add_event(self, token, event, collections.deque(), None, False, None)
            )
        front, done = None, False
        if events:  # the oldest is asked: done, it leaves; pending, it goes last (O(1))
            try:
                front = events[0]  # a hint: the move checks it is still the oldest
                done = bool(front.query())
            except (KeyboardInterrupt, SystemExit):  # a signal handler's: this thread's
                raise
            except BaseException:  # not this call's to report: asked again at release
                done = False
        checksum, in_flight = self.checksum, False
        if ledger.verify is not None:
            current = _debug.checksum(self.arrays, self.n)
            in_flight = checksum is not None and checksum != current and _pending(events)
            checksum = current
        fresh: collections.deque[Any] | None = collections.deque() if events is None else None
        if not ledger.add_event(self, token, event, fresh, front, done, checksum):
            return False
        if in_flight:
            raise InFlightWriteError(_debug.in_flight_problem(self))
        return True

    def views_cost(self) -> int:
        """(the holder, as its hand-out ends) The bytes its cached view sets count."""
        return 0 if self.own_views else (len(self.views) + self.lent_sets) * VIEW_SET_BYTES

    def scrap(self) -> None:
        """(freed, outside the lock) Let go of memory and views: a stale reader finds nothing."""
        self.views, self.lent, self.lent_sets = {}, [None, None], 0
        self.base = base = new_tensor(0, self.dtype)
        self.storage = base.untyped_storage()
        self.arrays_ = _fields(base)


def _pending(events: collections.deque[Any] | None) -> bool:
    """Whether an earlier event may still be running (one whose query raises may be)."""
    for event in (*events,) if events else ():
        try:
            if not event.query():
                return True
        except (KeyboardInterrupt, SystemExit):  # a signal handler's: this thread's
            raise
        except BaseException:  # not this call's to report: asked again at release
            return True
    return False


def _fields(base: torch.Tensor) -> DescriptorArrays:
    whole = base.numpy()
    third = len(whole) // 3
    return (whole[:third], whole[third : 2 * third], whole[2 * third :])


def field_arrays(buffer: Buffer, n: int) -> DescriptorArrays:
    """Numpy arrays of the first *n* entries of each field (read-only at ``strict``'s end)."""
    if buffer.strict:
        return _debug.guarded_arrays(buffer, n)
    src, dst, sizes = buffer.arrays
    return (src[:n], dst[:n], sizes[:n])
