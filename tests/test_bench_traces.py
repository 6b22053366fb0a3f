"""The benchmark's trace model and replay files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from bucketpool.bench import _traces as bench
from bucketpool.bench._traces import ReplayError, Trace

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample.trace"
TRIPLE = bench.ENTRY_BYTES


def live_handles(events: Sequence[int]) -> list[int]:
    """Check that every release names an earlier live acquire; return live counts."""
    live: set[int] = set()
    acquired = 0
    counts = []
    for event in events:
        if event >= 0:
            live.add(acquired)
            acquired += 1
        else:
            assert ~event in live
            live.remove(~event)
        counts.append(len(live))
    assert not live, "every acquire is released by the end"
    return counts


# -- traces ---------------------------------------------------------------------------------


def test_builtin_traces_are_valid_and_selectable() -> None:
    traces = bench.builtin_traces(300)
    names = [trace.name for trace in traces]
    assert len(set(names)) == len(names)
    assert set(names) <= set(bench.SELECTIONS)
    families = {"repeated", "loguniform", "parked", "threads", "debug", "fills", "overhead"}
    assert set(bench.SELECTIONS) - families == set(names)
    assert names == list(bench.TRACE_NAMES)
    for trace in traces:
        live_handles(trace.events)
        assert trace.ops == sum(1 for event in trace.events if event >= 0)
        assert trace.ops == 300


def test_builtin_traces_are_deterministic() -> None:
    assert bench.builtin_traces(200) == bench.builtin_traces(200)
    other = {t.name: t for t in bench.builtin_traces(200, seed=1)}
    mine = {t.name: t for t in bench.builtin_traces(200)}
    assert other["loguniform-w4"] != mine["loguniform-w4"]
    assert other["repeated-64"] == mine["repeated-64"]


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


# -- replay files ---------------------------------------------------------------------------


def test_parse_replay() -> None:
    text = "# header\n\nacquire 10   # first\n  acquire 0\nrelease 0\nacquire 7\nrelease 2\n"
    trace = bench.parse_replay(text, "dir/t.trace")
    assert trace.name == "replay:t.trace"
    assert trace.events == (10, 0, ~0, 7, ~2, ~1)  # acquire #1 is released at the end
    assert trace.record_bytes


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("acquire 1\nfree 0\n", 2, "expected 'acquire N' or 'release ID', got 'free 0'"),
        ("acquire\n", 1, "expected 'acquire N'"),
        ("acquire 1 2\n", 1, "expected 'acquire N'"),
        ("acquire -1\n", 1, "acquire needs a number >= 0, got '-1'"),
        ("acquire 1.5\n", 1, "acquire needs a number >= 0"),
        ("ACQUIRE 1\n", 1, "expected 'acquire N'"),
        ("acquire 16777217\n", 1, "above the limit"),
        ("acquire 1\nrelease 1\n", 2, "acquire #1 has not happened yet"),
        ("acquire 1\nrelease 0\n\nrelease 0\n", 4, "acquire #0 was already released"),
        ("release x\n", 1, "release needs a number >= 0, got 'x'"),
    ],
)
def test_parse_replay_errors(text: str, line: int, message: str) -> None:
    with pytest.raises(ReplayError) as info:
        bench.parse_replay(text, "bad.trace")
    assert str(info.value).startswith(f"bad.trace:{line}: ")
    assert message in str(info.value)
    assert info.value.line == line
    assert "\n" not in str(info.value)


def test_parse_replay_needs_an_acquire() -> None:
    with pytest.raises(ReplayError, match=r"^empty\.trace: no 'acquire N' line"):
        bench.parse_replay("# nothing\n\n", "empty.trace")


def test_load_replay_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.trace"
    with pytest.raises(ReplayError, match=r"nope\.trace: cannot read the replay file"):
        bench.load_replay(missing)


def test_load_replay_repeats_short_files(tmp_path: Path) -> None:
    path = tmp_path / "short.trace"
    path.write_text("acquire 5\nacquire 6\nrelease 1\n", encoding="utf-8")
    trace = bench.load_replay(path, min_ops=5)
    assert trace.ops == 6
    assert trace.events[:8] == (5, 6, ~1, ~0, 5, 6, ~3, ~2)
    live_handles(trace.events)
    assert bench.load_replay(path, min_ops=1).events == (5, 6, ~1, ~0)


def test_sample_trace_parses() -> None:
    trace = bench.parse_replay(SAMPLE.read_text(encoding="utf-8"), str(SAMPLE))
    assert trace.ops == 48
    assert 65536 in trace.events
    live_handles(trace.events)
    assert bench.load_replay(SAMPLE).ops >= bench.MIN_BATCH_OPS
