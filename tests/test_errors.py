from __future__ import annotations

import pytest

import bucketpool
from bucketpool import (
    InFlightWriteError,
    PoolError,
    ReleaseError,
    UseAfterReleaseError,
)

ERRORS = [ReleaseError, UseAfterReleaseError, InFlightWriteError]


@pytest.mark.parametrize("error", ERRORS)
def test_every_misuse_error_is_a_pool_error(error: type[PoolError]) -> None:
    assert issubclass(error, PoolError)
    assert getattr(error, "__final__", False)
    with pytest.raises(PoolError):
        raise error("x")


def test_pool_error_is_a_runtime_error() -> None:
    assert issubclass(PoolError, RuntimeError)
    assert not getattr(PoolError, "__final__", False)  # the base stays open to subclass


def test_every_error_is_exported() -> None:
    for error in [PoolError, *ERRORS]:
        assert getattr(bucketpool, error.__name__) is error
        assert error.__doc__


def test_capacity_error_is_both_index_and_value_error() -> None:
    assert issubclass(bucketpool.CapacityError, IndexError)
    assert issubclass(bucketpool.CapacityError, ValueError)
    with pytest.raises(ValueError, match="x"):
        raise bucketpool.CapacityError("x")


def test_leak_warning_is_shown_by_default() -> None:
    # The default filters ignore DeprecationWarning, ResourceWarning, ...; not UserWarning.
    assert issubclass(bucketpool.LeakWarning, UserWarning)
    assert not issubclass(bucketpool.LeakWarning, ResourceWarning)
