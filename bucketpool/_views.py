"""The views a pool hands out, and their fills: inputs read, hand-out checked, `write`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn, Protocol, SupportsIndex, TypeAlias

import numpy as np
import torch

from bucketpool._errors import CapacityError, ReleaseError, reentered
from bucketpool._inputs import IntArray, Plan, as_integer, read_block_copies, read_copies
from bucketpool._lock import owned
from bucketpool._settings import as_index

__all__ = [
    "CompletionEvent",
    "DescriptorArrays",
    "DescriptorBuffers",
    "IntArray",
    "IntegerInput",
    "Views",
    "record",
    "write",
]

#: ``(src, dst, sizes)``: three 1-D int64 or uint64 arrays of one length, written in place.
DescriptorArrays: TypeAlias = tuple[IntArray, IntArray, IntArray]
#: A fill's column: a numpy integer array, a CPU integer tensor or a sequence of ints.
IntegerInput: TypeAlias = IntArray | torch.Tensor | Sequence[int | np.integer[Any]]

_ndarray = np.ndarray
_I64, _U64 = np.dtype(np.int64), np.dtype(np.uint64)
_WORDS = (_I64, _U64)
_may_share = getattr(np.may_share_memory, "_implementation", np.may_share_memory)  # no dispatch


class CompletionEvent(Protocol):
    """An event `record_event` takes (`torch.Event`): ``query()``, optionally ``synchronize()``."""

    def query(self) -> bool:
        """Return whether the work recorded before the event has finished."""
        ...


class DescriptorBuffers(NamedTuple):
    """The three tensors of one `swap_blocks_batch` call: 1-D CPU views of ``n`` entries."""

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor

    def add_copies(
        self,
        first: SupportsIndex,
        sources: IntegerInput,
        destinations: IntegerInput,
        byte_counts: IntegerInput | SupportsIndex,
        *,
        step: SupportsIndex = 1,
    ) -> int:
        """Write copies into entries ``first, first + step, ...``; return the entry after the last.

        Copy ``i`` moves ``byte_counts[i]`` bytes from ``sources[i]`` to ``destinations[i]``
        (*byte_counts* may be one int) in entry ``first + i * step`` (``step=1``: entries
        ``[first, first + k)``, returns ``first + k``); one fill per layer with ``first=layer,
        step=num_layers`` interleaves them, the last returning the count.  Addresses are
        0..2**64-1 (64-bit values taken as bits; others >= 0), byte counts 0..2**63-1.  A call
        that raises writes nothing.

        Raises:
            ReleaseError: the hand-out these views belong to is over.
            TypeError: an input is not integer or on the CPU, or the views were not handed out.
            CapacityError: the last entry is ``n`` or more (an `IndexError`, a `ValueError`).
            IndexError: *first* is negative.
            ValueError: a column is not 1-D, lengths differ, a value is out of range, or
                *step* is below 1.
        """
        try:
            buffer = self._buffer  # type: ignore[attr-defined]
        except AttributeError:
            _not_handed_out("add_copies")
        token = self._token  # type: ignore[attr-defined]  # before any user code runs
        if (  # fresh 1-D int64 or uint64 arrays (taken as bits), consecutive: checked inline
            step == 1
            and type(first) is int
            and type(sources) is _ndarray
            and type(destinations) is _ndarray
            and type(byte_counts) is _ndarray
            and sources.dtype in _WORDS
            and destinations.dtype in _WORDS
            and byte_counts.dtype in _WORDS
            and sources.base is None  # not a view: no overlap with the buffer to look for
            and destinations.base is None
            and byte_counts.base is None
            and first >= 0
            and (end := first + len(sources)) <= buffer.n
            and (end - first,) == sources.shape == destinations.shape == byte_counts.shape
            and not (buffer.own_views and end > first and _least(byte_counts) < 0)  # (off: no)
        ):
            if token <= 0 or buffer.token != token:
                _over("add_copies", buffer, self)
            src, dst, size = buffer.arrays
            src[first:end] = sources
            dst[first:end] = destinations
            size[first:end] = byte_counts
            return end
        if type(step) is not int:
            step = as_integer(step, "step", "add_copies")
        plan = read_copies(first, sources, destinations, byte_counts, buffer.dtype_np)
        if token <= 0 or buffer.token != token:
            _over("add_copies", buffer, self)
        return write(buffer.arrays, buffer.n, plan, "add_copies", step)

    def add_block_copies(
        self,
        first: SupportsIndex,
        src_base: SupportsIndex,
        dst_base: SupportsIndex,
        src_blocks: IntegerInput,
        dst_blocks: IntegerInput,
        block_bytes: SupportsIndex,
        *,
        total_bytes: SupportsIndex | None = None,
        coalesce: bool = True,
    ) -> int:
        """Write copies of whole blocks; return the next free entry.

        Copy ``i`` moves *block_bytes* from ``src_base + src_blocks[i] * block_bytes`` to
        ``dst_base + dst_blocks[i] * block_bytes``; *coalesce* merges runs stepping by one,
        *total_bytes* trims the last copy.  A call that raises writes nothing.

        Raises:
            ReleaseError: the hand-out these views belong to is over.
            TypeError: an input is not integer, or these views were not handed out.
            CapacityError: the descriptors do not fit in ``[first, n)``.
            IndexError: *first* is negative.
            ValueError: bad lengths, block indices, block size, bases or *total_bytes*.
        """
        try:
            buffer = self._buffer  # type: ignore[attr-defined]
        except AttributeError:
            _not_handed_out("add_block_copies")
        token = self._token  # type: ignore[attr-defined]
        plan = read_block_copies(
            (first, src_base, dst_base, src_blocks, dst_blocks, block_bytes),
            *(total_bytes, coalesce, buffer.dtype_np),
        )
        if token <= 0 or buffer.token != token:
            _over("add_block_copies", buffer, self)
        return write(buffer.arrays, buffer.n, plan, "add_block_copies")

    def shrink(self, count: SupportsIndex) -> DescriptorBuffers:
        """Return views of the first *count* entries (same hand-out, no copy).

        Entries are not cleared between holders: pass `swap_blocks_batch` only those written.

        Raises:
            ReleaseError: the hand-out these views belong to is over.
            TypeError: *count* is not an integer, or these views were not handed out.
            ValueError: *count* is negative or above the hand-out's ``n``.
        """
        try:
            buffer = self._buffer  # type: ignore[attr-defined]
        except AttributeError:
            _not_handed_out("shrink")
        token = self._token  # type: ignore[attr-defined]
        if type(count) is not int:
            count = as_index(count, "shrink: count", hint="pass the index add_copies() returned")
        if token <= 0 or buffer.token != token:
            _over("shrink", buffer, self)
        if not 0 <= count <= buffer.n:
            raise ValueError(
                f"shrink: count={count} is outside 0..n={buffer.n}; views can only shrink "
                "(acquire a larger handle to write more entries)"
            )
        views = buffer.views.get(count)  # (no version check: a change of the holder's own)
        if views is not None:
            views._token = token
            return views  # type: ignore[no-any-return]
        found: DescriptorBuffers = buffer.cut(count)
        found._token = token  # type: ignore[attr-defined]
        return found

    def record_event(self, event: CompletionEvent) -> None:
        """Keep the buffer out of reuse until *event* (and every other one recorded) is done.

        Record it after the `swap_blocks_batch` call (or upload) that reads the descriptors.

        Raises:
            ReleaseError: the hand-out these views belong to is over.
            TypeError: *event* has no ``query()`` method, or these views were not handed out.
            InFlightWriteError: (debug levels) descriptors changed under an earlier copy.
        """
        try:
            buffer = self._buffer  # type: ignore[attr-defined]
        except AttributeError:
            _not_handed_out("record_event")
        record(buffer, self._token, event)  # type: ignore[attr-defined]


class Views(DescriptorBuffers):
    """A view set a pool hands out: `DescriptorBuffers` that know their buffer and hand-out."""

    _buffer: Any  # a `bucketpool._buffer.Buffer` (which imports this module)
    _token: int  # the holder's hand-out, set as the set is handed out

    def __copy__(self) -> DescriptorBuffers:  # the public tuple: never views that fill
        return DescriptorBuffers(*self)

    def __deepcopy__(self, memo: dict[int, object]) -> DescriptorBuffers:
        return DescriptorBuffers(*(tensor.clone() for tensor in self))

    def __reduce__(self) -> tuple[object, ...]:  # plain tensors: guarded views do not pickle
        return (DescriptorBuffers, tuple(tensor.as_subclass(torch.Tensor) for tensor in self))


Views.__name__ = Views.__qualname__ = "DescriptorBuffers"  # reprs say the public name


def write(arrays: DescriptorArrays, n: int, plan: Plan, op: str, step: int = 1) -> int:
    """Write *plan* into *arrays* of *n* entries, *step* apart; no user code run."""
    first, k, sources, destinations, sizes = plan
    end = first + k
    if step != 1:
        if step < 1:
            raise ValueError(
                f"{op}: step must be >= 1, got step={step}; pass 1 for consecutive entries, "
                "or the distance between the entries of interleaved fills"
            )
        end = first + (k - 1) * step + 1 if k else first
    if first < 0:
        raise IndexError(f"{op}: first must be >= 0, got first={first}")
    if end > n:
        what = "copies" if op == "add_copies" else "descriptors"
        every = f" every {step} entries" if step != 1 else ""
        raise CapacityError(
            f"{op}: k={k} {what} starting at first={first}{every} need entries up to {end}, "
            f"but the buffers hold n={n}; nothing was written: acquire at least {end} "
            "entries, or split the batch"
        )
    src, dst, size = arrays
    whole = src.base if src.base is not None else src
    if sources.base is not None and _may_share(sources, whole):
        sources = sources.copy()  # (numpy reads some overlaps after writing them)
    if destinations.base is not None and _may_share(destinations, whole):
        destinations = destinations.copy()
    if type(sizes) is _ndarray and sizes.base is not None and _may_share(sizes, whole):
        sizes = sizes.copy()
    src[first:end:step] = sources
    dst[first:end:step] = destinations
    size[first:end:step] = sizes
    return end


def record(buffer: Any, token: int, event: CompletionEvent) -> None:
    """Add *event* to the events of *buffer*'s hand-out *token* (the holder's call)."""
    if token <= 0 or buffer.token != token:
        _over("record_event", buffer)
    if owned():  # a finaliser or signal handler inside a move: the records are half-made
        raise reentered("record_event")
    if not callable(getattr(event, "query", None)):
        raise TypeError(
            "record_event needs an object with a query() -> bool method "
            f"(torch.Event, torch.cuda.Event), got {type(event).__name__}"
        )
    if not buffer.record(token, event):
        _over("record_event", buffer)


def _least(counts: IntArray) -> int:
    """The least byte count as int64 (uint64 ones of 2**63 or more read as negative)."""
    signed = counts if counts.dtype is _I64 else counts.view(_I64)
    least: int = signed.item(signed.argmin())
    return least


def _over(op: str, buffer: Any, holder: object = None) -> NoReturn:
    name = "DescriptorBuffers" if holder is None else type(holder).__name__
    raise ReleaseError(
        f"{op}: this {name} (capacity {buffer.bucket.capacity}) is of a hand-out that is "
        "over (released), and its buffer may be another holder's now; use it only while it "
        "is held: inside the with block of a live handle, or before pool.release(bufs)"
    )


def _not_handed_out(op: str) -> NoReturn:
    raise TypeError(
        f"{op} works on the views a pool hands out (with pool.acquire(n) as bufs: ...); "
        "these DescriptorBuffers were built some other way, so there is no hand-out to "
        "fill: write the tensors directly"
    )
