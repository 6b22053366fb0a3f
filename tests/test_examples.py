"""The programs in ``examples/`` run as ``python examples/NAME.py`` and say what they should.

Each runs in a fresh interpreter with warnings as errors, so a leaked handle or a stale
write in an example fails it too.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(name: str) -> list[str]:
    """Run ``examples/<name>`` as a user would; return its output lines (exit status 0)."""
    completed = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLES / name)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stderr == ""
    return completed.stdout.splitlines()


def test_every_example_is_tested() -> None:
    assert {path.name for path in EXAMPLES.glob("*.py")} == {
        "compat_switch.py",
        "events.py",
        "worker.py",
    }


def test_worker() -> None:
    moved, pool = run_example("worker.py")
    found = re.fullmatch(
        r"200 steps: (\d+) blocks moved with (\d+) descriptors, every byte checked", moved
    )
    assert found is not None, moved
    blocks, descriptors = map(int, found.groups())
    assert 0 < descriptors < blocks  # consecutive blocks were merged into one descriptor
    found = re.fullmatch(
        r"pool: (\d+) hits, (\d+) misses, (\d+) buffers cached \([\d,]+ bytes\), 0 out, 0 leaked",
        pool,
    )
    assert found is not None, pool
    hits, misses, cached = map(int, found.groups())
    assert hits + misses == 400  # a save and a load per step
    assert misses == cached <= 2  # one buffer per bucket used, each allocated once


def test_events() -> None:
    assert run_example("events.py") == [
        "one copy in flight: 1 parked, 1 allocated",
        "two copies in flight: 2 parked, 2 allocated",
        "collect() retired 2",
        "after a third step: 1 parked, 2 allocated",
        "collect() retired 1",
        "out of order: collect() retired 1 (the newest)",
        "collect() retired 2 (the other two)",
        "ten steps after a stuck copy: 3 parked, 3 allocated",
        "after synchronize(): 0 parked, 3 allocated",
    ]


def test_compat_switch() -> None:
    capacity, refused, backed, switch, *why = run_example("compat_switch.py")
    assert capacity == "acquire(5) gave a triple of capacity 16"
    assert refused.startswith("a second release is refused: release: this DescriptorBuffers")
    assert backed.startswith("backed by <BucketPool")
    assert backed.endswith(": 1 buffer allocated")
    # Whether the example's own interpreter finds vLLM (this one may hold the bench's copy).
    finds = subprocess.run([sys.executable, "-c", "import vllm"], cwd=ROOT, capture_output=True)
    if finds.returncode:
        assert switch == "vLLM is not installed here: bucketpool.vllm.install() needs it"
        # After .ci/setup, the vLLM in .vllm/site (for the tests) is explained away.
        set_up = (ROOT / ".vllm" / "site" / "vllm").is_dir()
        assert len(why) == 1 + set_up, why
        if set_up:
            assert why[0].startswith(".vllm/site does not count: .ci/setup installs vLLM's")
        assert why[-1].startswith("install() said how to install it: ")
        assert "pip install vllm" in why[-1]
    else:  # pragma: no cover - only where vLLM is installed
        assert switch == "bucketpool.vllm.install(): installed() is True"
        assert why == []


@pytest.mark.parametrize("name", ["compat_switch", "events", "worker"])
def test_examples_have_main(name: str) -> None:
    source = (EXAMPLES / f"{name}.py").read_text(encoding="utf-8")
    assert "def main() -> int:" in source
    assert 'if __name__ == "__main__":\n    raise SystemExit(main())' in source
