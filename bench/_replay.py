"""Replay files (``--replay FILE``): the user's own workload, read into a `bench._traces.Trace`.

One event per line::

    # a comment; blank lines are ignored, and so is anything after '#'
    acquire 1196      # acquire #0: 1,196 entries
    acquire 64        # acquire #1
    release 0         # release the handle of acquire #0
    release 1

``N`` is 0..16,777,216 and ``ID`` is the 0-based index of an earlier acquire not yet
released.  Handles still live at the end of the file are released in acquire order.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

import attrs

from bench._traces import Trace

__all__ = ["MIN_BATCH_OPS", "REPLAY_MAX_N", "ReplayError", "load_replay", "parse_replay"]

REPLAY_MAX_N = 1 << 24
#: A replayed trace is repeated until a timed pass has at least this many acquires.
MIN_BATCH_OPS = 1_000


class ReplayError(ValueError):
    """A replay file cannot be read or has a bad line; the message names file and line."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line


_NUMBER = re.compile(r"[0-9]+")


def parse_replay(text: str, source: str = "<replay>") -> Trace:
    """Parse replay *text* (the format is in the module docstring) into a trace.

    Args:
        text: the file's contents.
        source: the file name used in errors and in the trace's name.

    Returns:
        A trace named ``replay:<file name>``, with a byte recording for the plot.

    Raises:
        ReplayError: a line is not ``acquire N`` or ``release ID`` with valid numbers, a
            release names an acquire that is unknown or already released, or there is no
            acquire at all.
    """
    events: list[int] = []
    live: set[int] = set()
    acquires = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.partition("#")[0].split()
        if not words:
            continue
        if len(words) != 2 or words[0] not in ("acquire", "release"):
            raise ReplayError(
                source, number, f"expected 'acquire N' or 'release ID', got {raw.strip()[:60]!r}"
            )
        keyword, value = words
        if not _NUMBER.fullmatch(value):
            raise ReplayError(source, number, f"{keyword} needs a number >= 0, got {value!r}")
        count = int(value)
        if keyword == "acquire":
            if count > REPLAY_MAX_N:
                raise ReplayError(
                    source, number, f"acquire {count:,} is above the limit {REPLAY_MAX_N:,}"
                )
            events.append(count)
            live.add(acquires)
            acquires += 1
        elif count not in live:
            state = "was already released" if count < acquires else "has not happened yet"
            raise ReplayError(
                source, number, f"release {count}: acquire #{count} {state} (IDs count from 0)"
            )
        else:
            live.remove(count)
            events.append(~count)
    if not acquires:
        raise ReplayError(source, None, "no 'acquire N' line")
    events.extend(~i for i in sorted(live))
    name = f"replay:{Path(source).name}"
    return Trace(name, f"replayed from {source}", tuple(events), record_bytes=True)


def load_replay(path: str | os.PathLike[str], min_ops: int = MIN_BATCH_OPS) -> Trace:
    """Read and parse a replay file, repeated end to end up to at least *min_ops* acquires.

    Repeating a short file makes each timed pass long enough to time; every repetition
    acquires and releases exactly what the file does.

    Raises:
        ReplayError: the file cannot be read or is not valid (see `parse_replay`).
    """
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ReplayError(source, None, f"cannot read the replay file: {reason}") from None
    trace = parse_replay(text, source)
    times = max(1, math.ceil(min_ops / trace.ops))
    if times == 1:
        return trace
    return attrs.evolve(
        trace,
        description=f"{trace.description}, {trace.ops:,} acquires repeated {times} times",
        events=_tile(trace.events, trace.ops, times),
    )


def _tile(events: Sequence[int], ops: int, times: int) -> tuple[int, ...]:
    """Repeat *events* (with *ops* acquires) *times* times, renumbering the releases."""
    tiled: list[int] = []
    for shift in range(0, ops * times, ops):
        tiled.extend(event if event >= 0 else ~(~event + shift) for event in events)
    return tuple(tiled)
