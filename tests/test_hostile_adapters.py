"""A hostile review of ``install(kv_offload=True)``: vLLM's real handler, its call patterns.

Each test fails on the code it was written against; each quotes the promise it checks.
"""

from __future__ import annotations

import copy
import gc
import importlib
import pickle
import sys
import types
import warnings
from collections.abc import Iterator

import _kv_standin as kv_standin
import _vllm_standin as standin
import pytest
import torch
from test_kv_offload import make_worker, pool_of, specs

from bucketpool import LeakWarning, _kv_offload
from bucketpool import vllm as bucketpool_vllm

pytestmark = pytest.mark.skipif(
    standin.vllm_locations() is None,
    reason="no vLLM: run .ci/setup, or see docs/development.md",
)


def _vllm_names() -> set[str]:
    return {name for name in sys.modules if name.split(".")[0] in ("vllm", "vllm_ascend")}


@pytest.fixture(params=[False, True], ids=["int64", "xpu-uint64"])
def kv_worker(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[types.ModuleType]:
    """vLLM's real ``gpu_worker`` over the stand-in (as ``test_kv_offload.gpu_worker``)."""
    before = _vllm_names()
    for name in ("BUCKETPOOL_CONF", "BUCKETPOOL_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    kv_standin.install_kv_standin(monkeypatch, eager=False, xpu=request.param)
    try:
        yield importlib.import_module(kv_standin.KV_WORKER)
    finally:
        bucketpool_vllm.uninstall()
        for name in _vllm_names() - before:
            sys.modules.pop(name, None)


def _leaks(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(each.message) for each in record if issubclass(each.category, LeakWarning)]


def test_uninstall_restores_a_factory_bound_after_install(kv_worker: types.ModuleType) -> None:
    """A module imported after install binds bucketpool's factory: uninstall must undo it.

    docs/compat.md: "Modules imported after `install` are served by calling
    `install(kv_offload=True)` again." ... "`uninstall()` puts back the factory and the
    methods." /work/briefs/issue28.md: "`uninstall()` restores everything."
    """
    original = kv_worker._new_descriptor_buffers
    bucketpool_vllm.install(kv_offload=True)
    late = types.ModuleType("vllm_ascend.kv_offload.late")  # `from ...gpu_worker import` it
    vars(late)["_new_descriptor_buffers"] = kv_worker._new_descriptor_buffers
    sys.modules[late.__name__] = late
    try:
        bucketpool_vllm.install(kv_offload=True)  # again, for the module imported since
        bucketpool_vllm.uninstall()
        assert late._new_descriptor_buffers is original  # still bucketpool's partial
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            bucketpool_vllm.install(kv_offload=True)  # probes the stale partial: a leak
            gc.collect()
        assert _leaks(record) == []
    finally:
        sys.modules.pop(late.__name__, None)


def test_a_handler_made_before_install_reports_no_leak_when_it_grows(
    kv_worker: types.ModuleType,
) -> None:
    """vLLM throws away a too-small triple from its own list: that is not a leak.

    docs/compat.md: "Only handlers made afterwards get the empty list; a handler made
    before keeps its own and works as before". issue28: "no buffer thrown away for being
    small ... leaks reported" (a LeakWarning here names vLLM's line for vLLM's own design).
    """
    early = make_worker(kv_worker)  # its _buffer_pool stays vLLM's plain list
    bucketpool_vllm.install(kv_offload=True)
    device = standin.device()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.inference_mode():
            assert early.submit_store(0, *specs([0], [0]))  # 2 ops: a bucket of 16
            device.drain()
            assert [result.job_id for result in early.get_finished()] == [0]
            blocks = list(range(12))  # 24 ops: vLLM drops the 16 it pops, asks for 24
            assert early.submit_store(1, *specs(blocks, blocks))
            device.drain()
            assert [result.job_id for result in early.get_finished()] == [1]
        early.shutdown()
        gc.collect()
    assert _leaks(record) == []
    assert pool_of(kv_worker).stats().leaks == 0


@pytest.mark.parametrize(
    "duplicate",
    [copy.deepcopy, lambda triple: pickle.loads(pickle.dumps(triple))],
    ids=["deepcopy", "pickle"],
)
def test_descriptor_tensors_copy_as_vllms_own(
    kv_worker: types.ModuleType, duplicate: object
) -> None:
    """A deep copy or pickle of the factory's triple works as with vLLM's factory.

    The factory is a drop-in for vLLM's ``_new_descriptor_buffers`` (docs/compat.md:
    "`_new_descriptor_buffers(n)`, the handler's factory, is rebound"); vLLM's tensors deep
    copy and pickle. Today both raise TypeError "a BufferHandle cannot be copied or pickled
    ... Pass the handle itself": a handle the caller never saw (common brief: "Every error
    is a documented exception whose message ... says what to do").
    """
    assert callable(duplicate)
    try:
        duplicate(kv_worker._new_descriptor_buffers(4))  # vLLM's own factory's triple
    except Exception as error:  # (torch pickles no uint64 tensor)
        expected: type[Exception] | None = type(error)
    else:
        expected = None
    bucketpool_vllm.install(kv_offload=True)
    triple = kv_worker._new_descriptor_buffers(4)
    returns = _kv_offload._Returns()
    try:
        for tensor in triple:
            tensor.fill_(7)
        if expected is not None:
            with pytest.raises(expected):
                duplicate(triple)
            return
        copied = duplicate(triple)  # raises TypeError today
        assert [c.tolist() for c in copied] == [t.tolist() for t in triple]
        assert all(c.data_ptr() != t.data_ptr() for c, t in zip(copied, triple, strict=True))
        returns.append(tuple(copied))  # no holder: kept, as vLLM's list keeps its own
        assert len(returns) == 1
    finally:
        returns.append(triple)  # the one holder gives the buffer back
    assert pool_of(kv_worker).outstanding() == []
