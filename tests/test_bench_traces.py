"""The benchmark's built-in traces: valid, seeded, deterministic, of the documented shapes."""

from __future__ import annotations

import statistics

import pytest
from _bench_case import live_handles

from bench import _traces as bench
from bench._traces import Trace

TRIPLE = bench.ENTRY_BYTES


def test_builtin_traces_are_valid_and_selectable() -> None:
    traces = bench.builtin_traces(300)
    names = [trace.name for trace in traces]
    assert len(set(names)) == len(names)
    assert set(names) <= set(bench.SELECTIONS)
    families = {"repeated", "loguniform", *bench.CASE_KINDS}
    assert set(bench.SELECTIONS) - families == set(names)
    assert {"normal-64", "blocks"} <= set(names)
    assert names == list(bench.TRACE_NAMES)
    for trace in traces:
        live_handles(trace.events)
        assert trace.ops == sum(1 for event in trace.events if event >= 0)
        assert trace.ops == 300


def test_builtin_traces_are_deterministic() -> None:
    assert bench.builtin_traces(200) == bench.builtin_traces(200)
    other = {t.name: t for t in bench.builtin_traces(200, seed=1)}
    mine = {t.name: t for t in bench.builtin_traces(200)}
    for seeded in ("loguniform-w4", "normal-64", "blocks"):
        assert other[seeded] != mine[seeded]
    assert other["repeated-64"] == mine["repeated-64"]
    # Each trace has its own stream: the seed is mixed with the name, not shared.
    assert mine["normal-64"].cycle != mine["blocks"].cycle


def by_name(ops: int = 400) -> dict[str, Trace]:
    return {trace.name: trace for trace in bench.builtin_traces(ops)}


def test_trace_shapes() -> None:
    traces = by_name()
    assert traces["repeated-1196"].cycle == (1196,) * 400
    assert set(traces["alternating"].cycle or ()) == {96, 9568}
    for window in (1, 4, 16):
        trace = traces[f"loguniform-w{window}"]
        sizes = [event for event in trace.events if event >= 0]
        assert min(sizes) >= 1
        assert max(sizes) <= 16384
        assert max(live_handles(trace.events)) == window
    ramp = traces["ramp"].cycle
    assert ramp is not None
    assert ramp[0] == 1
    assert ramp[-1] == 16384
    assert list(ramp) == sorted(ramp)
    spike = traces["spike"]
    assert spike.record_bytes
    assert spike.cycle is not None
    assert spike.cycle.count(bench.SPIKE_N) == 1
    assert spike.peak_requested_bytes == bench.SPIKE_N * TRIPLE
    encoder = [event for event in traces["encoder-cache"].events if event >= 0]
    assert all(abs(n - round(n / 1196) * 1196) <= 8 for n in encoder)
    assert all(1 <= round(n / 1196) <= 8 for n in encoder)


def test_spike_trace_is_capped() -> None:
    spike = by_name(50_000)["spike"]
    assert spike.ops == bench.SPIKE_OPS


def test_one_op_traces() -> None:
    assert all(trace.ops == 1 for trace in bench.builtin_traces(1))
    with pytest.raises(ValueError, match="ops must be >= 1"):
        bench.builtin_traces(0)


def test_windowed_events() -> None:
    trace = Trace("t", "", bench.windowed_events([1, 2, 3], 2))
    assert trace.events == (1, 2, ~0, 3, ~1, ~2)
    assert trace.cycle is None
    assert trace.ops == 3
    assert trace.peak_requested_bytes == 5 * TRIPLE
    once = Trace("t", "", bench.windowed_events([4, 5]))
    assert once.events == (4, ~0, 5, ~1)
    assert once.cycle == (4, 5)
    with pytest.raises(ValueError, match="window"):
        bench.windowed_events([1], 0)


def test_select_traces() -> None:
    traces = bench.builtin_traces(100)
    assert [t.name for t in bench.select_traces(traces, ["repeated"])] == [
        "repeated-64",
        "repeated-1196",
        "repeated-16384",
    ]
    chosen = bench.select_traces(traces, ["spike", "loguniform-w4", "fills"])
    assert [t.name for t in chosen] == ["loguniform-w4", "spike"]
    assert bench.select_traces(traces, ["fills", "threads", "overhead"]) == ()
    with pytest.raises(ValueError, match="no trace named 'repeat'"):
        bench.select_traces(traces, ["repeat"])


def test_normal_64_is_near_64_and_steady() -> None:
    trace = by_name(4_000)["normal-64"]
    sizes = trace.cycle
    assert sizes is not None  # one in flight: every acquire is released at once
    assert max(live_handles(trace.events)) == 1
    assert min(sizes) >= 1
    assert all(isinstance(n, int) for n in sizes)
    assert abs(statistics.fmean(sizes) - 64) < 0.5
    assert 3.5 < statistics.pstdev(sizes) < 4.5
    assert max(abs(n - 64) for n in sizes) <= 6 * 4


def test_blocks_sums_two_to_four_requests_of_14_to_18_blocks() -> None:
    trace = by_name(4_000)["blocks"]
    sizes = trace.cycle
    assert sizes is not None
    assert max(live_handles(trace.events)) == 1
    assert min(sizes) >= 2 * 14
    assert max(sizes) <= 4 * 18
    # Uniform counts of uniform requests: the mean is 3 x 16 blocks, both ends are reached.
    assert abs(statistics.fmean(sizes) - 48) < 1
    assert min(sizes) <= 30
    assert max(sizes) >= 70
