"""The report of one tiny run: a one-screen summary, or (``verbose``) every figure and check."""

from __future__ import annotations

import functools
import itertools
import re

import _bench_case
import attrs
import pytest

from bench import _report as report
from bench._host_step import EcStepCase
from bench._runner import BenchResult, Settings, environment
from bench._stats import Measurement, Verdict, exact
from bench._targets import check_targets
from bench._traces import TRACE_NAMES

#: The most lines the summary may take: one tall screen (the kv-offload rows made 60 too few,
#: the words of each figure, with how to read them, 66, the host steps and the counts 72, and
#: what to do on a loaded machine 82; a toy run's outliers, "31x slower" or "1/12 UNSURE",
#: narrow the figure column and wrap a few more figures).
SCREEN = 90


@pytest.fixture(scope="module")
def tiny_run() -> BenchResult:
    """Every trace and case at toy sizes: a report as long as a full run's."""
    return _bench_case.tiny_run(None)


def test_formatting() -> None:
    assert report.format_bytes(512) == "512 B"
    assert report.format_bytes(1536) == "1.5 KiB"
    assert report.format_bytes(24 << 20) == "24.0 MiB"
    assert report.format_value(0.294, "x") == "0.294x"
    assert report.format_value(2178.4, "x") == "2,178x"
    assert report.format_value(1234.4, "ns") == "1,234 ns"
    assert report.format_value(12, "count") == "12"
    assert report.format_value(0.57, "count") == "0.57"  # a mean, not rounded to 1
    assert report.format_value(0.6, "count") == "0.6"
    assert report.format_value(812_345.6, "ops/s") == "812,346 ops/s"
    assert report.format_measurement(Measurement(0.3, 0.29, 0.31, "x")) == "0.3x [0.29x-0.31x]"
    assert report.format_measurement(exact(3, "count")) == "3"


@pytest.mark.parametrize(
    ("value", "low", "high", "words"),
    [
        (1.3, 1.2, 1.4, "1.3x slower"),  # a takes 1.3 times b's time
        (0.5, 0.45, 0.55, "2x faster"),  # half b's time
        (0.25, 0.2, 0.3, "4x faster"),
        (2178.4, 2000, 2300, "2,178x slower"),
        (0.95, 0.9, 1.05, "cannot tell"),  # the interval holds 1
        (1.08, 1.0, 1.15, "cannot tell"),  # ... at its end too
        (1.004, 1.002, 1.006, "1.004x slower"),  # never "1x slower"
    ],
)
def test_a_ratio_in_words(value: float, low: float, high: float, words: str) -> None:
    assert report.in_words(Measurement(value, low, high, "x")) == words


def test_an_exact_ratio_in_words() -> None:
    assert report.in_words(exact(2, "x")) == "2x more"
    assert report.in_words(exact(0.5, "x")) == "2x less"
    assert report.in_words(exact(0.0848, "x")) == "12x less"
    assert report.in_words(exact(1, "x")) == "the same"
    assert report.in_words(exact(0, "x")) == "none"
    with pytest.raises(ValueError, match="not a ratio"):
        report.in_words(exact(3, "count"))


def rows_of(table: str, first: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines() if line.split()[:1] == [first]]


