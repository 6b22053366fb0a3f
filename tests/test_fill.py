from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, overload

import attrs
import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketpool._blocks import BlockPlan, read_block_copies
from bucketpool._errors import CapacityError
from bucketpool._fill import (
    DescriptorArrays,
    add_block_copies,
    add_copies,
    write_block_copies,
    write_copies,
)
from bucketpool._inputs import CopyPlan, read_copies
from bucketpool.testing import swap_blocks_batch

SENTINEL = 0x5A5A_5A5A_5A5A_5A5A
HIGH = 2**63 + 12_345  # an address with the top bit set
TOP = 2**64 - 1
DTYPES = [np.int64, np.uint64]


def make_arrays(n: int, dtype: Any = np.int64) -> DescriptorArrays:
    src, dst, sizes = (np.full(n, SENTINEL, dtype=dtype) for _ in range(3))
    return src, dst, sizes


def snapshot(arrays: DescriptorArrays) -> list[list[int]]:
    return [a.view(np.uint64).tolist() for a in arrays]


def unsigned(a: npt.NDArray[Any]) -> list[int]:
    """Read an int64 or uint64 descriptor column back as unsigned addresses."""
    return [int(v) for v in a.view(np.uint64)]


# --- add_copies: values, chaining, input forms -------------------------------------------


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


SOURCE_FORMS: list[Callable[[list[int]], Any]] = [
    list,
    tuple,
    lambda v: np.array(v, dtype=np.int64),
    lambda v: np.array(v, dtype=np.uint64),
    lambda v: np.array(v, dtype=np.int32),
    lambda v: np.array(v, dtype=np.uint16),
    lambda v: np.array(v, dtype=">i8"),  # non-native byte order
    lambda v: np.repeat(np.array(v, dtype=np.int64), 2)[::2],  # a strided view
    lambda v: torch.tensor(v, dtype=torch.int64),
    lambda v: torch.tensor(v, dtype=torch.int32),
    lambda v: torch.from_numpy(np.array(v, dtype=np.uint64)),
]


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


# --- add_copies: addresses at and above 2**63 --------------------------------------------

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


# --- add_copies: errors, and a failed call writes nothing --------------------------------

GOOD: dict[str, Any] = {
    "first": 1,
    "sources": [10, 20],
    "destinations": [30, 40],
    "byte_counts": [5, 6],
}

