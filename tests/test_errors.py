"""The errors and warnings: one family, each raised by the misuse it names, all exported."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from _events import FlagEvent

import bucketpool
from bucketpool import (
    BucketPool,
    InFlightWriteError,
    PoolError,
    ReleaseError,
    UseAfterReleaseError,
)

ERRORS = [ReleaseError, UseAfterReleaseError, InFlightWriteError]


def release_twice() -> None:
    handle = BucketPool().acquire(3)
    handle.release()
    handle.release()


def use_a_view_after_release() -> None:
    pool = BucketPool(debug="strict")
    with pool.acquire(4) as bufs:
        sizes = bufs.sizes
    sizes.sum()


def rewrite_while_in_flight() -> None:
    pool = BucketPool(debug="checks")
    handle = pool.acquire(4)
    handle.add_copies(0, [16], [32], 8)
    handle.record_event(FlagEvent())
    handle.add_copies(0, [48], [64], 8)  # the recorded copy may still read these
    try:
        handle.record_event(FlagEvent(done=True))
    finally:
        handle.release()


#: For each error, a misuse that raises it.
MISUSES: dict[type[PoolError], Callable[[], None]] = {
    ReleaseError: release_twice,
    UseAfterReleaseError: use_a_view_after_release,
    InFlightWriteError: rewrite_while_in_flight,
}


@pytest.mark.parametrize("error", ERRORS)
def test_every_misuse_error_is_a_pool_error(error: type[PoolError]) -> None:
    assert issubclass(error, PoolError)
    assert getattr(error, "__final__", False)
    with pytest.raises(PoolError) as caught:  # the misuse it names, caught as the family
        MISUSES[error]()
    assert type(caught.value) is error


def test_pool_error_is_a_runtime_error() -> None:
    assert issubclass(PoolError, RuntimeError)
    assert not getattr(PoolError, "__final__", False)  # the base stays open to subclass


def test_debug_errors_share_one_base() -> None:
    for error in (ReleaseError, UseAfterReleaseError, InFlightWriteError):
        assert issubclass(error, PoolError)
    assert issubclass(PoolError, RuntimeError)


def test_every_error_is_exported() -> None:
    for error in [PoolError, *ERRORS]:
        assert getattr(bucketpool, error.__name__) is error
        assert error.__doc__


def test_capacity_error_is_both_index_and_value_error() -> None:
    assert issubclass(bucketpool.CapacityError, IndexError)
    assert issubclass(bucketpool.CapacityError, ValueError)
    handle = BucketPool().acquire(2)
    for caught in (ValueError, IndexError):  # an overrun, caught as either
        with pytest.raises(caught, match="add_copies: ") as info:
            handle.add_copies(1, [1, 2], [3, 4], 5)  # two copies from entry 1 of n=2
        assert type(info.value) is bucketpool.CapacityError
    handle.release()


def test_leak_warning_is_shown_by_default() -> None:
    # The default filters ignore DeprecationWarning, ResourceWarning, ...; not UserWarning.
    assert issubclass(bucketpool.LeakWarning, UserWarning)
    assert not issubclass(bucketpool.LeakWarning, ResourceWarning)
