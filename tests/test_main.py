"""``python -m bucketpool``: usage without a command, and a ``--quick`` run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bucketpool import __main__ as cli

ROOT = Path(__file__).resolve().parent.parent


def test_no_command_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: python -m bucketpool")
    assert "bench" in cli.build_parser().format_help()
    assert err == ""


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--help"])
    assert info.value.code == 0
    assert "--strict-check" in capsys.readouterr().out


def test_subprocess_quick_run(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bucketpool", "bench", "--quick", "--trace", "repeated"]
    completed = subprocess.run(
        [*command, "--ops", "200", "--rounds", "2", "--budget", "0", "--json", str(path)],
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
    assert list(data["cases"]) == ["repeated-64", "repeated-1196", "repeated-16384"]
    assert data["settings"]["quick"]
    assert "verdicts:" in completed.stdout


def test_bare_module_prints_usage() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bucketpool"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0
    assert completed.stdout.startswith("usage:")
