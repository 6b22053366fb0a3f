"""vLLM's own KV-offload worker tests pass the same with and without ``install(kv_offload=True)``.

Runs where ``$BUCKETPOOL_VLLM_TESTS`` names vLLM's source tree (the sdist's root, holding
``tests/``; by default ``.vllm``, when its ``tests/`` holds the files) and a vLLM wheel can be
found (see ``_vllm_standin.vllm_locations``); skipped otherwise.  Each run is a pytest of
its own over `_vllm_kv_plugin` (the host stand-in, and vLLM's two fixtures the file needs),
with ``--noconftest``: vLLM's conftest imports all of vLLM.  The run with the drop-in turns
a `bucketpool.LeakWarning` into an error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import _vllm_standin as standin
import pytest

TESTS_VARIABLE = "BUCKETPOOL_VLLM_TESTS"
FILES = ["tests/v1/kv_offload/cpu/test_gpu_worker.py"]
HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get(TESTS_VARIABLE) or HERE.parent / ".vllm")

pytestmark = pytest.mark.skipif(
    not (os.environ.get(TESTS_VARIABLE) or (ROOT / FILES[0]).is_file())
    or standin.vllm_locations() is None,
    reason=f"set {TESTS_VARIABLE} to vLLM's source tree (and have its wheel) to run its tests",
)


def outcomes(root: Path, test_file: str, install: str, report: Path) -> dict[str, str]:
    """Run vLLM's *test_file* under the plugin; return each test's outcome by name."""
    locations = standin.vllm_locations()
    assert locations is not None
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
        "BUCKETPOOL_VLLM_INSTALL": install,
        standin.SITE_VARIABLE: str(Path(locations[0]).parent),
    }
    warnings = ["-W", "error::bucketpool.LeakWarning"] if install else []
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest"]
    command += ["-p", "_vllm_kv_plugin", f"--junitxml={report}", *warnings, test_file]
    run = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    assert run.returncode in (0, 1), run.stdout[-4000:] + run.stderr[-4000:]
    found = {}
    for case in ElementTree.parse(report).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[f"{case.get('classname')}::{case.get('name')}"] = (kinds or ["passed"])[0]
    return found


@pytest.mark.parametrize("test_file", FILES)
def test_vllms_tests_pass_the_same_with_the_drop_in(test_file: str, tmp_path: Path) -> None:
    if not (ROOT / test_file).is_file():
        raise FileNotFoundError(f"{TESTS_VARIABLE}={ROOT} holds no {test_file}")
    own = outcomes(ROOT, test_file, "", tmp_path / "own.xml")
    installed = outcomes(ROOT, test_file, "kv_offload", tmp_path / "installed.xml")
    assert installed == own
    assert list(own.values()).count("passed") >= len(own) // 2, own
