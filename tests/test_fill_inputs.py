"""How fills read their inputs: all before any write, once, into plans that run no user code."""

from __future__ import annotations

import collections.abc
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, overload

import numpy as np
import numpy.typing as npt
import pytest
import torch
from _fill_cases import (
    DTYPES,
    SENTINEL,
    SOURCE_FORMS,
    DescriptorArrays,
    add_block_copies,
    add_copies,
    descriptor_tensors,
    descriptors,
    make_arrays,
    reference_blocks,
    snapshot,
    unsigned,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import bucketpool
from bucketpool import BucketPool, DebugLevel, ReleaseError
from bucketpool._errors import CapacityError

# -- inputs that share memory with the descriptor arrays -----------------------------------


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


# -- reading apart from writing: a plan, then writes that run no user code -----------------


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


PLAIN_FORMS: list[Callable[[list[int]], Any]] = [
    *SOURCE_FORMS,
    lambda v: np.array(v, dtype=np.int64).view(LoggedArray),
    lambda v: torch.tensor(v).as_subclass(LoggedTensor),
]


def span_error(error: type[Exception]) -> bool:
    """Whether *error* is one that only the writer, which knows the length, can raise."""
    return error in (CapacityError, IndexError)


# -- hostile inputs ------------------------------------------------------------------------


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


class ReleasingInput(collections.abc.Sequence[int]):
    """An integer sequence whose reading releases *handle* and hands its buffer out again."""

    def __init__(self, pool: BucketPool, handle: bucketpool.BufferHandle) -> None:
        self.pool, self.handle = pool, handle
        self.thief: bucketpool.BufferHandle | None = None

    def _steal(self) -> None:
        if self.thief is None:
            self.handle.__exit__(None, None, None)  # released, also inside its with block
            self.thief = self.pool.acquire(self.handle.n)
            self.thief.buffers.src_ptrs.fill_(7)

    def __len__(self) -> int:
        self._steal()
        return 2

    @typing.overload
    def __getitem__(self, index: int) -> int: ...
    @typing.overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        self._steal()
        if isinstance(index, slice):
            return [100, 101][index]
        if index >= 2:
            raise IndexError(index)
        return 100 + index

    def __index__(self) -> int:
        self._steal()
        return 0


# Issue 18 (the third hostile review), case 5.
@pytest.mark.parametrize("where", ["first", "sources", "count"])
def test_a_fill_whose_input_releases_the_handle_writes_nothing(where: str) -> None:
    pool = BucketPool()
    handle = pool.acquire(4)
    calling_back = ReleasingInput(pool, handle)
    fills: dict[str, Callable[[], object]] = {
        "first": lambda: handle.add_copies(calling_back, [1, 2], [3, 4], 8),
        "sources": lambda: handle.add_copies(0, calling_back, [3, 4], 8),
        "count": lambda: handle.shrink(calling_back),
    }
    with pytest.raises(ReleaseError):
        fills[where]()
    thief = calling_back.thief
    assert thief is not None
    assert thief.buffers.src_ptrs.tolist() == [7] * 4  # the new holder's entries untouched
    assert thief.n == 4
    thief.release()


@pytest.mark.parametrize("level", ["off", "checks", "strict"])
@pytest.mark.parametrize("where", ["first", "sources", "block", "count"])
def test_a_with_bound_fill_whose_input_releases_the_handle_writes_nothing(
    where: str, level: DebugLevel
) -> None:
    # At "off" the next hand-out of the buffer has the very same views: the fill tells the
    # hand-outs apart by the token it began with.
    pool = BucketPool(debug=level)
    handle = pool.acquire(4)
    calling_back = ReleasingInput(pool, handle)

    def fill_in_the_block() -> None:
        with handle as bufs:
            fills: dict[str, Callable[[], object]] = {
                "first": lambda: bufs.add_copies(calling_back, [1, 2], [3, 4], 8),
                "sources": lambda: bufs.add_copies(0, calling_back, [3, 4], 8),
                "block": lambda: bufs.add_block_copies(0, 4096, 8192, calling_back, [0, 1], 64),
                "count": lambda: bufs.shrink(calling_back),
            }
            with pytest.raises(ReleaseError, match="hand-out that is over"):
                fills[where]()

    with pytest.raises(ReleaseError, match="end of with block"):  # the input released it
        fill_in_the_block()
    thief = calling_back.thief
    assert thief is not None
    assert thief.buffers.src_ptrs.tolist() == [7] * 4  # the new holder's entries untouched
    assert thief.n == 4
    thief.release()


# -- a refused input is named as it was passed ---------------------------------------------


FILLS: dict[str, Callable[[DescriptorArrays, object], int]] = {
    "sources": lambda arrays, column: add_copies(arrays, 0, column, [1, 2], 8),
    "src_blocks": lambda arrays, column: add_block_copies(arrays, 0, 0, 0, column, [1, 2], 8),
}


@pytest.mark.parametrize(
    ("column", "named", "advice"),
    [
        (torch.ones(2), "a torch tensor of dtype torch.float32", "tensor.long()"),
        (torch.ones(2, dtype=torch.bool), "a torch tensor of dtype torch.bool", "tensor.long()"),
        (torch.ones(2, dtype=torch.bfloat16), "a torch tensor of dtype torch.bfloat16", "long"),
        (np.ones(2), "a numpy array of dtype float64", "array.astype(np.int64)"),
        (["a", "b"], "a list whose item {name}[0] = 'a' is a str", "pass ints"),
        ([1, "b"], "a list whose item {name}[1] = 'b' is a str", "pass ints"),
        ((1, None), "a tuple whose item {name}[1] = None is a NoneType", "pass ints"),
        ([[1.0], [2.0]], "a list whose item {name}[0] = [1.0] is a list", "pass ints"),
    ],
)
@pytest.mark.parametrize("name", FILLS)
def test_a_column_that_is_not_integer_is_named_as_passed(
    column: object, named: str, advice: str, name: str
) -> None:
    arrays = make_arrays(4)
    with pytest.raises(TypeError) as info:
        FILLS[name](arrays, column)
    message = str(info.value)
    assert named.format(name=name) in message
    assert advice in message
    if not isinstance(column, np.ndarray):  # what numpy made of it is not what was passed
        assert "numpy array" not in message
        assert "dtype <U" not in message
    assert snapshot(arrays) == [[SENTINEL] * 4] * 3
