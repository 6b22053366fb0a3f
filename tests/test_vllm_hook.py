"""bucketpool's pools for vLLM's descriptor-pool hook, and the plugin that sets them, without vLLM.

`bucketpool.vllm.descriptor_pool_factory` gets a call site's spec (any object with vLLM's
``DescriptorSpec`` attributes); `bucketpool.vllm.plugin` sets a factory where vLLM's hook
module is (here a stand-in module in ``sys.modules``) and installs nothing.  The pools
against vLLM's own code and its default pool: ``test_vllm_upstream.py``.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable, Iterator

import pytest
import torch
from _events import DeviceError, FlagEvent, SyncEvent

from bucketpool import ReleaseError
from bucketpool import vllm as bucketpool_vllm
from bucketpool._hook import HookPool
from bucketpool.compat import AliasedDescriptorBuffers
from bucketpool.vllm import descriptor_pool_factory


@dataclasses.dataclass(frozen=True)
class Spec:
    """vLLM's ``DescriptorSpec``, as the patch defines it."""

    name: str = "ec_cpu"
    dtype: torch.dtype = torch.int64
    pin_memory: bool = False
    aliased: bool = True


def test_aliased_pools_hand_out_vllms_six_fields() -> None:
    pool = descriptor_pool_factory(Spec(dtype=torch.uint64))
    assert isinstance(pool, HookPool)
    bufs = pool.acquire(5)

    assert isinstance(bufs, AliasedDescriptorBuffers)
    assert bufs.src_ptrs.dtype == torch.uint64
    assert bufs.src_ptrs.numel() == 16
    pool.release(bufs)
    assert pool._pool == [bufs]  # what vLLM's tests read (docs/compat.md)
    again = pool.acquire(9)
    assert isinstance(again, AliasedDescriptorBuffers)
    assert again.src_ptrs is bufs.src_ptrs
    pool.release(again)


def test_triple_pools_hand_out_three_tensors_that_hold_the_hand_out() -> None:
    pool = descriptor_pool_factory(Spec(name="kv_offload", aliased=False))
    assert isinstance(pool, HookPool)
    triple = pool.acquire(20)

    assert type(triple) is tuple
    assert [len(t) for t in triple] == [32, 32, 32]
    assert pool.pool.stats().active_requests.current == 1
    pool.release(triple)
    assert pool.pool.stats().active_requests.current == 0
    assert pool._pool == []


@pytest.mark.parametrize("aliased", [True, False], ids=["aliased", "triple"])
def test_a_second_release_is_refused(aliased: bool) -> None:
    pool = descriptor_pool_factory(Spec(aliased=aliased))
    bufs = pool.acquire(4)
    pool.release(bufs)

    with pytest.raises(ReleaseError, match="already released"):
        pool.release(bufs)


def test_tensors_of_two_hand_outs_are_refused() -> None:
    pool = descriptor_pool_factory(Spec(aliased=False))
    first, second = pool.acquire(4), pool.acquire(4)

    with pytest.raises(ReleaseError, match="not one triple"):
        pool.release((first[0], second[1], second[2]))
    pool.release(first)
    pool.release(second)
    assert pool.pool.stats().active_requests.current == 0


def test_an_aliased_tuple_of_another_pool_is_refused() -> None:
    ours, theirs = descriptor_pool_factory(Spec()), descriptor_pool_factory(Spec())
    bufs = theirs.acquire(4)

    with pytest.raises(ReleaseError, match="not acquired from this pool"):
        ours.release(bufs)
    theirs.release(bufs)


def test_a_triple_the_pool_did_not_hand_out_is_let_go() -> None:
    pool = descriptor_pool_factory(Spec(aliased=False))
    own = tuple(torch.zeros(4, dtype=torch.int64) for _ in range(3))  # vLLM's tests make one

    pool.release(own, end_event=FlagEvent())

    assert pool.pool.stats().allocations.current == 0


def test_an_end_event_without_query_is_refused_and_changes_nothing() -> None:
    pool = descriptor_pool_factory(Spec())
    bufs = pool.acquire(4)

    with pytest.raises(TypeError, match=r"end_event needs a query\(\) -> bool method"):
        pool.release(bufs, end_event=object())
    pool.release(bufs)