def target_rows(summary: str, kind: str) -> dict[str, str]:
    """Figure to the rest of its row, under the summary's heading of *kind* (promises, goals)."""
    lines = summary.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{kind} ("))
    rows: list[tuple[str, str]] = []
    for line in itertools.takewhile(
        lambda line: line and not line.startswith("goals ("), lines[start + 1 :]
    ):
        if line.startswith(" "):  # the figure, wrapped, goes on (at a space or after a "-")
            figure, rest = rows.pop()
            rows.append((figure + ("" if figure.endswith("-") else " ") + line.strip(), rest))
        else:
            figure, _, rest = line.partition("  ")
            rows.append((figure, rest))
    assert len({figure for figure, _ in rows}) == len(rows), "a row per figure"
    return dict(rows)


def test_the_summary_fits_one_screen_and_says_each_headline(tiny_run: BenchResult) -> None:
    summary = report.render_table(tiny_run)
    assert len(summary.splitlines()) <= SCREEN, summary
    for trace in TRACE_NAMES:  # a row per trace: its step ratio, its interval and its words
        (row,) = rows_of(summary, trace)
        measured = tiny_run.figures[trace]["bucketpool/original"]
        assert report.format_measurement(measured).split()[0] in row
        assert report.in_words(measured) in " ".join(row)
    for k in ("16", "64", "256", "4,096", "65,536"):
        assert len(rows_of(summary, k)) == 1
    assert "fill-step (normal-64, 20 steps" in summary
    assert "-check: exit" not in summary
    # The step and fill promises are in those tables, case by case; the rest below, each once.
    promise_rows = target_rows(summary, "promises")
    assert "bucketpool allocations after warm-up" in promise_rows
    assert "add_copies/numpy (arrays)" not in promise_rows
    shown = {"bucketpool/original", "setitem/add_copies", "installed/vllm"}
    shown |= {f"add_copies/numpy ({source})" for source in ("arrays", "lists")}
    shown |= set(tiny_run.figures["view-cache"])
    figures = {c.spec.figure for c in tiny_run.checks if c.spec.kind == "promise"}
    assert set(promise_rows) == figures - shown
    goals = {c.spec.figure for c in tiny_run.checks if c.spec.kind == "goal"}
    assert set(target_rows(summary, "goals")) == goals


def test_the_host_steps_come_first_then_the_counts_then_the_traces(tiny_run: BenchResult) -> None:
    hosts = [case for case in tiny_run.figures if case.startswith("host-")]
    if not hosts:
        pytest.skip("no vLLM wheel (.ci/setup installs one): no host-step cases")
    lines = report.render_table(tiny_run).splitlines()
    firsts = [line.split()[0] if line.split() else "" for line in lines]
    tables = [firsts.index(name) for name in (*hosts, "view-cache,", *TRACE_NAMES, "16")]
    assert tables == sorted(tables)  # the host steps, the counts, the traces, the fills
    assert not any(name in tiny_run.figures for name in firsts[: tables[0]])  # nothing before
    for case in hosts:  # each with its ratio, in words, and what install() adds to a step
        row = lines[firsts.index(case)]
        figures = tiny_run.figures[case]
        assert report.format_measurement(figures["installed/vllm"]) in row
        assert f"{report.in_words(figures['installed/vllm'])}, " in row
        extra = row.split(", ", 1)[1].split()[0]  # "+27" in "1.15x slower, +27 µs"
        assert float(extra) == pytest.approx(
            figures["installed - vllm ns/step"].value / 1000, abs=0.5
        )
    counts = lines[firsts.index("view-cache,") + 1 :]
    for figure in ("view sets cut per step, log-uniform n", "torch calls per view set cut"):
        (row,) = (line for line in counts if line.startswith(figure))
        measured = tiny_run.figures["view-cache"][figure]
        assert report.format_value(measured.value, "count") in row.split()


def test_each_comparison_says_who_wins_in_words(tiny_run: BenchResult) -> None:
    summary = report.render_table(tiny_run)
    said = ("slower", "faster", "cannot tell", "more", "less", "the same", "none")
    for k in ("16", "64", "256", "4,096", "65,536"):  # every ratio of the fills, in words
        (cells,) = rows_of(summary, k)
        assert sum(" ".join(cells).count(w) for w in said) == 2 + (k in ("64", "256", "4,096"))
    rows = [*target_rows(summary, "promises").items(), *target_rows(summary, "goals").items()]
    timed = {c.spec.figure for c in tiny_run.checks if c.measurement.timed}
    compared = timed | {"allocations bucketpool/lists", "spike: retained bytes bucketpool/lists"}
    for figure, rest in rows:  # a ratio of two things says which wins; a count or a share not
        assert any(word in rest for word in said) == (figure in compared), (figure, rest)


def test_verbose_has_every_figure_and_every_check(tiny_run: BenchResult) -> None:
    table = report.render_table(tiny_run, verbose=True)
    for case, figures in tiny_run.figures.items():
        assert f"\n{case} ({tiny_run.rounds[case]} rounds): " in table  # described
        for figure in figures:
            assert figure in table
    lines = table.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith(("promise ", "goal "))]
    indented = functools.partial(itertools.takewhile, lambda line: line.startswith("  "))
    rows = [(lines[i], row.split()) for i in heads for row in indented(lines[i + 1 :])]
    assert len(rows) == len(tiny_run.checks)
    for check in tiny_run.checks:  # under its kind and figure, its case and verdict
        verdicts = (check.verdict, f"{check.interval_verdict})")
        head = f"{check.spec.kind} {check.spec.figure}:"
        assert any(h == head and r[0] == check.case and r[-1] in verdicts for h, r in rows)


