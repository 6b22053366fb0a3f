"""The host-step cases' arms: only the installed worker's copies are recorded (issue 35).

The ``record ns/copy`` figure is the installed step against the same with vLLM's op
unwrapped: it measures the recording only if the ``unrecorded`` arm records nothing and
vLLM's own arms never reach bucketpool's op, each copy of the installed arm being recorded.
"""

from __future__ import annotations

from typing import Any

import _vllm_standin as standin
import pytest

from bench._host_step import RECORD, EcStepCase, KvStepCase
from bucketpool import _copies

pytestmark = pytest.mark.skipif(
    standin.vllm_locations() is None, reason="no vLLM: run .ci/setup (see docs/development.md)"
)


@pytest.mark.parametrize("make", [lambda: EcStepCase("small", 20), lambda: KvStepCase(20)])
def test_only_the_installed_arm_records_its_copies(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = make()
    case.setup()
    try:
        calls: list[bool] = []
        original = _copies.begun

        def spy(*args: Any) -> _copies.Copy | None:
            copy = original(*args)
            calls.append(copy is not None)
            return copy

        monkeypatch.setattr(_copies, "begun", spy)
        for _ in range(2):
            case.round()
        figures = case.measurements()
    finally:
        case.close()
    copies = case._copies
    assert copies["installed"] == copies["unrecorded"] == copies["vllm"] > 0  # the same plans
    assert calls == [True] * copies["installed"]  # each of its copies, and no other arm's
    assert RECORD in figures
