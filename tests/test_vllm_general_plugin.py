"""bucketpool's ``vllm.general_plugins`` entry point, loaded by vLLM's own plugin loader.

vLLM runs the general plugins in every process it starts (``vllm.plugins``); bucketpool's
(`bucketpool.vllm.plugin`) installs as ``$BUCKETPOOL_VLLM`` says.  The loader is vLLM's own,
from the wheel (``.ci/setup`` puts it in ``.vllm/site``), over the host stand-in of
``tests/_vllm_standin.py``; skipped without the wheel.  It finds entry points through
``importlib.metadata``: each test puts first on ``sys.path`` the ``.dist-info`` that pip
would install from this checkout's ``pyproject.toml`` (the shared ``.venv`` may hold one
installed before the entry point was declared).
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import _vllm_standin as standin
import pytest
from _vllm_standin import distribution

import bucketpool.vllm as bucketpool_vllm

pytestmark = pytest.mark.skipif(
    standin.vllm_locations() is None,
    reason="no vLLM: run .ci/setup, or see docs/development.md",
)

ROOT = Path(__file__).resolve().parent.parent
GROUP = "vllm.general_plugins"
VARIABLES = ("BUCKETPOOL_VLLM", "BUCKETPOOL_VLLM_UNTESTED", "VLLM_PLUGINS")


def _vllm_names() -> set[str]:
    return {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")}


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[types.ModuleType]:
    """vLLM's ``vllm.plugins`` from the wheel, with bucketpool's entry point to find."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(distribution(tmp_path)))
    before = _vllm_names()
    standin.install_kv_standin(monkeypatch, eager=True)  # the EC worker's and the KV one's
    try:
        yield importlib.import_module("vllm.plugins")  # with vllm.envs, the real ones
    finally:
        bucketpool_vllm.uninstall()
        for name in _vllm_names() - before:
            sys.modules.pop(name, None)


def test_vllms_loader_finds_the_entry_point(plugins: types.ModuleType) -> None:
    assert plugins.load_plugins_by_group(GROUP) == {"bucketpool": bucketpool_vllm.plugin}


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_unset_or_empty_installs_nothing(
    plugins: types.ModuleType, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is not None:
        monkeypatch.setenv("BUCKETPOOL_VLLM", value)

    plugins.load_general_plugins()

    assert plugins.plugins_loaded
    assert not bucketpool_vllm.installed()


def test_ec_installs_the_ec_part(
    plugins: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_worker = importlib.import_module(standin.KV_WORKER)
    factory = gpu_worker._new_descriptor_buffers
    monkeypatch.setenv("BUCKETPOOL_VLLM", "ec")

    plugins.load_general_plugins()

    assert bucketpool_vllm.installed()
    worker = importlib.import_module(standin.WORKER)  # imported now: it binds bucketpool's
    assert worker.DescriptorBufferPool.__module__ == "bucketpool.vllm"
    assert gpu_worker._new_descriptor_buffers is factory  # the KV part was not asked for


def test_ec_kv_installs_both_parts(
    plugins: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_worker = importlib.import_module(standin.KV_WORKER)
    factory = gpu_worker._new_descriptor_buffers
    monkeypatch.setenv("BUCKETPOOL_VLLM", "ec,kv")

    plugins.load_general_plugins()

    assert bucketpool_vllm.installed()
    assert gpu_worker._new_descriptor_buffers is not factory
    bucketpool_vllm.uninstall()
    assert gpu_worker._new_descriptor_buffers is factory


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BUCKETPOOL_VLLM", "kv"),
        ("BUCKETPOOL_VLLM", "EC"),
        ("BUCKETPOOL_VLLM", "ec, kv"),
        ("BUCKETPOOL_VLLM", "1"),
        ("BUCKETPOOL_VLLM_UNTESTED", "yes"),
    ],
)
def test_an_invalid_value_is_an_error_that_names_the_accepted_ones(
    plugins: types.ModuleType, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("BUCKETPOOL_VLLM", "ec")
    monkeypatch.setenv(variable, value)
    accepted = "'ec' (install()), 'ec,kv' (install(kv_offload=True)), or nothing"
    if variable == "BUCKETPOOL_VLLM_UNTESTED":
        accepted = "'1' (install on a vLLM bucketpool was not tested with), or nothing"

    with pytest.raises(ValueError, match=rf"^{variable}={value!r}: .*") as caught:
        plugins.load_general_plugins()  # vLLM logs a failed import, but lets this through

    assert accepted in str(caught.value)
    assert not bucketpool_vllm.installed()


def test_untested_is_forced_by_its_variable(
    plugins: types.ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.35.0")
    monkeypatch.setenv("BUCKETPOOL_VLLM", "ec")
    with caplog.at_level(logging.WARNING, logger="vllm.bucketpool"):
        plugins.load_general_plugins()
    assert not bucketpool_vllm.installed()
    assert [record.name for record in caplog.records] == ["vllm.bucketpool"]

    monkeypatch.setattr(plugins, "plugins_loaded", False)  # as in a process started anew
    monkeypatch.setenv("BUCKETPOOL_VLLM_UNTESTED", "1")
    plugins.load_general_plugins()

    assert bucketpool_vllm.installed()


@pytest.mark.parametrize(
    ("selection", "loaded"),
    [("bucketpool", True), ("other,bucketpool", True), ("other", False), ("", False)],
)
def test_vllm_plugins_selects_it_by_its_name(
    plugins: types.ModuleType, monkeypatch: pytest.MonkeyPatch, selection: str, loaded: bool
) -> None:
    monkeypatch.setenv("BUCKETPOOL_VLLM", "ec")
    monkeypatch.setenv("VLLM_PLUGINS", selection)

    plugins.load_general_plugins()

    assert bucketpool_vllm.installed() is loaded


#: A process vLLM starts: it loads the general plugins, then builds its workers.
PROCESS = """
import importlib

import pytest

import bucketpool.vllm
from bench import _vllm_host

_vllm_host.install_standin(pytest.MonkeyPatch(), _vllm_host.vllm_locations(), eager=True)
importlib.import_module("vllm.plugins").load_general_plugins()
worker = importlib.import_module(_vllm_host.WORKER)
print(bucketpool.vllm.installed(), worker.DescriptorBufferPool.__module__)
"""


@pytest.mark.parametrize(
    ("value", "expected"),
    [("ec", "True bucketpool.vllm"), ("", f"False {standin.WORKER}.descriptor_buffers")],
)
def test_a_process_vllm_starts_is_turned_on_by_the_environment(
    tmp_path: Path, value: str, expected: str
) -> None:
    environment = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    environment["BUCKETPOOL_VLLM"] = value
    environment["PYTHONPATH"] = os.pathsep.join([str(distribution(tmp_path)), str(ROOT)])

    ran = subprocess.run(
        [sys.executable, "-c", PROCESS],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        check=False,
    )

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == expected.split()
