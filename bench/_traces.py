"""The built-in traces: seeded workloads of acquires and releases, with each step's end.

A trace is a sequence of events: ``n >= 0`` acquires ``n`` entries, ``~i`` (``-1 - i``)
releases the ``i``-th acquire.  Each acquire is a step and has an end, the entries the step
writes and passes on: ``n`` in 3 steps of 4, otherwise uniform in ``[n // 2, n)`` (for
``n >= 2``), drawn from a seeded generator of its own, so both pools get the same ends.
"""

from __future__ import annotations

import math
import random
import typing
from collections.abc import Iterable, Sequence

import attrs

__all__ = [
    "CASE_KINDS",
    "DEFAULT_OPS",
    "ENTRY_BYTES",
    "IMAGE_BLOCKS",
    "QUICK_OPS",
    "SELECTIONS",
    "SHORT_SHARE",
    "SPIKE_N",
    "SPIKE_OPS",
    "TRACE_NAMES",
    "Trace",
    "builtin_traces",
    "draw_ends",
    "make_trace",
    "select_traces",
    "windowed_events",
]

#: Steps per built-in trace pass.
DEFAULT_OPS = 10_000
QUICK_OPS = 2_000
#: The spike trace is capped at this many steps: long enough for the idle trim to show.
SPIKE_OPS = 4_000
SPIKE_N = 1 << 20
#: One image of a 7B vision model, in encoder-cache blocks.
IMAGE_BLOCKS = 1_196
ENTRY_BYTES = 3 * 8  # one descriptor: three int64 entries
#: The share of steps whose end is below n.
SHORT_SHARE = 0.25
_REPEATED = (64, 1_196, 16_384)
_WINDOWS = (1, 4, 16)
_LOG_MAX = 16_384
#: The built-in traces, in report order.
TRACE_NAMES = (
    *(f"repeated-{n}" for n in _REPEATED),
    "alternating",
    *(f"loguniform-w{w}" for w in _WINDOWS),
    "normal-64",
    "blocks",
    "ramp",
    "spike",
    "encoder-cache",
)
#: The cases beside the traces, as ``--trace`` names them.
CASE_KINDS = (
    *("host-step", "view-cache", "fills", "fill-step", "parked", "debug", "compat"),
    *("kv-offload", "fork"),
)
#: What ``--trace`` accepts: a trace, a family (``repeated``, ``loguniform``) or a case kind.
SELECTIONS = ("repeated", "loguniform", *TRACE_NAMES, *CASE_KINDS)


@typing.final
@attrs.frozen
class Trace:
    """A deterministic sequence of steps.

    Attributes:
        name: its name in ``--trace`` and in reports.
        description: one line for the report.
        events: ``n >= 0`` acquires ``n`` entries; ``~i`` releases the ``i``-th acquire.
        ends: each acquire's end, in acquire order.
        ops: acquires in the trace.
        peak_requested_bytes: the most bytes live handles ask for at one time.
        steps: ``(n, end)`` per acquire when each is released at once, else `None`.
    """

    name: str
    description: str
    events: tuple[int, ...]
    ends: tuple[int, ...]
    ops: int = attrs.field(init=False, repr=False)
    peak_requested_bytes: int = attrs.field(init=False, repr=False)
    steps: tuple[tuple[int, int], ...] | None = attrs.field(init=False, repr=False, eq=False)

    @ops.default
    def _ops(self) -> int:
        return sum(1 for event in self.events if event >= 0)

    @peak_requested_bytes.default
    def _peak(self) -> int:
        sizes: list[int] = []
        live = peak = 0
        for event in self.events:
            if event >= 0:
                sizes.append(event)
                live += event
                peak = max(peak, live)
            else:
                live -= sizes[~event]
        return peak * ENTRY_BYTES

    @steps.default
    def _steps(self) -> tuple[tuple[int, int], ...] | None:
        sizes, releases = self.events[0::2], self.events[1::2]
        if releases != tuple(~i for i in range(len(sizes))) or min(sizes, default=0) < 0:
            return None
        return tuple(zip(sizes, self.ends, strict=True))