def test_the_exit_line_comes_last_with_check(tiny_run: BenchResult) -> None:
    checked = report.render_table(tiny_run, check=True).splitlines()
    assert checked[-1].startswith("--check: exit ")
    strict = report.render_table(tiny_run, check=True, strict=True).splitlines()
    assert strict[-1].startswith("--strict-check: exit ")


def host_run(ratio: Measurement, extra_ns: float) -> BenchResult:
    """A run of ``host-ec-small`` alone, measuring *ratio* and *extra_ns* over 180 µs a step."""
    case = EcStepCase("small", 1)  # (not set up: its figures are given)
    figures = {
        case.name: {
            "installed/vllm": ratio,
            "vllm/vllm": Measurement(1.0, 0.99, 1.01, "x"),
            "installed - vllm ns/step": Measurement(extra_ns, extra_ns - 1, extra_ns + 1, "ns"),
            "vllm ns/step": Measurement(180_000, 170_000, 190_000, "ns"),
        }
    }
    return BenchResult(
        settings=Settings(),
        environment=environment(),
        cases=(case,),
        figures=figures,
        checks=check_targets(figures),
        rounds={case.name: 7},
        load={case.name: 0.0},
        duration_s=1.0,
    )


def test_the_host_step_says_what_install_costs_vllm_in_words() -> None:
    def row(ratio: Measurement, extra_ns: float) -> str:
        (line,) = (
            line
            for line in report.render_table(host_run(ratio, extra_ns)).splitlines()
            if line.startswith("host-ec-small ")
        )
        return line

    costs = row(Measurement(1.15, 1.12, 1.18, "x"), 27_400)
    assert "1.15x slower, +27 µs" in costs
    assert costs.split()[1] == "180"  # vLLM's µs a step
    assert re.search(r"  <= 1\.1x  +FAIL  ", costs)  # its promise, missed
    assert "1.15x [1.12x-1.18x]" in costs
    assert costs.endswith("  1x")  # the control
    assert "cannot tell, -0.4 µs" in row(Measurement(1.0, 0.98, 1.03, "x"), -400)
    assert "1.25x faster, -45 µs" in row(Measurement(0.8, 0.78, 0.82, "x"), -45_000)


def judged(result: BenchResult, verdicts: dict[str, Verdict]) -> BenchResult:
    """*result* with each check's verdict set by its case (others PASS), its interval's too."""
    checks = tuple(
        attrs.evolve(c, verdict=verdicts.get(c.case, "PASS"), interval_verdict="UNSURE")
        for c in result.checks
    )
    return attrs.evolve(result, checks=checks)


