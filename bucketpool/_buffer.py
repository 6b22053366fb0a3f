"""The records of buckets and buffers, and a buffer's views: cut, cached, checked, repaired.

A buffer is one tensor of ``3 * capacity`` entries; its three fields (source addresses,
destination addresses, sizes) are consecutive views of it, so that they share one version
counter: one read of it tells whether anything changed any view in place.  Each buffer
keeps up to `VIEW_SETS` view sets, one per recent ``n``, so that a repeated ``n`` cuts no
tensor.  A holder may change its views in place (``resize_``, ``set_``, ``out=``, ...):
every such change bumps the version counter, and the next hand-out then checks every
cached view set against the buffer's own memory and drops the ones that no longer match,
so the next holder always gets three contiguous 1-D views of exactly ``n`` entries of the
pool's memory.  Plain writes through torch bump the counter too; they cost the next
hand-out that check, nothing more.

Which fields the lock guards is said in `bucketpool._lock`; the rest of a buffer belongs to
its holder while it is handed out, and to the ledger otherwise.
"""

from __future__ import annotations

import collections
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import numpy as np
import torch

from bucketpool._types import (
    ENTRY_BYTES,
    FIELDS,
    CompletionEvent,
    DescriptorArrays,
    DescriptorBuffers,
    Views,
)
from bucketpool._viewfills import ViewFills

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "AS_RECORDED",
    "HELD",
    "LEAK",
    "LEAK_TUPLE",
    "VIEW_SETS",
    "VIEW_SET_BYTES",
    "Bucket",
    "Buffer",
    "Entry",
    "GuardViews",
    "MakeHolder",
    "new_tensor",
]

#: Bytes one cached view set costs (three tensors and their tuple), as measured on
#: torch 2.13: what a buffer's views count against ``max_cached_bytes``.
VIEW_SET_BYTES = 2048
#: View sets cached per buffer, one per recent n.  Chosen by measurement (see the
#: benchmark's log-uniform traces; the trade is in docs/design.md, "The view cache").
VIEW_SETS = 16

#: Makes a hand-out's guarded views (`bucketpool._guard.guarded_views`): (buffer, token, n).
GuardViews = Callable[["Buffer", int, int], tuple[torch.Tensor, ...]]
#: Makes the tuple a compat adapter hands out with a buffer, and its id (`bucketpool.compat`).
MakeHolder = Callable[["Buffer", bool], tuple[object, int]]

_empty = torch.empty  # bound at import: a test that patches torch.empty does not reach us


def new_tensor(size: int, dtype: torch.dtype, pin_memory: bool = False) -> torch.Tensor:
    """A plain CPU tensor of *size* entries, whatever the host's ambient torch state.

    vLLM acquires inside ``torch.inference_mode()``, where a new tensor would be an
    inference tensor (no version counter, refused in place outside that mode), and model
    code may set a default device: the buffer is made outside inference mode, on the CPU.
    Views cut from it later, in any mode, are plain tensors too.
    """
    with torch.inference_mode(False):
        return _empty(size, dtype=dtype, device="cpu", pin_memory=pin_memory)


#: What a dropped holder's finaliser queues in place of pending events: a handle's, and a
#: compat tuple's (the advice in the warning differs).
LEAK: Final = "leak"
LEAK_TUPLE: Final = "leaked tuple"
#: What a release queued from inside a move parks on: every event recorded by then.
AS_RECORDED: Final = "as recorded"
#: An entry of a bucket's inbox: the buffer, the token of the hand-out (minus it for a
#: parked buffer whose events are done), and None, the events still pending, or `LEAK`.
#: Last, the bytes of the views it keeps (`Buffer.views_cost`).
Entry = tuple["Buffer", int, "list[CompletionEvent] | str | None", int]
#: The compat tuples out: ``id()`` of the tuple -> (its buffer, the hand-out's token).  A
#: tuple holds its buffer while its entry is here: `Ledger.serve` puts it in; the tuple's
#: release or finaliser takes it out with one ``dict.pop``, so that of two releases of one
#: tuple exactly one reports success.  The buffer itself is moved only by the ledger,
#: under the lock, on the hand-out's token.
HELD: dict[int, tuple[Buffer, int]] = {}


