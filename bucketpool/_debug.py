"""The debug levels: call sites, poison, checksums, strict's guarded views (see docs/)."""

from __future__ import annotations

import os
import sys
import traceback
import typing
import weakref
import zlib
from collections.abc import Callable, Sequence
from types import CodeType, FrameType
from typing import Any, SupportsIndex

import numpy as np
import torch

from bucketpool._errors import UseAfterReleaseError

__all__ = [
    "check_poison",
    "checksum",
    "code_line",
    "end_arrays",
    "format_site",
    "guarded",
    "guarded_arrays",
    "guarded_views",
    "in_flight_problem",
    "in_package",
    "line_of",
    "site",
    "verify",
]

Buffer = Any  # a `bucketpool._buffer.Buffer` (that module imports this one)
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep
_zeros = [b""]  # the poison to compare with (swapped whole, never mutated)
#: A code object's instruction (its line looked up when shown), file and line, stack, unknown.
Site = tuple[CodeType, int] | tuple[str, int] | traceback.StackSummary | None


def site(full_stack: bool) -> Site:
    """Return the caller's first frame outside this package (or the stack from there)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is not None and full_stack:
        return traceback.extract_stack(frame)
    return None if frame is None else (frame.f_code, frame.f_lasti)  # no line decoded yet


def in_package(code: CodeType) -> bool:
    return code.co_filename.startswith(_PACKAGE_DIR)


def code_line(code: object, lasti: int) -> tuple[str, int] | None:
    """Return the file and line of instruction *lasti* of *code*."""
    if not isinstance(code, CodeType):
        return None
    found = (n for start, end, n in code.co_lines() if start <= lasti < end and n is not None)
    return (code.co_filename, next(found, code.co_firstlineno))


def line_of(where: Site) -> tuple[str, int] | None:
    """Return the file and line of *where* (a stack's innermost frame), if known."""
    if where is None:
        return None
    if isinstance(where, traceback.StackSummary):
        return (where[-1].filename, where[-1].lineno or 0)
    place, number = where
    return code_line(place, number) if isinstance(place, CodeType) else (place, number)


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
    at = f"n={n}, acquired at {format_site(acquired)}"
    return f"a buffer ({at}{'' if released is None else f', released at {format_site(released)}'})"


def checksum(arrays: Sequence[Any], n: int) -> int:
    value = 0
    for array in arrays:
        value = zlib.crc32(array[:n].data, value)
    return value


def verify(buffer: Buffer, token: int, caching: bool) -> tuple[str | None, Any]:
    """(in `settle`, before its move) Check the checksum of a buffer to cache; change nothing.

    Returns the problem found and the sizes to poison, which the move changes with the rest.
    """
    if not caching:
        return None, None
    problem, stored, arrays = None, buffer.checksum, buffer.arrays
    if stored is not None and token < 0 and stored != checksum(arrays, buffer.n):
        problem = (
            f"the descriptors of {describe(buffer.n, buffer.site, buffer.released_at)} changed "
            "between record_event() and the completion of its events: a copy in flight may have "
            "read the new values. Fill descriptors before recording the event, keep no views "
            "past the with block, or acquire another buffer"
        )
    return problem, arrays[2]


def end_arrays(buffer: Buffer) -> None:
    """(after the move that ended strict hand-outs) Make their arrays read-only; forget them."""
    ended = buffer.ended
    for handed in ended:  # the lists themselves: arrays derived meanwhile are marked too
        for ref in handed:
            if (array := ref()) is not None:
                array.flags.writeable = False
    ledger = buffer.ledger()
    if ledger is not None:  # (its pool gone: no holder comes)
        ledger.forget_ended(buffer, ended)  # not those of hand-outs ended since: marked next


def check_poison(buffer: Buffer) -> str | None:
    """(the new holder, its sites not yet recorded) Return a message if the poison was written."""
    poisoned = buffer.poisoned
    if not poisoned:
        return None
    data = buffer.arrays[2][:poisoned].tobytes()
    zeros = _zeros[0]
    if len(zeros) != len(data):  # one size kept: a repeated n makes no new one
        _zeros[0] = zeros = bytes(len(data))
    if data == zeros:
        return None
    return (
        f"a buffer of capacity {buffer.bucket.capacity} was written after its release, through "
        f"a stale view of {describe(poisoned, buffer.site, buffer.released_at)}. Keep views only "
        "inside the handle's with block (copy data out with tensor.clone()); the new holder is "
        "not affected"
    )


def in_flight_problem(buffer: Buffer) -> str:
    return (
        f"record_event: the descriptors of {describe(buffer.n, buffer.site)} "
        "changed while an earlier recorded copy could still read them; the new event was "
        "recorded. Fill descriptors only before recording an event"
    )


class _Owner(typing.NamedTuple):  # the hand-out a guarded view belongs to
    buffer: Buffer
    token: int
    n: int
    site: Site


#: What a stale view may still do (print itself), and what returns arrays of its memory.
_HARMLESS = frozenset({torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.__str__})
_TO_NUMPY: frozenset[object] = frozenset((torch.Tensor.numpy, torch.Tensor.__array__))
_Guard = tuple[list["weakref.ref[np.ndarray[Any, Any]]"], int, int]  # arrays to end, memory range


class GuardedArray(np.ndarray):
    """A numpy array of a strict hand-out's memory (or derived from one), read-only at its end."""

    _bp_guard: _Guard | None = None

    def __array_finalize__(self, obj: object) -> None:
        guard: _Guard | None = getattr(obj, "_bp_guard", None)
        if guard is not None and guard[1] <= self.__array_interface__["data"][0] < guard[2]:
            self._bp_guard = guard
            guard[0].append(weakref.ref(self))  # not a derived array with memory of its own
            if not getattr(obj, "flags", self.flags).writeable:  # its source ended meanwhile
                self.flags.writeable = False


@typing.final
class GuardedView(torch.Tensor):
    """A view of a pool buffer (or cut from one): `UseAfterReleaseError` after its hand-out."""

    _bp_owner: _Owner

    @classmethod
    def __torch_function__(
        cls, func: Callable[..., Any], types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> object:
        """Check the hand-out of every guarded argument, run *func*, guard what it returns."""
        owner, kwargs = None, kwargs or {}
        if func not in _HARMLESS:
            for value in (*args, *kwargs.values()):
                for item in value if isinstance(value, (list, tuple)) else (value,):
                    if type(item) is GuardedView:
                        owner = item._bp_owner
                        if owner.buffer.token != owner.token:
                            raise _stale(owner, func)
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__deepcopy__:
                return args[0].clone()
            result = func(*args, **kwargs)
        if owner is None:
            return result
        if func in _TO_NUMPY and isinstance(result, np.ndarray):
            return _guard_array(result, owner.buffer)
        if type(result) in (tuple, list):  # split, chunk, unbind, tensor_split: views too
            guarded = [_guard_if_view(item, owner) for item in typing.cast("list[object]", result)]
            return tuple(guarded) if type(result) is tuple else guarded
        return _guard_if_view(result, owner)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        """Pickle as a plain tensor: the guard (and its hand-out's code objects) stays here."""
        plain: Any = self.as_subclass(torch.Tensor)
        return plain.__reduce_ex__(protocol)


def guarded_views(buffer: Buffer, token: int, n: int) -> tuple[torch.Tensor, ...]:
    """Cut three guarded views of *n* entries for the hand-out *token* of *buffer*."""
    owner = _Owner(buffer, token, n, buffer.site)
    capacity = buffer.bucket.capacity
    with torch._C.DisableTorchFunctionSubclass():
        plains = [buffer.base[field * capacity : field * capacity + n] for field in range(3)]
    return tuple(_guarded(plain, owner) for plain in plains)


def guarded(tensors: Sequence[torch.Tensor], buffer: Buffer, token: int) -> tuple[Any, ...]:
    """*tensors* of *buffer*'s whole fields as guarded views of hand-out *token*."""
    owner = _Owner(buffer, token, buffer.bucket.capacity, buffer.site)
    return tuple(_guarded(tensor, owner) for tensor in tensors)


def guarded_arrays(buffer: Buffer, n: int) -> tuple[Any, Any, Any]:
    """Numpy arrays of the first *n* entries for a strict hand-out."""
    src, dst, sizes = (_guard_array(array[:n], buffer) for array in buffer.arrays)
    return (src, dst, sizes)


def _guard_array(array: np.ndarray[Any, Any], buffer: Buffer) -> Any:
    guarded = array.view(GuardedArray)
    low = buffer.storage.data_ptr()  # where the memory is now (share_memory_ moves it)
    guarded._bp_guard = (buffer.handed, low, low + buffer.storage.nbytes())
    buffer.handed.append(weakref.ref(guarded))  # weakly: a cycle would keep freed memory
    return guarded


def _guard_if_view(result: object, owner: _Owner) -> object:
    if not isinstance(result, torch.Tensor):
        return result
    storage = owner.buffer.storage  # the buffer's memory, wherever it is now
    low = storage.data_ptr()
    try:  # a storage in it: the buffer's own, or one made over it (`_handle.holding`)
        with torch._C.DisableTorchFunctionSubclass():
            shares = low <= result.untyped_storage().data_ptr() < low + storage.nbytes()
    except (RuntimeError, NotImplementedError):  # sparse, meta, ...: not a view of ours
        return result
    return _guarded(result, owner) if shares else result


def _guarded(tensor: torch.Tensor, owner: _Owner) -> GuardedView:
    view = tensor.as_subclass(GuardedView)
    view._bp_owner = owner
    return view


def _stale(owner: _Owner, func: Callable[..., object]) -> UseAfterReleaseError:
    name = getattr(func, "__name__", repr(func))
    return UseAfterReleaseError(
        f"{name}: a view of {describe(owner.n, owner.site)} was used after the hand-out "
        "ended (its with block exited or the handle was released). Use views only while the "
        "handle is held; copy data out with tensor.clone() to keep it"
    )
