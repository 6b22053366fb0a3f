"""The debug levels and tracing: call sites, poison, checksums, and strict's guarded views.

Nothing here decides who holds a buffer.  ``checks`` poisons the sizes of every buffer
taken back (a stale write is reported to the next holder) and checksums the descriptors
of a parked buffer (a write while its copy may read them is reported); `verify` runs
inside the ledger's move, on the pool's own memory, and calls no user code.  ``strict``
adds views and arrays of each hand-out's own that refuse to be used once it ends:
every torch operation on a `GuardedView` (and on views cut from it) checks the hand-out,
and `GuardedArray` objects are made read-only when it ends.  Not caught: raw memory taken
past numpy (``memoryview``, ``np.frombuffer``, ``ctypes``, ``torch.from_numpy``).
"""

from __future__ import annotations

import os
import sys
import traceback
import typing
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import CodeType, FrameType
from typing import Any

import numpy as np
import torch

from bucketpool._errors import UseAfterReleaseError

__all__ = [
    "GuardedArray",
    "GuardedView",
    "check_poison",
    "checksum",
    "code_line",
    "format_site",
    "guarded_arrays",
    "guarded_views",
    "in_flight_problem",
    "in_package",
    "line_of",
    "site",
    "verify",
]

#: A `bucketpool._buffer.Buffer` (which imports this module, so it is not imported here).
Buffer = Any
#: ``(src, dst, sizes)`` numpy arrays of a buffer's fields.
DescriptorArrays = tuple[Any, Any, Any]

_PACKAGE_DIR = os.path.dirname(__file__) + os.sep
_zeros = [b""]  # the poison to compare with, as bytes (a list: swapped whole, never mutated)

#: Where something happened: an instruction of a code object (its line is looked up only
#: when shown), file and line, the whole stack (``trace=True``), or unknown.
Site = tuple[CodeType, int] | tuple[str, int] | traceback.StackSummary | None


def site(full_stack: bool) -> Site:
    """Return where the caller outside this package is (file and line, or the whole stack).

    The first frame outside the package, from this call's caller out: a ``with`` block's
    exit and ``release()`` sit at different depths below the user's line.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    if full_stack:
        return traceback.extract_stack(frame)
    return (frame.f_code, frame.f_lasti)  # f_lineno would decode the line table now


def in_package(code: CodeType) -> bool:
    """Whether *code* is this package's own (a site is the first frame outside it)."""
    return code.co_filename.startswith(_PACKAGE_DIR)


def code_line(code: object, lasti: int) -> tuple[str, int] | None:
    """Return the file and line of instruction *lasti* of *code* (an acquire's call site)."""
    if not isinstance(code, CodeType):
        return None
    line = code.co_firstlineno
    for start, end, number in code.co_lines():
        if start <= lasti < end and number is not None:
            line = number
            break
    return (code.co_filename, line)


def line_of(where: Site) -> tuple[str, int] | None:
    """Return the file and line of *where* (the innermost frame of a stack), if known."""
    if where is None:
        return None
    if isinstance(where, traceback.StackSummary):
        frame = where[-1]
        return (frame.filename, frame.lineno or 0)
    place, number = where
    if isinstance(place, CodeType):
        return code_line(place, number)
    return (place, number)


def format_site(where: Site) -> str:
    """Return *where* for a message; say how to record sites when it is unknown."""
    if where is None:
        return "<unknown: make the pool with trace=True or debug='checks' to record sites>"
    if isinstance(where, traceback.StackSummary):
        return "\n" + "".join(where.format())
    line = line_of(where)
    return "<unknown>" if line is None else f"{line[0]}:{line[1]}"


def describe(n: int, acquired: Site, released: Site = None) -> str:
    """Say which hand-out: ``a buffer (n=5, acquired at f.py:3, released at f.py:9)``."""
    parts = [f"n={n}", f"acquired at {format_site(acquired)}"]
    if released is not None:
        parts.append(f"released at {format_site(released)}")
    return f"a buffer ({', '.join(parts)})"


def checksum(arrays: DescriptorArrays, n: int) -> int:
    """Return a CRC of the first *n* entries of the three fields."""
    value = 0
    for array in arrays:
        value = zlib.crc32(array[:n].data, value)
    return value


