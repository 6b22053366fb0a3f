"""Debug checks: poison in idle buffers, checksums of descriptors in flight, call sites.

Nothing here takes the pool's lock or decides who holds a buffer; the pool calls these
functions at the debug levels ``checks`` and ``strict`` (and `site` when tracing) and
reports what they find to the code that caused it.
"""

from __future__ import annotations

import os
import sys
import traceback
import zlib
from types import FrameType

import numpy as np
import numpy.typing as npt

__all__ = ["POISON", "Site", "checksum", "describe", "format_site", "poison", "poisoned", "site"]

#: Pointer entries of an idle buffer hold this pattern at the debug levels; sizes hold 0, so
#: a stale batched copy moves nothing.
POISON = 0xDEADBEEF_DEADBEEF
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep

#: Where something happened: file and line, the whole stack (``trace=True``), or unknown.
Site = tuple[str, int] | traceback.StackSummary | None
_Arrays = tuple[npt.NDArray[np.integer], ...]


def site(full_stack: bool) -> Site:
    """Return where the caller outside this package is (file and line, or the whole stack)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    if full_stack:
        return traceback.extract_stack(frame)
    return (frame.f_code.co_filename, frame.f_lineno)


def format_site(where: Site) -> str:
    """Return *where* for a message; say how to record sites when it is unknown."""
    if where is None:
        return "<unknown: make the pool with trace=True or debug='checks' to record sites>"
    if isinstance(where, traceback.StackSummary):
        return "\n" + "".join(where.format())
    return f"{where[0]}:{where[1]}"


def describe(n: int, acquired: Site, released: Site = None) -> str:
    """Say which hand-out: ``a buffer (n=5, acquired at f.py:3, released at f.py:9)``."""
    parts = [f"n={n}", f"acquired at {format_site(acquired)}"]
    if released is not None:
        parts.append(f"released at {format_site(released)}")
    return f"a buffer ({', '.join(parts)})"


def checksum(arrays: _Arrays, n: int) -> int:
    """Return a CRC of the first *n* entries of the three fields."""
    value = 0
    for array in arrays:
        value = zlib.crc32(array[:n].data, value)
    return value


def poison(arrays: _Arrays, n: int) -> None:
    """Fill the first *n* entries with the poison pattern (sizes with 0)."""
    src, dst, sizes = arrays
    src[:n].view(np.uint64)[:] = POISON
    dst[:n].view(np.uint64)[:] = POISON
    sizes[:n] = 0


def poisoned(arrays: _Arrays, n: int) -> bool:
    """Return whether the first *n* entries still hold the poison pattern."""
    src, dst, sizes = arrays
    return bool(
        (src[:n].view(np.uint64) == POISON).all()
        and (dst[:n].view(np.uint64) == POISON).all()
        and not sizes[:n].any()
    )
