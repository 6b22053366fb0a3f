"""The host's ambient torch state is not the pool's: every call works the same inside it.

vLLM acquires inside ``torch.inference_mode()``; model code runs under a default dtype or
device, and some hosts turn on deterministic algorithms.  Buffers made there must still be
plain CPU tensors of the pool's dtype, usable in place after the mode ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _events import FlagEvent, SyncEvent

from bucketpool import BucketPool
from bucketpool.compat import AliasedDescriptorBufferPool, DescriptorBufferPool


@contextlib.contextmanager
def _default_dtype() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _default_device() -> Iterator[None]:
    torch.set_default_device("meta")  # any device but the CPU: "meta" exists on every build
    try:
        yield
    finally:
        torch.set_default_device(None)


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


AMBIENT: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
    "with-device": lambda: torch.device("meta"),
    "default-device": _default_device,
    "default-dtype": _default_dtype,
    "deterministic": _deterministic,
}


def _assert_plain(tensor: torch.Tensor, dtype: torch.dtype = torch.int64) -> None:
    assert tensor.device.type == "cpu"
    assert tensor.dtype == dtype
    assert not tensor.is_inference()


@pytest.mark.parametrize("ambient", AMBIENT.values(), ids=AMBIENT.keys())
@pytest.mark.parametrize("level", ["off", "checks", "strict"])
def test_every_pool_call_works_inside_the_hosts_state(
    ambient: Callable[[], contextlib.AbstractContextManager[Any]], level: str
) -> None:
    pool = BucketPool(debug=level)  # type: ignore[arg-type]
    with ambient():
        pool.reserve(40)
        for n in (40, 40, 100, 3):  # a hit, a miss, and a repeated n from the view cache
            handle = pool.acquire(n)
            with handle as bufs:
                for view in bufs:
                    _assert_plain(view)
                    assert view.shape == (n,)
                end = handle.add_copies(0, [4096, 8192], [12288, 16384], 64)
                src, _, sizes = handle.shrink(end)
                assert src.tolist() == [4096, 8192]
                assert sizes.tolist() == [64, 64]
                handle.record_event(SyncEvent())
        assert pool.collect() == 0
        with pool.acquire(7) as bufs:
            bufs[2].fill_(1)  # in place, inside the mode
        pool.trim()
        assert pool.stats().active_requests.current == 0
    # ... and, after it, in place on what was cut inside it
    with pool.acquire(40) as bufs:
        bufs[0].fill_(5)
        assert bufs[0].tolist() == [5] * 40
    pool.synchronize()
    assert pool.outstanding() == []


@pytest.mark.parametrize("ambient", AMBIENT.values(), ids=AMBIENT.keys())
@pytest.mark.parametrize("adapter", [DescriptorBufferPool, AliasedDescriptorBufferPool])
def test_the_compat_adapters_work_inside_the_hosts_state(
    ambient: Callable[[], contextlib.AbstractContextManager[Any]],
    adapter: type[DescriptorBufferPool | AliasedDescriptorBufferPool],
) -> None:
    pool: Any = adapter()  # either adapter: the same calls
    inference = ambient is torch.inference_mode
    with ambient():
        first = pool.acquire(5)
        for tensor in first[:3]:  # inference tensors where vLLM's pool makes them, as its are
            assert (tensor.device.type, tensor.dtype) == ("cpu", torch.int64)
            assert tensor.is_inference() is inference
        first.src_ptrs[:5].fill_(1)
        pool.release(first, event=FlagEvent(done=True))
        again = pool.acquire(5)
        assert again.src_ptrs.data_ptr() == first.src_ptrs.data_ptr()
    again.sizes[:5].numpy().fill(2)  # outside the mode, through numpy (vLLM's add_copies)
    assert again.sizes[:5].tolist() == [2] * 5
    pool.release(again)
    later = pool.acquire(5)  # outside the mode: plain tensors of the same memory
    _assert_plain(later.sizes)
    later.sizes[:5].fill_(3)
    assert later.src_ptrs.data_ptr() == first.src_ptrs.data_ptr()
    pool.release(later)


def test_pinned_buffers_are_made_on_the_cpu_under_a_default_device() -> None:
    if not torch.cuda.is_available():
        pytest.skip("pin_memory needs an accelerator")
    pool = BucketPool(pin_memory=True)
    with torch.device("cuda"), torch.inference_mode(), pool.acquire(8) as bufs:
        _assert_plain(bufs[0])
        assert bufs[0].is_pinned()
