"""The ``kv-offload`` case: vLLM's KV-offload lists against ``install(kv_offload=True)``."""

from __future__ import annotations

import warnings

import pytest

from bench import _kv_offload
from bucketpool import LeakWarning


def test_the_trace_is_log_uniform_with_one_to_three_in_flight() -> None:
    trace = _kv_offload.kv_trace(0)
    assert len(trace) == _kv_offload.JOBS
    assert {limit for _, limit, _ in trace} == {1, 2, 3}
    assert {handler for _, _, handler in trace} == {0, 1}
    sizes = sorted(n for n, _, _ in trace)
    assert 16 <= sizes[0] < 32
    assert 8_192 <= sizes[-1] <= 16_384
    assert 256 <= sizes[len(sizes) // 2] <= 1_024  # log-uniform: the median near sqrt(16 * 16384)
    assert _kv_offload.kv_trace(0, 2_000, spike=True)[50][0] == _kv_offload.SPIKE_N


def test_the_figures_are_exact_and_leak_nothing() -> None:
    case = _kv_offload.KvOffloadCase(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LeakWarning)
        case.setup()
    figures = case.measurements()
    assert all(not measured.timed for measured in figures.values())
    lists = figures["allocations per 1,000 jobs, lists"].value
    pooled = figures["allocations per 1,000 jobs, bucketpool"].value
    assert figures["allocations bucketpool/lists"].value == pytest.approx(pooled / lists)
    # A recycled end event keeps its buffer parked until the later copy: more allocations,
    # unless collect() retires the buffers before the events go back.
    recycled = figures["allocations per 1,000 jobs, events recycled"].value
    assert figures["allocations per 1,000 jobs, collect() first"].value < recycled / 2
    # The lists keep the spike's triple; the pool trims it when its bucket idles.
    spike = _kv_offload.SPIKE_N * 24
    assert figures["spike: retained bytes, lists"].value >= spike
    assert figures["spike: retained bytes, bucketpool"].value < spike