def verify(buffer: Buffer, token: int, caching: bool) -> str | None:
    """(inside `settle`) Check and prepare *buffer*, taken back from hand-out or parking.

    Ends a hand-out's guarded arrays (``strict``); when the buffer is about to be cached,
    compares a parked buffer's checksum with its descriptors (a write after its release,
    while the copy could read it, is reported) and zeroes the sizes, so that a stale
    batched copy moves nothing.  Returns the problem found, if any.  Idempotent: an
    interrupted `settle` verifies again.
    """
    problem = None
    if token > 0 and buffer.own_views:  # the hand-out's own views (strict: arrays) end
        buffer.views = {}
        buffer.version = -1  # the next hand-out puts the buffer back first, whatever changed
        for array in buffer.handed:
            array.flags.writeable = False
        buffer.handed = []  # a new list: arrays derived from stale ones join the old one
    if not caching:
        return None
    if (
        buffer.checksum is not None
        and token < 0
        and buffer.checksum != checksum(buffer.arrays, buffer.n)
    ):
        which = describe(buffer.n, buffer.site, buffer.released_at)  # type: ignore[arg-type]
        problem = (
            f"the descriptors of {which} changed between record_event() and the "
            "completion of its events: a copy in flight may have read the new values. "
            "Fill descriptors before recording the event, keep no views past the with "
            "block, or acquire another buffer"
        )
    buffer.checksum = None
    buffer.arrays[2][: buffer.n].fill(0)
    buffer.poisoned = buffer.n
    return problem


def check_poison(buffer: Buffer) -> str | None:
    """(the new holder) Return a message if the poison the last release left was written.

    Sizes are what every descriptor write sets (``add_copies`` writes all three fields), so
    one comparison of one field finds a stale write and keeps ``checks`` cheap; a stale
    write of addresses alone is caught at ``strict``, where stale views refuse to be used.
    """
    poisoned = buffer.poisoned
    if not poisoned:
        return None
    data = buffer.arrays[2][:poisoned].tobytes()
    zeros = _zeros[0]
    if len(zeros) != len(data):  # one size kept: a repeated n makes no new one
        _zeros[0] = zeros = bytes(len(data))
    if data == zeros:
        return None
    # The previous hand-out's sites are still on the buffer until this acquire records its
    # own: the stale writer is reported, not blamed on the new holder.
    return (
        f"a buffer of capacity {buffer.bucket.capacity} was written after its release, "
        f"through a stale view of "
        f"{describe(poisoned, buffer.site, buffer.released_at)}"  # type: ignore[arg-type]
        ". Keep views only inside the handle's with block (copy data out with "
        "tensor.clone()); the new holder is not affected"
    )


def in_flight_problem(buffer: Buffer) -> str:
    """The message for descriptors rewritten while an earlier recorded copy could read them."""
    return (
        f"record_event: the descriptors of {describe(buffer.n, buffer.site)} "  # type: ignore[arg-type]
        "changed while an earlier recorded copy could still read them; the new event was "
        "recorded. Fill descriptors only before recording an event"
    )


class _Owner(typing.NamedTuple):
    """The hand-out a guarded view belongs to."""

    buffer: Buffer
    token: int
    n: int
    site: object


#: Operations a stale view may still do: printing it in a debugger or a log must not raise.
_HARMLESS = frozenset({torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.__str__})
#: Operations that return numpy arrays of the view's memory: those are guarded too.
_TO_NUMPY: frozenset[object] = frozenset((torch.Tensor.numpy, torch.Tensor.__array__))


#: A strict hand-out's record of its arrays: the list the end of the hand-out makes
#: read-only, and the address range of the buffer's memory.
_Guard = tuple[list["np.ndarray[Any, Any]"], int, int]


