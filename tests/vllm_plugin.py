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
nothing (empty), ``ec`` (``bucketpool.vllm.install()``), ``kv_offload``
(``install(kv_offload=True)``), or ``plugin``: bucketpool's general plugin, loaded by vLLM's
own loader with ``BUCKETPOOL_VLLM=ec,kv``, on a vLLM with the descriptor-pool hook of
``upstream/`` (see `serve_through_the_plugin`).  The directory holding vLLM's ``tests``
package (``$BUCKETPOOL_VLLM_TESTS``, by default ``.vllm/tests``) goes first on ``sys.path``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
import tempfile
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
#: What the plugin installs: empty, ``ec``, ``kv_offload`` or ``plugin``.
INSTALL_VARIABLE = "BUCKETPOOL_VLLM_INSTALL"
INSTALLS = ("", "ec", "kv_offload", "plugin")
#: A file to write `report` into as JSON, at the end of the run (unset: none).
REPORT_VARIABLE = "BUCKETPOOL_VLLM_REPORT"

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
    if install not in INSTALLS:
        raise pytest.UsageError(f"{INSTALL_VARIABLE}={install!r}: use one of {INSTALLS}")
    _patches.syspath_prepend(str(tests.parent))
    standin.install_kv_standin(_patches, eager=True, cuda=True, device_tensors=True)
    for module in _config_modules():
        _patches.setitem(sys.modules, module.__name__, module)
    _patches.setattr(
        torch.ops._C_cache_ops, "swap_blocks_batch", standin.swap_blocks_batch, raising=False
    )
    if install == "plugin":
        serve_through_the_plugin()
    elif install:
        from bucketpool import vllm as bucketpool_vllm

        bucketpool_vllm.install(kv_offload=install == "kv_offload")


#: What a run found, written to ``$BUCKETPOOL_VLLM_REPORT``: the files of vLLM's workers,
#: whether the hook is there, the factory it holds, the pools bucketpool's factory made
#: (by call site), whether ``install`` is in effect, and what was rebound (see `rebound`).
report: dict[str, Any] = {"pools": {}, "rebound": []}
_bindings: dict[tuple[str, str], object] = {}
_scratch: list[tempfile.TemporaryDirectory[str]] = []  # bucketpool's .dist-info, for vLLM


def _vllm_bindings() -> dict[tuple[str, str], object]:
    """Every global of every ``vllm`` module, and every attribute of the classes they define."""
    found: dict[tuple[str, str], object] = {}
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] == "vllm" and isinstance(module, types.ModuleType):
            for key, value in list(vars(module).items()):
                found[name, key] = value
                if isinstance(value, type) and value.__module__ == name:
                    found.update(((f"{name}.{key}", k), v) for k, v in vars(value).items())
    return found


def rebound() -> list[str]:
    """The bindings of `_bindings` (taken before the plugin ran) bound to another object now.

    The hook's factory is set on purpose, and vLLM's loader records that it ran.
    """
    now = _vllm_bindings()
    allowed = {("vllm.utils.descriptor_pool", "_factory"), ("vllm.plugins", "plugins_loaded")}
    return [
        f"{module}.{name}"
        for (module, name), value in _bindings.items()
        if (module, name) not in allowed and now.get((module, name), _bindings) is not value
    ]


def serve_through_the_plugin() -> None:
    """Load bucketpool's general plugin as vLLM does; check that it set the hook's factory.

    The workers' modules and vLLM's hook are imported first, and every binding of every
    ``vllm`` module taken (`_bindings`); after vLLM's ``load_general_plugins`` ran
    `bucketpool.vllm.plugin` (its entry point, from a ``.dist-info`` written for the run),
    none may be bound to another object, and bucketpool's factory serves the pools.
    """
    from bucketpool import _hook
    from bucketpool import vllm as bucketpool_vllm

    hook = _hook.find()
    if hook is None:
        raise pytest.UsageError(f"{INSTALL_VARIABLE}=plugin: this vLLM has no {_hook.HOOK}")
    for name in (standin.WORKER, standin.KV_WORKER, "vllm.plugins"):
        importlib.import_module(name)
    _bindings.update(_vllm_bindings())
    made = _hook.HookPool.__init__

    def counted(self: _hook.HookPool, spec: _hook.DescriptorSpec, *args: Any) -> None:
        made(self, spec, *args)
        report["pools"][spec.name] = report["pools"].get(spec.name, 0) + 1

    _patches.setattr(_hook.HookPool, "__init__", counted)  # counts them; vLLM's untouched
    for name in ("BUCKETPOOL_VLLM_UNTESTED", "VLLM_PLUGINS"):
        _patches.delenv(name, raising=False)
    _patches.setenv("BUCKETPOOL_VLLM", "ec,kv")
    _scratch.append(tempfile.TemporaryDirectory())
    _patches.syspath_prepend(str(standin.distribution(Path(_scratch[0].name))))
    sys.modules["vllm.plugins"].load_general_plugins()
    factory = hook.get_descriptor_pool_factory()
    if getattr(factory, "__module__", None) != _hook.__name__ or rebound():
        raise pytest.UsageError(
            f"bucketpool's plugin set the factory {factory!r} and rebound {rebound()}; it "
            "should set bucketpool's factory and rebind nothing"
        )
    report["installed"] = bucketpool_vllm.installed()


def pytest_unconfigure(config: pytest.Config) -> None:
    from bucketpool import _hook
    from bucketpool import vllm as bucketpool_vllm

    hook = _hook.find()
    factory = None if hook is None else hook.get_descriptor_pool_factory()
    report.update(
        hook=hook is not None,
        factory=None if factory is None else f"{factory.__module__}.{factory.__qualname__}",
        installed=report.get("installed", False) or bucketpool_vllm.installed(),
        rebound=rebound(),
        files=[
            sys.modules[name].__file__
            for name in (standin.WORKER, standin.KV_WORKER)
            if name in sys.modules
        ],
    )
    if os.environ.get(REPORT_VARIABLE):
        Path(os.environ[REPORT_VARIABLE]).write_text(json.dumps(report), encoding="utf-8")
    bucketpool_vllm.uninstall()
    _patches.undo()
    for scratch in _scratch:
        scratch.cleanup()


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