def test_a_loaded_run_says_once_what_to_do_and_still_shows_the_figures(
    tiny_run: BenchResult,
) -> None:
    # A busy machine: every timing verdict LOADED, the exact ones judged (PASS).
    checks = tuple(
        attrs.evolve(c, verdict="LOADED" if c.measurement.timed else "PASS")
        for c in tiny_run.checks
    )
    timed = sum(c.measurement.timed for c in checks)
    summary = report.render_table(attrs.evolve(tiny_run, checks=checks))
    words = " ".join(summary.split())  # (the advice is wrapped)
    assert words.count("MACHINE LOOKS LOADED") == 1
    assert f"{timed} of {timed} timing verdicts are LOADED, not judged" in words
    assert words.count("rerun on a quiet machine") == 1
    cpus = tiny_run.environment["cpus"]
    assert isinstance(cpus, int)
    assert f"`uptime` shows a load average under {cpus - 0.5:g}" in words  # a CPU left free
    lines = summary.splitlines()
    advice = next(i for i, line in enumerate(lines) if line.startswith("MACHINE LOOKS LOADED"))
    for trace in TRACE_NAMES:  # after it, every figure as measured, with its words
        (row,) = (i for i, line in enumerate(lines) if line.startswith(f"{trace} "))
        measured = tiny_run.figures[trace]["bucketpool/original"]
        assert row > advice
        assert report.format_measurement(measured) in lines[row]
        assert report.in_words(measured) in lines[row]
        assert " LOADED " in lines[row]
    assert lines[-1].startswith("no promise FAILED; not judged (UNSURE or LOADED)")
    verbose = " ".join(
        report.render_table(attrs.evolve(tiny_run, checks=checks), verbose=True).split()
    )
    assert (
        f"not judged ({', '.join(dict.fromkeys(c.case for c in checks if c.measurement.timed))}):"
        in verbose
    )
    quiet = report.render_table(judged(tiny_run, {}))
    assert "MACHINE LOOKS LOADED" not in quiet
    assert "uptime" not in quiet


@pytest.mark.parametrize("verdict", ["PASS", "FAIL", "UNSURE", "LOADED"])
def test_every_line_fits_100_columns(tiny_run: BenchResult, verdict: Verdict) -> None:
    # The longest verdicts on every case: LOADED names the interval's, FAIL names the checks.
    result = judged(tiny_run, dict.fromkeys(tiny_run.figures, verdict))
    for flags in ({}, {"verbose": True}, {"check": True}, {"check": True, "strict": True}):
        text = report.render_table(result, **flags)
        assert max(len(line) for line in text.splitlines()) <= report.WIDTH < 100, flags
    assert len(report.render_table(result).splitlines()) <= SCREEN


def test_the_last_line_says_what_the_promises_came_to(tiny_run: BenchResult) -> None:
    def last(verdicts: dict[str, Verdict]) -> str:
        return report.render_table(judged(tiny_run, verdicts)).splitlines()[-1]

    promised = len([c for c in tiny_run.checks if c.spec.kind == "promise"])
    assert last({}) == f"every promise held ({promised} PASS)"
    assert last({"compat": "FAIL"}) == "1 promise FAILED: compat: refused calls"
    two = "2 promises FAILED: evented: evented/plain; compat: refused calls"
    assert last({"evented": "FAIL", "compat": "FAIL"}) == two
    spike = len([c for c in tiny_run.checks if c.spec.kind == "promise" and c.case == "spike"])
    named = last({"spike": "FAIL", "compat": "FAIL"})  # the names do not fit: the cases
    assert named == f"{spike + 1} promises FAILED, on spike, compat (see above)"
    every = last(dict.fromkeys(tiny_run.figures, "FAIL"))  # too many to name: their cases
    assert every.startswith(f"{promised} promises FAILED, on ")
    named = every.removeprefix(f"{promised} promises FAILED, on ").split(" and ")[0]
    assert set(named.split(", ")) <= set(tiny_run.figures)  # the first cases, by name
    assert every.endswith(" more (see above)")
    assert last({"spike": "LOADED"}).startswith("no promise FAILED; not judged (UNSURE or ")