ERROR_CASES: list[tuple[dict[str, Any], type[Exception], Sequence[str]]] = [
    ({"first": 3}, CapacityError,
     ["add_copies: ", "k=2 copies", "first=3", "n=4", "acquire at least 5 entries"]),
    ({"first": 2, "sources": [1, 2, 3], "destinations": [1, 2, 3], "byte_counts": 1},
     CapacityError, ["add_copies: ", "first=2", "k=3 copies", "n=4"]),
    ({"first": -1}, IndexError, ["add_copies: ", "first=-1"]),
    ({"first": 1.0}, TypeError, ["add_copies: ", "first", "float"]),
    ({"first": True}, TypeError, ["add_copies: ", "first", "bool"]),
    ({"first": np.True_}, TypeError, ["add_copies: ", "first", "bool"]),
    ({"first": "1"}, TypeError, ["add_copies: ", "first", "str"]),
    ({"destinations": [30]}, ValueError, ["2 sources", "1 destinations"]),
    ({"byte_counts": [5, 6, 7]}, ValueError, ["3 byte counts", "2 sources"]),
    ({"byte_counts": np.array([5], dtype=np.int64)}, ValueError, ["1 byte counts"]),
    ({"byte_counts": [5, -1]}, ValueError, ["byte_counts[1]", "-1"]),
    ({"byte_counts": np.array([5, -1])}, ValueError, ["byte_counts[1] = -1"]),
    ({"byte_counts": np.array([-3, 5], dtype=np.int32)}, ValueError, ["byte_counts[0] = -3"]),
    ({"byte_counts": -1}, ValueError, ["add_copies: ", "byte_counts", "-1"]),
    ({"byte_counts": 2**63}, ValueError, ["byte_counts", str(2**63)]),
    ({"byte_counts": np.array([1, 2**63], dtype=np.uint64)}, ValueError,
     [f"byte_counts[1] = {2**63}"]),
    ({"byte_counts": [1, 2**64 + 1]}, ValueError, ["byte_counts[1]", str(2**64 + 1)]),
    ({"byte_counts": True}, TypeError, ["add_copies: ", "bool"]),
    ({"byte_counts": 5.0}, TypeError, ["float"]),
    ({"byte_counts": np.array([True, False])}, TypeError, ["bool"]),
    ({"sources": [10, -20]}, ValueError, ["sources[1] = -20"]),
    ({"sources": np.array([10, -20], dtype=np.int32)}, ValueError, ["sources[1] = -20"]),
    ({"sources": [10, 2**64]}, ValueError, ["sources[1]", str(2**64)]),
    ({"sources": [10, -(2**63) - 1]}, ValueError, ["sources[1]"]),
    ({"sources": [10.0, 20.0]}, TypeError, ["sources", "float"]),
    ({"sources": [10, 20.5]}, TypeError, ["sources", "20.5"]),
    ({"sources": [2**63, 1.5]}, TypeError, ["sources", "1.5"]),
    ({"sources": np.array([1.0, 2.0])}, TypeError, ["sources", "float64"]),
    ({"sources": np.array([True, False])}, TypeError, ["sources", "bool"]),
    ({"sources": [True, False]}, TypeError, ["sources", "bool"]),
    ({"sources": ["10", "20"]}, TypeError, ["sources"]),
    ({"sources": "10"}, TypeError, ["sources", "str"]),
    ({"sources": b"\x01\x02"}, TypeError, ["sources", "bytes"]),
    ({"sources": [object(), object()]}, TypeError, ["sources"]),
    ({"sources": None}, TypeError, ["sources", "NoneType"]),
    ({"sources": 10}, TypeError, ["sources", "int"]),
    ({"sources": (v for v in (10, 20))}, TypeError, ["sources", "generator"]),
    ({"sources": [[10, 20]]}, ValueError, ["sources", "1-D", "(1, 2)"]),
    ({"sources": np.zeros((2, 1), dtype=np.int64)}, ValueError, ["1-D", "(2, 1)"]),
    ({"sources": np.int64(10)}, TypeError, ["sources"]),
    ({"sources": torch.tensor([1.0, 2.0])}, TypeError, ["sources", "float32"]),
    ({"sources": torch.tensor([True, False])}, TypeError, ["sources", "bool"]),
    ({"sources": torch.zeros(2, dtype=torch.bfloat16)}, TypeError, ["sources", "bfloat16"]),
    ({"sources": torch.zeros(2, dtype=torch.int64, device="meta")}, TypeError,
     ["sources", "meta", "CPU"]),
    ({"destinations": torch.zeros(2, dtype=torch.int64, device="meta")}, TypeError,
     ["destinations", "CPU"]),
    ({"byte_counts": torch.zeros(2, dtype=torch.int64, device="meta")}, TypeError,
     ["byte_counts", "CPU"]),
]  # fmt: skip


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


# --- add_block_copies ---------------------------------------------------------------------


def reference_blocks(
    src_base: int,
    dst_base: int,
    src_blocks: Sequence[int],
    dst_blocks: Sequence[int],
    block_bytes: int,
    total_bytes: int | None,
    coalesce: bool,
) -> list[tuple[int, int, int]]:
    """The descriptors add_block_copies must write, computed one block at a time."""
    out: list[tuple[int, int, int]] = []
    for i, (s, d) in enumerate(zip(src_blocks, dst_blocks, strict=True)):
        if coalesce and i and s == src_blocks[i - 1] + 1 and d == dst_blocks[i - 1] + 1:
            src, dst, size = out[-1]
            out[-1] = (src, dst, size + block_bytes)
        else:
            out.append((src_base + s * block_bytes, dst_base + d * block_bytes, block_bytes))
    if total_bytes is not None and out:
        src, dst, size = out[-1]
        out[-1] = (src, dst, size - (len(src_blocks) * block_bytes - total_bytes))
    return out


def descriptors(arrays: DescriptorArrays, first: int, end: int) -> list[tuple[int, int, int]]:
    return list(
        zip(
            unsigned(arrays[0][first:end]),
            unsigned(arrays[1][first:end]),
            unsigned(arrays[2][first:end]),
            strict=True,
        )
    )


