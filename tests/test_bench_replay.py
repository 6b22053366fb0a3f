"""Replay files: the format, its errors, and short files repeated to a timed length."""

from __future__ import annotations

from pathlib import Path

import pytest
from _bench_case import live_handles

from bench import _replay as replay
from bench._replay import ReplayError

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample.trace"


def test_parse_replay() -> None:
    text = "# header\n\nacquire 10   # first\n  acquire 0\nrelease 0\nacquire 7\nrelease 2\n"
    trace = replay.parse_replay(text, "dir/t.trace")
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
        replay.parse_replay(text, "bad.trace")
    assert str(info.value).startswith(f"bad.trace:{line}: ")
    assert message in str(info.value)
    assert info.value.line == line
    assert "\n" not in str(info.value)


def test_parse_replay_needs_an_acquire() -> None:
    with pytest.raises(ReplayError, match=r"^empty\.trace: no 'acquire N' line"):
        replay.parse_replay("# nothing\n\n", "empty.trace")


def test_load_replay_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.trace"
    with pytest.raises(ReplayError, match=r"nope\.trace: cannot read the replay file"):
        replay.load_replay(missing)


def test_load_replay_repeats_short_files(tmp_path: Path) -> None:
    path = tmp_path / "short.trace"
    path.write_text("acquire 5\nacquire 6\nrelease 1\n", encoding="utf-8")
    trace = replay.load_replay(path, min_ops=5)
    assert trace.ops == 6
    assert trace.events[:8] == (5, 6, ~1, ~0, 5, 6, ~3, ~2)
    live_handles(trace.events)
    assert replay.load_replay(path, min_ops=1).events == (5, 6, ~1, ~0)


def test_sample_trace_parses() -> None:
    trace = replay.parse_replay(SAMPLE.read_text(encoding="utf-8"), str(SAMPLE))
    assert trace.ops == 48
    assert 65536 in trace.events
    live_handles(trace.events)
    assert replay.load_replay(SAMPLE).ops >= replay.MIN_BATCH_OPS
