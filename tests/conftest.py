"""Fixtures the tests share: pools (at any debug level), heap-scan and thread-switch guards.

Plain helpers and fake events are modules of their own (`_helpers`, `_events`), imported by
name: pytest does not mean a conftest to be imported.
"""

from __future__ import annotations

import collections
import gc
import sys
from collections.abc import Iterator

import pytest

from bucketpool import BucketPool, _parking
from bucketpool._ledger import Ledger


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


@pytest.fixture(autouse=True)
def _own_orphans() -> Iterator[collections.deque[Ledger]]:
    """Each test's dropped pools wait in a queue of its own (`bucketpool._parking.ORPHANS`):
    no test's pool calls ask another test's events.  (No monkeypatch: the fixtures that
    check what a test leaves behind run after it.)"""
    before, mine = _parking.ORPHANS, collections.deque[Ledger]()
    _parking.ORPHANS = mine
    try:
        yield mine
    finally:
        _parking.ORPHANS = before


@pytest.fixture
def orphans(_own_orphans: collections.deque[Ledger]) -> collections.deque[Ledger]:
    """This test's dropped pools that wait, and none the collector finds of an earlier test."""
    gc.collect()
    _own_orphans.clear()
    return _own_orphans
