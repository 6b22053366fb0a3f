"""The pools are driven through each step as their callers drive them, with the same ends."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from bench import _pools as pools
from bench._original import OriginalDescriptorBufferPool
from bench._traces import ENTRY_BYTES as TRIPLE
from bench._traces import Trace, builtin_traces, make_trace, windowed_events
from bucketpool import BucketPool


class Sliced:
    """A stand-in for a tensor: records the stop of each ``[:end]`` slice taken of it."""

    def __init__(self, stops: list[int]) -> None:
        self.stops = stops

    def __getitem__(self, key: slice) -> Sliced:
        self.stops.append(key.stop)
        return self


class SlicingPool:
    """The original's API: records each step's end from the slices its callers cut."""

    pool = None  # compat's BucketPool, read for its counters only

    def __init__(self) -> None:
        self.stops: list[int] = []
        self.live = 0

    def acquire(self, n: int) -> SimpleNamespace:
        self.live += 1
        field = Sliced(self.stops)
        return SimpleNamespace(src_ptrs=field, dst_ptrs=field, sizes=field)

    def release(self, bufs: object) -> None:
        self.live -= 1

    @property
    def ends(self) -> list[int]:
        assert self.stops[0::3] == self.stops[1::3] == self.stops[2::3]  # three alike
        return self.stops[0::3]


class Handle:
    """A handle and its bound views at once: records the end each step shrinks to."""

    def __init__(self, pool: HandlePool) -> None:
        self.pool = pool

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def shrink(self, end: int) -> tuple[()]:
        self.pool.ends.append(end)
        return ()

    def release(self) -> None:
        self.pool.live -= 1


class HandlePool:
    def __init__(self) -> None:
        self.ends: list[int] = []
        self.live = 0

    def acquire(self, n: int) -> Handle:
        self.live += 1
        return Handle(self)


@pytest.mark.parametrize("name", ["normal-64", "loguniform-w4", "encoder-cache"])
def test_every_pool_gets_the_same_ends(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (trace,) = (t for t in builtin_traces(200) if t.name == name)
    made: dict[str, SlicingPool | HandlePool] = {}

    def fake(kind: str, make: type[SlicingPool | HandlePool]) -> None:
        monkeypatch.setattr(pools, kind, lambda: made.setdefault(kind, make()))

    fake("OriginalDescriptorBufferPool", SlicingPool)
    fake("BucketPool", HandlePool)
    fake("DescriptorBufferPool", SlicingPool)
    for driver in pools.drivers(trace):
        driver.run()
    original, ours, compat = made.values()
    assert isinstance(original, SlicingPool)
    assert isinstance(compat, SlicingPool)
    assert isinstance(ours, HandlePool)
    assert original.ends == ours.ends == compat.ends == list(trace.ends)
    assert original.live == ours.live == compat.live == 0  # every step released


def test_drivers_drive_the_real_pools() -> None:
    trace = make_trace("t", "", windowed_events([100, 20], 2))
    drivers = pools.drivers(trace)
    assert tuple(driver.name for driver in drivers) == pools.IMPLEMENTATIONS
    for driver in drivers:
        driver.run()
    original, ours, compat = (driver.memory() for driver in drivers)
    assert original == pools.Memory(2, 120 * TRIPLE, 120 * TRIPLE)
    assert ours == compat == pools.Memory(2, (128 + 32) * TRIPLE, (128 + 32) * TRIPLE)
    steady = Trace("s", "", windowed_events([64, 64]), (64, 40))
    drivers = pools.drivers(steady, ["compat", "original"])
    assert [driver.name for driver in drivers] == ["original", "compat"]
    for driver in drivers:
        driver.run()
        driver.run()
        assert driver.memory().allocations == 1


def fill_inputs(ends: list[int]) -> tuple[list[tuple[int, int]], list[pools.Copies]]:
    rng = np.random.default_rng(1)
    return [(64, end) for end in ends], [pools.random_copies(rng, end) for end in ends]


def test_the_original_fills_write_the_steps_copies() -> None:
    steps, copies = fill_inputs([64, 40])
    lists = [(s.tolist(), d.tolist(), z.tolist()) for s, d, z in copies]
    for fill in ("setitem", "numpy"):
        pool = OriginalDescriptorBufferPool()
        if fill == "setitem":
            pools.setitem_fill_steps(pool, steps, lists)
        else:
            pools.numpy_fill_steps(pool, steps, copies)
        bufs = pool.acquire(64)  # LIFO: the triple the last step wrote
        for field, values in zip(bufs, copies[-1], strict=True):
            assert field[:40].tolist() == values.tolist()
        assert pool.allocations == 1


def test_the_with_fill_step_shrinks_to_what_add_copies_wrote() -> None:
    steps, copies = fill_inputs([64, 40])
    pools.with_fill_steps(BucketPool(), steps, copies)  # the real pool accepts the step
    seen: list[tuple[str, int]] = []

    class Views:
        def __enter__(self) -> Views:
            return self

        def __exit__(self, *exc: object) -> None:
            seen.append(("release", 0))

        def add_copies(self, first: int, src: object, dst: object, sizes: object) -> int:
            assert isinstance(src, np.ndarray)
            seen.append(("add_copies", first + len(src)))
            return first + len(src)

        def shrink(self, end: int) -> tuple[()]:
            seen.append(("shrink", end))
            return ()

    fake = SimpleNamespace(acquire=lambda n: Views())
    pools.with_fill_steps(fake, steps, copies)  # type: ignore[arg-type]
    assert seen == [
        ("add_copies", 64),
        ("shrink", 64),
        ("release", 0),
        ("add_copies", 40),
        ("shrink", 40),
        ("release", 0),
    ]


def test_handle_ops_and_memory_of() -> None:
    pool = BucketPool()
    pools.handle_ops(pool, 10, 3)
    assert pool.stats().active_requests.current == 0
    assert pools.memory_of(pool).allocations == 1
    original = OriginalDescriptorBufferPool()
    original.release(original.acquire(8))
    assert pools.memory_of(original) == pools.Memory(1, 8 * TRIPLE, 8 * TRIPLE)
