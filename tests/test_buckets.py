"""Bucket arithmetic: powers of two, the smallest bucket for n, and the checks on counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketpool import BucketPool, bucket_capacity
from bucketpool._settings import DEFAULT_MAX_CAPACITY, DEFAULT_MIN_CAPACITY, check_count


def capacity_for(n: int, min_capacity: int) -> int:
    """The reference: the smallest power of two >= n and >= min_capacity."""
    return min_capacity if n <= min_capacity else 1 << (n - 1).bit_length()


BOUNDARIES = sorted(
    {0, 1, DEFAULT_MAX_CAPACITY}
    | {
        (1 << k) + d
        for k in range(1, 25)
        for d in (-1, 0, 1)
        if (1 << k) + d <= DEFAULT_MAX_CAPACITY
    }
)


@pytest.mark.parametrize("n", BOUNDARIES)
def test_capacity_at_every_boundary(n: int) -> None:
    capacity = bucket_capacity(n)
    assert capacity >= max(n, DEFAULT_MIN_CAPACITY)
    assert capacity & (capacity - 1) == 0
    assert capacity == DEFAULT_MIN_CAPACITY or capacity // 2 < n


def test_capacity_examples() -> None:
    assert [bucket_capacity(n) for n in (0, 1, 16, 17, 32, 33, 1196)] == [
        16,
        16,
        16,
        32,
        32,
        64,
        2048,
    ]


@given(st.integers(min_value=0, max_value=DEFAULT_MAX_CAPACITY))
def test_capacity_is_smallest_power_of_two_above(n: int) -> None:
    capacity = bucket_capacity(n)
    assert capacity >= n
    assert capacity & (capacity - 1) == 0
    assert capacity == DEFAULT_MIN_CAPACITY or capacity // 2 < n


@given(
    st.integers(min_value=0, max_value=1 << 30),
    st.integers(min_value=0, max_value=20).map(lambda k: 1 << k),
)
def test_capacity_for_respects_minimum(n: int, min_capacity: int) -> None:
    capacity = capacity_for(n, min_capacity)
    assert capacity >= max(n, min_capacity)
    assert capacity & (capacity - 1) == 0
    assert capacity == min_capacity or capacity // 2 < n


@pytest.mark.parametrize("min_capacity", [1, 2, 16, 1024])
def test_a_pool_serves_each_n_from_the_bucket_capacity_for_gives(min_capacity: int) -> None:
    pool = BucketPool(min_capacity=min_capacity, max_capacity=4096)
    for n in [*range(70), 1023, 1024, 1025, 4095, 4096]:
        expected = capacity_for(n, min_capacity)
        assert pool.bucket_capacity(n) == expected, n
        with pool.acquire(n) as bufs:
            assert bufs.sizes.untyped_storage().nbytes() == 3 * 8 * expected, n


def test_numpy_integers_are_counts() -> None:
    assert check_count(np.int64(5)) == 5
    assert type(check_count(np.uint16(7))) is int
    assert bucket_capacity(np.int32(100)) == 128


def test_maximum_and_above() -> None:
    assert bucket_capacity(DEFAULT_MAX_CAPACITY) == DEFAULT_MAX_CAPACITY
    with pytest.raises(ValueError, match=r"n=16777217 is above the pool's max_capacity=16777216"):
        bucket_capacity(DEFAULT_MAX_CAPACITY + 1)


@pytest.mark.parametrize("bad", [True, False, 1.0, "3", None, [3], np.float64(2.0)])
def test_non_integers_are_type_errors(bad: object) -> None:
    with pytest.raises(TypeError, match="n must be an integer count"):
        check_count(bad)


def test_negative_is_value_error() -> None:
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        bucket_capacity(-1)
