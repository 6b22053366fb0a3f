from __future__ import annotations

import pytest

import bucketpool
from bucketpool import (
    EscapedViewError,
    InFlightWriteError,
    PoolError,
    ReleaseError,
    UseAfterReleaseError,
)

ERRORS = [ReleaseError, UseAfterReleaseError, InFlightWriteError, EscapedViewError]


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
