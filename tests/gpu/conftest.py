"""The GPU checks' fixtures, and the one summary line they print at the end of the run."""

from __future__ import annotations

import pytest
import torch

from ._cuda import stall

_SUMMARY = pytest.StashKey[dict[str, str]]()
_FIELDS = (
    "device",
    "torch",
    "pinned",
    "corruption without event",
    "bytes correct with event",
    "host step bucketpool/original",
    "early release parked",
    "record per copy",
)
_CALIBRATION_CYCLES = 50_000_000  # about 25 ms at 2 GHz


@pytest.fixture
def summary(request: pytest.FixtureRequest) -> dict[str, str]:
    """The results a test reports for the summary line (`pytest_terminal_summary`)."""
    results = request.config.stash.setdefault(_SUMMARY, {})
    results.setdefault("device", torch.cuda.get_device_name())
    results.setdefault("torch", torch.__version__)
    return results


@pytest.fixture(scope="session")
def cycles_per_ms() -> float:
    """``torch.cuda._sleep`` cycles per millisecond on this device, measured once."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stall(stream, 1_000).synchronize()  # the first launch loads the kernel
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record(stream)
    stall(stream, _CALIBRATION_CYCLES)
    end.record(stream)
    end.synchronize()
    return _CALIBRATION_CYCLES / float(start.elapsed_time(end))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Print one line to paste into the benchmark page, if a GPU check ran."""
    results = config.stash.get(_SUMMARY, None)
    if results:
        line = "; ".join(f"{field}: {results.get(field, 'not run')}" for field in _FIELDS)
        terminalreporter.write_line(f"GPU check: {line}")