@pytest.mark.parametrize("aliased", [True, False], ids=["aliased", "triple"])
def test_an_end_event_that_raises_another_error_raises_it_once_released(aliased: bool) -> None:
    # Only RuntimeError is a device fault (as in vLLM): another error stays loud.
    class Broken:
        def query(self) -> bool:
            raise AttributeError("no such op")

    pool = descriptor_pool_factory(Spec(aliased=aliased))
    bufs = pool.acquire(4)

    with pytest.raises(AttributeError, match="no such op"):
        pool.release(bufs, end_event=Broken())
    assert pool.pool.stats().parked == 1


def test_a_device_fault_parks_quietly_and_shutdown_raises_what_its_wait_raises() -> None:
    class Lost(SyncEvent):
        def query(self) -> bool:
            raise DeviceError("device lost")

        def synchronize(self) -> None:
            raise DeviceError("device lost")

    pool = descriptor_pool_factory(Spec())
    pool.release(pool.acquire(4), end_event=Lost())
    pool.release(pool.acquire(300))
    pool.collect()

    with pytest.raises(DeviceError, match="device lost"):
        pool.shutdown()
    stats = pool.pool.stats()
    assert (stats.parked, stats.cached_bytes) == (1, 0)  # parked for good; the idle one freed


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        (Spec(dtype=torch.int32), TypeError, r"'ec_cpu' call site asks for torch.int32"),
        (Spec(pin_memory=True), ValueError, r"pinned six-field descriptors"),
    ],
    ids=["dtype", "pinned-aliased"],
)
def test_a_spec_bucketpool_cannot_serve_is_an_error_that_says_what_to_do(
    spec: Spec, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        descriptor_pool_factory(spec)

    assert "leave it to vLLM's pool (a factory that returns None for it)" in str(caught.value)


def test_pinned_triples_need_an_accelerator() -> None:
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="pin_memory=True needs an accelerator"):
            descriptor_pool_factory(Spec(pin_memory=True, aliased=False))
    else:
        assert (
            descriptor_pool_factory(Spec(pin_memory=True, aliased=False)).acquire(1)[0].is_pinned()
        )


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in for the patched vLLM's hook module: ``set_descriptor_pool_factory``."""
    module = types.ModuleType("vllm.utils.descriptor_pool")
    module.factory = None  # type: ignore[attr-defined]

    def set_descriptor_pool_factory(factory: Callable[[Spec], object] | None) -> None:
        module.factory = factory  # type: ignore[attr-defined]

    module.set_descriptor_pool_factory = set_descriptor_pool_factory  # type: ignore[attr-defined]
    for name in ("BUCKETPOOL_VLLM", "BUCKETPOOL_VLLM_UNTESTED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    yield module
    assert not bucketpool_vllm.installed()  # the plugin rebound nothing


@pytest.mark.parametrize(
    ("value", "served"),
    [("ec", ["ec_cpu"]), ("ec,kv", ["ec_cpu", "kv_offload"])],
)
def test_the_plugin_sets_a_factory_for_the_call_sites_it_names(
    hook: types.ModuleType, monkeypatch: pytest.MonkeyPatch, value: str, served: list[str]
) -> None:
    monkeypatch.setenv("BUCKETPOOL_VLLM", value)

    bucketpool_vllm.plugin()

    names = ("ec_cpu", "kv_offload", "hisparse")
    pools = {name: hook.factory(Spec(name=name, aliased=name != "kv_offload")) for name in names}
    assert [name for name, pool in pools.items() if pool is not None] == served
    assert all(isinstance(pool, HookPool) for pool in pools.values() if pool)


def test_the_plugin_sets_nothing_when_unset(hook: types.ModuleType) -> None:
    bucketpool_vllm.plugin()

    assert hook.factory is None


def test_the_plugin_ignores_untested_where_vllm_has_the_hook(
    hook: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hook is a contract, not vLLM's internals: no version to check.
    monkeypatch.setenv("BUCKETPOOL_VLLM", "ec")
    monkeypatch.setenv("BUCKETPOOL_VLLM_UNTESTED", "1")

    bucketpool_vllm.plugin()

    assert hook.factory is not None