class Bucket:
    """The buffers of one capacity (guarded by the lock); its counters are the ledger's."""

    __slots__ = ("capacity", "free", "inbox", "index", "last_tick", "nbytes")

    def __init__(self, index: int, capacity: int) -> None:
        self.index = index  # log2 of the capacity: its place in the ledger's counters
        self.capacity = capacity
        self.nbytes = capacity * ENTRY_BYTES * FIELDS
        #: Cached buffers, the least recently released first.
        self.free: list[Buffer] = []
        #: Buffers of this bucket coming back, oldest first: `bucketpool._ledger`'s
        #: "returning" place.  Appended to without the lock; taken from under it.
        self.inbox: collections.deque[Entry] = collections.deque()
        self.last_tick = 0  # the tick of its last hand-out (or reservation)


class Buffer(ViewFills):
    """One buffer: its memory, its cached views, and the records of its hand-out."""

    __slots__ = (
        "_arrays",
        "address",
        "base",
        "bucket",
        "checksum",
        "code",
        "current",
        "dtype",
        "events",
        "guard",
        "handed",
        "lasti",
        "n",
        "next_holder",
        "next_id",
        "own_sets",
        "poisoned",
        "pool_ref",
        "recorded",
        "released_at",
        "site",
        "span",
        "storage",
        "token",
        "version",
        "view_bytes",
        "views",
        "whole",
    )

    def __init__(
        self,
        bucket: Bucket,
        dtype: torch.dtype,
        pin_memory: bool,
        guard: GuardViews | None,
        own_sets: bool = False,
    ) -> None:
        self.bucket = bucket
        capacity = bucket.capacity
        self.dtype = dtype
        self.base = new_tensor(FIELDS * capacity, dtype, pin_memory)
        self.storage = self.base.untyped_storage()
        self.address = self.base.data_ptr()
        self._arrays = _field_arrays(self.base, capacity)  # see `arrays`
        self.views: dict[int, Views] = {}
        self.view_bytes = 0  # what the views counted against the cap when it went idle
        # At debug level strict every hand-out gets guarded views of its own, made by
        # *guard* (`bucketpool._guard.guarded_views`): an impossible version sends every
        # hand-out past the cache.
        self.guard = guard
        # At "checks", a tuple of its own per hand-out over cached views checked intact:
        # stale views are then told from the live ones (`check_live`).
        self.own_sets = own_sets
        # torch's version counter of the buffer's own tensor, as last seen.  It decides
        # nothing about who holds the buffer (tokens, under the lock, do): only whether the
        # cached views must be checked before the next hand-out.  The tensor is always a
        # plain one (`new_tensor`, outside inference mode), whose counter never raises.
        self.version = -1 if guard is not None or own_sets else self.base._version
        #: The hand-out that holds it: its token (> 0); 0 when cached or freed; minus the
        #: token of the hand-out it waits for while parked.
        self.token = 0
        self.n = 0  # the live hand-out's n (a shrink lowers it)
        self.span = 0  # debug levels: the hand-out's n as acquired (checksums, poison)
        self.events: collections.deque[CompletionEvent] | list[CompletionEvent] | None = None
        self.recorded = 0  # events ever recorded on it: a release tells a new one by this
        self.current: Views | None = None
        self.code: object = None  # the acquire's code object and instruction (leak warnings)
        self.lasti = 0
        self.site: object = None  # where the hand-out was acquired and released (tracing)
        self.released_at: object = None
        self.checksum: int | None = None  # debug levels: of the first n entries
        self.poisoned = 0  # debug levels: entries holding the poison
        self.handed: list[npt.NDArray[np.integer]] = []  # strict: arrays to make read-only
        self.whole: tuple[object, ...] | None = None  # compat: the whole fields' views
        self.next_holder: object = None  # compat: the tuple its next compat hand-out gets
        self.next_id = 0  # ... and its id()
        self.pool_ref: Callable[[], object] | None = None  # compat: a weakref to the pool

    @property
    def arrays(self) -> DescriptorArrays:
        """The pool's own numpy arrays of the whole fields; fills write through these.

        They are never handed out, so no holder changes them; made anew first if the
        memory moved under them (``share_memory_()`` on a view moves it uncounted).
        """
        if self.storage.data_ptr() != self.address:
            self._restore_base()
        return self._arrays

    # -- views ------------------------------------------------------------------------------

    def views_for(self, n: int) -> Views:
        """Return the view set of *n* entries for the holder (who alone calls this).

        Checks the cached sets first if anything changed a view since the last look.
        """
        if self.base._version != self.version:
            guard = self.guard
            if guard is not None:  # one guarded set per hand-out
                return self.current if self.current is not None else self._guarded(guard, n)
            if self.own_sets:
                return self.current if self.current is not None else self._own(n)
            self._repair()
        return self._cached(n)

    def _cached(self, n: int) -> Views:
        """The cached view set of *n* entries, cut or resized from the oldest if none."""
        views = self.views
        found = views.get(n)
        if found is not None:
            return found
        if len(views) < VIEW_SETS:
            found = self.cut(n)
        else:
            # Reuse the oldest set: three in-place resizes cost less than three new views.
            found = views.pop(next(iter(views)))
            if self.own_sets and not self._matches(found):
                found = self.cut(n)  # (checks) a holder changed it: not reused
            else:
                try:
                    for view in (*found, *found.masters) if self.own_sets else found:
                        view.resize_(n)
                except RuntimeError:  # a holder put it on memory that cannot grow
                    found = self.cut(n)
                else:
                    if not self.own_sets:
                        self.version = self.base._version  # our own change
        views[n] = found
        return found

    def _own(self, n: int) -> Views:
        """(checks) A tuple of its own for this hand-out, over cached views checked intact."""
        if n not in self.views:  # a set to cut from the buffer's tensor: put that back first
            self._restore_base()
        found = self._cached(n)
        if not self._matches(found):
            self._repair()
            self.version = -1
            found = self._cached(n)
        own = tuple.__new__(Views, found)
        own._buffer = self
        return own

    def _matches(self, views: Views) -> bool:
        """(checks) Whether *views* are still as cut: plain, and on memory that did not move.

        ``is_set_to`` compares each with its kept copy: the same storage, offset, shape and
        strides (not the dtype, class or bits: `_plain` does).
        """
        (src, dst, sizes), (first, second, third) = views, views.masters
        return (
            src.is_set_to(first)
            and dst.is_set_to(second)
            and sizes.is_set_to(third)
            and self._plain(views)
            and self.storage.data_ptr() == self.address
        )

    def _plain(self, views: Views) -> bool:
        """Whether *views* are plain tensors of the pool's dtype, with no negation or conj bit."""
        src, dst, sizes = views
        return (
            type(src) is type(dst) is type(sizes) is torch.Tensor
            and src.dtype is dst.dtype is sizes.dtype is self.dtype
            and not (src.is_neg() or dst.is_neg() or sizes.is_neg())
            and not (src.is_conj() or dst.is_conj() or sizes.is_conj())
        )

    def _intact_set(self, views: Views, n: int) -> bool:
        """Whether *views* are still the three fields' first *n* entries, 1-D, contiguous."""
        src, dst, sizes = views
        if not src.shape == dst.shape == sizes.shape == (n,) or not self._plain(views):
            return False
        own, capacity = self.storage._cdata, self.bucket.capacity  # the storage itself, not
        storages = (src.untyped_storage(), dst.untyped_storage(), sizes.untyped_storage())
        offsets = (src.storage_offset(), dst.storage_offset(), sizes.storage_offset())
        return (
            all(storage._cdata == own for storage in storages)  # another on the same memory
            and offsets == (0, capacity, 2 * capacity)
            and src.is_contiguous()
            and dst.is_contiguous()
            and sizes.is_contiguous()
        )

    def cut(self, n: int) -> Views:
        """A new view set of *n* entries (not cached)."""
        views = tuple.__new__(Views, self._slices(n))
        views._buffer = self
        if self.own_sets:  # (checks) what the views are checked against: never handed out
            views.masters = self._slices(n)
        return views

    def _slices(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        base = self.base
        capacity = self.bucket.capacity
        return (base[:n], base[capacity : capacity + n], base[2 * capacity : 2 * capacity + n])

    def _guarded(self, guard: GuardViews, n: int) -> Views:
        views = tuple.__new__(Views, guard(self, self.token, n))
        views._buffer = self
        return views

    def _repair(self) -> None:
        """Put the buffer's memory and views back as the pool made them; keep what is intact."""
        self._restore_base()
        self.whole = None
        for n, views in list(self.views.items()):
            if not self._intact_set(views, n):
                del self.views[n]
        self.version = self.base._version

    def _restore_base(self) -> None:
        """Put the buffer's own tensor back on its memory, as the pool made it.

        A holder may have re-pointed, resized or re-strided a view, or, through a view's
        ``_base``, the buffer's own tensor (``.data =`` too: then a new tensor takes its
        place); growing a view past the buffer resizes the storage, which moves the memory.
        """
        base = self.base
        capacity = self.bucket.capacity
        size = FIELDS * capacity
        kind = (type(base), base.dtype, base.is_neg(), base.is_conj())
        if kind != (torch.Tensor, self.dtype, False, False):
            # Views cut from it would be of another kind: a new tensor, and new views.
            self.base = base = new_tensor(0, self.dtype).set_(self.storage, 0, (size,), (1,))
            self.views.clear()
        elif (
            base.untyped_storage()._cdata != self.storage._cdata  # not another on our memory
            or base.shape != (size,)
            or base.stride() != (1,)
            or base.storage_offset()
        ):
            base.set_(self.storage, 0, (size,), (1,))
        if self.storage.nbytes() != size * ENTRY_BYTES:
            self.storage.resize_(size * ENTRY_BYTES)  # grown through a view: give it back
        if base.data_ptr() != self.address:
            # The memory moved: the arrays point at the old memory, and every view too.
            self.address = base.data_ptr()
            self._arrays = _field_arrays(base, capacity)
            self.views.clear()

    def narrow(self, views: DescriptorBuffers, count: int) -> None:
        """Resize *views* (this hand-out's) to *count* entries in place, and re-key them."""
        in_step = self.base._version == self.version
        for view in views:
            view.resize_(count)
        if self.guard is None:
            cached = self.views.get(self.n)
            if cached is not None and cached[0] is views[0]:  # the same tensors
                del self.views[self.n]
                if self.own_sets:  # (checks) the set behind this hand-out's own tuple
                    for master in cached.masters:
                        master.resize_(count)
                    views = cached
                self._serve_instead(count, self.n)
            if not self.own_sets or views is cached:
                self.views[count] = typing.cast("Views", views)
            if in_step:
                self.version = self.base._version  # our own changes, not a holder's
        self.n = count

    def _serve_instead(self, count: int, n: int) -> None:
        """Resize the set cached for *count*, if any, to serve *n*: a shrink's next acquire.

        Else `narrow` would drop it, and the next ``acquire(n)`` cut a new set.
        """
        other = self.views.pop(count, None)
        if other is None or (self.own_sets and not self._matches(other)):
            return
        try:
            for view in (*other, *other.masters) if self.own_sets else other:
                view.resize_(n)
        except RuntimeError:  # a holder put it on memory that cannot grow: dropped
            return
        self.views[n] = other

    def views_cost(self) -> int:
        """(the holder, as its hand-out ends) The bytes of the views the buffer keeps.

        The move that takes the buffer back stores it as `view_bytes`, for the byte cap.
        """
        return (len(self.views) + (self.whole is not None)) * VIEW_SET_BYTES

    def field_arrays(self, n: int) -> DescriptorArrays:
        """Numpy arrays of the first *n* entries of each field, made for one caller."""
        src, dst, sizes = self.arrays
        return (src[:n], dst[:n], sizes[:n])

    def scrap(self) -> None:
        """(freed, outside the lock) Let go of the memory and views, so they go at once.

        A released handle may keep this record: it then keeps no memory.  What a stale
        reader finds instead is an empty tensor, never the freed memory.
        """
        self.views = {}
        self.current = self.whole = self.next_holder = None
        self.base = base = new_tensor(0, self.dtype)
        self.storage = base.untyped_storage()
        self._arrays = _field_arrays(base, 0)


def _field_arrays(base: torch.Tensor, capacity: int) -> DescriptorArrays:
    whole = base.numpy()
    return (whole[:capacity], whole[capacity : 2 * capacity], whole[2 * capacity :])