def test_consecutive_blocks_become_one_descriptor() -> None:
    arrays = make_arrays(4)
    blocks = np.arange(1024)
    end = add_block_copies(arrays, 1, 1 << 40, 1 << 41, blocks, blocks + 5, 256)
    assert end == 2
    assert descriptors(arrays, 1, 2) == [((1 << 40), (1 << 41) + 5 * 256, 1024 * 256)]
    assert unsigned(arrays[0])[2:] == [SENTINEL] * 2


def shuffled_without_runs(count: int, seed: int) -> npt.NDArray[np.int64]:
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(count).astype(np.int64)
        if not np.any(np.diff(perm) == 1):
            return perm


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


BLOCK_GOOD: dict[str, Any] = {
    "first": 0,
    "src_base": 1 << 20,
    "dst_base": 1 << 30,
    "src_blocks": [0, 2],
    "dst_blocks": [1, 3],
    "block_bytes": 64,
}

BLOCK_ERRORS: list[tuple[dict[str, Any], type[Exception], Sequence[str]]] = [
    ({"first": 3}, CapacityError,
     ["add_block_copies: ", "first=3", "k=2 descriptors", "n=4", "acquire at least 5"]),
    ({"first": -2}, IndexError, ["add_block_copies: ", "first=-2"]),
    ({"first": 0.5}, TypeError, ["add_block_copies: ", "first"]),
    ({"first": np.False_}, TypeError, ["add_block_copies: ", "first", "bool"]),
    ({"src_blocks": list(range(0, 10, 2)), "dst_blocks": list(range(5))}, CapacityError,
     ["add_block_copies: ", "k=5 descriptors", "n=4"]),
    ({"dst_blocks": [1]}, ValueError, ["2 source blocks", "1 destination blocks"]),
    ({"src_blocks": [0, -2]}, ValueError, ["src_blocks[1] = -2"]),
    ({"src_blocks": np.array([0, -2])}, ValueError, ["src_blocks[1] = -2"]),
    ({"dst_blocks": np.array([-1, 3], dtype=np.int16)}, ValueError, ["dst_blocks[0] = -1"]),
    ({"dst_blocks": torch.tensor([1, -3])}, ValueError, ["dst_blocks[1] = -3"]),
    ({"src_blocks": [0.0, 2.0]}, TypeError, ["src_blocks"]),
    ({"src_blocks": np.array([False, True])}, TypeError, ["src_blocks", "bool"]),
    ({"src_blocks": torch.zeros(2, dtype=torch.int64, device="meta")}, TypeError, ["CPU"]),
    ({"block_bytes": 0}, ValueError, ["add_block_copies: ", "block_bytes=0"]),
    ({"block_bytes": -64}, ValueError, ["block_bytes", "-64"]),
    ({"block_bytes": 2**63}, ValueError, ["block_bytes"]),
    ({"block_bytes": 64.0}, TypeError, ["block_bytes", "float"]),
    ({"block_bytes": True}, TypeError, ["add_block_copies: ", "block_bytes", "bool"]),
    ({"block_bytes": np.True_}, TypeError, ["block_bytes", "bool"]),
    ({"total_bytes": True}, TypeError, ["add_block_copies: ", "total_bytes", "bool"]),
    ({"src_base": False}, TypeError, ["add_block_copies: ", "src_base", "bool"]),
    ({"src_base": -1}, ValueError, ["add_block_copies: ", "src_base=-1"]),
    ({"dst_base": 2**64}, ValueError, ["dst_base", str(2**64)]),
    ({"src_base": "0"}, TypeError, ["src_base"]),
    ({"src_base": 2**64 - 64}, ValueError, ["src_blocks", "past the 64-bit address space"]),
    ({"dst_blocks": [1, 2**58]}, ValueError, ["dst_blocks", "2**63 bytes"]),
    ({"dst_blocks": np.array([1, 2**63], dtype=np.uint64)}, ValueError, ["dst_blocks"]),
    ({"total_bytes": 64}, ValueError, ["add_block_copies: ", "total_bytes=64", "65..128"]),
    ({"total_bytes": 129}, ValueError, ["total_bytes=129", "65..128"]),
    ({"total_bytes": 0}, ValueError, ["65..128"]),
    ({"total_bytes": -1}, ValueError, ["65..128"]),
    ({"total_bytes": 100.0}, TypeError, ["total_bytes"]),
    ({"src_blocks": [], "dst_blocks": [], "total_bytes": 1}, ValueError, ["0..0"]),
    ({"src_blocks": [], "dst_blocks": [], "total_bytes": -1}, ValueError, ["0..0"]),
    ({"src_blocks": [], "dst_blocks": [], "first": 5}, CapacityError, ["first=5", "n=4"]),
]  # fmt: skip


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


