"""Debug verification: call sites, the poison in idle buffers, checksums of descriptors in flight.

Nothing here decides who holds a buffer.  The pool calls these at the debug levels
``checks`` and ``strict`` (and `site` when tracing); `verify` runs inside the ledger's
`settle`, on the pool's own memory, and calls no user code.  What they find is reported
to the code that caused it.
"""

from __future__ import annotations

import os
import sys
import traceback
import zlib
from types import CodeType, FrameType
from typing import TYPE_CHECKING

from bucketpool._types import DescriptorArrays

if TYPE_CHECKING:
    from bucketpool._buffer import Buffer

__all__ = [
    "Site",
    "check_poison",
    "checksum",
    "code_line",
    "describe",
    "format_site",
    "in_flight_problem",
    "in_package",
    "line_of",
    "site",
    "verify",
]

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
    if token > 0 and buffer.handed:
        for array in buffer.handed:
            array.flags.writeable = False
        buffer.handed = []  # a new list: arrays derived from stale ones join the old one
    if not caching:
        return None
    if (
        buffer.checksum is not None
        and token < 0
        and buffer.checksum != checksum(buffer.arrays, buffer.span)
    ):
        which = describe(buffer.span, buffer.site, buffer.released_at)  # type: ignore[arg-type]
        problem = (
            f"the descriptors of {which} changed between record_event() and the "
            "completion of its events: a copy in flight may have read the new values. "
            "Fill descriptors before recording the event, keep no views past the with "
            "block, or acquire another buffer"
        )
    buffer.checksum = None
    buffer.arrays[2][: buffer.span].fill(0)
    buffer.poisoned = buffer.span
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
        f"record_event: the descriptors of {describe(buffer.span, buffer.site)} "  # type: ignore[arg-type]
        "changed while an earlier recorded copy could still read them; the new event was "
        "recorded. Fill descriptors only before recording an event"
    )
