"""The ``bench`` subcommand: selections, outputs, errors and the ``--check`` exit status."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from bucketpool import __main__ as cli
from bucketpool.bench import _cli as bench_cli
from bucketpool.bench import _runner as runner
from bucketpool.bench._cases import Case
from bucketpool.bench._stats import Measurement
from bucketpool.bench._targets import TargetSpec, check_targets

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample.trace"
TINY = ["--ops", "40", "--rounds", "1", "--budget", "0"]


def fake_run(value: float) -> object:
    """A stand-in for `run_benchmark` whose one target measures *value* against <= 1.0."""

    def run(
        settings: runner.Settings,
        cases: Sequence[Case],
        *,
        progress: runner.Progress | None = None,
    ) -> runner.BenchResult:
        figure = Measurement(value, value * 0.95, value * 1.05, "x", rounds=7, spread=0.01)
        figures = {"repeated-64": {"bucketpool/original": figure}}
        spec = TargetSpec(("repeated-*",), "bucketpool/original", "<=", 1.0, "fake")
        return runner.BenchResult(
            settings=settings,
            environment=runner.environment(),
            cases=(),
            figures=figures,
            checks=check_targets(figures, specs=[spec]),
            rounds={"repeated-64": 7},
            load={"repeated-64": 0.0},
            duration_s=0.0,
        )

    return run


@pytest.mark.parametrize(
    ("value", "argv", "status"),
    [
        (0.5, ["--check"], 0),  # PASS
        (2.0, ["--check"], 1),  # FAIL
        (2.0, [], 0),  # FAIL, but no --check
        (1.0, ["--check"], 0),  # UNSURE does not fail ...
        (1.0, ["--strict-check"], 1),  # ... unless strict
        (0.5, ["--strict-check"], 0),
    ],
)
def test_check_exit_status(
    value: float,
    argv: list[str],
    status: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(bench_cli, "run_benchmark", fake_run(value))
    assert cli.main(["bench", "--trace", "repeated-64", *argv]) == status
    out = capsys.readouterr().out
    verdict = {0.5: "PASS", 2.0: "FAIL", 1.0: "UNSURE"}[value]
    assert f"1 {verdict}" in out


def test_a_tiny_real_run_with_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out.json"
    status = cli.main(["bench", "--trace", "repeated-64", *TINY, "--json", str(path), "--check"])
    data = json.loads(path.read_text(encoding="utf-8"))
    assert status == int(any(check["verdict"] == "FAIL" for check in data["checks"]))
    out, err = capsys.readouterr()
    assert "repeated-64" in out
    assert "[1/1] repeated-64" in err
    assert list(data["cases"]) == ["repeated-64"]
    assert data["settings"]["ops"] == 40


def test_case_selection(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--trace", "fills", "--trace", "overhead", *TINY]) == 0
    out, _ = capsys.readouterr()
    assert "handle.add_copies" in out
    assert "bytes per cached buffer" in out
    assert "repeated-64" not in out


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--rounds", "0"],
        ["bench", "--repeats", "many"],
        ["bench", "--ops", "-3"],
        ["bench", "--budget", "-1"],
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
    assert cli.main(["bench", "--json", str(tmp_path / name)]) == 2
    assert reason in capsys.readouterr().err


def test_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--replay", str(SAMPLE), *TINY[2:]]) == 0
    out, _ = capsys.readouterr()
    assert "replay:sample.trace" in out
    assert "handle.add_copies" not in out


def test_replay_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.trace"
    path.write_text("acquire 4\n# fine\nrelease 3\n", encoding="utf-8")
    assert cli.main(["bench", "--replay", str(path)]) == 2
    assert cli.main(["bench", "--replay", str(tmp_path / "gone.trace")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{path}:3: release 3" in err
    assert "gone.trace" in err