@pytest.mark.parametrize(
    ("src_blocks", "dst_blocks"),
    [
        ([3, 4, 5, 6], [0, 1, 2, 3]),  # one run
        ([6, 3, 5, 0], [1, 4, 2, 7]),  # no run merges
        ([0, 1, 5, 6], [2, 3, 0, 1]),  # two runs
    ],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_block_lists_may_be_views_of_the_descriptor_arrays(
    src_blocks: list[int], dst_blocks: list[int], dtype: Any
) -> None:
    # Each input is read before an output entry that it shares memory with is written.
    expected = reference_blocks(64, 128, src_blocks, dst_blocks, 16, 60, True)
    for src_column, dst_column in [(0, 1), (1, 0), (2, 0), (1, 2), (2, 1)]:
        arrays = make_arrays(4, dtype)
        arrays[src_column][:] = src_blocks
        arrays[dst_column][:] = dst_blocks
        end = add_block_copies(
            arrays, 0, 64, 128, arrays[src_column], arrays[dst_column], 16, total_bytes=60
        )
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


# --- End to end: fill real descriptors, run the host reference op, compare bytes --------


def descriptor_tensors(
    n: int, dtype: torch.dtype = torch.int64
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], DescriptorArrays]:
    tensors = (
        torch.empty(n, dtype=dtype),
        torch.empty(n, dtype=dtype),
        torch.empty(n, dtype=dtype),
    )
    return tensors, (tensors[0].numpy(), tensors[1].numpy(), tensors[2].numpy())


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


# --- Inputs that share memory with the descriptor arrays ---------------------------------

ALIAS_N = 8


def aliased_arrays(dtype: Any, as_tensor: bool) -> tuple[DescriptorArrays, list[Any]]:
    """Descriptor arrays holding distinct small values, and their columns as inputs."""
    if as_tensor:
        tensors, arrays = descriptor_tensors(
            ALIAS_N, torch.int64 if dtype is np.int64 else torch.uint64
        )
        columns: list[Any] = list(tensors)
    else:
        arrays = make_arrays(ALIAS_N, dtype)
        columns = list(arrays)
    for i, column in enumerate(arrays):
        column[:] = np.arange(ALIAS_N) * 3 + i + 1
    return arrays, columns


def copy_of(values: Any) -> npt.NDArray[Any]:
    return values.numpy().copy() if isinstance(values, torch.Tensor) else np.array(values)


# Where an input comes from: a column of the descriptor arrays and an offset in it, or None
# for a fresh array.
alias_strategy = st.one_of(st.none(), st.tuples(st.integers(0, 2), st.integers(0, 4)))


def test_swapping_directions_in_place() -> None:
    # The case of issue 10: the handle's own columns, the directions swapped.
    arrays = make_arrays(4)
    arrays[0][:] = [1, 2, 3, 4]
    arrays[1][:] = [5, 6, 7, 8]
    arrays[2][:] = 9
    assert add_copies(arrays, 0, arrays[1], arrays[0], arrays[2]) == 4
    assert snapshot(arrays) == [[5, 6, 7, 8], [1, 2, 3, 4], [9] * 4]


@settings(max_examples=300, deadline=None)
@given(
    st.tuples(alias_strategy, alias_strategy, alias_strategy),
    st.integers(0, 4),
    st.booleans(),
    st.sampled_from(DTYPES),
)
def test_add_copies_reads_every_input_before_writing(
    aliases: tuple[tuple[int, int] | None, ...], first: int, as_tensor: bool, dtype: Any
) -> None:
    k = 4
    arrays, columns = aliased_arrays(dtype, as_tensor)
    inputs = [
        np.arange(k, dtype=dtype) * 5 + 100 * (i + 1)
        if alias is None
        else columns[alias[0]][alias[1] : alias[1] + k]
        for i, alias in enumerate(aliases)
    ]
    # The reference: the same call with every input copied first.
    expected = (arrays[0].copy(), arrays[1].copy(), arrays[2].copy())
    copied = [copy_of(v) for v in inputs]
    assert add_copies(expected, first, copied[0], copied[1], copied[2]) == first + k
    assert add_copies(arrays, first, inputs[0], inputs[1], inputs[2]) == first + k
    assert snapshot(arrays) == snapshot(expected)


