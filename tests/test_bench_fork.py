"""The ``fork`` case: forks with the pool's hooks over forks without (toy sizes; no time)."""

from __future__ import annotations

from _bench_case import TOY

from bench._fork import ForkCase, forks_for
from bench._runner import build_cases
from bench._targets import check_targets


def test_fork_case() -> None:
    case = ForkCase(forks=2)
    case.setup()  # both workers started, each asked for one pass
    workers = list(case._workers.values())
    for _ in range(2):
        case.round()
    case.close()
    assert [worker.returncode for worker in workers] == [0, 0]  # each ended as told
    assert set(case.samples) == {"without", "with hooks"}
    assert all(len(samples) == 2 and min(samples) > 0 for samples in case.samples.values())
    figures = case.measurements()
    assert set(figures) == {"fork with hooks/without", "without ns/fork", "with hooks ns/fork"}
    ratio = figures["fork with hooks/without"]
    assert (ratio.unit, ratio.timed, ratio.rounds) == ("x", True, 2)
    checks = check_targets({case.name: figures})
    assert {c.spec.figure: c.spec.kind for c in checks} == {"fork with hooks/without": "goal"}


def test_the_fork_kind_is_one_case_sized_by_the_run() -> None:
    (case,) = build_cases(TOY, (), ["fork"])
    assert isinstance(case, ForkCase)
    assert case.name == "fork"
    assert "2 per pass" in case.description
    assert (forks_for(40), forks_for(2_000), forks_for(10_000)) == (2, 10, 50)
