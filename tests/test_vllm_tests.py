"""vLLM's own worker tests pass the same with and without bucketpool's drop-in.

For each vLLM tested (`_vllm_standin.vllm_sites`: 0.34.0's wheel and 0.33.0's modules after
``.ci/setup``), its EC CPU worker tests run with vLLM's pool and after ``install()``, its
KV-offload handler tests with vLLM's lists and after ``install(kv_offload=True)``: each run
is a pytest of its own, hosted on the CPU by `vllm_plugin`; every run must pass (a test may
skip), with the same outcome for every test.  A vLLM's test files are the ``tests``
directory beside its site (``.vllm/tests`` beside ``.vllm/site``, ``.vllm/0.33.0/tests``
beside ``.vllm/0.33.0/site``), fetched from its sdist by ``.ci/setup``; without them its
runs skip, unless ``$BUCKETPOOL_VLLM_SITE`` names the site (``.ci/run`` does): then they
fail.  ``test_vllm_upstream.py`` runs them on vLLM with ``upstream/``'s patch the same way.
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


def outcomes(
    site: Path, test_file: Path, install: str, report: Path, tests: Path | None = None
) -> dict[str, str]:
    """Run vLLM's *test_file* through `vllm_plugin`; return each test's outcome by name.

    *tests* is the directory of vLLM's test files, by default ``tests`` beside *site*; the
    run's `vllm_plugin.report` goes to *report* with ``.json`` for ``.xml``.
    """
    env = {
        **os.environ,
        standin.SITE_VARIABLE: str(site),
        vllm_plugin.TESTS_VARIABLE: str(tests or site.parent / "tests"),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
        vllm_plugin.INSTALL_VARIABLE: install,
        vllm_plugin.REPORT_VARIABLE: str(report.with_suffix(".json")),
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


_own: dict[tuple[Path, Path], dict[str, str]] = {}


def vllms_own(site: Path, test_file: Path, directory: Path) -> dict[str, str]:
    """The outcomes of vLLM's *test_file* on the vLLM in *site* itself: run once a session."""
    if (site, test_file) not in _own:
        _own[site, test_file] = outcomes(site, test_file, "", directory / "own.xml")
    return _own[site, test_file]


@pytest.mark.parametrize(("test_file", "install"), FILES.items())
@pytest.mark.parametrize("site", standin.site_params())
def test_vllms_own_tests_pass_the_same_with_the_drop_in(
    site: Path, test_file: str, install: str, tmp_path: Path
) -> None:
    path = standin.test_file(site, test_file)
    own = vllms_own(site, path, tmp_path)
    installed = outcomes(site, path, install, tmp_path / "installed.xml")
    assert installed == own
    assert "passed" in own.values(), own
