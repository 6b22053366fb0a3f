"""The README and the docs: every Python block runs, and the README keeps its shape.

The Python blocks of one page run in order in one namespace (Sybil), so a page may build on
its earlier blocks; a failing block is reported at its own line of the Markdown file.
Blocks that are not Python, or are not meant to run, use another fence (``sh``, ``text``,
``toml``); `test_no_python_block_escapes` makes sure no Python hides behind a look-alike
fence.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sybil import Document
from sybil.parsers.markdown import PythonCodeBlockParser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
DOCUMENTS = [README, *PAGES]
#: Fences that are not run: shell, output and configuration, and Python not meant to run.
NOT_RUN = {"sh", "text", "toml"}
_FENCE = re.compile(r"^[ \t]*```[ \t]*([^\s`{]*)", re.MULTILINE)
_LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")
_NAMED_PAGE = re.compile(r"`([\w./-]+\.md)`")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _fences(path: Path) -> list[str]:
    """The language of every opening fence of *path* (closing fences are skipped)."""
    languages = _FENCE.findall(path.read_text(encoding="utf-8"))
    return languages[::2]


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_python_blocks_run(path: Path) -> None:
    document = Document.parse(str(path), PythonCodeBlockParser())
    examples = list(document)
    assert len(examples) == _fences(path).count("python")
    for example in examples:
        example.evaluate()


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_no_python_block_escapes(path: Path) -> None:
    languages = _fences(path)
    assert "" not in languages, f"{_name(path)}: a fence without a language"
    assert set(languages) <= {"python", *NOT_RUN}, f"{_name(path)}: fences {set(languages)}"


def test_docs_have_python_blocks() -> None:
    # The guide's pages show code; a page whose blocks all lost their fence would pass
    # test_python_blocks_run with nothing run.
    for path in (README, *sorted((ROOT / "docs" / "guide").glob("*.md"))):
        assert _fences(path).count("python") >= 1, _name(path)


def test_readme_is_short() -> None:
    assert len(README.read_bytes()) <= 8 * 1024


def test_readme_starts_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in first_block.splitlines()]
    assert lines == ["bash .ci/setup && .venv/bin/python -m bench", "bash .ci/run"]
    assert text.index("```sh") < text.index("## ")  # before any section


def test_readme_works_on_an_index_page() -> None:
    # The README is the package's long description (pyproject's `readme`). On an index page a
    # relative link leads nowhere, and the project has no public host to link to instead, so
    # the README names the files (`docs/install.md`, in the checkout and the sdist).
    text = README.read_text(encoding="utf-8")
    relative = [target for target, _anchor in _LINK.findall(text) if "://" not in target]
    assert relative == [], f"README.md links to {relative}: name the files instead"
    for name in _NAMED_PAGE.findall(text):
        assert (ROOT / name).exists(), f"README.md names {name}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_relative_links_resolve(path: Path) -> None:
    # mkdocs --strict checks links between pages; this also covers the README's.
    for target, _anchor in _LINK.findall(path.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{_name(path)} links to {target}"
