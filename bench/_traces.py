"""The benchmark's built-in workloads: seeded traces of acquires and releases.

A trace is a sequence of events: an int ``n >= 0`` acquires ``n`` entries and ``~i``
(``-1 - i``) releases the handle of the ``i``-th acquire (0-based).  An op is one acquire,
its views and its release.  Replay files, the user's own traces, are read by ``_replay``.

Kept custom: no benchmarking library models a pool's workload (sizes, handles in flight,
release order), and the whole model is a tuple of ints.
"""

from __future__ import annotations

import math
import random
import typing
from collections.abc import Iterable, Sequence

import attrs

__all__ = [
    "BLOCKS_PER_REQUEST",
    "CASE_KINDS",
    "DEFAULT_OPS",
    "ENTRY_BYTES",
    "IMAGE_BLOCKS",
    "NORMAL_MEAN",
    "NORMAL_SD",
    "QUICK_OPS",
    "REQUESTS_PER_STEP",
    "SELECTIONS",
    "SPIKE_N",
    "SPIKE_OPS",
    "TRACE_NAMES",
    "Trace",
    "builtin_traces",
    "select_traces",
    "windowed_events",
]

#: Ops per built-in trace pass (one op: acquire, views, release).
DEFAULT_OPS = 10_000
QUICK_OPS = 2_000
#: The spike trace is capped at this many ops: long enough for the idle trim to show.
SPIKE_OPS = 4_000
SPIKE_N = 1 << 20
#: One image of a 7B vision model, in encoder-cache blocks.
IMAGE_BLOCKS = 1_196
ENTRY_BYTES = 3 * 8  # one descriptor: three int64 entries
#: ``normal-64``: n ~ round(Normal(mean, sd)), at least 1.
NORMAL_MEAN, NORMAL_SD = 64, 4
#: ``blocks``: each step batches this many requests (uniform), each this many blocks.
REQUESTS_PER_STEP = (2, 4)
BLOCKS_PER_REQUEST = (14, 18)

_REPEATED_SIZES = (64, 1_196, 16_384)
_LOGUNIFORM_WINDOWS = (1, 4, 16)
_LOGUNIFORM_MAX = 16_384
#: The built-in traces, in report order.
TRACE_NAMES = (
    *(f"repeated-{n}" for n in _REPEATED_SIZES),
    "alternating",
    *(f"loguniform-w{w}" for w in _LOGUNIFORM_WINDOWS),
    f"normal-{NORMAL_MEAN}",
    "blocks",
    "ramp",
    "spike",
    "encoder-cache",
)
#: The cases beside the traces, as ``--trace`` names them (``parked`` and ``threads`` are
#: families of two cases each).
CASE_KINDS = ("parked", "threads", "debug", "fills", "overhead", "leak-site", "floor", "compat")
#: What ``--trace`` accepts: a trace, a family (``repeated``, ``loguniform``) or a case.
SELECTIONS = ("repeated", "loguniform", *TRACE_NAMES, *CASE_KINDS)


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
        record_bytes: record bytes held after every op for the plot (a separate pass).
        ops: acquires in the trace.
        peak_requested_bytes: the most bytes live handles ask for at one time.
        cycle: the sizes when every acquire is released at once, else `None`.
    """

    name: str
    description: str
    events: tuple[int, ...]
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


def _normal(rng: random.Random, count: int) -> list[int]:
    return [max(1, round(rng.gauss(NORMAL_MEAN, NORMAL_SD))) for _ in range(count)]


def _block_steps(rng: random.Random, count: int) -> list[int]:
    requests, blocks = REQUESTS_PER_STEP, BLOCKS_PER_REQUEST
    return [sum(rng.randint(*blocks) for _ in range(rng.randint(*requests))) for _ in range(count)]


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
        The traces, in `TRACE_NAMES` order.

    Raises:
        ValueError: *ops* is below 1.
    """
    if ops < 1:
        raise ValueError(f"ops must be >= 1, got {ops}")

    def rng(name: str) -> random.Random:
        return random.Random(f"{seed}:{name}")

    traces = [
        Trace(f"repeated-{n}", f"n = {n:,} every op", windowed_events([n] * ops))
        for n in _REPEATED_SIZES
    ]
    traces.append(
        Trace(
            "alternating",
            "n = 96 (loads) and 9,568 (saves), alternating",
            windowed_events(([96, 9_568] * ops)[:ops]),
        )
    )
    traces.extend(
        Trace(
            f"loguniform-w{window}",
            f"log-uniform n in [1, {_LOGUNIFORM_MAX:,}], {window} in flight (FIFO)",
            windowed_events(
                _loguniform(rng(f"loguniform-w{window}"), _LOGUNIFORM_MAX, ops), window
            ),
        )
        for window in _LOGUNIFORM_WINDOWS
    )
    traces.append(
        Trace(
            f"normal-{NORMAL_MEAN}",
            f"n ~ round(Normal({NORMAL_MEAN}, {NORMAL_SD})), at least 1",
            windowed_events(_normal(rng(f"normal-{NORMAL_MEAN}"), ops)),
        )
    )
    low, high = (
        REQUESTS_PER_STEP[0] * BLOCKS_PER_REQUEST[0],
        REQUESTS_PER_STEP[1] * BLOCKS_PER_REQUEST[1],
    )
    traces.append(
        Trace(
            "blocks",
            f"n = sum of {REQUESTS_PER_STEP[0]}-{REQUESTS_PER_STEP[1]} requests of "
            f"{BLOCKS_PER_REQUEST[0]}-{BLOCKS_PER_REQUEST[1]} blocks (n in {low}-{high})",
            windowed_events(_block_steps(rng("blocks"), ops)),
        )
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
            record_bytes=True,
        )
    )
    traces.append(
        Trace(
            "encoder-cache",
            f"saves and loads of 1-8 images x {IMAGE_BLOCKS:,} blocks (+-8), 4 in flight",
            windowed_events(_encoder_steps(rng("encoder-cache"), ops), 4),
        )
    )
    return tuple(traces)


def select_traces(traces: Iterable[Trace], selections: Iterable[str]) -> tuple[Trace, ...]:
    """Return the traces named by *selections*, in the order of *traces*.

    A selection names a trace or a family: ``repeated`` selects every ``repeated-*``.
    The case names (`CASE_KINDS`) select no trace.

    Raises:
        ValueError: a selection matches nothing.
    """
    chosen = [name for name in selections if name not in CASE_KINDS]
    available = tuple(traces)
    for name in chosen:
        if not any(_matches(trace.name, name) for trace in available):
            names = ", ".join(trace.name for trace in available)
            raise ValueError(f"no trace named {name!r}; traces: {names}")
    return tuple(trace for trace in available if any(_matches(trace.name, n) for n in chosen))


def _matches(trace_name: str, selection: str) -> bool:
    return trace_name == selection or trace_name.startswith(selection + "-")
