"""The floor case: the least a sound pure-Python pool does per op, timed beside the pools.

Two skeletons that keep what a sound pool cannot do without, and nothing else: one size, no
buckets, no counters, caps, events, debug levels or sweeps. Where they do less than
bucketpool does for soundness (`FloorCompat` hands out the views its tuples were made with,
unchecked; no view set is ever repaired, only cut anew), they are cheaper for it: a floor
that errs low, so that a goal below it is below what any sound pool of this design can do.

* `FloorPool` (the ``with pool.acquire(n)`` path): one locked section per op that checks
  the returned entry's token and binds a new token to a handle made before it; views cached
  per buffer and checked against the buffer's version counter; the release queued without
  the lock; a finaliser that takes a dropped handle's buffer back; the acquire's site kept.
* `FloorCompat` (the original's API): the same hand-out, with a fresh tuple per hand-out
  held by ``id()`` and a finaliser on it, so that a stale release is refused; the release
  claims the hand-out in a second locked section, so that of two releases one takes effect.
* `FloorCompatPop`: `FloorCompat` claiming with one ``dict.pop`` instead, which this
  project's rules forbid; timed to show what breaking them would buy.

Each pool of the benchmark is timed against them in the same rounds, so that a goal below
a skeleton's figure is a goal below the floor, not a figure to optimise towards.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading
import typing
from collections.abc import Callable
from typing import NamedTuple

import torch

from bench._cases import HOT_N, ops_for, ratio_of
from bench._original import OriginalDescriptorBufferPool
from bench._pools import handle_ops
from bench._stats import Measurement, time_ns
from bucketpool import BucketPool
from bucketpool.compat import DescriptorBufferPool

__all__ = ["FloorCase", "FloorCompat", "FloorCompatPop", "FloorPool"]

_LOCK = threading.RLock()
_inside = _LOCK._is_owned  # type: ignore[attr-defined]
_new = object.__new__
_getframe = sys._getframe


class _Triple(NamedTuple):
    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor


class _Buffer:
    __slots__ = ("base", "code", "inbox", "lasti", "n", "token", "version", "views", "whole")

    def __init__(self, capacity: int, inbox: collections.deque[_Entry]) -> None:
        self.base = torch.empty(3 * capacity, dtype=torch.int64)
        self.version = self.base._version
        base = self.base
        self.whole = _Triple(base[:capacity], base[capacity : 2 * capacity], base[2 * capacity :])
        self.views: dict[int, _Triple] = {}
        self.inbox = inbox
        self.token = self.n = self.lasti = 0
        self.code: object = None

    def views_for(self, n: int) -> _Triple:
        views = self.views.get(n)
        if views is None or self.base._version != self.version:
            base, capacity = self.base, len(self.whole.sizes)
            views = _Triple(base[:n], base[capacity : capacity + n], base[2 * capacity :][:n])
            self.views = {n: views}
            self.version = base._version
        return views


#: An inbox entry: the buffer, the hand-out's token, and the tuple its next hand-out gets.
_Entry = tuple[_Buffer, int, "tuple[object, int] | None"]


class _Core:
    """One bucket of one size: its buffers, the tick, the one move."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tick = 0
        #: Returning and cached buffers alike, oldest first (no caps: nothing is freed).
        self.inbox: collections.deque[_Entry] = collections.deque()

    def serve(self, holder: object, n: int, code: object, lasti: int) -> object:
        """Returning -> held by *holder* (a handle, or None: the entry's tuple); None if not."""
        with _LOCK:
            inbox = self.inbox
            if not inbox:
                return None
            buffer, token, following = inbox[0]
            if holder is None and following is None:  # no tuple to hand out (never here)
                return None
            del inbox[0]
            if buffer.token != token:  # a stale entry: nothing to take back
                return None
            self.tick = token = self.tick + 1
            buffer.token = token
            buffer.n = n
            buffer.code = code
            buffer.lasti = lasti
            if following is not None:  # a compat hand-out: its tuple is the holder
                held, holder_id = following
                _HELD[holder_id] = (buffer, token)
                return held
            holder._buffer = buffer  # type: ignore[attr-defined]
            holder._token = token  # type: ignore[attr-defined]
            return holder

    def claim(
        self, buffer: _Buffer, token: int, holder_id: int, following: tuple[object, int]
    ) -> bool:
        """Held by the tuple *holder_id* -> returning; False if that hand-out was over."""
        with _LOCK:
            if buffer.token != token or holder_id not in _HELD:
                return False
            del _HELD[holder_id]
            self.inbox += ((buffer, token, following),)
            return True


