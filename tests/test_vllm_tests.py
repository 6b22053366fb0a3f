"""vLLM's own worker tests pass the same with and without bucketpool's drop-in.

vLLM 0.33.0's EC CPU worker tests run with vLLM's pool and after ``install()``, its
KV-offload handler tests with vLLM's lists and after ``install(kv_offload=True)``: each run
is a pytest of its own on the real wheel, hosted on the CPU by `vllm_plugin`; every run must
pass (a test may skip), with the same outcome for every test.  Runs where vLLM's test files
are (``$BUCKETPOOL_VLLM_TESTS``, by default ``.vllm/tests``, fetched by ``.ci/setup``);
skipped otherwise, unless the variable is set (``.ci/run`` sets it): then a missing file
fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import _vllm_standin as standin
import pytest
import vllm_plugin

HERE = Path(__file__).resolve().parent
#: vLLM's test files, each with what ``$BUCKETPOOL_VLLM_INSTALL`` installs in the second run.
FILES = {
    "v1/ec_connector/unit/cpu/worker/test_worker.py": "ec",
    "v1/kv_offload/cpu/test_gpu_worker.py": "kv_offload",
}

pytestmark = pytest.mark.skipif(
    (
        vllm_plugin.TESTS_VARIABLE not in os.environ
        and not (vllm_plugin.DEFAULT_TESTS / "__init__.py").is_file()
    )
    or standin.vllm_locations() is None,
    reason="no vLLM test files or wheel: run .ci/setup (see docs/development.md)",
)


def outcomes(test_file: Path, install: str, report: Path) -> dict[str, str]:
    """Run vLLM's *test_file* through `vllm_plugin`; return each test's outcome by name."""
    locations = standin.vllm_locations()
    assert locations is not None
    env = {
        **os.environ,
        standin.SITE_VARIABLE: str(Path(locations[0]).parent),  # the wheel this run found
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
        vllm_plugin.INSTALL_VARIABLE: install,
    }
    command = [sys.executable, "-m", "pytest", "-c", str(HERE.parent / "pyproject.toml")]
    command += ["-q", "-p", "no:cacheprovider", "-p", "vllm_plugin", f"--junitxml={report}"]
    run = subprocess.run(
        [*command, str(test_file)], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, f"{vllm_plugin.INSTALL_VARIABLE}={install!r}:\n" + (
        run.stdout[-8000:] + run.stderr[-2000:]
    )
    found = {}
    for case in ElementTree.parse(report).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[f"{case.get('classname')}::{case.get('name')}"] = (kinds or ["passed"])[0]
    return found


@pytest.mark.parametrize(("test_file", "install"), FILES.items())
def test_vllms_own_tests_pass_the_same_with_the_drop_in(
    test_file: str, install: str, tmp_path: Path
) -> None:
    path = vllm_plugin.tests_dir() / test_file
    if not path.is_file():
        raise FileNotFoundError(f"{vllm_plugin.TESTS_VARIABLE}: no {path}; run .ci/setup")
    own = outcomes(path, "", tmp_path / "own.xml")
    installed = outcomes(path, install, tmp_path / "installed.xml")
    assert installed == own
    assert "passed" in own.values(), own
