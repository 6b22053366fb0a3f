"""A pytest plugin that runs vLLM's own EC CPU worker tests on the CPU, with or without install().

``.ci/check`` runs vLLM 0.33.0's ``tests/v1/ec_connector/unit/cpu/worker/test_worker.py``
(fetched by ``.ci/setup`` into ``.vllm/tests``) twice against the real wheel, with
``-p vllm_plugin`` (``tests/`` on the path), and requires the same outcome for every test:

    python -m pytest -p vllm_plugin .vllm/tests/v1/.../test_worker.py   # vLLM's pool
    BUCKETPOOL_INSTALL=1 python -m pytest -p vllm_plugin ...             # bucketpool's

At configuration, before vLLM's test module is imported, it puts `_vllm_standin`'s host in
place (every copy runs as it is queued; the platform answers ``is_cuda()``, so the byte tests
run), registers ``torch.ops._C_cache_ops.swap_blocks_batch`` (the tests' check for the op),
small stand-ins for the ``vllm.config`` classes vLLM's ``tests/.../unit/utils.py`` builds its
configs from (the real ones import vLLM's dependencies), and the ``caplog_vllm`` fixture of
vLLM's ``tests/conftest.py``.  With ``BUCKETPOOL_INSTALL=1`` it calls
``bucketpool.vllm.install()`` after that.  The directory holding vLLM's ``tests`` package
(``.vllm`` by default, or ``$BUCKETPOOL_VLLM_TESTS``'s parent) goes first on ``sys.path``.
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

#: Where ``.ci/setup`` extracts vLLM's test files (a ``tests`` package).
TESTS_VARIABLE = "BUCKETPOOL_VLLM_TESTS"
DEFAULT_TESTS = Path(__file__).resolve().parent.parent / ".vllm" / "tests"

_patches = pytest.MonkeyPatch()
#: The tests the stand-in cannot host: skipped in both runs, with the reason.
UNHOSTED = {
    "test_e2e_scheduler_worker_save_then_load": (
        "needs vLLM's scheduler, whose imports (vllm.v1.outputs, vllm.multimodal) need "
        "vLLM's dependencies"
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


def pytest_configure(config: pytest.Config) -> None:
    named = os.environ.get(TESTS_VARIABLE, "")
    tests = Path(named) if named else DEFAULT_TESTS
    if not (tests / "__init__.py").is_file():
        raise pytest.UsageError(f"no vLLM test files in {tests}: run .ci/setup")
    _patches.syspath_prepend(str(tests.parent))
    standin.install_standin(_patches, eager=True, cuda=True)
    for module in _config_modules():
        _patches.setitem(sys.modules, module.__name__, module)
    _patches.setattr(
        torch.ops._C_cache_ops, "swap_blocks_batch", standin.swap_blocks_batch, raising=False
    )
    if os.environ.get("BUCKETPOOL_INSTALL") == "1":
        from bucketpool import vllm as bucketpool_vllm

        bucketpool_vllm.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    from bucketpool import vllm as bucketpool_vllm

    bucketpool_vllm.uninstall()
    _patches.undo()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = UNHOSTED.get(getattr(item, "originalname", item.name))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"bucketpool's CPU host: {reason}"))


def pytest_report_header() -> str:
    install = os.environ.get("BUCKETPOOL_INSTALL") == "1"
    return f"bucketpool vllm_plugin: install() {'called' if install else 'not called'}"


@pytest.fixture
def caplog_vllm(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """vLLM's fixture of that name: ``caplog`` at INFO (vLLM's loggers propagate here)."""
    with caplog.at_level(logging.INFO):
        yield caplog
