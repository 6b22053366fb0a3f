"""A pytest plugin that runs vLLM's own KV-offload worker tests on the host stand-in.

``pytest -p _vllm_kv_plugin --noconftest <vllm>/tests/v1/kv_offload/cpu/test_gpu_worker.py``
with this directory and the repository on ``PYTHONPATH``: it puts `_kv_standin` in place
(copies run as they are queued) before vLLM's test module is imported, gives the two fixtures
the file takes from vLLM's conftest (which would import all of vLLM), and, when
``BUCKETPOOL_VLLM_INSTALL`` is ``kv_offload``, calls ``bucketpool.vllm.install(kv_offload=True)``
first (``ec``: ``install()``).  ``test_vllm_tests.py`` runs it both ways.
"""

from __future__ import annotations

import os

import _kv_standin as kv_standin
import pytest

import bucketpool.vllm

_patch = pytest.MonkeyPatch()


def pytest_configure(config: pytest.Config) -> None:
    kv_standin.install_kv_standin(_patch, eager=True, device_tensors=True)
    how = os.environ.get("BUCKETPOOL_VLLM_INSTALL", "")
    if how in ("ec", "kv_offload"):
        bucketpool.vllm.install(kv_offload=how == "kv_offload")
    elif how:
        raise pytest.UsageError(f"BUCKETPOOL_VLLM_INSTALL={how!r}: use 'ec' or 'kv_offload'")


def pytest_unconfigure(config: pytest.Config) -> None:
    bucketpool.vllm.uninstall()
    _patch.undo()


@pytest.fixture
def caplog_vllm(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """vLLM's fixture: its logger does not propagate; the stand-in's does, so pytest's works."""
    return caplog


@pytest.fixture
def default_vllm_config() -> None:
    """vLLM's fixture sets a default config; the KV worker reads none."""