@typing.final
class _Handle:
    __slots__ = ("_buffer", "_token")

    _buffer: _Buffer
    _token: int

    def __copy__(self) -> typing.NoReturn:
        raise TypeError("a handle has one holder: it is not copied")

    def __deepcopy__(self, memo: object) -> typing.NoReturn:
        raise TypeError("a handle has one holder: it is not copied")

    def __reduce_ex__(self, protocol: typing.SupportsIndex) -> typing.NoReturn:
        raise TypeError("a handle has one holder: it is not pickled")

    def __del__(self) -> None:
        token = self._token
        if token > 0 and self._buffer.token == token:
            self._buffer.inbox.append((self._buffer, token, None))

    def __enter__(self) -> _Triple:
        buffer = self._buffer
        token = self._token
        if token <= 0 or buffer.token != token:
            raise RuntimeError("released")
        return buffer.views_for(buffer.n)

    def __exit__(self, *exc: object) -> None:
        buffer = self._buffer
        token = self._token
        if token <= 0 or buffer.token != token:
            raise RuntimeError("released")
        self._token = 0
        buffer.inbox.append((buffer, token, None))


@typing.final
class FloorPool:
    """The skeleton of ``with pool.acquire(n) as bufs:`` (see the module docstring)."""

    def __init__(self, capacity: int = 2048) -> None:
        self._core = _Core(capacity)

    def acquire(self, n: int) -> _Handle:
        """A handle whose views have *n* entries."""
        if type(n) is not int or not 0 <= n <= self._core.capacity:
            raise ValueError(n)
        if _inside():
            raise RuntimeError("called from inside the pool")
        frame = _getframe(1)
        handle = _new(_Handle)
        handle._token = 0
        core = self._core
        while core.serve(handle, n, frame.f_code, frame.f_lasti) is None:
            if not core.inbox:  # a new buffer joins the queue (deque appends need no lock)
                core.inbox.append((_Buffer(core.capacity, core.inbox), 0, None))
        return handle


_HELD: dict[int, tuple[_Buffer, int]] = {}


class _Held(_Triple):
    __slots__ = ()

    def __del__(self) -> None:
        record = _HELD.get(id(self))
        if record is not None:  # dropped while it held the buffer: queue it, then let go
            buffer, token = record
            buffer.inbox.append((buffer, token, _fresh(buffer)))
            _HELD.pop(id(self), None)


def _fresh(buffer: _Buffer) -> tuple[_Held, int]:
    held = tuple.__new__(_Held, buffer.whole)
    return held, id(held)


@typing.final
class FloorCompat:
    """The skeleton of the original's API with a fresh tuple per hand-out."""

    def __init__(self, capacity: int = 2048) -> None:
        self._core = _Core(capacity)

    def acquire(self, n: int) -> _Triple:
        """The whole buffer, as a tuple of its own; slice ``[:n]``."""
        if type(n) is not int or not 0 <= n <= self._core.capacity:
            raise ValueError(n)
        if _inside():
            raise RuntimeError("called from inside the pool")
        frame = _getframe(1)
        core = self._core
        while True:
            held = core.serve(None, n, frame.f_code, frame.f_lasti)
            if held is not None:
                return typing.cast("_Triple", held)
            if not core.inbox:
                buffer = _Buffer(core.capacity, core.inbox)
                core.inbox.append((buffer, 0, _fresh(buffer)))

    def release(self, bufs: _Triple) -> None:
        """Give *bufs* back; a stale or double release raises and changes nothing."""
        record = _HELD.get(id(bufs))
        if record is None or type(bufs) is not _Held or record[0].token != record[1]:
            raise RuntimeError("not held")
        buffer, token = record
        # Claimed in one locked section, so that of two releases exactly one takes effect.
        if not self._core.claim(buffer, token, id(bufs), _fresh(buffer)):
            raise RuntimeError("released already")


