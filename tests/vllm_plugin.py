"""A pytest plugin that hosts vLLM's own worker tests on the CPU, with or without the drop-in.

``test_vllm_tests.py`` runs vLLM 0.33.0's EC CPU worker tests and KV-offload worker tests
(fetched by ``.ci/setup`` into ``.vllm/tests``) on the real wheel through it, with ``tests/``
and the repository on ``PYTHONPATH``:

    BUCKETPOOL_VLLM_INSTALL=kv_offload python -m pytest -c pyproject.toml -p vllm_plugin \
        .vllm/tests/v1/kv_offload/cpu/test_gpu_worker.py

Before vLLM's conftests and test modules are imported, it puts the KV host of `bench._vllm_host` in
place (every copy runs as it is queued; the platform answers ``is_cuda()`` and
``is_cuda_alike()``, so the byte tests run; the KV tests' "device" tensors say they are on
CUDA), registers ``torch.ops._C_cache_ops.swap_blocks_batch`` (the EC tests' check for the
op), small stand-ins for the ``vllm.config`` classes vLLM's ``tests/.../unit/utils.py``
builds its configs from (the real ones import vLLM's dependencies), and two fixtures of
vLLM's ``tests/conftest.py``.  It skips the tests it cannot host (one needs vLLM's
scheduler, three stall a CUDA stream with ``torch.cuda._sleep``), and lets the one that
drops a buffer on purpose warn of the leak (elsewhere pyproject's ``filterwarnings`` makes
a `bucketpool.LeakWarning` an error).  ``$BUCKETPOOL_VLLM_INSTALL`` says what is installed:
nothing (empty), ``ec`` (``bucketpool.vllm.install()``) or ``kv_offload``
(``install(kv_offload=True)``).  The directory holding vLLM's ``tests`` package
(``$BUCKETPOOL_VLLM_TESTS``, by default ``.vllm/tests``) goes first on ``sys.path``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _vllm_standin as standin
import pytest
import torch

#: Names the directory of vLLM's test files (a ``tests`` package), ``DEFAULT_TESTS`` unset.
TESTS_VARIABLE = "BUCKETPOOL_VLLM_TESTS"
DEFAULT_TESTS = Path(__file__).resolve().parent.parent / ".vllm" / "tests"
#: What the plugin installs: empty, ``ec`` or ``kv_offload``.
INSTALL_VARIABLE = "BUCKETPOOL_VLLM_INSTALL"

_patches = pytest.MonkeyPatch()
#: Marks for the tests the CPU host treats apart, by name, in every run.
MARKS = {
    "test_e2e_scheduler_worker_save_then_load": pytest.mark.skip(
        reason="bucketpool's CPU host: needs vLLM's scheduler, whose imports "
        "(vllm.v1.outputs, vllm.multimodal) need vLLM's dependencies"
    ),
    # They stall a stream with torch.cuda._sleep (the platform says it is CUDA-like).
    **dict.fromkeys(
        (
            "test_save_survives_encoder_cache_free_before_copy_runs",
            "test_load_buffer_survives_eviction_while_consumer_read_is_queued",
            "test_load_waits_for_pending_compute_stream_writes",
        ),
        pytest.mark.skip(reason="bucketpool's CPU host: stalls a CUDA stream (torch.cuda._sleep)"),
    ),
    # It drops a save triple unreleased on purpose: with install(), a LeakWarning says so.
    "test_save_descriptors_hold_high_bit_source_addresses": pytest.mark.filterwarnings(
        "always::bucketpool.LeakWarning"
    ),
}


@dataclasses.dataclass
class ParallelConfig:
    """``vllm.config.parallel.ParallelConfig``: what the worker tests pass and read."""

    tensor_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    rank: int = 0
    data_parallel_index: int = 0


@dataclasses.dataclass
class ECTransferConfig:
    """``vllm.config.ec_transfer.ECTransferConfig``: what the worker tests pass and read."""

    ec_connector: str | None = None
    ec_role: str | None = None
    engine_id: str | None = None
    ec_connector_extra_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    mm_encoder_output_widths: dict[str, int] | None = None


class ModelConfig:
    """``vllm.config.ModelConfig``, a spec for ``Mock``: the attributes the tests use."""

    dtype: torch.dtype
    model: str

    def get_inputs_embeds_size(self) -> int:
        raise NotImplementedError


class VllmConfig:
    """``vllm.config.VllmConfig``, a spec for ``Mock``."""

    model_config: ModelConfig
    parallel_config: ParallelConfig
    ec_transfer_config: ECTransferConfig
    instance_id: str


def _config_modules() -> list[types.ModuleType]:
    modules = []
    for name, attributes in (
        ("vllm.config", {"ModelConfig": ModelConfig, "VllmConfig": VllmConfig}),
        ("vllm.config.ec_transfer", {"ECRole": str, "ECTransferConfig": ECTransferConfig}),
        ("vllm.config.parallel", {"ParallelConfig": ParallelConfig}),
    ):
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        modules.append(module)
    modules[0].__path__ = []  # a package
    return modules


def tests_dir() -> Path:
    """The directory of vLLM's test files: ``$BUCKETPOOL_VLLM_TESTS``, or `DEFAULT_TESTS`."""
    return Path(os.environ.get(TESTS_VARIABLE) or DEFAULT_TESTS)


def pytest_load_initial_conftests() -> None:
    """Before vLLM's conftests are loaded (``v1/kv_offload``'s imports the KV config)."""
    tests = tests_dir()
    if not (tests / "__init__.py").is_file():
        raise pytest.UsageError(f"no vLLM test files in {tests}: run .ci/setup")
    install = os.environ.get(INSTALL_VARIABLE, "")
    if install not in ("", "ec", "kv_offload"):
        raise pytest.UsageError(f"{INSTALL_VARIABLE}={install!r}: use '', 'ec' or 'kv_offload'")
    _patches.syspath_prepend(str(tests.parent))
    standin.install_kv_standin(_patches, eager=True, cuda=True, device_tensors=True)
    for module in _config_modules():
        _patches.setitem(sys.modules, module.__name__, module)
    _patches.setattr(
        torch.ops._C_cache_ops, "swap_blocks_batch", standin.swap_blocks_batch, raising=False
    )
    if install:
        from bucketpool import vllm as bucketpool_vllm

        bucketpool_vllm.install(kv_offload=install == "kv_offload")


def pytest_unconfigure(config: pytest.Config) -> None:
    from bucketpool import vllm as bucketpool_vllm

    bucketpool_vllm.uninstall()
    _patches.undo()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        mark = MARKS.get(getattr(item, "originalname", item.name))
        if mark is not None:
            item.add_marker(mark)


def pytest_report_header() -> str:
    return f"bucketpool vllm_plugin: {INSTALL_VARIABLE}={os.environ.get(INSTALL_VARIABLE, '')!r}"


@pytest.fixture
def caplog_vllm(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """vLLM's fixture of that name: ``caplog`` at INFO (the stand-in's loggers propagate)."""
    with caplog.at_level(logging.INFO):
        yield caplog


@pytest.fixture
def default_vllm_config() -> None:
    """vLLM's fixture sets a default config; the KV worker reads none."""
