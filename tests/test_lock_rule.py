"""The locking rule of `bucketpool._lock`, checked on the source rather than trusted.

One lock, taken with ``with`` in the ledger's moves only; a move calls nothing (so no
signal handler, finaliser or thread switch can land inside it) and loops nowhere.  The
exception is named here: the debug levels' verification, which runs before the move changes
anything.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import bucketpool

PACKAGE = pathlib.Path(bucketpool.__file__).parent
#: Calls a locked section may make, as ``(function, call)`` source text.
ALLOWED_CALLS = {("settle", "self.verify(buffer, token, not events)")}
_LOOPS = (ast.For, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_SUSPENDS = (ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda)


def _locked_sections(tree: ast.AST) -> list[tuple[ast.FunctionDef, ast.With]]:
    found = []
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.With) and any(
                    _is_lock(item.context_expr) for item in node.items
                ):
                    found.append((function, node))
    return found


def _is_lock(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "LOCK") or (
        isinstance(node, ast.Attribute) and node.attr == "_lock" and _is_pool_lock(node)
    )


def _is_pool_lock(node: ast.Attribute) -> bool:
    # bucketpool.vllm's module-level `_lock` serialises install(); the pool's is `x._lock`.
    return not isinstance(node.value, ast.Name) or node.value.id != "_lock"


def _is_local(target: ast.expr) -> bool:
    if isinstance(target, ast.Tuple):
        return all(_is_local(item) for item in target.elts)
    return isinstance(target, ast.Name)


def _is_mutation(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Assign):
        return not all(_is_local(target) for target in statement.targets)
    return isinstance(statement, (ast.AugAssign, ast.Delete, ast.Expr))


def violations(source: str, module: str = "<source>") -> list[str]:
    """Every place *source* breaks the locking rule, as readable lines."""
    problems = []
    for function, section in _locked_sections(ast.parse(source)):
        where = f"{module}:{section.lineno} ({function.name})"
        for node in ast.walk(function):
            if isinstance(node, ast.Call):
                call = (function.name, ast.unparse(node))
                if call not in ALLOWED_CALLS:
                    problems.append(f"{where}: a move calls {call[1]}")
            elif isinstance(node, _LOOPS):
                problems.append(f"{where}: a move loops ({type(node).__name__})")
            elif isinstance(node, _SUSPENDS):
                problems.append(f"{where}: a move can suspend ({type(node).__name__})")
            elif isinstance(node, ast.With) and node is not section:
                problems.append(f"{where}: a move enters another context")
        problems.extend(_verify_comes_first(section, where))
    return problems


def _verify_comes_first(section: ast.With, where: str) -> list[str]:
    """The verification (which may raise) runs before the section changes anything."""
    for position, statement in enumerate(section.body):
        if "self.verify(" not in ast.unparse(statement):
            continue
        for earlier in section.body[:position]:
            early_exit = isinstance(earlier, ast.If) and isinstance(earlier.body[-1], ast.Return)
            if _is_mutation(earlier) or (
                isinstance(earlier, ast.If) and not early_exit and _changes(earlier)
            ):
                return [f"{where}: line {earlier.lineno} changes the records before verify"]
    return []


def _changes(node: ast.AST) -> bool:
    return any(isinstance(inner, ast.stmt) and _is_mutation(inner) for inner in ast.walk(node))


def _modules() -> list[pathlib.Path]:
    return sorted(PACKAGE.glob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda path: path.name)
def test_no_locked_section_calls_or_loops(path: pathlib.Path) -> None:
    assert violations(path.read_text(), path.name) == []


def test_the_lock_is_taken_in_the_ledger_only() -> None:
    taken = {path.name for path in _modules() if _locked_sections(ast.parse(path.read_text()))}
    assert taken == {"_ledger.py"}


def test_the_lock_is_acquired_by_hand_only_around_fork() -> None:
    by_hand = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in {"acquire", "release"}
                and isinstance(node.value, ast.Name)
                and node.value.id == "LOCK"
            ):
                by_hand.append(path.name)
    assert sorted(by_hand) == ["_lock.py"] * 3  # the fork handlers: acquire, release twice


def test_every_move_is_checked() -> None:
    # The checker sees the ledger's moves: a change that hid them would pass vacuously.
    source = (PACKAGE / "_ledger.py").read_text()
    names = {function.name for function, _ in _locked_sections(ast.parse(source))}
    assert {"serve", "settle", "uncache", "retire", "young_front", "compact"} <= names


def _function(*lines: str, name: str = "move") -> str:
    return "\n".join([f"def {name}(self, pool, buffer, token, events):", *lines]) + "\n"


BROKEN = {
    "a call": _function("    with LOCK:", "        self.free.pop()"),
    "a call before the section": _function(
        "    x = len(self.free)", "    with LOCK:", "        pass"
    ),
    "a loop": _function("    with LOCK:", "        for b in self.free:", "            b.token = 0"),
    "a comprehension": _function("    with LOCK:", "        return [b for b in self.free]"),
    "a pool's own lock": _function("    with pool._lock:", "        pool.stats()"),
    "verify after a change": _function(
        "    with LOCK:",
        "        self.active -= 1",
        "        self.verify(buffer, token, not events)",
        name="settle",
    ),
    "a nested context": _function("    with LOCK:", "        with self.other:", "            pass"),
}


@pytest.mark.parametrize("source", BROKEN.values(), ids=BROKEN.keys())
def test_the_checker_catches_a_broken_rule(source: str) -> None:
    assert violations(source)