@settings(max_examples=100, deadline=None)
@given(
    st.tuples(*[st.one_of(st.none(), st.tuples(st.integers(0, 2), st.booleans()))] * 3),
    st.booleans(),
    st.sampled_from(DTYPES),
)
def test_filling_the_whole_arrays_reads_every_input_before_writing(
    aliases: tuple[tuple[int, bool] | None, ...], as_tensor: bool, dtype: Any
) -> None:
    # A fill of every entry takes a path of its own. The inputs are fresh arrays, whole
    # columns or (numpy only: a tensor has no negative strides) columns reversed.
    arrays, columns = aliased_arrays(dtype, as_tensor)
    inputs = [
        np.arange(ALIAS_N, dtype=dtype) * 5 + 100 * (i + 1)
        if alias is None
        else columns[alias[0]][::-1]
        if alias[1] and not as_tensor
        else columns[alias[0]]
        for i, alias in enumerate(aliases)
    ]
    expected = (arrays[0].copy(), arrays[1].copy(), arrays[2].copy())
    copied = [copy_of(v) for v in inputs]
    assert add_copies(expected, 0, copied[0], copied[1], copied[2]) == ALIAS_N
    assert add_copies(arrays, 0, inputs[0], inputs[1], inputs[2]) == ALIAS_N
    assert snapshot(arrays) == snapshot(expected)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([([3, 4, 5, 6], [0, 1, 2, 3]), ([0, 1, 5, 6], [2, 3, 0, 1]),
                     ([6, 3, 5, 0], [1, 4, 2, 7])]),
    st.tuples(st.integers(0, 2), st.integers(0, 4)),
    st.tuples(st.integers(0, 2), st.integers(0, 4)),
    st.integers(0, 4),
    st.booleans(),
    st.sampled_from(DTYPES),
    st.booleans(),
)  # fmt: skip
def test_add_block_copies_reads_every_input_before_writing(
    blocks: tuple[list[int], list[int]],
    src_alias: tuple[int, int],
    dst_alias: tuple[int, int],
    first: int,
    as_tensor: bool,
    dtype: Any,
    coalesce: bool,
) -> None:
    k = 4
    arrays, columns = aliased_arrays(dtype, as_tensor)
    (src_col, src_at), (dst_col, dst_at) = src_alias, dst_alias
    if src_col == dst_col and src_at != dst_at:
        dst_col = (dst_col + 1) % 3  # the two lists would overwrite each other
    arrays[src_col][src_at : src_at + k] = blocks[0]
    arrays[dst_col][dst_at : dst_at + k] = blocks[1]
    src_in = columns[src_col][src_at : src_at + k]
    dst_in = columns[dst_col][dst_at : dst_at + k]
    expected = (arrays[0].copy(), arrays[1].copy(), arrays[2].copy())
    end = add_block_copies(
        expected, first, 64, 128, copy_of(src_in), copy_of(dst_in), 16,
        total_bytes=60, coalesce=coalesce,
    )  # fmt: skip
    got = add_block_copies(
        arrays, first, 64, 128, src_in, dst_in, 16, total_bytes=60, coalesce=coalesce
    )
    assert got == end
    assert snapshot(arrays) == snapshot(expected)


# --- Reading apart from writing: a plan, then writes that run no user code ----------------


class LoggedIndex:
    """An integer argument that logs each call of its ``__index__``."""

    def __init__(self, value: int, log: list[str]) -> None:
        self.value = value
        self.log = log

    def __index__(self) -> int:
        self.log.append("__index__")
        return self.value


class LoggedSequence(Sequence[int]):
    """A sequence of ints that logs every call into it."""

    def __init__(self, values: list[int], log: list[str]) -> None:
        self.values = values
        self.log = log

    def __len__(self) -> int:
        self.log.append("__len__")
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        self.log.append("__getitem__")
        return self.values[index]

    def __iter__(self) -> Iterator[int]:
        self.log.append("__iter__")
        return iter(self.values)