@typing.final
class FloorCompatPop:
    """`FloorCompat` with the claim made by one ``dict.pop`` instead of a locked section.

    Not sound by this project's rules (it rests on ``dict.pop`` being atomic, and a signal
    between the pop and the append strands the buffer): timed only to show what breaking
    them would buy.
    """

    def __init__(self, capacity: int = 2048) -> None:
        self._compat = FloorCompat(capacity)
        self.acquire = self._compat.acquire

    def release(self, bufs: _Triple) -> None:
        """Give *bufs* back (see the class docstring)."""
        record = _HELD.get(id(bufs))
        if record is None or type(bufs) is not _Held or record[0].token != record[1]:
            raise RuntimeError("not held")
        buffer, token = record
        following = _fresh(buffer)
        if _HELD.pop(id(bufs), None) is None:
            raise RuntimeError("released already")
        buffer.inbox.append((buffer, token, following))


_Sliced = OriginalDescriptorBufferPool | DescriptorBufferPool | FloorCompat | FloorCompatPop


def _sliced(pool: _Sliced, ops: int) -> None:
    acquire, release, n = pool.acquire, pool.release, HOT_N
    for _ in range(ops):
        bufs = acquire(n)
        _src, _dst, _sizes = bufs.src_ptrs[:n], bufs.dst_ptrs[:n], bufs.sizes[:n]
        release(bufs)  # type: ignore[arg-type]


def _with(pool: BucketPool | FloorPool, ops: int) -> None:
    handle_ops(pool, HOT_N, ops, None)  # type: ignore[arg-type]


@typing.final
class FloorCase:
    """The skeletons beside the original, bucketpool and compat, at n = `HOT_N`."""

    def __init__(self, min_pass_ns: int, max_ops: int) -> None:
        self.name = "floor"
        self.description = (
            f"n = {HOT_N:,} every op: the least a sound pool does (one locked section per op, "
            "tokens, a finaliser; compat: a fresh tuple per hand-out), beside the pools"
        )
        names = ("original", "bucketpool", "floor-with", "compat", "floor-compat", "floor-pop")
        self.samples: dict[str, list[float]] = {name: [] for name in names}
        self._min_pass_ns = min_pass_ns
        self._max_ops = max_ops
        self._runs: dict[str, Callable[[], None]] = {}
        self._ops = 0

    def setup(self) -> None:
        """Make the pools, warm each up, size the passes on the original."""
        runs: dict[str, Callable[[int], None]] = {
            "original": functools.partial(_sliced, OriginalDescriptorBufferPool()),
            "bucketpool": functools.partial(_with, BucketPool()),
            "floor-with": functools.partial(_with, FloorPool()),
            "compat": functools.partial(_sliced, DescriptorBufferPool()),
            "floor-compat": functools.partial(_sliced, FloorCompat()),
            "floor-pop": functools.partial(_sliced, FloorCompatPop()),
        }
        for run in runs.values():
            run(1_000)
        self._ops = ops = ops_for(runs["original"], self._min_pass_ns, self._max_ops)
        self._runs = {name: functools.partial(run, ops) for name, run in runs.items()}

    def round(self) -> None:
        """One timed pass of each, back to back."""
        for name, run in self._runs.items():
            self.samples[name].append(time_ns(run) / self._ops)

    def close(self) -> None:
        """Drop the pools."""
        self._runs = {}

    def measurements(self) -> dict[str, Measurement]:
        """Each pool and skeleton as a ratio to the original, and each pool to its floor."""
        samples = self.samples
        return {
            "bucketpool/original": ratio_of(samples, "bucketpool", "original"),
            "floor-with/original": ratio_of(samples, "floor-with", "original"),
            "bucketpool/floor-with": ratio_of(samples, "bucketpool", "floor-with"),
            "compat/original": ratio_of(samples, "compat", "original"),
            "floor-compat/original": ratio_of(samples, "floor-compat", "original"),
            "compat/floor-compat": ratio_of(samples, "compat", "floor-compat"),
            "floor-pop/original": ratio_of(samples, "floor-pop", "original"),
        }
