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
from bench._host_step import host_step_cases
from bench._stats import Measurement, Verdict
from bench._targets import Kind, TargetSpec, check_targets

ROOT = Path(__file__).resolve().parent.parent
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
    else:  # what the promises came to
        assert "-check: exit" not in out
        last = {"PASS": "every promise held", "FAIL": "1 promise FAILED: promise-case: a/b"}
        assert out.splitlines()[-1].startswith(last.get(promise, "no promise FAILED; not judged"))


def test_a_loaded_promise_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The interval alone says FAIL, but the machine was loaded: not judged, so 3, not 1.
    run = fake_run({"promise": "FAIL", "goal": "PASS"}, loaded=True)
    monkeypatch.setattr(cli, "run_benchmark", run)
    assert cli.main(["--trace", "repeated-64", "--check", "--verbose"]) == 3
    out = capsys.readouterr().out
    assert "LOADED (interval: FAIL)" in out
    assert "MACHINE LOOKS LOADED" in out


def test_a_tiny_real_run_with_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out.json"
    argv = ["--trace", "repeated-64", "--trace", "compat", *TINY, "--json", str(path), "--check"]
    status = cli.main(argv)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert status == data["exit_status"]["check"]
    promises = {
        target["verdict"]
        for case in data["cases"].values()
        for figure in case["figures"].values()
        for target in figure["targets"]
        if target["kind"] == "promise"
    }
    assert status == (1 if "FAIL" in promises else 3 if promises - {"PASS"} else 0)
    out, err = capsys.readouterr()
    assert max(len(line) for line in (out + err).splitlines()) < 100
    assert "repeated-64" in out
    assert "[1/2] repeated-64" in err
    assert "[2/2] compat" in err
    assert list(data["cases"]) == ["repeated-64", "compat"]
    assert data["settings"]["ops"] == 40


def test_families_select_their_traces_and_cases(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen: list[list[str]] = []

    def run(settings: runner.Settings, cases: Sequence[Case], **_: object) -> object:
        chosen.append([case.name for case in cases])
        raise SystemExit(0)

    monkeypatch.setattr(cli, "run_benchmark", run)
    for argv in (["--trace", "loguniform", "--trace", "parked"], ["--trace", "fills"], []):
        with pytest.raises(SystemExit):
            cli.main(argv)
    loguniform = ["loguniform-w1", "loguniform-w4", "loguniform-w16"]
    assert chosen[0] == [*loguniform, "parked-10000", "evented", "parked-stuck", "collect"]
    assert chosen[1] == ["fills-16", "fills-64", "fills-256", "fills-4096", "fills-65536"]
    host = len(host_step_cases(1))  # 3 where vLLM's wheel is, else none
    assert len(chosen[2]) == 12 + host + 1 + 5 + 1 + 4 + 4  # every trace and case
    capsys.readouterr()


def test_every_case_the_report_names_is_a_trace_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen: list[list[str]] = []

    def run(settings: runner.Settings, cases: Sequence[Case], **_: object) -> object:
        chosen.append([case.name for case in cases])
        raise SystemExit(0)

    monkeypatch.setattr(cli, "run_benchmark", run)
    with pytest.raises(SystemExit):
        cli.main([])
    (everything,) = chosen
    assert "fills-64" in everything
    for name in everything:  # as the report names the case, --trace takes it: it alone
        with pytest.raises(SystemExit):
            cli.main(["--trace", name])
        assert chosen[-1] == [name]
    with pytest.raises(SystemExit):
        cli.main(["--trace", "fills-64", "--trace", "spike", "--trace", "debug"])
    assert chosen[-1] == ["spike", "fills-64", "debug"]  # in run order
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listed = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # (wrapped at "-")
    assert all(f" {name}," in listed or f" {name} " in listed for name in everything)


@pytest.mark.parametrize(
    "argv",
    [
        ["--trace", "fills-63"],
        ["--rounds", "0"],
        ["--repeats", "many"],
        ["--ops", "-3"],
        ["--budget", "-1"],
        ["--budget", "soon"],
        ["--trace", "nope"],
        ["--replay", "x.trace"],
        ["--plot", "x.pdf"],  # SVG or PNG only (said before matplotlib is looked for)
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
    options = (
        "--quick",
        "--rounds",
        "--ops",
        "--budget",
        "--trace",
        "--verbose",
        "--json",
        "--plot",
    )
    for option in options:
        assert option in out
    assert "--check" in out
    assert "--strict-check" in out
    assert "3 when one is UNSURE or LOADED" in " ".join(out.split())


@pytest.mark.parametrize(("name", "reason"), [("missing/out.json", "folder"), (".", "a folder")])
def test_unwritable_output(
    name: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--check", "--json", str(tmp_path / name)]) == 2
    assert reason in capsys.readouterr().err


def test_plot_without_matplotlib_is_a_usage_error_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: import fails

    def run(*args: object, **kwargs: object) -> runner.BenchResult:
        raise AssertionError("the benchmark ran before --plot was refused")

    monkeypatch.setattr(cli, "run_benchmark", run)
    path = tmp_path / "ratios.svg"
    with pytest.raises(SystemExit) as info:
        cli.main(["--trace", "repeated-64", "--plot", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --plot: needs matplotlib" in err
    assert "pip install '.[plot]'" in err
    assert not path.exists()


def test_plot_draws_the_ratios_as_svg_and_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra: pip install '.[plot]'")
    svg = tmp_path / "ratios.svg"
    assert (
        cli.main(["--trace", "repeated-64", "--trace", "fills-64", *TINY, "--plot", str(svg)]) == 0
    )
    text = svg.read_text(encoding="utf-8")
    assert "<svg" in text
    for name in ("repeated-64: bucketpool/original", "fills-64: add_copies/numpy (arrays)"):
        assert name in text  # a row per timed ratio with a target, named by case and figure
    assert "repeated-64: original ns/step" not in text  # (no target: not drawn)
    assert f"wrote {svg}" in capsys.readouterr().err
    png = tmp_path / "ratios.png"
    monkeypatch.setattr(cli, "run_benchmark", fake_run({"promise": "FAIL", "goal": "PASS"}))
    assert cli.main(["--trace", "repeated-64", "--plot", str(png)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG")


def test_the_package_has_no_command_line_and_no_benchmark() -> None:
    assert importlib.util.find_spec("bucketpool.__main__") is None
    assert importlib.util.find_spec("bucketpool.bench") is None


def test_subprocess_quick_run(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bench", "--quick", "--trace", "repeated", *TINY]
    completed = subprocess.run(
        [*command, "--json", str(path), "--check"],
        cwd=tmp_path,  # not the checkout: PYTHONPATH finds the benchmark
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    data = json.loads(path.read_text(encoding="utf-8"))
    assert completed.returncode == data["exit_status"]["check"], completed.stderr
    assert "[3/3] repeated-16384" in completed.stderr
    assert list(data["cases"]) == ["repeated-64", "repeated-1196", "repeated-16384"]
    assert data["settings"]["quick"]
    assert completed.stdout.splitlines()[-1].startswith("--check: exit ")
