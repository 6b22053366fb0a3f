"""The built-in traces: valid, seeded, of the documented shapes, with ends as specified."""

from __future__ import annotations

import random
import statistics

import pytest
from _bench_case import live_handles

from bench import _traces as traces
from bench._traces import Trace


def by_name(ops: int = 400, seed: int = 0) -> dict[str, Trace]:
    return {trace.name: trace for trace in traces.builtin_traces(ops, seed)}


def sizes_of(trace: Trace) -> list[int]:
    return [event for event in trace.events if event >= 0]


def test_builtin_traces_are_valid_and_selectable() -> None:
    made = traces.builtin_traces(300)
    names = [trace.name for trace in made]
    assert names == list(traces.TRACE_NAMES)
    assert set(traces.SELECTIONS) - {"repeated", "loguniform", *traces.CASE_KINDS} == set(names)
    for trace in made:
        live_handles(trace.events)
        assert trace.ops == len(trace.ends) == len(sizes_of(trace)) == 300


def test_builtin_traces_are_deterministic_and_seeded() -> None:
    assert traces.builtin_traces(200) == traces.builtin_traces(200)
    mine, other = by_name(200), by_name(200, seed=1)
    for seeded in ("loguniform-w4", "normal-64", "blocks"):
        assert sizes_of(other[seeded]) != sizes_of(mine[seeded])
    assert sizes_of(other["repeated-64"]) == sizes_of(mine["repeated-64"])
    assert other["repeated-64"].ends != mine["repeated-64"].ends  # the ends are seeded too
    assert mine["normal-64"].ends != mine["blocks"].ends  # each trace has its own stream


def test_trace_shapes() -> None:
    made = by_name()
    assert sizes_of(made["repeated-1196"]) == [1196] * 400
    assert set(sizes_of(made["alternating"])) == {96, 9568}
    for window in (1, 4, 16):
        trace = made[f"loguniform-w{window}"]
        assert 1 <= min(sizes_of(trace)) <= max(sizes_of(trace)) <= 16384
        assert max(live_handles(trace.events)) == window
        assert (trace.steps is None) == (window > 1)
    ramp = sizes_of(made["ramp"])
    assert (ramp[0], ramp[-1]) == (1, 16384)
    assert ramp == sorted(ramp)
    spike = made["spike"]
    assert sizes_of(spike).count(traces.SPIKE_N) == 1
    assert spike.peak_requested_bytes == traces.SPIKE_N * traces.ENTRY_BYTES
    assert by_name(50_000)["spike"].ops == traces.SPIKE_OPS
    encoder = made["encoder-cache"]
    assert max(live_handles(encoder.events)) == 4
    for n in sizes_of(encoder):
        images = round(n / traces.IMAGE_BLOCKS)
        assert 1 <= images <= 8
        assert abs(n - images * traces.IMAGE_BLOCKS) <= 8


def test_normal_64_and_blocks() -> None:
    made = by_name(4_000)
    normal = sizes_of(made["normal-64"])
    assert abs(statistics.fmean(normal) - 64) < 0.5
    assert 3.5 < statistics.pstdev(normal) < 4.5
    blocks = sizes_of(made["blocks"])
    assert 2 * 14 <= min(blocks) <= 30
    assert 70 <= max(blocks) <= 4 * 18
    assert abs(statistics.fmean(blocks) - 48) < 1


def test_ends_are_n_in_three_steps_of_four_else_uniform_in_the_lower_half() -> None:
    for trace in by_name(4_000).values():
        short = 0
        for n, end in zip(sizes_of(trace), trace.ends, strict=True):
            if end != n:
                short += 1
                assert n // 2 <= end < n, (trace.name, n, end)
        share = short / trace.ops
        long = all(n >= 2 for n in sizes_of(trace))
        assert abs(share - traces.SHORT_SHARE) < 0.04 if long else share < 0.3, trace.name
    lows = [end for end in by_name(8_000)["repeated-64"].ends if end < 64]
    assert set(lows) == set(range(32, 64))  # uniform over the whole of [32, 64)
    assert max(lows.count(end) for end in set(lows)) < 3 * len(lows) / 32


def test_draw_ends_keeps_n_below_two() -> None:
    rng = random.Random(0)
    assert traces.draw_ends([0, 1] * 100, rng) == (0, 1) * 100
    assert traces.draw_ends([2] * 100, rng).count(1) > 0  # 2 // 2 == 1: the only short end


def test_a_shorter_run_has_the_first_ends_of_the_longer() -> None:
    # The fill step runs normal-64's first steps: the same sizes and ends as the full trace.
    short, full = by_name(100)["normal-64"], by_name(1_000)["normal-64"]
    assert short.steps is not None
    assert full.steps is not None
    assert short.steps == full.steps[:100]


def test_windowed_events_and_steps() -> None:
    trace = traces.make_trace("t", "", traces.windowed_events([1, 2, 3], 2))
    assert trace.events == (1, 2, ~0, 3, ~1, ~2)
    assert trace.steps is None
    assert trace.peak_requested_bytes == 5 * traces.ENTRY_BYTES
    once = Trace("t", "", traces.windowed_events([4, 5]), (3, 5))
    assert once.events == (4, ~0, 5, ~1)
    assert once.steps == ((4, 3), (5, 5))
    with pytest.raises(ValueError, match="window"):
        traces.windowed_events([1], 0)
    with pytest.raises(ValueError, match="ops must be >= 1"):
        traces.builtin_traces(0)
    assert all(trace.ops == 1 for trace in traces.builtin_traces(1))


def test_select_traces() -> None:
    made = traces.builtin_traces(100)
    chosen = traces.select_traces(made, ["repeated"])
    assert [t.name for t in chosen] == ["repeated-64", "repeated-1196", "repeated-16384"]
    chosen = traces.select_traces(made, ["spike", "loguniform-w4", "fills"])
    assert [t.name for t in chosen] == ["loguniform-w4", "spike"]
    assert traces.select_traces(made, ["fills", "parked"]) == ()
    with pytest.raises(ValueError, match="no trace named 'repeat'"):
        traces.select_traces(made, ["repeat"])
