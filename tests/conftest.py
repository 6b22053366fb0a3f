"""Fixtures the tests share: pools (at any debug level), heap-scan and thread-switch guards.

Plain helpers and fake events are modules of their own (`_helpers`, `_events`), imported by
name: pytest does not mean a conftest to be imported.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from bucketpool import BucketPool


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "pool(**options): the options of the `pool` fixture's BucketPool "
        '(default debug="off", trace=False)',
    )


@pytest.fixture
def pool(request: pytest.FixtureRequest) -> Iterator[BucketPool]:
    """A pool (``debug="off"`` unless ``@pytest.mark.pool(...)`` says otherwise) that must have
    every buffer back when the test ends."""
    marker = request.node.get_closest_marker("pool")
    options: dict[str, object] = {"debug": "off", "trace": False}
    if marker is not None:
        options.update(marker.kwargs)
    made = BucketPool(**options)  # type: ignore[arg-type]
    yield made
    assert made.outstanding() == []


@pytest.fixture(params=["off", "checks", "strict"])
def pool_at_each_level(request: pytest.FixtureRequest) -> Iterator[BucketPool]:
    """The `pool` fixture at each debug level in turn."""
    made = BucketPool(debug=request.param, trace=False)
    yield made
    assert made.outstanding() == []


@pytest.fixture
def no_heap_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any scan of the garbage collector's heap fail the test."""

    def refuse(*args: object) -> list[object]:
        raise AssertionError("the pool scanned the heap")

    monkeypatch.setattr(gc, "get_referrers", refuse)
    monkeypatch.setattr(gc, "get_objects", refuse)


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Switch threads every 0.1 ms instead of 5 ms, so that races get their chance."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