class GuardedArray(np.ndarray):
    """A numpy array of a strict hand-out's memory; arrays numpy derives from it are too.

    Each array of the buffer's memory is added to the hand-out's list, which the end of the
    hand-out makes read-only; an array numpy derives from one but that has memory of its
    own (a ufunc's result) is left alone.
    """

    _bp_guard: _Guard | None = None

    def __array_finalize__(self, obj: object) -> None:
        guard: _Guard | None = getattr(obj, "_bp_guard", None)
        if guard is None:
            return
        handed, low, high = guard
        if low <= self.__array_interface__["data"][0] < high:
            self._bp_guard = guard
            handed.append(self)


@typing.final
class GuardedView(torch.Tensor):
    """A view of a pool buffer that raises `UseAfterReleaseError` once its hand-out ends.

    Kept in a local, an attribute, a container or returned from a function, a view is
    caught where it is used after the ``with`` block.  ``copy.deepcopy`` of a live view
    gives a plain copy of its data.
    """

    _bp_owner: _Owner

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., object],
        types: Iterable[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        """Check the hand-out of every guarded argument, run *func*, guard what it returns."""
        kwargs = kwargs or {}
        owner = None
        if func not in _HARMLESS:
            for value in (*args, *kwargs.values()):
                for item in value if isinstance(value, (list, tuple)) else (value,):
                    if type(item) is GuardedView:
                        owner = item._bp_owner
                        if owner.buffer.token != owner.token:
                            raise _stale(owner, func)
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__deepcopy__:
                return typing.cast("torch.Tensor", args[0]).clone()
            result = func(*args, **kwargs)
        if owner is None:
            return result
        if func in _TO_NUMPY and isinstance(result, np.ndarray):
            return _guard_array(result, owner.buffer)
        if isinstance(result, torch.Tensor):
            return _guard_if_view(result, owner)
        if type(result) in (tuple, list):  # split, chunk, unbind, tensor_split: views too
            items = typing.cast("Sequence[object]", result)
            guarded = [
                _guard_if_view(item, owner) if isinstance(item, torch.Tensor) else item
                for item in items
            ]
            return tuple(guarded) if type(result) is tuple else guarded
        return result


def guarded_views(buffer: Buffer, token: int, n: int) -> tuple[torch.Tensor, ...]:
    """Cut three guarded views of *n* entries for the hand-out *token* of *buffer*."""
    owner = _Owner(buffer, token, n, buffer.site)
    capacity = buffer.bucket.capacity
    views = []
    for field in range(3):
        with torch._C.DisableTorchFunctionSubclass():
            plain = buffer.base[field * capacity : field * capacity + n]
        view = plain.as_subclass(GuardedView)
        view._bp_owner = owner
        views.append(view)
    return tuple(views)


def guarded_arrays(buffer: Buffer, n: int) -> DescriptorArrays:
    """Numpy arrays of the first *n* entries for a strict hand-out, made read-only at its end."""
    src, dst, sizes = buffer.arrays
    return (
        _guard_array(src[:n], buffer),
        _guard_array(dst[:n], buffer),
        _guard_array(sizes[:n], buffer),
    )


def _guard_array(array: np.ndarray[Any, Any], buffer: Buffer) -> Any:
    guarded = array.view(GuardedArray)
    low = buffer.storage.data_ptr()  # where the memory is now (share_memory_ moves it)
    guarded._bp_guard = (buffer.handed, low, low + buffer.storage.nbytes())
    buffer.handed.append(guarded)
    return guarded


def _guard_if_view(result: torch.Tensor, owner: _Owner) -> torch.Tensor:
    try:
        with torch._C.DisableTorchFunctionSubclass():  # the buffer's storage, wherever it is
            shares = result.untyped_storage()._cdata == owner.buffer.storage._cdata
    except (RuntimeError, NotImplementedError):  # sparse, meta, ...: not a view of ours
        return result
    if not shares:
        return result
    view = result.as_subclass(GuardedView)
    view._bp_owner = owner
    return view


def _stale(owner: _Owner, func: Callable[..., object]) -> UseAfterReleaseError:
    name = getattr(func, "__name__", repr(func))
    return UseAfterReleaseError(
        f"{name}: a view of {describe(owner.n, owner.site)} was used after the hand-out "  # type: ignore[arg-type]
        "ended (its with block exited or the handle was released). Use views only while the "
        "handle is held; copy data out with tensor.clone() to keep it"
    )
