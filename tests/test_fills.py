"""Filling descriptors: add_copies, add_block_copies (runs merged), via the handle, end to end."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from _fill_cases import (
    BLOCK_ERRORS,
    BLOCK_GOOD,
    DTYPES,
    ERROR_CASES,
    GOOD,
    HIGH,
    SENTINEL,
    SOURCE_FORMS,
    TOP,
    add_block_copies,
    add_copies,
    descriptor_tensors,
    descriptors,
    make_arrays,
    reference_blocks,
    shuffled_without_runs,
    snapshot,
    unsigned,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketpool import BucketPool
from bucketpool._errors import CapacityError
from bucketpool.testing import swap_blocks_batch

# -- add_copies: values, chaining, input forms ---------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_copies_writes_the_range_and_nothing_else(dtype: Any) -> None:
    arrays = make_arrays(8, dtype)
    end = add_copies(arrays, 2, np.array([10, 20, 30]), np.array([11, 21, 31]), [1, 2, 3])
    assert end == 5
    src, dst, sizes = snapshot(arrays)
    assert src == [SENTINEL] * 2 + [10, 20, 30] + [SENTINEL] * 3
    assert dst == [SENTINEL] * 2 + [11, 21, 31] + [SENTINEL] * 3
    assert sizes == [SENTINEL] * 2 + [1, 2, 3] + [SENTINEL] * 3


def test_add_copies_chains_on_the_returned_index() -> None:
    arrays = make_arrays(6)
    first = 0
    for batch in ([100, 200], [300], [400, 500, 600]):
        first = add_copies(arrays, first, batch, [b + 1 for b in batch], 7)
    assert first == 6
    assert arrays[0].tolist() == [100, 200, 300, 400, 500, 600]
    assert arrays[1].tolist() == [101, 201, 301, 401, 501, 601]
    assert arrays[2].tolist() == [7] * 6


@pytest.mark.parametrize(
    "byte_counts",
    [
        64,
        np.int64(64),
        np.uint32(64),
        [64, 64, 64],
        np.full(3, 64, dtype=np.int64),
        np.full(3, 64, dtype=np.uint64),
        np.full(3, 64, dtype=np.int16),
        torch.full((3,), 64, dtype=torch.int64),
    ],
)
def test_scalar_and_array_byte_counts_agree(byte_counts: Any) -> None:
    arrays = make_arrays(3)
    assert add_copies(arrays, 0, [1, 2, 3], [4, 5, 6], byte_counts) == 3
    assert arrays[2].tolist() == [64, 64, 64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", SOURCE_FORMS)
def test_every_input_form_gives_the_same_descriptors(
    form: Callable[[list[int]], Any], dtype: Any
) -> None:
    values = [4096, 0, 65_000, 7]
    arrays = make_arrays(4, dtype)
    assert add_copies(arrays, 0, form(values), form([v + 1 for v in values]), form(values)) == 4
    assert unsigned(arrays[0]) == values
    assert unsigned(arrays[1]) == [v + 1 for v in values]
    assert unsigned(arrays[2]) == values


def test_range_is_accepted_as_a_sequence() -> None:
    arrays = make_arrays(4)
    add_copies(arrays, 0, range(4), range(10, 14), range(4))
    assert arrays[0].tolist() == [0, 1, 2, 3]


def test_the_descriptors_are_copies_not_views_of_the_input() -> None:
    arrays = make_arrays(3)
    sources = np.array([1, 2, 3], dtype=np.int64)
    add_copies(arrays, 0, sources, sources, sources)
    sources[:] = 99
    assert snapshot(arrays) == [[1, 2, 3]] * 3


def test_empty_batch_returns_first_and_writes_nothing() -> None:
    arrays = make_arrays(4)
    assert add_copies(arrays, 4, [], [], []) == 4
    assert add_copies(arrays, 2, np.empty(0, dtype=np.int64), [], 5) == 2
    assert snapshot(arrays) == [[SENTINEL] * 4] * 3


# -- add_copies: interleaved fills (step) --------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_step_writes_every_step_th_entry_and_returns_the_one_after_the_last(dtype: Any) -> None:
    arrays = make_arrays(9, dtype)
    assert add_copies(arrays, 1, [10, 20, 30], [11, 21, 31], [1, 2, 3], step=3) == 8
    s = SENTINEL
    assert snapshot(arrays) == [
        [s, 10, s, s, 20, s, s, 30, s],
        [s, 11, s, s, 21, s, s, 31, s],
        [s, 1, s, s, 2, s, s, 3, s],
    ]


def test_one_fill_per_layer_interleaves_as_a_strided_slice_does() -> None:
    # vLLM's HiSparse: descriptors[slice(layer, count, num_layers)] = column, per layer.
    layers, k = 3, 4
    arrays, expected = make_arrays(layers * k), make_arrays(layers * k)
    ends = []
    for layer in range(layers):
        values = np.arange(k, dtype=np.int64) * 100 + layer
        ends.append(add_copies(arrays, layer, values, values + 1, values + 2, step=layers))
        for offset, column in enumerate(expected):
            column[slice(layer, layers * k, layers)] = values + offset
    assert ends == [10, 11, 12]  # the last layer's fill returns the count
    assert snapshot(arrays) == snapshot(expected)


@given(
    n=st.integers(0, 12),
    first=st.integers(0, 12),
    k=st.integers(0, 6),
    step=st.integers(1, 5),
)
def test_a_strided_fill_fits_exactly_when_its_last_entry_does(
    n: int, first: int, k: int, step: int
) -> None:
    arrays, expected = make_arrays(n), make_arrays(n)
    values = np.arange(1, k + 1, dtype=np.int64)
    end = first + (k - 1) * step + 1 if k else first
    if end > n:
        with pytest.raises(CapacityError, match=f"need entries up to {end},.* hold n={n}"):
            add_copies(arrays, first, values, values, values, step=step)
    else:
        assert add_copies(arrays, first, values, values, values, step=step) == end
        for column in expected:
            column[first:end:step] = values
    assert snapshot(arrays) == snapshot(expected)


@pytest.mark.parametrize(
    ("step", "error", "fragments"),
    [
        (0, ValueError, ["step must be >= 1, got step=0", "pass 1"]),
        (-2, ValueError, ["step must be >= 1, got step=-2"]),
        (True, TypeError, ["step must be an integer, not bool", "pass an int"]),
        (2.0, TypeError, ["step must be an integer, not float (step=2.0)"]),
        ("2", TypeError, ["step must be an integer, not str"]),
        (3, CapacityError, ["k=3 copies starting at first=1 every 3 entries", "up to 8", "n=6"]),
    ],
)
def test_a_bad_step_is_refused_and_nothing_is_written(
    step: Any, error: type[Exception], fragments: list[str]
) -> None:
    arrays = make_arrays(6)
    with pytest.raises(error) as info:
        add_copies(arrays, 1, [1, 2, 3], [4, 5, 6], 7, step=step)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert snapshot(arrays) == [[SENTINEL] * 6] * 3


@pytest.mark.parametrize("step", [np.int64(2), np.uint8(2)])
def test_a_step_may_be_a_numpy_integer(step: Any) -> None:
    arrays = make_arrays(4)
    assert add_copies(arrays, 0, [1, 2], [3, 4], 5, step=step) == 3
    assert snapshot(arrays)[0] == [1, SENTINEL, 2, SENTINEL]


# -- add_copies: addresses at and above 2**63 ----------------------------------------------


HIGH_ADDRESSES = [0, 1, 2**63 - 1, 2**63, HIGH, TOP]


@pytest.mark.parametrize(
    "form",
    [
        list,
        lambda v: np.array(v, dtype=np.uint64),
        lambda v: torch.from_numpy(np.array(v, dtype=np.uint64)),
        # An int64 array already holds bit patterns: they are stored unchanged.
        lambda v: np.array(v, dtype=np.uint64).view(np.int64),
        lambda v: torch.from_numpy(np.array(v, dtype=np.uint64).view(np.int64)),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_high_addresses_are_exact(form: Callable[[list[int]], Any], dtype: Any) -> None:
    arrays = make_arrays(len(HIGH_ADDRESSES), dtype)
    add_copies(arrays, 0, form(HIGH_ADDRESSES), form(HIGH_ADDRESSES[::-1]), 1)
    assert unsigned(arrays[0]) == HIGH_ADDRESSES
    assert unsigned(arrays[1]) == HIGH_ADDRESSES[::-1]
    if dtype is np.uint64:
        assert arrays[0].tolist() == HIGH_ADDRESSES  # the values themselves
    else:
        assert arrays[0][4] == HIGH - 2**64  # two's complement
        assert arrays[0][5] == -1


def test_a_list_numpy_would_read_as_float_is_exact() -> None:
    # np.asarray([1, 2**63 + 1]) is float64, which would round 2**63 + 1 to 2**63.
    arrays = make_arrays(2)
    add_copies(arrays, 0, [1, 2**63 + 1], [2**63 + 3, 5], [2**62 + 1, 3])
    assert unsigned(arrays[0]) == [1, 2**63 + 1]
    assert unsigned(arrays[1]) == [2**63 + 3, 5]
    assert arrays[2].tolist() == [2**62 + 1, 3]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(DTYPES),
    st.lists(
        st.tuples(
            st.integers(0, TOP),
            st.integers(0, TOP),
            st.integers(0, 2**63 - 1),
        ),
        max_size=20,
    ),
    st.integers(0, 4),
)
def test_any_valid_copy_is_stored_exactly(
    dtype: Any, copies: list[tuple[int, int, int]], first: int
) -> None:
    arrays = make_arrays(len(copies) + 4, dtype)
    sources = [c[0] for c in copies]
    destinations = [c[1] for c in copies]
    counts = [c[2] for c in copies]
    assert add_copies(arrays, first, sources, destinations, counts) == first + len(copies)
    stop = first + len(copies)
    assert unsigned(arrays[0][first:stop]) == sources
    assert unsigned(arrays[1][first:stop]) == destinations
    assert [int(v) for v in arrays[2][first:stop]] == counts
    assert unsigned(arrays[0][:first]) == [SENTINEL] * first
    assert unsigned(arrays[0][stop:]) == [SENTINEL] * (len(arrays[0]) - stop)


# -- add_copies: errors, and a failed call writes nothing ----------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("change", "error", "fragments"), ERROR_CASES)
def test_add_copies_rejects_bad_input_and_writes_nothing(
    change: dict[str, Any], error: type[Exception], fragments: Sequence[str], dtype: Any
) -> None:
    arrays = make_arrays(4, dtype)
    kwargs = {**GOOD, **change}
    with pytest.raises(error) as info:
        add_copies(arrays, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert snapshot(arrays) == [[SENTINEL] * 4] * 3


def test_good_arguments_of_the_error_table_succeed() -> None:
    arrays = make_arrays(4)
    assert add_copies(arrays, **GOOD) == 3  # so each error above comes from its change


def test_an_overrun_is_both_an_index_error_and_a_value_error() -> None:
    # The original pool's slice assignment raised ValueError; IndexError is what this
    # module raised before CapacityError: callers catching either keep working.
    arrays = make_arrays(2)
    for caught in (IndexError, ValueError, CapacityError):
        with pytest.raises(caught):
            add_copies(arrays, 1, [1, 2], [3, 4], 5)
        with pytest.raises(caught):
            add_block_copies(arrays, 1, 0, 0, [0, 2], [0, 2], 8)
    assert snapshot(arrays) == [[SENTINEL] * 2] * 3


@pytest.mark.parametrize("integer", [int, np.int64, np.uint64, np.int32, np.uint8])
def test_every_integer_argument_takes_numpy_integers(integer: Callable[[int], Any]) -> None:
    arrays = make_arrays(4)
    assert add_copies(arrays, integer(1), [10, 20], [30, 40], integer(5)) == 3
    assert snapshot(arrays)[2][1:3] == [5, 5]
    end = add_block_copies(
        arrays, integer(2), integer(64), integer(128), [0, 2], [1, 3], integer(16),
        total_bytes=integer(20),
    )  # fmt: skip
    assert end == 4
    assert descriptors(arrays, 2, end) == [(64, 144, 16), (96, 176, 4)]


# -- add_block_copies ----------------------------------------------------------------------


def test_consecutive_blocks_become_one_descriptor() -> None:
    arrays = make_arrays(4)
    blocks = np.arange(1024)
    end = add_block_copies(arrays, 1, 1 << 40, 1 << 41, blocks, blocks + 5, 256)
    assert end == 2
    assert descriptors(arrays, 1, 2) == [((1 << 40), (1 << 41) + 5 * 256, 1024 * 256)]
    assert unsigned(arrays[0])[2:] == [SENTINEL] * 2


@pytest.mark.parametrize(
    ("src_blocks", "dst_blocks", "total_bytes"),
    [
        ([0, 1], [2, 3], None),  # the last source block is one before the first destination
        ([2, 3], [0, 1], 12),
        ([0, 2, 4], [0, 1, 2], None),  # no source run: the destinations' runs do not count
        ([0, 1, 2], [7, 9, 10], 20),
        ([0, 0, 1], [255, 0, 1], None),
    ],
)
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint32, np.int64, np.uint64])
def test_runs_are_found_in_every_index_dtype_at_the_columns_ends(
    src_blocks: list[int], dst_blocks: list[int], total_bytes: int | None, dtype: Any
) -> None:
    arrays = make_arrays(3)
    src, dst = np.array(src_blocks, dtype), np.array(dst_blocks, dtype)
    end = add_block_copies(arrays, 0, 64, 1 << 20, src, dst, 8, total_bytes=total_bytes)
    expected = reference_blocks(64, 1 << 20, src_blocks, dst_blocks, 8, total_bytes, True)
    assert descriptors(arrays, 0, end) == expected


@pytest.mark.parametrize("dtype", DTYPES)
def test_shuffled_blocks_stay_separate(dtype: Any) -> None:
    arrays = make_arrays(1024, dtype)
    src_blocks = shuffled_without_runs(1024, 0)
    dst_blocks = np.arange(1024)
    end = add_block_copies(arrays, 0, 4096, 1 << 30, src_blocks, dst_blocks, 64)
    assert end == 1024
    assert unsigned(arrays[0]) == (4096 + src_blocks * 64).tolist()
    assert unsigned(arrays[1]) == ((1 << 30) + dst_blocks * 64).tolist()
    assert unsigned(arrays[2]) == [64] * 1024


def test_mixed_runs_merge_only_where_both_sides_are_consecutive() -> None:
    arrays = make_arrays(8)
    src_blocks = [3, 4, 5, 9, 10, 0, 1, 7]
    dst_blocks = [0, 1, 2, 3, 5, 6, 7, 8]
    # Runs: 3-5/0-2, then 9/3, 10/5 (the destination skips 4), 0-1/6-7, 7/8.
    end = add_block_copies(arrays, 0, 1000, 2000, src_blocks, dst_blocks, 10)
    assert end == 5
    assert descriptors(arrays, 0, 5) == [
        (1030, 2000, 30),
        (1090, 2030, 10),
        (1100, 2050, 10),
        (1000, 2060, 20),
        (1070, 2080, 10),
    ]


def test_coalesce_false_writes_one_descriptor_per_block() -> None:
    arrays = make_arrays(4)
    end = add_block_copies(arrays, 0, 0, 100, range(4), range(4), 8, coalesce=False)
    assert end == 4
    assert descriptors(arrays, 0, 4) == [(0, 100, 8), (8, 108, 8), (16, 116, 8), (24, 124, 8)]


def test_runs_count_is_known_for_a_known_pattern() -> None:
    # 128 runs of 8 consecutive blocks whose order is shuffled without adjacent runs.
    order = shuffled_without_runs(128, 1)
    src_blocks = (order[:, None] * 8 + np.arange(8)).ravel()
    arrays = make_arrays(1024)
    assert add_block_copies(arrays, 0, 0, 0, src_blocks, np.arange(1024), 16) == 128
    assert unsigned(arrays[2])[:128] == [128] * 128


def test_coalesced_descriptors_fit_where_single_blocks_would_not() -> None:
    arrays = make_arrays(2)
    assert add_block_copies(arrays, 1, 0, 0, np.arange(1000), np.arange(1000), 4) == 2
    assert descriptors(arrays, 1, 2) == [(0, 0, 4000)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_total_bytes_trims_the_last_copy(dtype: Any) -> None:
    arrays = make_arrays(3, dtype)
    end = add_block_copies(arrays, 0, 0, 1000, [0, 1, 5], [0, 1, 2], 100, total_bytes=201)
    assert end == 2
    assert descriptors(arrays, 0, 2) == [(0, 1000, 200), (500, 1200, 1)]
    end = add_block_copies(arrays, 0, 0, 1000, [0, 1, 2], [0, 1, 2], 100, total_bytes=250)
    assert descriptors(arrays, 0, end) == [(0, 1000, 250)]
    end = add_block_copies(arrays, 0, 0, 1000, [0, 1], [0, 1], 100, total_bytes=199, coalesce=False)
    assert descriptors(arrays, 0, end) == [(0, 1000, 100), (100, 1100, 99)]
    end = add_block_copies(arrays, 0, 0, 1000, [4, 0], [0, 1], 100, total_bytes=200)
    assert descriptors(arrays, 0, end) == [(400, 1000, 100), (0, 1100, 100)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_high_bases_are_exact(dtype: Any) -> None:
    arrays = make_arrays(3, dtype)
    base = 2**64 - 4096
    end = add_block_copies(arrays, 0, base, HIGH, [3, 0, 1], [1, 2, 3], 1024)
    assert end == 2
    assert descriptors(arrays, 0, 2) == [
        (base + 3072, HIGH + 1024, 1024),
        (base, HIGH + 2048, 2048),
    ]
    if dtype is np.int64:
        assert arrays[0][0] == base + 3072 - 2**64


@pytest.mark.parametrize("dtype", DTYPES)
def test_addresses_crossing_2_63_are_exact(dtype: Any) -> None:
    # The offsets carry the sum from below 2**63 to above it: int64 arithmetic wraps, and
    # must do so silently (warnings are errors here) and exactly.
    arrays = make_arrays(4, dtype)
    base = 2**63 - 2048
    blocks = [0, 2, 4, 6]
    end = add_block_copies(arrays, 0, base, base, blocks, blocks, 1024)
    assert end == 4
    assert unsigned(arrays[0]) == [base + 1024 * b for b in blocks]


def test_a_region_may_end_exactly_at_2_64() -> None:
    arrays = make_arrays(1)
    add_block_copies(arrays, 0, 2**64 - 8, 0, [1], [0], 4)
    assert descriptors(arrays, 0, 1) == [(2**64 - 4, 0, 4)]


def test_src_and_dst_arrays_of_different_dtypes() -> None:
    arrays = (
        np.full(2, SENTINEL, dtype=np.int64),
        np.full(2, SENTINEL, dtype=np.uint64),
        np.full(2, SENTINEL, dtype=np.int64),
    )
    end = add_block_copies(arrays, 0, HIGH, TOP - 99, [1, 0], [0, 1], 10)
    assert end == 2
    assert descriptors(arrays, 0, 2) == [(HIGH + 10, TOP - 99, 10), (HIGH, TOP - 89, 10)]


@pytest.mark.parametrize(
    "form",
    [
        list,
        lambda v: np.array(v, dtype=np.int32),
        lambda v: np.array(v, dtype=np.uint8),
        lambda v: np.array(v, dtype=np.uint64),
        lambda v: torch.tensor(v, dtype=torch.int64),
    ],
)
def test_block_indices_in_any_integer_form(form: Callable[[list[int]], Any]) -> None:
    arrays = make_arrays(3)
    end = add_block_copies(arrays, 0, 0, 0, form([2, 3, 0]), form([5, 6, 9]), 8)
    assert descriptors(arrays, 0, end) == [(16, 40, 16), (0, 72, 8)]


def test_empty_block_list() -> None:
    arrays = make_arrays(2)
    assert add_block_copies(arrays, 2, 0, 0, [], [], 8) == 2
    assert add_block_copies(arrays, 1, 0, 0, [], [], 8, total_bytes=0) == 1
    assert snapshot(arrays) == [[SENTINEL] * 2] * 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("change", "error", "fragments"), BLOCK_ERRORS)
def test_add_block_copies_rejects_bad_input_and_writes_nothing(
    change: dict[str, Any], error: type[Exception], fragments: Sequence[str], dtype: Any
) -> None:
    arrays = make_arrays(4, dtype)
    kwargs = {**BLOCK_GOOD, **change}
    with pytest.raises(error) as info:
        add_block_copies(arrays, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert snapshot(arrays) == [[SENTINEL] * 4] * 3


def test_good_arguments_of_the_block_error_table_succeed() -> None:
    arrays = make_arrays(4)
    assert add_block_copies(arrays, **BLOCK_GOOD) == 2
    assert add_block_copies(arrays, **BLOCK_GOOD, total_bytes=65) == 2
    assert add_block_copies(arrays, **BLOCK_GOOD, total_bytes=128) == 2


def test_each_region_is_checked_against_its_own_base() -> None:
    # The source blocks reach far, the destination base is high: each alone is fine.
    arrays = make_arrays(2)
    end = add_block_copies(arrays, 0, 0, 2**64 - 128, [0, 2**40], [0, 1], 64)
    assert descriptors(arrays, 0, end) == [(0, 2**64 - 128, 64), (2**46, 2**64 - 64, 64)]


# Block lists built from runs, so that coalescing has something to merge.
runs_strategy = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(1, 6)), max_size=12
)


@settings(max_examples=150, deadline=None)
@given(
    runs_strategy,
    st.integers(1, 9),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.sampled_from(DTYPES),
    st.data(),
)
def test_coalescing_matches_the_block_by_block_reference(
    runs: list[tuple[int, int, int]],
    block_bytes: int,
    src_base: int,
    dst_base: int,
    dtype: Any,
    data: st.DataObject,
) -> None:
    src_blocks = [s + j for s, _, length in runs for j in range(length)]
    dst_blocks = [d + j for _, d, length in runs for j in range(length)]
    limit = 2**64 - 50 * block_bytes
    src_base, dst_base = min(src_base, limit), min(dst_base, limit)
    count = len(src_blocks)
    total = None
    if count and data.draw(st.booleans()):
        total = data.draw(st.integers((count - 1) * block_bytes + 1, count * block_bytes))
    results = {}
    for coalesce in (True, False):
        arrays = make_arrays(count + 2, dtype)
        end = add_block_copies(
            arrays, 1, src_base, dst_base, np.array(src_blocks, dtype=np.int64), dst_blocks,
            block_bytes, total_bytes=total, coalesce=coalesce,
        )  # fmt: skip
        got = descriptors(arrays, 1, end)
        assert got == reference_blocks(
            src_base, dst_base, src_blocks, dst_blocks, block_bytes, total, coalesce
        )
        assert unsigned(arrays[0])[end:] == [SENTINEL] * (count + 2 - end)
        results[coalesce] = got
    # Both cover the same byte ranges, pair by pair, and the merged ones are maximal.
    assert byte_pairs(results[True]) == byte_pairs(results[False])
    for (s1, d1, n1), (s2, d2, _) in zip(results[True], results[True][1:], strict=False):
        assert not (s2 == s1 + n1 and d2 == d1 + n1)


def byte_pairs(copies: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    return [(s + j, d + j) for s, d, n in copies for j in range(n)]


# Index offsets on both sides of 2**31, where run detection switches from one packed int64
# key per block pair to testing the two columns apart.
INDEX_OFFSETS = [0, 2**31 - 60, 2**31 - 6, 2**31, 2**32 - 3, 2**32, 2**40, 2**59]


@settings(max_examples=150, deadline=None)
@given(
    runs_strategy,
    st.sampled_from(INDEX_OFFSETS),
    st.sampled_from(INDEX_OFFSETS),
    st.integers(1, 8),
    st.sampled_from(DTYPES),
    st.sampled_from([np.int64, np.uint64, np.int32, np.uint32]),
)
def test_coalescing_at_large_indices_matches_the_reference(
    runs: list[tuple[int, int, int]],
    src_offset: int,
    dst_offset: int,
    block_bytes: int,
    dtype: Any,
    index_dtype: Any,
) -> None:
    if np.iinfo(index_dtype).max < max(src_offset, dst_offset) + 46:
        index_dtype = np.int64
    src_blocks = [src_offset + s + j for s, _, length in runs for j in range(length)]
    dst_blocks = [dst_offset + d + j for _, d, length in runs for j in range(length)]
    count = len(src_blocks)
    arrays = make_arrays(count + 1, dtype)
    end = add_block_copies(
        arrays, 0, HIGH, 4096, np.array(src_blocks, dtype=index_dtype),
        np.array(dst_blocks, dtype=index_dtype), block_bytes,
    )  # fmt: skip
    assert descriptors(arrays, 0, end) == reference_blocks(
        HIGH, 4096, src_blocks, dst_blocks, block_bytes, None, True
    )
    assert unsigned(arrays[0])[end:] == [SENTINEL] * (count + 1 - end)


@pytest.mark.parametrize(
    ("src_blocks", "dst_blocks", "runs"),
    [
        ([2**31 - 3, 2**31 - 2, 2**31 - 1], [0, 1, 2], 1),  # the packed key's largest index
        ([0, 1, 2], [2**31 - 3, 2**31 - 2, 2**31 - 1], 1),
        ([2**31 - 2, 2**31 - 1, 2**31], [7, 8, 9], 1),  # past it: the columns apart
        ([0, 1, 2], [2**31 - 2, 2**31 - 1, 2**31], 1),
        ([5, 6, 7], [2**31 - 1, 0, 1], 2),  # a destination step of 1 - 2**31
        ([2**31 - 1, 0, 1], [5, 6, 7], 2),
        # Blocks that would step the packed key by 2**32 + 1 if it held larger indices:
        ([0, 0, 1], [0, 2**32 + 1, 2**32 + 2], 2),
        ([0, 2, 3], [2**32 - 1, 0, 1], 2),
        ([2**32 - 1, 0, 1], [5, 6, 7], 2),
    ],
)
def test_run_detection_at_the_key_limit(
    src_blocks: list[int], dst_blocks: list[int], runs: int
) -> None:
    for form in (np.array, lambda v: np.array(v, dtype=np.uint64)):
        arrays = make_arrays(3)
        end = add_block_copies(arrays, 0, 0, 0, form(src_blocks), form(dst_blocks), 8)
        assert end == runs
        expected = reference_blocks(0, 0, src_blocks, dst_blocks, 8, None, True)
        assert descriptors(arrays, 0, end) == expected


@pytest.mark.parametrize("byte_order", [">i8", ">u8"])
@pytest.mark.parametrize("pattern", [[3, 0, 1], [0, 1, 2], [1, 2, 0]])
def test_descriptor_arrays_in_another_byte_order(byte_order: str, pattern: list[int]) -> None:
    arrays = (
        np.full(3, SENTINEL, dtype=byte_order),
        np.full(3, SENTINEL, dtype=np.uint64),
        np.full(3, SENTINEL, dtype=byte_order),
    )
    end = add_block_copies(arrays, 0, HIGH, 2**64 - 2048, pattern, [2, 3, 4], 256)
    expected = reference_blocks(HIGH, 2**64 - 2048, pattern, [2, 3, 4], 256, None, True)
    got = [
        (int(s), int(d), int(n))
        for s, d, n in zip(
            arrays[0][:end].astype(np.uint64),
            arrays[1][:end],
            arrays[2][:end].astype(np.uint64),
            strict=True,
        )
    ]
    assert got == expected


# -- through the handle --------------------------------------------------------------------


def test_a_strided_fill_through_the_handle(pool: BucketPool) -> None:
    handle = pool.acquire(4)
    assert handle.add_copies(1, [16, 32], [48, 64], 8, step=2) == 4
    assert handle.buffers.src_ptrs[1:4:2].tolist() == [16, 32]
    handle.release()


def test_add_copies_through_the_handle(pool: BucketPool) -> None:
    handle = pool.acquire(4)
    end = handle.add_copies(0, [16, 32], [48, 64], 8)
    end = handle.add_copies(end, np.array([1 << 12]), np.array([1 << 13]), [24])
    assert end == 3
    assert handle.buffers.src_ptrs[:3].tolist() == [16, 32, 1 << 12]
    assert handle.buffers.sizes[:3].tolist() == [8, 8, 24]
    handle.release()


def test_add_block_copies_through_the_handle(pool: BucketPool) -> None:
    handle = pool.acquire(4)
    end = handle.add_block_copies(0, 1000, 5000, [0, 1, 2, 7], [3, 4, 5, 0], 10)
    assert end == 2
    assert handle.buffers.src_ptrs[:2].tolist() == [1000, 1070]
    assert handle.buffers.dst_ptrs[:2].tolist() == [5030, 5000]
    assert handle.buffers.sizes[:2].tolist() == [30, 10]
    handle.release()


def test_add_copies_from_the_handles_own_columns_swaps_directions() -> None:
    """Issue 10, case 15: add_copies(0, dst_col, src_col, sizes_col) wrote before reading all
    inputs."""
    pool = BucketPool()
    handle = pool.acquire(4)
    src, dst, sizes = handle.arrays
    src[:] = [1, 2, 3, 4]
    dst[:] = [10, 20, 30, 40]
    sizes[:] = [5, 6, 7, 8]
    assert handle.add_copies(0, dst, src, sizes) == 4
    assert src.tolist() == [10, 20, 30, 40]
    assert dst.tolist() == [1, 2, 3, 4]
    assert sizes.tolist() == [5, 6, 7, 8]
    reversed_sources = np.asarray(src)[::-1]
    assert handle.add_copies(0, reversed_sources, dst, sizes) == 4  # overlapping, reversed
    assert src.tolist() == [40, 30, 20, 10]
    handle.release()


# -- end to end: fill real descriptors, run the host reference op, compare bytes -----------


def run(tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor], n: int) -> None:
    swap_blocks_batch(tensors[0][:n], tensors[1][:n], tensors[2][:n])


BLOCK = 48  # bytes per block, deliberately not a power of two


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_save_tensors_into_blocks_with_add_copies(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    region = torch.zeros(16 * BLOCK, dtype=torch.uint8)
    items = [
        torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen) for size in (48, 20, 1)
    ]
    where = [7, 2, 15]
    tensors, arrays = descriptor_tensors(8, dtype)
    end = add_copies(
        arrays,
        0,
        [t.data_ptr() for t in items],
        np.array([region.data_ptr() + b * BLOCK for b in where], dtype=np.uint64),
        torch.tensor([t.numel() for t in items]),
    )
    run(tensors, end)
    expected = torch.zeros_like(region)
    for t, b in zip(items, where, strict=True):
        expected[b * BLOCK : b * BLOCK + t.numel()] = t
    assert torch.equal(region, expected)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
@pytest.mark.parametrize("pattern", ["consecutive", "shuffled", "runs"])
@pytest.mark.parametrize("partial", [0, 1, BLOCK - 1])
def test_save_and_load_through_a_block_region(
    pattern: str, partial: int, dtype: torch.dtype
) -> None:
    count, region_blocks = 40, 64
    gen = torch.Generator().manual_seed(1)
    nbytes = count * BLOCK - partial
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    region = torch.full((region_blocks * BLOCK,), 0xEE, dtype=torch.uint8)
    blocks: npt.NDArray[Any]
    if pattern == "consecutive":
        blocks = np.arange(10, 10 + count)
    elif pattern == "shuffled":
        blocks = shuffled_without_runs(region_blocks, 2)[:count]
    else:
        blocks = np.concatenate([np.arange(50, 60), np.arange(0, 20), np.arange(30, 40)])
    mine = np.arange(count)
    tensors, arrays = descriptor_tensors(count, dtype)

    # Save: the data's blocks 0..count-1 go to the region's `blocks`.
    end = add_block_copies(
        arrays, 0, data.data_ptr(), region.data_ptr(), mine, blocks, BLOCK, total_bytes=nbytes
    )
    expected_runs = {"consecutive": 1, "shuffled": count, "runs": 3}[pattern]
    assert end == expected_runs
    run(tensors, end)
    padded = torch.cat([data, torch.full((partial,), 0xEE, dtype=torch.uint8)])
    expected_region = torch.full_like(region, 0xEE)
    for i, b in enumerate(blocks.tolist()):
        expected_region[b * BLOCK : (b + 1) * BLOCK] = padded[i * BLOCK : (i + 1) * BLOCK]
    assert torch.equal(region, expected_region)

    # Load them back into a fresh tensor.
    back = torch.zeros(nbytes, dtype=torch.uint8)
    end = add_block_copies(
        arrays, 0, region.data_ptr(), back.data_ptr(), blocks, mine, BLOCK, total_bytes=nbytes
    )
    run(tensors, end)
    assert torch.equal(back, data)


def test_chained_fills_feed_one_batch() -> None:
    region = torch.zeros(8 * BLOCK, dtype=torch.uint8)
    a = torch.arange(BLOCK * 2, dtype=torch.uint8)
    b = torch.arange(100, 100 + BLOCK, dtype=torch.uint8)
    tensors, arrays = descriptor_tensors(4)
    end = add_block_copies(arrays, 0, a.data_ptr(), region.data_ptr(), [0, 1], [5, 6], BLOCK)
    end = add_copies(arrays, end, [b.data_ptr()], [region.data_ptr()], [BLOCK])
    assert end == 2
    run(tensors, end)
    assert torch.equal(region[5 * BLOCK : 7 * BLOCK], a)
    assert torch.equal(region[:BLOCK], b)
    assert int(region[BLOCK : 5 * BLOCK].count_nonzero()) == 0


@pytest.mark.parametrize("coalesce", ["no", 0, None])
def test_coalesce_takes_only_a_bool(coalesce: object) -> None:
    pool = BucketPool()
    with pool.acquire(4) as bufs:
        with pytest.raises(TypeError, match="coalesce must be True or False"):
            bufs.add_block_copies(0, 4096, 8192, [0, 1], [0, 1], 64, coalesce=coalesce)  # type: ignore[arg-type]
        assert bufs.add_block_copies(0, 4096, 8192, [0, 1], [0, 1], 64, coalesce=np.True_) == 1  # type: ignore[arg-type]


def test_an_interleaved_fill_from_the_handles_own_column_reads_it_before_writing() -> None:
    # docs/guide/handles.md: "Every input is read and checked before the first entry is
    # written, so [...] a handle's own columns may be passed back"; `write`'s docstring:
    # "shared inputs copied first".  `write` copies a shared destinations or sizes column,
    # never the sources: numpy's `src[first:end:step] = sources` reads entries it has
    # already overwritten when the strided target overlaps them (entry 4 gets entry 2's new
    # value), and the copies move the wrong memory.
    pool = BucketPool()
    with pool.acquire(8) as bufs:
        bufs.add_copies(0, list(range(10, 18)), list(range(20, 28)), list(range(30, 38)))
        end = bufs.add_copies(0, bufs.src_ptrs[:4], bufs.dst_ptrs[:4], bufs.sizes[:4], step=2)
        assert end == 7
        assert bufs.src_ptrs.tolist() == [10, 11, 11, 13, 12, 15, 13, 17]
        assert bufs.dst_ptrs.tolist() == [20, 21, 21, 23, 22, 25, 23, 27]


def test_a_fill_from_a_strided_slice_of_the_handles_own_column_reads_it_first() -> None:
    # docs/guide/handles.md: "a handle's own columns may be passed back".  `write` copies a
    # shared sources column only when *step* is not 1; at step 1 a strided slice of it is
    # still written through in place: numpy runs an overlapping 1-D copy backwards when the
    # source starts lower, and with the source's stride 3 against the target's 1, entry 2
    # reads entry 3 after it was overwritten with entry 6.
    pool = BucketPool()
    with pool.acquire(16) as bufs:
        bufs.add_copies(0, list(range(10, 26)), list(range(30, 46)), 64)
        end = bufs.add_copies(1, bufs.src_ptrs[0:12:3], list(range(4)), 64)
        assert end == 5
        assert bufs.src_ptrs[:6].tolist() == [10, 10, 13, 16, 19, 15]
