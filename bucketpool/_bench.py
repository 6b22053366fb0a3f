"""The benchmark behind ``python -m bucketpool bench``: traces, runner, results, reports.

Three implementations run in one process, interleaved run by run, on the same traces:

* ``original``: `~bucketpool._baseline.OriginalDescriptorBufferPool`, called as vLLM's
  worker calls it (acquire, three ``[:n]`` slices, release);
* ``bucketpool``: `~bucketpool.BucketPool`, called as ``with pool.acquire(n) as bufs:``;
* ``compat``: `bucketpool.compat.DescriptorBufferPool`, called exactly as ``original``.

A trace is a sequence of events: an int ``n >= 0`` acquires ``n`` entries and ``~i``
(``-1 - i``) releases the handle of the ``i``-th acquire (0-based).  An op is one
acquire, its views and its release.  Each implementation gets a fresh pool per trace, runs
the trace once untimed (the warm-up), then ``repeats`` timed passes interleaved with the
others; the garbage collector is off during each timed pass.

Replay files (``--replay FILE``) hold one event per line::

    # a comment; blank lines are ignored, and so is anything after '#'
    acquire 1196      # acquire #0: 1,196 entries
    acquire 64        # acquire #1
    release 0         # release the handle of acquire #0
    release 1

``N`` is 0..16,777,216 and ``ID`` is the 0-based index of an earlier acquire not yet
released.  Handles still live at the end of the file are released in acquire order.

Nothing here is thread-safe; run one benchmark at a time.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.metadata
import json
import math
import os
import platform
import random
import re
import time
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol, TypeVar

import attrs
import numpy as np
import numpy.typing as npt
import torch

from bucketpool._baseline import OriginalDescriptorBufferPool
from bucketpool._pool import BucketPool, BufferHandle
from bucketpool.compat import DescriptorBufferPool

__all__ = [
    "DEFAULT_OPS",
    "DEFAULT_REPEATS",
    "IMPLEMENTATIONS",
    "MIN_BATCH_OPS",
    "QUICK_OPS",
    "QUICK_REPEATS",
    "SELECTIONS",
    "BenchResult",
    "BenchSettings",
    "FillResult",
    "ImplResult",
    "Implementation",
    "Memory",
    "Note",
    "Progress",
    "ReplayError",
    "Target",
    "Trace",
    "TraceResult",
    "builtin_traces",
    "compute_targets",
    "format_bytes",
    "format_ns",
    "format_ratio",
    "format_value",
    "load_replay",
    "make_implementations",
    "matplotlib_available",
    "parse_replay",
    "plot",
    "render_table",
    "run_benchmark",
    "run_fills",
    "run_trace",
    "select_traces",
    "to_json",
    "windowed_events",
    "write_json",
]

#: The implementations compared, in the order they run and are reported.
IMPLEMENTATIONS = ("original", "bucketpool", "compat")
DEFAULT_REPEATS = 7
QUICK_REPEATS = 3
#: Ops per built-in trace (one op: acquire, views, release).
DEFAULT_OPS = 30_000
QUICK_OPS = 5_000
#: The spike trace is capped at this many ops: long enough for the idle trim to show.
SPIKE_OPS = 4_000
SPIKE_N = 1 << 20
FILL_COPIES = 1_024
#: One encoder-cache block: one token's embedding row (3,584 bf16 values of a 7B model).
BLOCK_BYTES = 7_168
IMAGE_BLOCKS = 1_196
REPLAY_MAX_N = 1 << 24
#: A replayed trace is repeated until a timed pass has at least this many acquires.
MIN_BATCH_OPS = 1_000
ENTRY_BYTES = 3 * 8  # one descriptor: three int64 entries

_REPEATED_SIZES = (64, 1_196, 16_384)
_PARKED_N = 1_196
_PARKED_ELSEWHERE_N = 16_384
_PARKED_COUNT = 16
_LOGUNIFORM_WINDOWS = (1, 4, 16)
_LOGUNIFORM_MAX = 16_384
_TRACE_NAMES = (
    *(f"repeated-{n}" for n in _REPEATED_SIZES),
    "alternating",
    *(f"loguniform-w{w}" for w in _LOGUNIFORM_WINDOWS),
    "ramp",
    "spike",
    "encoder-cache",
    "parked-elsewhere",
)
#: What ``--trace`` accepts: a trace, a family (``repeated``, ``loguniform``) or ``fills``.
SELECTIONS = ("repeated", "loguniform", *_TRACE_NAMES, "fills")

_T = TypeVar("_T")
_Triple = TypeVar("_Triple", bound="_Fields")
Unit = Literal["x", "bytes", "count"]
#: Called with one line before each step of a run.
Progress = Callable[[str], None]


# -- traces ---------------------------------------------------------------------------------


def _count_acquires(events: Sequence[int]) -> int:
    return sum(1 for event in events if event >= 0)


def _peak_live_entries(events: Sequence[int]) -> int:
    sizes: list[int] = []
    live = peak = 0
    for event in events:
        if event >= 0:
            sizes.append(event)
            live += event
            peak = max(peak, live)
        else:
            live -= sizes[~event]
    return peak


def _cycle_sizes(events: Sequence[int]) -> tuple[int, ...] | None:
    """The sizes, if every acquire is released right away (the tight loop can run it)."""
    sizes = tuple(events[0::2])
    releases = events[1::2]
    if len(sizes) != len(releases) or any(n < 0 for n in sizes):
        return None
    if any(event != ~i for i, event in enumerate(releases)):
        return None
    return sizes


@typing.final
@attrs.frozen
class Trace:
    """A deterministic sequence of acquire and release events.

    Attributes:
        name: the name used by ``--trace`` and in reports.
        description: one line for the report's legend.
        events: ``n >= 0`` acquires ``n`` entries; ``~i`` releases the ``i``-th acquire.
        ratio_limit: the target for bucketpool's ns/op over original's, if any.
        steady: after the first pass, bucketpool should allocate nothing.
        bounded_final: bucketpool's final bytes should be within its cache cap.
        parked: handles acquired, given a never-done event and released (parked) before
            the run, by the implementations that can park (not ``original``).
        parked_n: the size of those parked handles (another bucket than the trace's).
        record_bytes: record bytes held after every op for the plot (a separate pass).
        ops: acquires in the trace.
        peak_requested_bytes: the most bytes live handles ask for at one time.
        cycle: the sizes when every acquire is released at once, else `None`.
    """

    name: str
    description: str
    events: tuple[int, ...]
    ratio_limit: float | None = None
    steady: bool = False
    bounded_final: bool = False
    parked: int = 0
    parked_n: int = 0
    record_bytes: bool = False
    ops: int = attrs.field(init=False, repr=False)
    peak_requested_bytes: int = attrs.field(init=False, repr=False)
    cycle: tuple[int, ...] | None = attrs.field(init=False, repr=False, eq=False)

    @ops.default
    def _ops_default(self) -> int:
        return _count_acquires(self.events)

    @peak_requested_bytes.default
    def _peak_default(self) -> int:
        return _peak_live_entries(self.events) * ENTRY_BYTES

    @cycle.default
    def _cycle_default(self) -> tuple[int, ...] | None:
        return _cycle_sizes(self.events)


def windowed_events(sizes: Sequence[int], window: int = 1) -> tuple[int, ...]:
    """Return the events that acquire *sizes* in order with *window* handles in flight.

    Each handle is released, oldest first, as soon as *window* handles are live, so with
    ``window=1`` every acquire is released at once.

    Raises:
        ValueError: *window* is below 1.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    events: list[int] = []
    oldest = 0
    for i, n in enumerate(sizes):
        events.append(n)
        if i + 1 - oldest >= window:
            events.append(~oldest)
            oldest += 1
    events.extend(~i for i in range(oldest, len(sizes)))
    return tuple(events)


def _loguniform(rng: random.Random, high: int, count: int) -> list[int]:
    top = math.log(high + 1)
    return [int(math.exp(rng.uniform(0.0, top))) for _ in range(count)]


def _encoder_steps(rng: random.Random, ops: int) -> list[int]:
    sizes: list[int] = []
    while len(sizes) < ops:  # a save, then a load, of 1-8 images each
        sizes.extend(rng.randint(1, 8) * IMAGE_BLOCKS + rng.randint(-8, 8) for _ in range(2))
    return sizes[:ops]


def builtin_traces(ops: int = DEFAULT_OPS, seed: int = 0) -> tuple[Trace, ...]:
    """Return the built-in traces, each seeded and deterministic.

    Args:
        ops: acquires per trace (the spike trace takes at most `SPIKE_OPS`).
        seed: mixed with each trace's name to seed its random numbers.

    Returns:
        The traces, in report order.

    Raises:
        ValueError: *ops* is below 1.
    """
    if ops < 1:
        raise ValueError(f"ops must be >= 1, got {ops}")

    def rng(name: str) -> random.Random:
        return random.Random(f"{seed}:{name}")

    traces = [
        Trace(
            f"repeated-{n}",
            f"n = {n:,} every op",
            windowed_events([n] * ops),
            ratio_limit=0.35,
            steady=True,
        )
        for n in _REPEATED_SIZES
    ]
    traces.append(
        Trace(
            "alternating",
            "n = 96 (loads) and 9,568 (saves), alternating",
            windowed_events(([96, 9_568] * ops)[:ops]),
            steady=True,
        )
    )
    traces.extend(
        Trace(
            f"loguniform-w{window}",
            f"log-uniform n in [1, {_LOGUNIFORM_MAX:,}], {window} in flight (FIFO)",
            windowed_events(
                _loguniform(rng(f"loguniform-w{window}"), _LOGUNIFORM_MAX, ops), window
            ),
            ratio_limit=1.0,
            steady=True,
        )
        for window in _LOGUNIFORM_WINDOWS
    )
    traces.append(
        Trace(
            "ramp",
            f"n growing from 1 to {_LOGUNIFORM_MAX:,}",
            windowed_events([1 + (_LOGUNIFORM_MAX - 1) * i // max(ops - 1, 1) for i in range(ops)]),
        )
    )
    spike_ops = min(ops, SPIKE_OPS)
    spike = _loguniform(rng("spike"), 2_048, spike_ops)
    spike[spike_ops // 10] = SPIKE_N
    traces.append(
        Trace(
            "spike",
            f"log-uniform n in [1, 2,048], one n = {SPIKE_N:,} at op {spike_ops // 10:,}",
            windowed_events(spike),
            bounded_final=True,
            record_bytes=True,
        )
    )
    traces.append(
        Trace(
            "encoder-cache",
            f"saves and loads of 1-8 images x {IMAGE_BLOCKS:,} blocks (+-8), 4 in flight",
            windowed_events(_encoder_steps(rng("encoder-cache"), ops), 4),
            steady=True,
        )
    )
    traces.append(
        Trace(
            "parked-elsewhere",
            f"n = {_PARKED_N:,} every op; {_PARKED_COUNT} handles of n = "
            f"{_PARKED_ELSEWHERE_N:,} parked on never-done events (not in original)",
            windowed_events([_PARKED_N] * ops),
            steady=True,
            parked=_PARKED_COUNT,
            parked_n=_PARKED_ELSEWHERE_N,
        )
    )
    return tuple(traces)


def select_traces(traces: Iterable[Trace], selections: Iterable[str]) -> tuple[Trace, ...]:
    """Return the traces named by *selections*, in the order of *traces*.

    A selection names a trace or a family: ``repeated`` selects every ``repeated-*``.
    ``fills`` selects no trace (it names the fill benchmark).

    Raises:
        ValueError: a selection matches nothing.
    """
    chosen = [name for name in selections if name != "fills"]
    available = tuple(traces)
    for name in chosen:
        if not any(_matches(trace.name, name) for trace in available):
            names = ", ".join(trace.name for trace in available)
            raise ValueError(f"no trace named {name!r}; traces: {names}")
    return tuple(trace for trace in available if any(_matches(trace.name, n) for n in chosen))


def _matches(trace_name: str, selection: str) -> bool:
    return trace_name == selection or trace_name.startswith(selection + "-")


# -- replay files ---------------------------------------------------------------------------


class ReplayError(ValueError):
    """A replay file cannot be read or has a bad line; the message names file and line."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line


_NUMBER = re.compile(r"[0-9]+")


def parse_replay(text: str, source: str = "<replay>") -> Trace:
    """Parse replay *text* (the format is in this module's docstring) into a trace.

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


# -- the three implementations behind one small interface -----------------------------------


@typing.final
@attrs.frozen
class Memory:
    """An implementation's memory counters at one moment.

    Attributes:
        allocations: buffer triples allocated so far.
        bytes_held: bytes of the triples the pool and its callers hold now.
        peak_bytes: the highest ``bytes_held`` so far.
    """

    allocations: int
    bytes_held: int
    peak_bytes: int


@typing.final
@attrs.frozen
class Implementation:
    """One pool, driven the way its callers drive it.

    Attributes:
        name: one of `IMPLEMENTATIONS`.
        cycle: the timed loop for traces whose handles are released at once.
        replay: the timed loop for any trace's events.
        record: an untimed pass over events that returns bytes held after each release.
        memory: the pool's counters now.
        park: parks ``count`` handles of ``n`` entries on never-done events, or `None`
            where the pool cannot defer reuse.
    """

    name: str
    cycle: Callable[[Sequence[int]], None]
    replay: Callable[[Sequence[int]], None]
    record: Callable[[Sequence[int]], tuple[int, ...]]
    memory: Callable[[], Memory]
    park: Callable[[int, int], None] | None


class _Fields(Protocol):
    @property
    def src_ptrs(self) -> torch.Tensor: ...
    @property
    def dst_ptrs(self) -> torch.Tensor: ...
    @property
    def sizes(self) -> torch.Tensor: ...


class _SlicingPool(Protocol[_Triple]):
    """The original pool's API, which the compat adapter also has."""

    def acquire(self, n: int, /) -> _Triple: ...
    def release(self, bufs: _Triple, /) -> None: ...


def _sliced_cycle(pool: _SlicingPool[_Triple], sizes: Sequence[int]) -> None:
    """The original's callers: acquire, cut three ``[:n]`` slices, release."""
    acquire = pool.acquire
    release = pool.release
    for n in sizes:
        bufs = acquire(n)
        _src, _dst, _sizes = bufs.src_ptrs[:n], bufs.dst_ptrs[:n], bufs.sizes[:n]
        release(bufs)


def _sliced_replay(pool: _SlicingPool[_Triple], events: Sequence[int]) -> None:
    acquire = pool.acquire
    release = pool.release
    live: dict[int, _Triple] = {}
    acquired = 0
    for event in events:
        if event >= 0:
            bufs = acquire(event)
            _src, _dst, _sizes = bufs.src_ptrs[:event], bufs.dst_ptrs[:event], bufs.sizes[:event]
            live[acquired] = bufs
            acquired += 1
        else:
            release(live.pop(~event))


def _sliced_acquire(pool: _SlicingPool[_Triple], n: int) -> _Triple:
    bufs = pool.acquire(n)
    _src, _dst, _sizes = bufs.src_ptrs[:n], bufs.dst_ptrs[:n], bufs.sizes[:n]
    return bufs


def _handle_cycle(pool: BucketPool, sizes: Sequence[int]) -> None:
    """The callers of a `BucketPool`: the views have exactly ``n`` entries, so nothing is sliced."""
    acquire = pool.acquire
    for n in sizes:
        with acquire(n) as bufs:
            _src, _dst, _sizes = bufs


def _handle_replay(pool: BucketPool, events: Sequence[int]) -> None:
    acquire = pool.acquire
    live: dict[int, BufferHandle] = {}
    acquired = 0
    for event in events:
        if event >= 0:
            handle = acquire(event)
            _src, _dst, _sizes = handle.buffers
            live[acquired] = handle
            acquired += 1
        else:
            live.pop(~event).release()


def _handle_acquire(pool: BucketPool, n: int) -> BufferHandle:
    handle = pool.acquire(n)
    _src, _dst, _sizes = handle.buffers
    return handle


def _record(
    acquire: Callable[[int], _T],
    release: Callable[[_T], None],
    memory: Callable[[], Memory],
    events: Sequence[int],
) -> tuple[int, ...]:
    live: dict[int, _T] = {}
    held: list[int] = []
    acquired = 0
    for event in events:
        if event >= 0:
            live[acquired] = acquire(event)
            acquired += 1
        else:
            release(live.pop(~event))
            held.append(memory().bytes_held)
    return tuple(held)


class _NeverDone:
    """An event whose work never finishes: what it guards stays parked."""

    def query(self) -> bool:
        return False


def _original_memory(pool: OriginalDescriptorBufferPool) -> Memory:
    return Memory(pool.allocations, pool.bytes_held, pool.peak_bytes_held)


def _pool_memory(pool: BucketPool) -> Memory:
    stats = pool.stats()
    allocated = stats.allocated_bytes
    return Memory(stats.allocations.allocated, allocated.current, allocated.peak)


def _park_handles(pool: BucketPool, n: int, count: int) -> None:
    handles = [pool.acquire(n) for _ in range(count)]
    for handle in handles:
        handle.record_event(_NeverDone())
        handle.release()


def _park_compat(pool: DescriptorBufferPool, n: int, count: int) -> None:
    held = [pool.acquire(n) for _ in range(count)]
    for bufs in held:
        pool.release(bufs, event=_NeverDone())


def _sliced(
    name: str,
    pool: _SlicingPool[_Triple],
    memory: Callable[[], Memory],
    park: Callable[[int, int], None] | None,
) -> Implementation:
    """Drive a pool with the original's API as the original's callers do."""

    def record(events: Sequence[int]) -> tuple[int, ...]:
        return _record(functools.partial(_sliced_acquire, pool), pool.release, memory, events)

    return Implementation(
        name=name,
        cycle=functools.partial(_sliced_cycle, pool),
        replay=functools.partial(_sliced_replay, pool),
        record=record,
        memory=memory,
        park=park,
    )


def _original() -> Implementation:
    pool = OriginalDescriptorBufferPool()
    return _sliced("original", pool, functools.partial(_original_memory, pool), park=None)


def _compat() -> Implementation:
    pool = DescriptorBufferPool()
    memory = functools.partial(_pool_memory, pool.pool)
    return _sliced("compat", pool, memory, park=functools.partial(_park_compat, pool))


def _bucketpool() -> Implementation:
    pool = BucketPool()
    memory = functools.partial(_pool_memory, pool)

    def record(events: Sequence[int]) -> tuple[int, ...]:
        acquire = functools.partial(_handle_acquire, pool)
        return _record(acquire, BufferHandle.release, memory, events)

    return Implementation(
        name="bucketpool",
        cycle=functools.partial(_handle_cycle, pool),
        replay=functools.partial(_handle_replay, pool),
        record=record,
        memory=memory,
        park=functools.partial(_park_handles, pool),
    )


_FACTORIES: Mapping[str, Callable[[], Implementation]] = {
    "original": _original,
    "bucketpool": _bucketpool,
    "compat": _compat,
}


def make_implementations() -> tuple[Implementation, ...]:
    """Return one `Implementation` of each kind, each with a fresh pool of default settings."""
    return tuple(factory() for factory in _FACTORIES.values())


# -- results --------------------------------------------------------------------------------


@typing.final
@attrs.frozen
class ImplResult:
    """One implementation on one trace.

    Attributes:
        impl: the implementation's name.
        median_ns: the median over repeats of ns per op.
        p25_ns: the 25th percentile of the same (linear interpolation).
        p75_ns: the 75th percentile.
        ratio: ``median_ns`` over ``original``'s ``median_ns`` on the same trace.
        allocations: buffer triples allocated, warm-up included.
        allocations_after_warmup: those allocated after the warm-up pass.
        peak_bytes: the most bytes held (cached, handed out and parked) at one time.
        final_bytes: bytes held at the end, every handle released.
        samples_ns: ns per op of each timed pass, in run order.
    """

    impl: str
    median_ns: float
    p25_ns: float
    p75_ns: float
    ratio: float
    allocations: int
    allocations_after_warmup: int
    peak_bytes: int
    final_bytes: int
    samples_ns: tuple[float, ...]


@typing.final
@attrs.frozen
class TraceResult:
    """Every implementation on one trace, plus the bytes recording when the trace asks.

    Attributes:
        trace: the trace that ran.
        results: one per implementation, in `IMPLEMENTATIONS` order.
        series: implementation name to bytes held after each op (empty if not recorded).
    """

    trace: Trace
    results: tuple[ImplResult, ...]
    series: Mapping[str, tuple[int, ...]] = attrs.field(factory=dict)

    def result(self, impl: str) -> ImplResult:
        """Return *impl*'s result.

        Raises:
            KeyError: *impl* did not run.
        """
        for result in self.results:
            if result.impl == impl:
                return result
        raise KeyError(impl)


@typing.final
@attrs.frozen
class FillResult:
    """One way of writing `FILL_COPIES` copies into descriptor buffers.

    Attributes:
        name: a key (``setitem``, ``add_copies``, ...).
        label: what the report calls it.
        descriptors: descriptors written per call.
        median_ns: the median over repeats of ns per call.
        p25_ns: the 25th percentile.
        p75_ns: the 75th percentile.
        descriptors_per_second: ``descriptors`` per median call time.
    """

    name: str
    label: str
    descriptors: int
    median_ns: float
    p25_ns: float
    p75_ns: float
    descriptors_per_second: float


@typing.final
@attrs.frozen
class Target:
    """A goal from the issue, checked against a measured value.

    Attributes:
        name: what is measured.
        value: the measured value.
        limit: the goal.
        op: ``"<="`` or ``">="``: how *value* must compare with *limit*.
        unit: ``"x"`` (a ratio), ``"bytes"`` or ``"count"``.
        passed: whether the goal is met.
    """

    name: str
    value: float
    limit: float
    op: Literal["<=", ">="]
    unit: Unit
    passed: bool


@typing.final
@attrs.frozen
class Note:
    """A derived figure shown beside the tables (no goal attached)."""

    name: str
    value: float
    unit: Unit


@typing.final
@attrs.frozen
class BenchSettings:
    """How a benchmark run is made.

    Attributes:
        repeats: timed passes per trace and implementation.
        ops: acquires per built-in trace.
        quick: whether ``--quick`` chose the defaults.
        seed: seeds the traces and the fill inputs.
        fill_min_batch_ns: a timed fill batch repeats its call until it lasts this long.
    """

    repeats: int = DEFAULT_REPEATS
    ops: int = DEFAULT_OPS
    quick: bool = False
    seed: int = 0
    fill_min_batch_ns: int = 5_000_000

    @classmethod
    def for_mode(
        cls, *, quick: bool, repeats: int | None = None, ops: int | None = None
    ) -> BenchSettings:
        """Return the defaults of the full or the ``--quick`` run, with overrides."""
        return cls(
            repeats=repeats or (QUICK_REPEATS if quick else DEFAULT_REPEATS),
            ops=ops or (QUICK_OPS if quick else DEFAULT_OPS),
            quick=quick,
            fill_min_batch_ns=1_000_000 if quick else 5_000_000,
        )


@typing.final
@attrs.frozen
class BenchResult:
    """Everything one run measured; the table, the JSON and the plot all come from it.

    Attributes:
        settings: how the run was made.
        environment: versions and machine (``version``, ``python``, ``torch``, ...).
        pool_settings: the default `BucketPool` settings that the run used.
        traces: one per trace that ran.
        fills: one per fill method, or empty.
        targets: the issue's goals that this run could check.
        notes: derived figures.
    """

    settings: BenchSettings
    environment: Mapping[str, object]
    pool_settings: Mapping[str, int]
    traces: tuple[TraceResult, ...]
    fills: tuple[FillResult, ...]
    targets: tuple[Target, ...]
    notes: tuple[Note, ...]

    @property
    def cache_cap(self) -> int:
        """The default pool's ``max_cached_bytes``."""
        return self.pool_settings["max_cached_bytes"]


# -- running --------------------------------------------------------------------------------


def _time_ns(run: Callable[[], object]) -> int:
    """Time one call of *run* with the garbage collector off, as it was after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        run()
        return time.perf_counter_ns() - start
    finally:
        if enabled:
            gc.enable()


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    p25, median, p75 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return float(p25), float(median), float(p75)


def _pass_of(impl: Implementation, trace: Trace) -> Callable[[], None]:
    if trace.cycle is not None:
        return functools.partial(impl.cycle, trace.cycle)
    return functools.partial(impl.replay, trace.events)


def run_trace(trace: Trace, repeats: int) -> TraceResult:
    """Run *trace* on every implementation, interleaved, and summarise.

    Each implementation gets a fresh pool; parks handles if the trace asks and it can;
    runs one untimed warm-up pass; then the implementations take turns for *repeats*
    timed passes.  A trace with ``record_bytes`` first runs once more on fresh pools,
    untimed, to record bytes held after every op.

    Args:
        trace: what to run.
        repeats: timed passes per implementation, >= 1.

    Returns:
        The results, ratios relative to ``original``.
    """
    series: dict[str, tuple[int, ...]] = {}
    if trace.record_bytes:
        series = {impl.name: impl.record(trace.events) for impl in make_implementations()}
    impls = make_implementations()
    for impl in impls:
        if trace.parked and impl.park is not None:
            impl.park(trace.parked_n, trace.parked)
    passes = [_pass_of(impl, trace) for impl in impls]
    for run in passes:
        run()
    warm = [impl.memory().allocations for impl in impls]
    gc.collect()
    samples: list[list[float]] = [[] for _ in impls]
    for _ in range(repeats):
        for run, timings in zip(passes, samples, strict=True):
            timings.append(_time_ns(run) / trace.ops)
    baseline = _quartiles(samples[0])[1]
    results = []
    for impl, timings, allocations_warm in zip(impls, samples, warm, strict=True):
        p25, median, p75 = _quartiles(timings)
        memory = impl.memory()
        results.append(
            ImplResult(
                impl=impl.name,
                median_ns=median,
                p25_ns=p25,
                p75_ns=p75,
                ratio=median / baseline,
                allocations=memory.allocations,
                allocations_after_warmup=memory.allocations - allocations_warm,
                peak_bytes=memory.peak_bytes,
                final_bytes=memory.bytes_held,
                samples_ns=tuple(timings),
            )
        )
    return TraceResult(trace, tuple(results), series)


def _fill_cases(handle: BufferHandle, seed: int) -> list[tuple[str, str, Callable[[], int]]]:
    """The fill methods, each a call that writes ``handle.n`` copies and returns descriptors."""
    copies = handle.n
    rng = np.random.default_rng(seed)
    src = rng.integers(1 << 12, 1 << 44, copies, dtype=np.int64) * 8
    dst = rng.integers(1 << 12, 1 << 44, copies, dtype=np.int64) * 8
    counts = rng.integers(1, 1 << 13, copies, dtype=np.int64) * 8
    src_list, dst_list, count_list = src.tolist(), dst.tolist(), counts.tolist()
    triple = OriginalDescriptorBufferPool().acquire(copies)
    src_t, dst_t, size_t = triple
    src_a, dst_a, size_a = handle.arrays
    src_base, dst_base = (int(rng.integers(1 << 20, 1 << 30)) * 4096 for _ in range(2))
    consecutive: npt.NDArray[np.int64] = np.arange(copies, dtype=np.int64)
    shuffled_src = rng.permutation(copies).astype(np.int64)
    shuffled_dst = rng.permutation(copies).astype(np.int64)

    def setitem() -> int:
        for i in range(copies):
            src_t[i] = src_list[i]
            dst_t[i] = dst_list[i]
            size_t[i] = count_list[i]
        return copies

    def bare_numpy() -> int:
        src_a[:copies] = src
        dst_a[:copies] = dst
        size_a[:copies] = counts
        return copies

    def add_copies() -> int:
        return handle.add_copies(0, src, dst, counts)

    def blocks(src_blocks: npt.NDArray[np.int64], dst_blocks: npt.NDArray[np.int64]) -> int:
        return handle.add_block_copies(0, src_base, dst_base, src_blocks, dst_blocks, BLOCK_BYTES)

    return [
        ("setitem", "torch setitem loop (the original worker)", setitem),
        ("add_copies", "handle.add_copies", add_copies),
        (
            "add_block_copies-consecutive",
            f"handle.add_block_copies, {copies:,} consecutive blocks",
            functools.partial(blocks, consecutive, consecutive),
        ),
        (
            "add_block_copies-shuffled",
            f"handle.add_block_copies, {copies:,} shuffled blocks",
            functools.partial(blocks, shuffled_src, shuffled_dst),
        ),
        ("numpy", "bare numpy slice assignment", bare_numpy),
    ]


def _calls_per_batch(call: Callable[[], int], min_ns: int) -> int:
    """How many calls make a timed batch last at least *min_ns*."""
    calls = 1
    while True:
        elapsed = _time_ns(functools.partial(_repeat_call, call, calls))
        if elapsed >= min_ns or calls >= 1 << 20:
            return calls
        calls = max(calls * 2, math.ceil(calls * min_ns * 1.2 / max(elapsed, 1)))


def run_fills(repeats: int, seed: int = 0, min_batch_ns: int = 5_000_000) -> tuple[FillResult, ...]:
    """Time the fill methods on `FILL_COPIES` random 8-byte aligned copies, interleaved.

    Args:
        repeats: timed batches per method.
        seed: seeds the addresses, sizes and block orders.
        min_batch_ns: each batch repeats the call until it lasts at least this long.

    Returns:
        One result per method, in report order.
    """
    handle = BucketPool().acquire(FILL_COPIES)
    try:
        cases = _fill_cases(handle, seed)
        descriptors = [call() for _, _, call in cases]
        batches = [_calls_per_batch(call, min_batch_ns) for _, _, call in cases]
        samples: list[list[float]] = [[] for _ in cases]
        for _ in range(repeats):
            for (_, _, call), calls, timings in zip(cases, batches, samples, strict=True):
                batch = functools.partial(_repeat_call, call, calls)
                timings.append(_time_ns(batch) / calls)
    finally:
        handle.release()
    results = []
    for (name, label, _), count, timings in zip(cases, descriptors, samples, strict=True):
        p25, median, p75 = _quartiles(timings)
        results.append(FillResult(name, label, count, median, p25, p75, count * 1e9 / median))
    return tuple(results)


def _repeat_call(call: Callable[[], int], calls: int) -> None:
    for _ in range(calls):
        call()


# -- targets --------------------------------------------------------------------------------


def _check(name: str, value: float, op: Literal["<=", ">="], limit: float, unit: Unit) -> Target:
    passed = value <= limit if op == "<=" else value >= limit
    return Target(name, value, limit, op, unit, passed)


def _trace_targets(traces: Sequence[TraceResult], cache_cap: int) -> list[Target]:
    targets = []
    for result in traces:
        trace = result.trace
        ours = result.result("bucketpool")
        if trace.ratio_limit is not None:
            name = f"{trace.name}: bucketpool ns/op / original"
            targets.append(_check(name, ours.ratio, "<=", trace.ratio_limit, "x"))
        if trace.steady:
            name = f"{trace.name}: bucketpool allocations after warm-up"
            targets.append(_check(name, ours.allocations_after_warmup, "<=", 0, "count"))
        if trace.bounded_final:
            name = f"{trace.name}: bucketpool final bytes held vs cache cap"
            targets.append(_check(name, ours.final_bytes, "<=", cache_cap, "bytes"))
    if traces:
        worst = max(
            r.result("bucketpool").peak_bytes / (2 * r.trace.peak_requested_bytes + cache_cap)
            for r in traces
        )
        name = "all traces: bucketpool peak bytes / (2 x peak live + cache cap)"
        targets.append(_check(name, worst, "<=", 1.0, "x"))
    return targets


def _fill_targets(fills: Sequence[FillResult]) -> list[Target]:
    ns = {fill.name: fill.median_ns for fill in fills}
    if not ns:
        return []
    copies = ns["add_copies"]
    return [
        _check("add_copies speed-up over the setitem loop", ns["setitem"] / copies, ">=", 100, "x"),
        _check("add_copies / bare numpy", copies / ns["numpy"], "<=", 3, "x"),
        _check(
            "add_block_copies (consecutive) / add_copies",
            ns["add_block_copies-consecutive"] / copies,
            "<=",
            5,
            "x",
        ),
        _check(
            "add_block_copies (shuffled) / add_copies",
            ns["add_block_copies-shuffled"] / copies,
            "<=",
            5,
            "x",
        ),
    ]


def compute_targets(
    traces: Sequence[TraceResult], fills: Sequence[FillResult], cache_cap: int
) -> tuple[Target, ...]:
    """Check the issue's goals that *traces* and *fills* cover."""
    return (*_trace_targets(traces, cache_cap), *_fill_targets(fills))


def _notes(traces: Sequence[TraceResult]) -> tuple[Note, ...]:
    by_name = {result.trace.name: result for result in traces}
    parked, repeated = by_name.get("parked-elsewhere"), by_name.get(f"repeated-{_PARKED_N}")
    if parked is None or repeated is None:
        return ()
    ours, theirs = parked.result("bucketpool"), repeated.result("bucketpool")
    return (
        Note(
            f"parked-elsewhere: bucketpool ns/op / its repeated-{_PARKED_N} ns/op",
            ours.median_ns / theirs.median_ns,
            "x",
        ),
        # Each ratio to original is measured interleaved, so this one cancels the drift in
        # machine load between the two traces.
        Note(
            f"parked-elsewhere: bucketpool ratio to original / repeated-{_PARKED_N}'s",
            ours.ratio / theirs.ratio,
            "x",
        ),
    )


# -- the whole run --------------------------------------------------------------------------


def _version() -> str:
    try:
        return importlib.metadata.version("bucketpool")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _environment() -> dict[str, object]:
    return {
        "version": _version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
        },
    }


def _pool_settings() -> dict[str, int]:
    pool = BucketPool()
    return {
        "min_capacity": pool.min_capacity,
        "max_capacity": pool.max_capacity,
        "max_cached_bytes": pool.max_cached_bytes,
        "max_cached_per_bucket": pool.max_cached_per_bucket,
        "idle_trim_acquires": pool.idle_trim_acquires,
    }


def run_benchmark(
    settings: BenchSettings,
    traces: Sequence[Trace],
    *,
    fills: bool = True,
    progress: Progress | None = None,
) -> BenchResult:
    """Run *traces* (and the fill benchmark) and check the targets.

    Args:
        settings: repeats, seed and batch sizes.
        traces: what to run, in order.
        fills: also time the fill methods.
        progress: called with a line before each step (the CLI prints it to stderr).

    Returns:
        Everything measured.
    """
    report = progress or (lambda message: None)
    steps = len(traces) + int(fills)
    results = []
    for step, trace in enumerate(traces, start=1):
        report(f"[{step}/{steps}] {trace.name}: {trace.ops:,} ops x {settings.repeats} repeats")
        results.append(run_trace(trace, settings.repeats))
    fill_results: tuple[FillResult, ...] = ()
    if fills:
        report(f"[{steps}/{steps}] fills: {FILL_COPIES:,} copies x {settings.repeats} repeats")
        fill_results = run_fills(settings.repeats, settings.seed, settings.fill_min_batch_ns)
    pool_settings = _pool_settings()
    return BenchResult(
        settings=settings,
        environment=_environment(),
        pool_settings=pool_settings,
        traces=tuple(results),
        fills=fill_results,
        targets=compute_targets(results, fill_results, pool_settings["max_cached_bytes"]),
        notes=_notes(results),
    )


# -- reports --------------------------------------------------------------------------------


def format_ns(ns: float) -> str:
    """Format nanoseconds for the table: ``1,234``."""
    return f"{ns:,.0f}"


def format_ratio(ratio: float) -> str:
    """Format a ratio for the table: ``0.38x``."""
    return f"{ratio:,.2f}x"


def format_bytes(count: float) -> str:
    """Format a byte count with binary units: ``512 B``, ``1.5 KiB``, ``24.0 MiB``."""
    if count < 1024:
        return f"{count:,.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        count /= 1024
        if count < 1024 or unit == "GiB":
            break
    return f"{count:,.1f} {unit}"


def format_value(value: float, unit: Unit) -> str:
    """Format a target's value or limit in its unit."""
    if unit == "x":
        return format_ratio(value)
    if unit == "bytes":
        return format_bytes(value)
    return f"{value:,.0f}"


def _columns(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if align else cell.ljust(width)
            for cell, width, align in zip(row, widths, right, strict=True)
        ).rstrip()
        for row in rows
    ]


def _trace_table(traces: Sequence[TraceResult]) -> list[str]:
    header = (
        "trace",
        "impl",
        "ns/op",
        "p25-p75",
        "ratio",
        "allocs",
        "after warm-up",
        "peak bytes",
        "final bytes",
    )
    rows: list[tuple[str, ...]] = [header]
    for result in traces:
        for i, impl in enumerate(result.results):
            rows.append(
                (
                    result.trace.name if i == 0 else "",
                    impl.impl,
                    format_ns(impl.median_ns),
                    f"{format_ns(impl.p25_ns)}-{format_ns(impl.p75_ns)}",
                    format_ratio(impl.ratio),
                    f"{impl.allocations:,}",
                    f"{impl.allocations_after_warmup:,}",
                    format_bytes(impl.peak_bytes),
                    format_bytes(impl.final_bytes),
                )
            )
    return _columns(rows, (False, False, True, True, True, True, True, True, True))


def _fill_table(fills: Sequence[FillResult]) -> list[str]:
    rows: list[tuple[str, ...]] = [
        (f"fill ({FILL_COPIES:,} copies)", "descriptors", "ns/call", "p25-p75", "descriptors/s")
    ]
    rows.extend(
        (
            fill.label,
            f"{fill.descriptors:,}",
            format_ns(fill.median_ns),
            f"{format_ns(fill.p25_ns)}-{format_ns(fill.p75_ns)}",
            f"{fill.descriptors_per_second / 1e6:,.1f} M",
        )
        for fill in fills
    )
    return _columns(rows, (False, True, True, True, True))


def _target_table(targets: Sequence[Target]) -> list[str]:
    rows: list[tuple[str, ...]] = [("target", "value", "goal", "result")]
    rows.extend(
        (
            target.name,
            format_value(target.value, target.unit),
            f"{target.op} {format_value(target.limit, target.unit)}",
            "PASS" if target.passed else "FAIL",
        )
        for target in targets
    )
    return _columns(rows, (False, True, True, False))


def render_table(result: BenchResult) -> str:
    """Render the report printed on stdout.

    Returns:
        The header, the trace table with its legend, the fill table, the targets and the
        derived figures, as one string ending in a newline.
    """
    env = result.environment
    machine = typing.cast("Mapping[str, object]", env["machine"])
    settings = result.settings
    lines = [
        f"bucketpool {env['version']} benchmark: Python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}, {machine['platform']}, {machine['cpus']} CPUs",
        f"{settings.repeats} timed passes per trace and implementation, interleaved "
        f"({', '.join(IMPLEMENTATIONS)}), after one warm-up pass; gc off while timing.",
        "ns/op: median [p25-p75] over passes; ratio: median / original's median; "
        "bytes: triples held by pool and callers.",
    ]
    if result.traces:
        lines += ["", *_trace_table(result.traces), ""]
        lines += [f"  {r.trace.name}: {r.trace.description}" for r in result.traces]
    if result.fills:
        lines += ["", *_fill_table(result.fills)]
    if result.targets:
        lines += ["", *_target_table(result.targets)]
    if result.notes:
        lines.append("")
        lines += [f"{note.name}: {format_value(note.value, note.unit)}" for note in result.notes]
    return "\n".join(lines) + "\n"


def to_json(result: BenchResult) -> dict[str, object]:
    """Return the run as JSON-ready data.

    The structure (``schema`` 1)::

        {"schema": 1, "version": str, "python": str, "torch": str, "numpy": str,
         "machine": {"platform", "machine", "processor", "cpus"},
         "settings": {"repeats", "ops", "quick", "seed", "fill_copies", "timer", "gc",
                      "warmup", "interleaved", "pool": {default BucketPool settings}},
         "traces": {trace: {impl: {"median_ns", "p25_ns", "p75_ns", "ratio",
                                   "allocations", "allocations_after_warmup",
                                   "peak_bytes", "final_bytes", "samples_ns"}}},
         "trace_info": {trace: {"description", "ops", "events", "peak_requested_bytes"}},
         "fills": {fill: {"label", "descriptors", "median_ns", "p25_ns", "p75_ns",
                          "descriptors_per_second"}},
         "targets": [{"name", "value", "limit", "op", "unit", "passed"}],
         "notes": {name: value},
         "series": {trace: {impl: [bytes held after each op]}}}

    Times are ns (floats), sizes bytes (ints); ``ratio`` is relative to ``original``.
    """
    settings = result.settings
    return {
        "schema": 1,
        **result.environment,
        "settings": {
            "repeats": settings.repeats,
            "ops": settings.ops,
            "quick": settings.quick,
            "seed": settings.seed,
            "fill_copies": FILL_COPIES,
            "timer": "time.perf_counter_ns",
            "gc": "disabled during timed passes",
            "warmup": "one untimed pass per trace and implementation",
            "interleaved": list(IMPLEMENTATIONS),
            "pool": dict(result.pool_settings),
        },
        "traces": {
            r.trace.name: {
                impl.impl: {
                    **attrs.asdict(impl, filter=lambda a, _: a.name != "impl"),
                    "samples_ns": list(impl.samples_ns),
                }
                for impl in r.results
            }
            for r in result.traces
        },
        "trace_info": {
            r.trace.name: {
                "description": r.trace.description,
                "ops": r.trace.ops,
                "events": len(r.trace.events),
                "peak_requested_bytes": r.trace.peak_requested_bytes,
            }
            for r in result.traces
        },
        "fills": {
            fill.name: attrs.asdict(fill, filter=lambda a, _: a.name != "name")
            for fill in result.fills
        },
        "targets": [attrs.asdict(target) for target in result.targets],
        "notes": {note.name: note.value for note in result.notes},
        "series": {
            r.trace.name: {impl: list(held) for impl, held in r.series.items()}
            for r in result.traces
            if r.series
        },
    }


def write_json(result: BenchResult, path: str | os.PathLike[str]) -> None:
    """Write `to_json` of *result* to *path*, indented.

    Raises:
        OSError: the file cannot be written.
    """
    with open(path, "w", encoding="utf-8") as file:
        json.dump(to_json(result), file, indent=1)
        file.write("\n")


def matplotlib_available() -> bool:
    """Return whether matplotlib (the ``bucketpool[plot]`` extra) can be imported."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return False
    return True


def plot(result: BenchResult, path: str | os.PathLike[str]) -> None:
    """Draw bytes held over the recorded trace and the latency ratios to a PNG file.

    Uses matplotlib's Agg canvas directly, so no global backend is changed.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'bucketpool[plot]'``).
        OSError: the file cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 5), layout="constrained")
    FigureCanvasAgg(figure)
    held_axes, ratio_axes = figure.subplots(1, 2, width_ratios=(1, 1.4))
    recorded = next((r for r in result.traces if r.series), None)
    if recorded is None:
        held_axes.text(0.5, 0.5, "no trace recorded bytes (run the spike trace)", ha="center")
    else:
        styles = {"original": "-", "bucketpool": "--", "compat": ":"}
        for impl, held in recorded.series.items():
            mib = [count / (1 << 20) for count in held]
            held_axes.plot(range(len(mib)), mib, styles.get(impl, "-"), label=impl)
        held_axes.axhline(result.cache_cap / (1 << 20), color="grey", lw=0.8, ls="-.")
        held_axes.text(0, result.cache_cap / (1 << 20), " bucketpool cache cap", va="bottom")
        held_axes.set_xlabel("op index")
        held_axes.set_ylabel("MiB held (cached + handed out)")
        held_axes.set_title(f"bytes held: {recorded.trace.name}")
        held_axes.legend()
    names = [r.trace.name for r in result.traces]
    positions = np.arange(len(names))
    for offset, impl in ((-0.2, "bucketpool"), (0.2, "compat")):
        ratios = [r.result(impl).ratio for r in result.traces]
        ratio_axes.bar(positions + offset, ratios, width=0.4, label=impl)
    ratio_axes.axhline(1.0, color="black", lw=0.8)
    ratio_axes.set_xticks(positions, names, rotation=45, ha="right")
    ratio_axes.set_ylabel("median ns/op / original's")
    ratio_axes.set_title("latency ratio to original (lower is better)")
    ratio_axes.legend()
    figure.savefig(path, format="png", dpi=100)
