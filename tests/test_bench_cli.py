"""``python -m bench``: arguments, selections, outputs, errors and the exit statuses."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from bench import _cli as cli
from bench import _runner as runner
from bench._cases import Case
from bench._stats import Measurement, Verdict
from bench._targets import Kind, TargetSpec, check_targets

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample.trace"
TINY = ["--ops", "40", "--rounds", "1", "--budget", "0"]
#: Interval ends of a figure that PASSes, FAILs or is UNSURE against a bound of 1.0.
VALUES = {"PASS": 0.5, "FAIL": 2.0, "UNSURE": 1.0}

RunBenchmark = Callable[..., runner.BenchResult]


def fake_run(verdicts: dict[Kind, Verdict], *, loaded: bool = False) -> RunBenchmark:
    """A stand-in for `run_benchmark`: one promise and one goal with the given verdicts."""

    def run(
        settings: runner.Settings,
        cases: Sequence[Case],
        *,
        progress: runner.Progress | None = None,
    ) -> runner.BenchResult:
        figures: dict[str, dict[str, Measurement]] = {}
        specs = []
        for kind, verdict in verdicts.items():
            value = VALUES[verdict]
            figure = Measurement(value, value * 0.95, value * 1.05, "x", rounds=7, spread=0.01)
            figures[f"{kind}-case"] = {"a/b": figure}
            specs.append(TargetSpec((f"{kind}-case",), "a/b", "<=", 1.0, "fake", kind=kind))
        loaded_cases = frozenset(figures) if loaded else frozenset()
        return runner.BenchResult(
            settings=settings,
            environment=runner.environment(),
            cases=(),
            figures=figures,
            checks=check_targets(figures, loaded_cases, specs=specs),
            rounds=dict.fromkeys(figures, 7),
            load=dict.fromkeys(figures, 0.0),
            duration_s=0.0,
        )

    return run


@pytest.mark.parametrize(
    ("promise", "goal", "argv", "status"),
    [
        ("PASS", "FAIL", ["--check"], 0),  # a goal never fails --check
        ("PASS", "UNSURE", ["--check"], 0),
        ("FAIL", "PASS", ["--check"], 1),
        ("FAIL", "PASS", [], 0),  # no --check: the run is the result
        ("UNSURE", "PASS", ["--check"], 3),  # could not judge: never 0
        ("UNSURE", "PASS", [], 0),
        ("PASS", "FAIL", ["--strict-check"], 1),  # strict: goals judged as promises
        ("PASS", "UNSURE", ["--strict-check"], 3),
        ("PASS", "PASS", ["--strict-check"], 0),
    ],
)
def test_check_exit_status(
    promise: Verdict,
    goal: Verdict,
    argv: list[str],
    status: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cli, "run_benchmark", fake_run({"promise": promise, "goal": goal}))
    assert cli.main(["--trace", "repeated-64", *argv]) == status
    out = capsys.readouterr().out
    assert f"promises: {int(promise == 'PASS')} PASS" in out
    if argv:  # the report's last line says what --check gives, and only with --check
        assert out.splitlines()[-1].startswith(f"{argv[0]}: exit {status},")
    else:
        assert "-check: exit" not in out


def test_a_loaded_promise_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The interval alone says FAIL, but the machine was loaded: not judged, so 3, not 1.
    run = fake_run({"promise": "FAIL", "goal": "PASS"}, loaded=True)
    monkeypatch.setattr(cli, "run_benchmark", run)
    assert cli.main(["--trace", "repeated-64", "--check", "--verbose"]) == 3
    out = capsys.readouterr().out
    assert "LOADED (interval alone: FAIL)" in out
    assert "MACHINE LOOKS LOADED" in out


def test_a_tiny_real_run_with_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out.json"
    status = cli.main(["--trace", "repeated-64", *TINY, "--json", str(path), "--check"])
    data = json.loads(path.read_text(encoding="utf-8"))
    assert status == data["exit_status"]["check"]
    promises = {c["verdict"] for c in data["checks"] if c["kind"] == "promise"}
    assert status == (1 if "FAIL" in promises else 3 if promises - {"PASS"} else 0)
    out, err = capsys.readouterr()
    assert "repeated-64" in out
    assert "[1/1] repeated-64" in err
    assert list(data["cases"]) == ["repeated-64"]
    assert data["settings"]["ops"] == 40


def test_the_report_fits_one_screen_unless_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--quick", "--trace", "repeated", "--trace", "fills", "--trace", "debug", *TINY]
    reports, statuses = [], []
    for flags in ([], ["--check"], ["--verbose"]):
        statuses.append(cli.main([*argv, *flags]))
        out, err = capsys.readouterr()
        assert "[5/5] fills" in err  # the progress goes to stderr
        assert "[5/5]" not in out
        reports.append(out)
    summary, checked, verbose = reports
    assert len(summary.splitlines()) <= 60
    assert "-check: exit" not in summary
    assert checked.splitlines()[-1].startswith(f"--check: exit {statuses[1]},")
    assert checked.count("-check: exit") == 1
    assert "-check: exit" not in verbose
    for table in ("PROMISES: ", "GOALS: ", "  repeated-64: n = 64", "handle.add_copies  "):
        assert table in verbose  # the full tables, the cases described
        assert table not in summary
    assert "debug: checks/off" in verbose
    rows = [line.split()[:3] for line in summary.splitlines() if line.startswith("goal ")]
    assert ["goal", "checks/off", "debug"] in rows  # one row per target, its worst case


def test_case_selection(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--trace", "fills", "--trace", "overhead", *TINY, "--verbose"]) == 0
    out, _ = capsys.readouterr()
    assert "handle.add_copies" in out
    assert "bytes per cached buffer" in out
    assert "repeated-64" not in out


def test_families_select_their_cases() -> None:
    settings = runner.Settings(ops=10, thread_ops=2, parked=3)
    names = [case.name for case in runner.build_cases(settings, (), ["parked", "threads"])]
    parked = ["parked-3", "evented", "parked-stuck", "collect"]
    assert names == [*parked, "threads-8", "threads-8-switch"]
    for kind in ("leak-site", "compat"):
        assert [case.name for case in runner.build_cases(settings, (), [kind])] == [kind]


@pytest.mark.parametrize(
    "argv",
    [
        ["--rounds", "0"],
        ["--repeats", "many"],
        ["--ops", "-3"],
        ["--budget", "-1"],
        ["--trace", "nope"],
        ["--trace", "spike", "--replay", "x.trace"],
        ["--frobnicate"],
        ["serve"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_help_lists_every_option_and_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m bench")
    for option in ("--quick", "--rounds", "--repeats", "--ops", "--budget", "--trace"):
        assert option in out
    for option in ("--replay", "--verbose", "--json", "--plot", "--check", "--strict-check"):
        assert option in out
    assert "3 when one is UNSURE or LOADED" in " ".join(out.split())


def test_plot_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "out.png"
    assert cli.main(["--quick", "--plot", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "pip install 'bucketpool[plot]'" in err
    assert not path.exists()


def test_plot_with_matplotlib(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "out.png"
    assert cli.main(["--trace", "spike", *TINY, "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "reason"), [("missing/out.json", "folder does not exist"), (".", "it is a folder")]
)
def test_unwritable_output(
    name: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--check", "--json", str(tmp_path / name)]) == 2
    assert reason in capsys.readouterr().err


def test_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--replay", str(SAMPLE), *TINY[2:]]) == 0
    out, _ = capsys.readouterr()
    assert "replay:sample.trace" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("promise ")]
    assert ["promise", "bucketpool/original", "replay:sample.trace"] in [r[:3] for r in rows]
    assert "handle.add_copies" not in out


def test_replay_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.trace"
    path.write_text("acquire 4\n# fine\nrelease 3\n", encoding="utf-8")
    assert cli.main(["--check", "--replay", str(path)]) == 2
    assert cli.main(["--replay", str(tmp_path / "gone.trace")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{path}:3: release 3" in err
    assert "gone.trace" in err


def test_the_package_has_no_command_line_and_no_benchmark() -> None:
    assert importlib.util.find_spec("bucketpool.__main__") is None
    assert importlib.util.find_spec("bucketpool.bench") is None


def test_subprocess_quick_run(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bench", "--quick", "--trace", "repeated"]
    completed = subprocess.run(
        [*command, "--ops", "200", "--rounds", "2", "--budget", "0", "--json", str(path)],
        cwd=tmp_path,  # not the checkout: PYTHONPATH finds the benchmark
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "[3/3] repeated-16384" in completed.stderr
    data = json.loads(path.read_text(encoding="utf-8"))
    assert list(data["cases"]) == ["repeated-64", "repeated-1196", "repeated-16384"]
    assert data["settings"]["quick"]
    assert "promises:" in completed.stdout
