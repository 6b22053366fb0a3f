"""Traces, runner, targets and reports of the benchmark (no test looks at a time)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from bucketpool import BucketPool
from bucketpool import _bench as bench
from bucketpool._bench import (
    IMPLEMENTATIONS,
    BenchResult,
    BenchSettings,
    FillResult,
    ImplResult,
    ReplayError,
    Trace,
    TraceResult,
)

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
    families = {"repeated", "loguniform", "fills"}
    assert set(bench.SELECTIONS) - families == set(names)
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
    parked = traces["parked-elsewhere"]
    assert parked.parked == 16
    assert BucketPool().bucket_capacity(parked.parked_n) != BucketPool().bucket_capacity(1196)


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
    assert bench.select_traces(traces, ["fills"]) == ()
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


# -- implementations and runner -------------------------------------------------------------


def test_implementations_drive_their_pools() -> None:
    impls = bench.make_implementations()
    assert tuple(impl.name for impl in impls) == IMPLEMENTATIONS
    trace = Trace("t", "", bench.windowed_events([100, 20], 2))
    assert trace.events == (100, 20, ~0, ~1)
    for impl in impls:
        impl.replay(trace.events)
    original, ours, compat = (impl.memory() for impl in impls)
    assert original == bench.Memory(2, 120 * TRIPLE, 120 * TRIPLE)
    assert ours == compat == bench.Memory(2, (128 + 32) * TRIPLE, (128 + 32) * TRIPLE)
    for impl in impls:
        impl.cycle([64, 64])
    original, ours, compat = (impl.memory() for impl in impls)
    # The original pops the 20-entry triple, drops it and allocates 64 entries.
    assert original == bench.Memory(3, 164 * TRIPLE, 164 * TRIPLE)
    assert ours == compat == bench.Memory(3, 224 * TRIPLE, 224 * TRIPLE)
    for impl in impls:
        held = impl.record(trace.events)
        assert len(held) == trace.ops
        assert held[-1] == impl.memory().bytes_held


def test_run_trace_summarises_each_implementation() -> None:
    trace = Trace("t", "", bench.windowed_events([64] * 50), steady=True)
    result = bench.run_trace(trace, repeats=3)
    assert tuple(r.impl for r in result.results) == IMPLEMENTATIONS
    assert result.series == {}
    for impl in result.results:
        assert len(impl.samples_ns) == 3
        assert impl.p25_ns <= impl.median_ns <= impl.p75_ns
        assert impl.allocations == 1
        assert impl.allocations_after_warmup == 0
        assert impl.final_bytes == impl.peak_bytes == 64 * TRIPLE
        expected = impl.median_ns / result.result("original").median_ns
        assert impl.ratio == pytest.approx(expected)
    assert result.result("original").ratio == 1.0
    with pytest.raises(KeyError):
        result.result("nope")


def test_run_trace_parks_and_records() -> None:
    events = bench.windowed_events([1196, 2000] * 20)
    trace = Trace("t", "", events, parked=2, parked_n=16384, record_bytes=True)
    result = bench.run_trace(trace, repeats=1)
    parked_bytes = 2 * 16384 * TRIPLE
    assert result.result("original").final_bytes == 2000 * TRIPLE
    for name in ("bucketpool", "compat"):
        assert result.result(name).final_bytes == parked_bytes + 2048 * TRIPLE
        assert result.result(name).allocations == 3
    assert set(result.series) == set(IMPLEMENTATIONS)
    assert all(len(held) == 40 for held in result.series.values())
    assert result.series["original"][0] == 1196 * TRIPLE
    assert result.series["bucketpool"][0] == 2048 * TRIPLE  # recorded on fresh pools


def test_run_fills_counts_descriptors() -> None:
    fills = bench.run_fills(repeats=1, min_batch_ns=0)
    counts = {fill.name: fill.descriptors for fill in fills}
    assert counts["setitem"] == counts["add_copies"] == counts["numpy"] == bench.FILL_COPIES
    assert counts["add_block_copies-consecutive"] == 1
    assert counts["add_block_copies-shuffled"] > bench.FILL_COPIES - 8
    for fill in fills:
        assert fill.p25_ns <= fill.median_ns <= fill.p75_ns
        assert fill.descriptors_per_second == pytest.approx(fill.descriptors * 1e9 / fill.median_ns)


# -- targets --------------------------------------------------------------------------------


def impl_result(
    impl: str, ratio: float, after: int = 0, peak: int = 0, final: int = 0
) -> ImplResult:
    return ImplResult(
        impl, 1000 * ratio, 1000 * ratio, 1000 * ratio, ratio, 1, after, peak, final, ()
    )


def trace_result(
    trace: Trace, ratio: float, after: int = 0, peak: int = 0, final: int = 0
) -> TraceResult:
    return TraceResult(
        trace,
        (
            impl_result("original", 1.0),
            impl_result("bucketpool", ratio, after, peak, final),
            impl_result("compat", 1.5),
        ),
    )


def test_targets_follow_the_trace_flags() -> None:
    repeated = Trace("repeated-64", "", (64, ~0), ratio_limit=0.35, steady=True)
    spike = Trace("spike", "", (1 << 20, ~0), bounded_final=True)
    cap = 1000
    traces = [
        trace_result(repeated, 0.3, after=2, peak=100),
        trace_result(spike, 2.0, peak=2 * spike.peak_requested_bytes + cap + 1, final=cap),
    ]
    targets = {t.name: t for t in bench.compute_targets(traces, (), cache_cap=cap)}
    assert list(targets) == [
        "repeated-64: bucketpool ns/op / original",
        "repeated-64: bucketpool allocations after warm-up",
        "spike: bucketpool final bytes held vs cache cap",
        "all traces: bucketpool peak bytes / (2 x peak live + cache cap)",
    ]
    assert targets["repeated-64: bucketpool ns/op / original"].passed
    assert not targets["repeated-64: bucketpool allocations after warm-up"].passed
    assert targets["spike: bucketpool final bytes held vs cache cap"].passed
    peak = targets["all traces: bucketpool peak bytes / (2 x peak live + cache cap)"]
    assert not peak.passed
    assert peak.value > 1.0


def fill(name: str, ns: float) -> FillResult:
    return FillResult(name, name, 1024, ns, ns, ns, 1024e9 / ns)


def test_fill_targets() -> None:
    fills = [
        fill("setitem", 1_000_000),
        fill("add_copies", 2_000),
        fill("add_block_copies-consecutive", 3_000),
        fill("add_block_copies-shuffled", 12_000),
        fill("numpy", 1_000),
    ]
    targets = bench.compute_targets((), fills, cache_cap=0)
    assert [(t.value, t.passed) for t in targets] == [
        (500.0, True),
        (2.0, True),
        (1.5, True),
        (6.0, False),
    ]
    assert bench.compute_targets((), (), cache_cap=0) == ()


# -- reports --------------------------------------------------------------------------------


def test_formatting() -> None:
    assert bench.format_bytes(0) == "0 B"
    assert bench.format_bytes(1023) == "1,023 B"
    assert bench.format_bytes(1536) == "1.5 KiB"
    assert bench.format_bytes(24 << 20) == "24.0 MiB"
    assert bench.format_bytes(3 << 40) == "3,072.0 GiB"
    assert bench.format_ns(1234.5) == "1,234"
    assert bench.format_ratio(0.384) == "0.38x"
    assert bench.format_value(3, "count") == "3"
    assert bench.format_value(2048, "bytes") == "2.0 KiB"


@pytest.fixture(scope="module")
def tiny_run() -> BenchResult:
    settings = BenchSettings(repeats=2, ops=60, fill_min_batch_ns=0)
    traces = bench.builtin_traces(settings.ops, settings.seed)
    lines: list[str] = []
    result = bench.run_benchmark(settings, traces, progress=lines.append)
    assert len(lines) == len(traces) + 1
    assert lines[0].startswith("[1/12] repeated-64")
    return result


def test_json_structure(tiny_run: BenchResult) -> None:
    data = json.loads(json.dumps(bench.to_json(tiny_run)))
    for key in ("schema", "version", "python", "torch", "machine", "settings", "traces"):
        assert key in data
    assert {"fills", "targets", "trace_info", "notes", "series"} <= set(data)
    assert data["settings"]["repeats"] == 2
    assert data["settings"]["pool"]["max_cached_bytes"] == BucketPool().max_cached_bytes
    assert list(data["traces"]) == [r.trace.name for r in tiny_run.traces]
    fields = {
        "median_ns",
        "p25_ns",
        "p75_ns",
        "ratio",
        "allocations",
        "allocations_after_warmup",
        "peak_bytes",
        "final_bytes",
        "samples_ns",
    }
    for impls in data["traces"].values():
        assert list(impls) == list(IMPLEMENTATIONS)
        for values in impls.values():
            assert set(values) == fields
    assert set(data["fills"]) == {f.name for f in tiny_run.fills}
    for target in data["targets"]:
        assert set(target) == {"name", "value", "limit", "op", "unit", "passed"}
    assert set(data["series"]) == {"spike"}
    assert len(data["series"]["spike"]["original"]) == data["trace_info"]["spike"]["ops"]
    assert set(data["notes"]) == {
        "parked-elsewhere: bucketpool ns/op / its repeated-1196 ns/op",
        "parked-elsewhere: bucketpool ratio to original / repeated-1196's",
    }


def test_table_and_json_agree(tiny_run: BenchResult) -> None:
    table = bench.render_table(tiny_run)
    data = bench.to_json(tiny_run)
    rows = [line.split() for line in table.splitlines()]
    traces = data["traces"]
    assert isinstance(traces, dict)
    current = ""
    seen = 0
    for row in rows:
        if row and row[0] in traces:
            current = row.pop(0)
        if current and row and row[0] in IMPLEMENTATIONS:
            values = traces[current][row[0]]
            p25, p75 = values["p25_ns"], values["p75_ns"]
            assert row[1] == bench.format_ns(values["median_ns"])
            assert row[2] == f"{bench.format_ns(p25)}-{bench.format_ns(p75)}"
            assert row[3] == bench.format_ratio(values["ratio"])
            assert row[4] == f"{values['allocations']:,}"
            assert row[5] == f"{values['allocations_after_warmup']:,}"
            peak, final = values["peak_bytes"], values["final_bytes"]
            assert " ".join(row[6:]) == f"{bench.format_bytes(peak)} {bench.format_bytes(final)}"
            seen += 1
    assert seen == 3 * len(traces)
    targets = data["targets"]
    assert isinstance(targets, list)
    verdicts = [
        line.rsplit(maxsplit=1)[-1]
        for line in table.splitlines()
        if line.endswith(("PASS", "FAIL"))
    ]
    assert verdicts == ["PASS" if t["passed"] else "FAIL" for t in targets]
    for target in targets:
        assert target["name"] in table
    fills = data["fills"]
    assert isinstance(fills, dict)
    for values in fills.values():
        assert f"{values['label']}" in table
        assert bench.format_ns(values["median_ns"]) in table


def test_write_json(tiny_run: BenchResult, tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    bench.write_json(tiny_run, path)
    assert json.loads(path.read_text(encoding="utf-8")) == json.loads(
        json.dumps(bench.to_json(tiny_run))
    )


def test_plot_writes_a_png(tiny_run: BenchResult, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    bench.plot(tiny_run, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_matplotlib_available_sees_a_missing_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert not bench.matplotlib_available()
