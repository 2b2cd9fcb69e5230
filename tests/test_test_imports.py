"""Tests are a library of behaviours, not of each other: no module under tests/ (a test module,
tests/helpers, conftest.py) imports a test module or conftest. What two test files share lives
in tests/helpers/ or in a fixture of conftest.py. A failure names each such import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def names_of_test_modules() -> set[str]:
    """The names a test module or conftest.py would be imported by (tests/ is on the path)."""
    return {p.stem for p in TESTS.glob("test_*.py")} | {"conftest"}


def imported_modules(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, function-local ones included; `from x import y`
    also as `x.y`, since `from tests import test_x` names the module in `y`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # relative: `from . import test_x`
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def imports_of_test_modules(source: str, filename: str, names: set[str]) -> list[str]:
    """'filename:line imports module' for each import in `source` of a module in `names`."""
    wrong: dict[int, str] = {}
    for line, module in imported_modules(source, filename):
        parts = module.split(".")
        if parts[0] in names or (parts[0] == "tests" and len(parts) > 1 and parts[1] in names):
            wrong.setdefault(line, f"{filename}:{line} imports {module}")
    return list(wrong.values())


def test_no_test_module_imports_another():
    names = names_of_test_modules()
    wrong = [
        w
        for path in sorted(TESTS.rglob("*.py"))
        for w in imports_of_test_modules(path.read_text(), str(path.relative_to(TESTS.parent)), names)
    ]
    assert not wrong, "test modules imported as libraries (move what they share to tests/helpers/):\n" + "\n".join(
        wrong
    )


@pytest.mark.parametrize(
    "source, caught",
    [
        ("from test_pipeline import run_turn\n", True),
        ("def f():\n    import test_cli\n", True),
        ("from tests import test_bench\n", True),
        ("from tests.test_bench import check\n", True),
        ("from conftest import GOLDEN_FILES\n", True),
        ("from helpers.pipeline_turns import run_turn\nimport pytest\nimport test_support_lib\n", False),
    ],
)
def test_the_scan_sees_every_form_of_import(source, caught):
    names = {"test_pipeline", "test_cli", "test_bench", "conftest"}
    assert bool(imports_of_test_modules(source, "tests/test_example.py", names)) == caught