class LoggedArray(np.ndarray[Any, np.dtype[Any]]):
    """An ndarray subclass that logs its ufunc, array-function and length calls."""

    calls: ClassVar[list[str]] = []

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        LoggedArray.calls.append(f"ufunc {ufunc.__name__}")
        plain = [np.asarray(x) if isinstance(x, np.ndarray) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(x) for x in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)

    def __array_function__(
        self, func: Any, types: Any, args: Any, kwargs: Mapping[str, Any]
    ) -> Any:
        LoggedArray.calls.append(f"function {func.__name__}")
        return super().__array_function__(func, types, args, kwargs)

    def __len__(self) -> int:
        LoggedArray.calls.append("__len__")
        return super().__len__()


class LoggedTensor(torch.Tensor):
    """A tensor subclass that logs every torch call on it (``numpy()``, ``is_cpu``, ...)."""

    calls: ClassVar[list[str]] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.calls.append(getattr(func, "__name__", repr(func)))
        return super().__torch_function__(func, types, args, kwargs)  # type: ignore[no-untyped-call]


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calls that the logged inputs of one test make, in order."""
    calls: list[str] = []
    monkeypatch.setattr(LoggedArray, "calls", calls)
    monkeypatch.setattr(LoggedTensor, "calls", calls)
    return calls


def logged_inputs(log: list[str]) -> dict[str, Callable[[list[int]], Any]]:
    """Ways to pass a column of ints that all call back into test code."""
    return {
        "sequence": lambda v: LoggedSequence(v, log),
        "ndarray subclass": lambda v: np.array(v, dtype=np.int64).view(LoggedArray),
        "tensor subclass": lambda v: torch.tensor(v).as_subclass(LoggedTensor),
    }


def plan_values(plan: CopyPlan | BlockPlan) -> list[object]:
    """Every value a plan holds, the items of a tuple field included."""
    values: list[object] = []
    for value in attrs.asdict(plan, recurse=False).values():
        values.extend(value if isinstance(value, tuple) else [value])
    return values


@pytest.mark.parametrize("form", ["sequence", "ndarray subclass", "tensor subclass"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_writing_a_copy_plan_calls_no_user_code(form: str, dtype: Any, log: list[str]) -> None:
    make = logged_inputs(log)[form]
    arrays = make_arrays(4, dtype)
    d = np.dtype(dtype)
    plan = read_copies(LoggedIndex(1, log), make([10, 20]), make([30, 40]), make([5, 6]), d, d, d)
    assert log  # reading called back, as it must
    log.clear()
    assert write_copies(arrays, 4, plan) == 3
    assert log == []
    assert snapshot(arrays) == [[SENTINEL, a, b, SENTINEL] for a, b in ([10, 20], [30, 40], [5, 6])]


@pytest.mark.parametrize("form", ["sequence", "ndarray subclass", "tensor subclass"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("src_blocks", "dst_blocks"),
    [
        ([3], [0]),  # one descriptor
        ([0, 1, 2], [4, 5, 6]),  # one run: one descriptor
        ([0, 1, 5], [2, 3, 0]),  # runs merged
        ([5, 0, 3], [1, 3, 0]),  # none merged
    ],
)
def test_writing_a_block_plan_calls_no_user_code(
    form: str, dtype: Any, src_blocks: list[int], dst_blocks: list[int], log: list[str]
) -> None:
    make = logged_inputs(log)[form]
    arrays = make_arrays(4, dtype)
    d = np.dtype(dtype)
    first, src_base, dst_base, block_bytes, total_bytes = (
        LoggedIndex(v, log) for v in (1, 64, 128, 16, len(src_blocks) * 16 - 2)
    )
    plan = read_block_copies(
        first, src_base, dst_base, make(src_blocks), make(dst_blocks), block_bytes,
        total_bytes=total_bytes, src_dtype=d, dst_dtype=d,
    )  # fmt: skip
    assert log
    log.clear()
    end = write_block_copies(arrays, 4, plan)
    assert log == []
    expected = reference_blocks(64, 128, src_blocks, dst_blocks, 16, len(src_blocks) * 16 - 2, True)
    assert descriptors(arrays, 1, end) == expected


PLAIN_FORMS: list[Callable[[list[int]], Any]] = [
    *SOURCE_FORMS,
    lambda v: np.array(v, dtype=np.int64).view(LoggedArray),
    lambda v: torch.tensor(v).as_subclass(LoggedTensor),
]


@pytest.mark.parametrize("form", PLAIN_FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_plans_hold_only_ints_and_base_class_arrays(
    form: Callable[[list[int]], Any], dtype: Any, log: list[str]
) -> None:
    d = np.dtype(dtype)
    column = form([0, 60_000])
    plans: list[CopyPlan | BlockPlan] = [
        read_copies(np.int64(0), column, column, column, d, d, d),
        read_copies(0, column, column, np.uint8(5), d, d, d),
    ]
    blocks = form([3, 1])
    for coalesce in (True, False):
        block_plan = read_block_copies(
            np.uint32(0), np.int64(64), 128, blocks, blocks, np.int16(8), coalesce=coalesce,
            src_dtype=d, dst_dtype=d,
        )  # fmt: skip
        plans.append(block_plan)
    for plan in plans:
        for value in plan_values(plan):
            assert value is None or type(value) in (int, np.ndarray), (plan, value)


def test_a_copy_plan_is_in_the_destination_dtypes() -> None:
    i64, u64 = np.dtype(np.int64), np.dtype(np.uint64)
    plan = read_copies(0, [2**63 + 1], np.array([7], dtype=np.int32), [5], i64, u64, u64)
    assert plan.sources.dtype == i64
    assert plan.sources.tolist() == [2**63 + 1 - 2**64]
    assert plan.destinations.dtype == u64
    assert isinstance(plan.byte_counts, np.ndarray)
    assert plan.byte_counts.dtype == u64
    assert (plan.first, plan.k) == (0, 1)


@pytest.mark.parametrize(
    ("src_blocks", "dst_blocks", "runs"),
    [([], [], 0), ([4], [2], 1), ([0, 1, 2], [5, 6, 7], 1), ([0, 1, 5], [2, 3, 0], 2),
     ([6, 3, 5, 0], [1, 4, 2, 7], 4)],
)  # fmt: skip
def test_a_block_plan_says_how_many_descriptors_it_writes(
    src_blocks: list[int], dst_blocks: list[int], runs: int
) -> None:
    i64 = np.dtype(np.int64)
    plan = read_block_copies(2, 0, 0, src_blocks, dst_blocks, 8, src_dtype=i64, dst_dtype=i64)
    assert plan.runs == runs
    assert plan.blocks == len(src_blocks)
    assert write_block_copies(make_arrays(8), 8, plan) == 2 + runs
    unmerged = read_block_copies(
        2, 0, 0, src_blocks, dst_blocks, 8, coalesce=False, src_dtype=i64, dst_dtype=i64
    )
    assert unmerged.runs == len(src_blocks)


def span_error(error: type[Exception]) -> bool:
    """Whether *error* is one that only the writer, which knows the length, can raise."""
    return error in (CapacityError, IndexError)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("change", "error", "fragments"), ERROR_CASES)
def test_read_copies_rejects_what_add_copies_rejects(
    change: dict[str, Any], error: type[Exception], fragments: Sequence[str], dtype: Any
) -> None:
    arrays = make_arrays(4, dtype)
    d = np.dtype(dtype)
    kwargs = {**GOOD, **change, "src_dtype": d, "dst_dtype": d, "size_dtype": d}
    if span_error(error):
        plan = read_copies(**kwargs)  # the span is the writer's to check
        with pytest.raises(error) as info:
            write_copies(arrays, 4, plan)
    else:
        with pytest.raises(error) as info:
            read_copies(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert snapshot(arrays) == [[SENTINEL] * 4] * 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("change", "error", "fragments"), BLOCK_ERRORS)
def test_read_block_copies_rejects_what_add_block_copies_rejects(
    change: dict[str, Any], error: type[Exception], fragments: Sequence[str], dtype: Any
) -> None:
    arrays = make_arrays(4, dtype)
    d = np.dtype(dtype)
    kwargs = {**BLOCK_GOOD, **change, "src_dtype": d, "dst_dtype": d}
    if span_error(error):
        plan = read_block_copies(**kwargs)
        with pytest.raises(error) as info:
            write_block_copies(arrays, 4, plan)
    else:
        with pytest.raises(error) as info:
            read_block_copies(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert snapshot(arrays) == [[SENTINEL] * 4] * 3


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_plan_that_does_not_fit_writes_nothing(dtype: Any) -> None:
    # n, not the arrays' length, bounds the writes: here 3 of 4 entries may be written.
    arrays = make_arrays(4, dtype)
    d = np.dtype(dtype)
    copies = read_copies(2, [1, 2], [3, 4], 5, d, d, d)
    blocks = read_block_copies(2, 0, 0, [0, 2], [0, 2], 8, src_dtype=d, dst_dtype=d)
    one_block = read_block_copies(3, 0, 0, [0, 1], [0, 1], 8, src_dtype=d, dst_dtype=d)
    with pytest.raises(CapacityError, match=r"add_copies: k=2 copies .* first=2 .* n=3;"):
        write_copies(arrays, 3, copies)
    with pytest.raises(CapacityError, match=r"add_block_copies: k=2 descriptors .* n=3;"):
        write_block_copies(arrays, 3, blocks)
    with pytest.raises(CapacityError, match=r"k=1 descriptors .* first=3 .* n=3;"):
        write_block_copies(arrays, 3, one_block)
    negative = "first must be >= 0, got first=-1"
    with pytest.raises(IndexError, match=negative):
        write_copies(arrays, 4, read_copies(-1, [1], [2], 3, d, d, d))
    with pytest.raises(IndexError, match=negative):
        write_block_copies(
            arrays, 4, read_block_copies(-1, 0, 0, [0], [1], 8, src_dtype=d, dst_dtype=d)
        )
    assert snapshot(arrays) == [[SENTINEL] * 4] * 3


@pytest.mark.parametrize("integer", [int, np.int64, np.uint64, np.int32, np.uint8, np.int8])
def test_reading_takes_numpy_integers_for_every_integer(integer: Callable[[int], Any]) -> None:
    d = np.dtype(np.uint64)
    copies = read_copies(integer(1), [10, 20], [30, 40], integer(5), d, d, d)
    blocks = read_block_copies(
        integer(2), integer(64), integer(96), [0, 2], [1, 3], integer(16),
        total_bytes=integer(20), src_dtype=d, dst_dtype=d,
    )  # fmt: skip
    assert (copies.first, copies.byte_counts) == (1, 5)
    assert (blocks.first, blocks.src_base, blocks.dst_base, blocks.block_bytes) == (2, 64, 96, 16)
    assert blocks.trim == 12
    for value in [*plan_values(copies), *plan_values(blocks)]:
        assert value is None or type(value) in (int, np.ndarray)


def test_each_integer_argument_is_read_once() -> None:
    log: list[str] = []
    read_copies(LoggedIndex(0, log), [1], [2], 3, *[np.dtype(np.int64)] * 3)
    assert log == ["__index__"]
    log.clear()
    i64 = np.dtype(np.int64)
    first, src_base, dst_base, block_bytes, total_bytes = (
        LoggedIndex(v, log) for v in (0, 2**64 - 64, 4096, 32, 30)
    )
    read_block_copies(
        first, src_base, dst_base, [1], [0], block_bytes, total_bytes=total_bytes,
        src_dtype=i64, dst_dtype=i64,
    )  # fmt: skip
    assert log == ["__index__"] * 5


class ShiftingSequence(Sequence[int]):
    """A sequence that gives the next of *passes* each time it is iterated (a hostile input)."""

    def __init__(self, passes: list[list[Any]]) -> None:
        self.passes = passes
        self.current = 0

    def __len__(self) -> int:
        return len(self.passes[0])

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self.passes[min(self.current, len(self.passes) - 1)][index]

    def __iter__(self) -> Iterator[int]:
        values = self.passes[min(self.current, len(self.passes) - 1)]
        self.current += 1
        return iter(values)


def test_what_is_checked_is_what_is_written() -> None:
    # numpy reads a list mixing ints >= 2**63 with others as float64, so such a sequence is
    # read again, exactly. One that changes between readings must not slip an unchecked value
    # into the descriptors (here 1.5, which numpy would truncate to 1).
    readings: list[list[Any]] = [[3, 2**63 + 3], [7, 2**63 + 9], [1.5, 2**63 + 9]]
    arrays = make_arrays(2, np.uint64)
    add_copies(arrays, 0, ShiftingSequence(readings), [1, 2], 8)
    assert unsigned(arrays[0]) in readings[:2]