def windowed_events(sizes: Sequence[int], window: int = 1) -> tuple[int, ...]:
    """Return events acquiring *sizes* in order, the oldest released once *window* are live.

    Raises:
        ValueError: *window* is below 1.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    events: list[int] = []
    for i, n in enumerate(sizes):
        events.append(n)
        if i + 1 >= window:
            events.append(~(i + 1 - window))
    events.extend(~i for i in range(max(0, len(sizes) + 1 - window), len(sizes)))
    return tuple(events)


def draw_ends(sizes: Iterable[int], rng: random.Random) -> tuple[int, ...]:
    """Return each step's end: *n*, or in `SHORT_SHARE` of steps uniform in ``[n // 2, n)``."""
    return tuple(
        rng.randrange(n // 2, n) if n >= 2 and rng.random() < SHORT_SHARE else n for n in sizes
    )


def make_trace(name: str, description: str, events: Sequence[int], seed: int = 0) -> Trace:
    """Return the trace of *events*, its ends drawn from a generator seeded by *seed* and *name*."""
    sizes = [event for event in events if event >= 0]
    ends = draw_ends(sizes, random.Random(f"{seed}:{name}:ends"))
    return Trace(name, description, tuple(events), ends)


def builtin_traces(ops: int = DEFAULT_OPS, seed: int = 0) -> tuple[Trace, ...]:
    """Return the built-in traces of *ops* steps (the spike at most `SPIKE_OPS`), seeded.

    Raises:
        ValueError: *ops* is below 1.
    """
    if ops < 1:
        raise ValueError(f"ops must be >= 1, got {ops}")

    def rng(name: str) -> random.Random:
        return random.Random(f"{seed}:{name}")

    def loguniform(name: str, high: int, count: int) -> list[int]:
        rand, top = rng(name), math.log(high + 1)
        return [int(math.exp(rand.uniform(0.0, top))) for _ in range(count)]

    traces: list[Trace] = []

    def add(name: str, description: str, sizes: list[int], window: int = 1) -> None:
        traces.append(make_trace(name, description, windowed_events(sizes, window), seed))

    for n in _REPEATED:
        add(f"repeated-{n}", f"n = {n:,} every step", [n] * ops)
    add("alternating", "n = 96 and 9,568, alternating", ([96, 9_568] * ops)[:ops])
    for w in _WINDOWS:
        sizes = loguniform(f"loguniform-w{w}", _LOG_MAX, ops)
        add(f"loguniform-w{w}", f"log-uniform n in [1, {_LOG_MAX:,}], {w} in flight", sizes, w)
    normal, blocks, images = rng("normal-64"), rng("blocks"), rng("encoder-cache")
    sizes = [max(1, round(normal.gauss(64, 4))) for _ in range(ops)]
    add("normal-64", "n ~ round(Normal(64, 4)), at least 1", sizes)
    sizes = [sum(blocks.randint(14, 18) for _ in range(blocks.randint(2, 4))) for _ in range(ops)]
    add("blocks", "n = the blocks of 2-4 requests of 14-18 blocks each", sizes)
    sizes = [1 + (_LOG_MAX - 1) * i // max(ops - 1, 1) for i in range(ops)]
    add("ramp", f"n growing from 1 to {_LOG_MAX:,}", sizes)
    sizes = loguniform("spike", 2_048, min(ops, SPIKE_OPS))
    sizes[len(sizes) // 10] = SPIKE_N
    add("spike", f"log-uniform n in [1, 2,048], one n = {SPIKE_N:,}", sizes)
    sizes = [images.randint(1, 8) * IMAGE_BLOCKS + images.randint(-8, 8) for _ in range(ops)]
    add(
        "encoder-cache",
        "saves and loads of 1-8 images of 1,196 blocks (+-8), 4 in flight",
        sizes,
        4,
    )
    return tuple(traces)


def select_traces(traces: Iterable[Trace], selections: Iterable[str]) -> tuple[Trace, ...]:
    """Return the traces that *selections* name (a trace or a family), in *traces*' order.

    Raises:
        ValueError: a selection that is not a case kind matches no trace.
    """
    chosen = [name for name in selections if name not in CASE_KINDS]
    available = tuple(traces)

    def named(trace: Trace, name: str) -> bool:
        return trace.name == name or trace.name.startswith(name + "-")

    for name in chosen:
        if not any(named(trace, name) for trace in available):
            raise ValueError(f"no trace named {name!r}")
    return tuple(t for t in available if any(named(t, name) for name in chosen))
