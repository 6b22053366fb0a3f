"""The ``python -m bucketpool`` command line, run in-process and once as a subprocess."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bucketpool import __main__ as cli

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample.trace"
TINY = ["--ops", "40", "--repeats", "1"]


def test_no_arguments_means_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []

    def fake(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(cli, "_bench_command", fake)
    assert cli.main([]) == 0
    assert cli.main(["--quick"]) == 0
    assert [args.command for args in seen] == ["bench", "bench"]
    assert not seen[0].quick
    assert seen[1].quick
    assert seen[0].repeats is None
    assert seen[0].trace is None


def test_bench_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "out.json"
    assert cli.main(["bench", "--trace", "repeated-64", *TINY, "--json", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "repeated-64" in out
    assert "original" in out
    assert "[1/1] repeated-64" in err
    data = json.loads(path.read_text(encoding="utf-8"))
    assert list(data["traces"]) == ["repeated-64"]
    assert data["fills"] == {}
    assert data["settings"]["ops"] == 40


def test_fills_selection(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--trace", "fills", "--repeats", "1"]) == 0
    out, _ = capsys.readouterr()
    assert "handle.add_copies" in out
    assert "repeated-64" not in out


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--repeats", "0"],
        ["bench", "--repeats", "many"],
        ["bench", "--ops", "-3"],
        ["bench", "--trace", "nope"],
        ["bench", "--trace", "spike", "--replay", "x.trace"],
        ["bench", "--frobnicate"],
        ["serve"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_plot_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "out.png"
    assert cli.main(["bench", "--quick", "--plot", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "pip install 'bucketpool[plot]'" in err
    assert not path.exists()


def test_plot_with_matplotlib(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "out.png"
    assert cli.main(["bench", "--trace", "spike", *TINY, "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "reason"), [("missing/out.json", "folder does not exist"), (".", "it is a folder")]
)
def test_unwritable_output(
    name: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    assert cli.main(["bench", "--json", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert reason in err


def test_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--replay", str(SAMPLE), "--repeats", "1"]) == 0
    out, _ = capsys.readouterr()
    assert "replay:sample.trace" in out
    for impl in ("original", "bucketpool", "compat"):
        assert impl in out
    assert "handle.add_copies" not in out


def test_replay_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gone.trace"
    assert cli.main(["bench", "--replay", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert str(path) in err


def test_replay_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.trace"
    path.write_text("acquire 4\n# fine\nrelease 3\n", encoding="utf-8")
    assert cli.main(["bench", "--replay", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert f"{path}:3: release 3" in err


def test_subprocess_quick_run(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bucketpool", "bench", "--quick", "--trace", "repeated"]
    completed = subprocess.run(
        [*command, "--ops", "200", "--repeats", "1", "--json", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "[3/3] repeated-16384" in completed.stderr
    data = json.loads(path.read_text(encoding="utf-8"))
    assert list(data["traces"]) == ["repeated-64", "repeated-1196", "repeated-16384"]
    for name, impls in data["traces"].items():
        row = next(line for line in completed.stdout.splitlines() if line.startswith(name))
        assert f"{impls['original']['median_ns']:,.0f}" in row
