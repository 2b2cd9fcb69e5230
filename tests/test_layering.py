"""The package's layer order, as README states it, holds in the imports; so does the server's
own order of its parts, as kimiaudio/server/__init__.py states it.

Every import in the package is read from the source (ast; function-local and type-checking
imports included, since each is a dependency all the same): a package may import only the
packages below its own layer, packages of one layer not each other, and no two modules may
import each other, directly or round a longer circle. Inside server/ the same holds for its
parts (its sub-packages and top-level modules). A failure names each offending import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kimiaudio"
ORDER_MARK = "→"


def order_line(text: str, first: str, where: str) -> list[list[str]]:
    """The line of `text` that starts with `first` and holds `→` (with the lines after it that
    go on with `→`), as layers, lowest first."""
    lines = [line.strip().strip("`") for line in text.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith(first) and ORDER_MARK in line:
            for more in lines[i + 1 :]:
                if not more.startswith(ORDER_MARK):
                    break
                line += " " + more
            return [[name.strip() for name in layer.split(",")] for layer in line.split(ORDER_MARK)]
    raise AssertionError(f"{where} states no layer order (a line `{first} → ...`)")


def layer_order() -> list[list[str]]:
    """README's order line, lowest layer first: `errors, validation → config → ... → cli`."""
    return order_line((ROOT / "README.md").read_text(), "errors", "README.md")


def server_layer_order() -> list[list[str]]:
    """The server's order line (its package docstring): `api_error, tls → inputs → ... → serve`."""
    init = PACKAGE / "server" / "__init__.py"
    return order_line(ast.get_docstring(ast.parse(init.read_text())) or "", "api_error", str(init))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported module or `module.name`) for every import in the file."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def module_graph() -> dict[str, dict[str, int]]:
    """module -> {module of this package it imports: line}."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {m: {} for m in files}
    for module, path in files.items():
        for line, target in imports_of(path):
            if target in files and target != module:
                graph[module].setdefault(target, line)
    return graph


def top_package(module: str) -> str:
    """kimiaudio.engine.scheduler -> engine; kimiaudio.config -> config; kimiaudio -> kimiaudio."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def rank_of(order: list[list[str]]) -> dict[str, int]:
    ranks = {name: i for i, layer in enumerate(order) for name in layer}
    ranks["kimiaudio"] = -1  # the package's own __init__ (its version) sits below everything
    ranks["__main__"] = len(order)  # `python -m kimiaudio` runs the CLI, above it
    return ranks


def test_every_package_has_a_layer():
    ranks = rank_of(layer_order())
    unplaced = sorted({top_package(m) for m in module_graph()} - set(ranks))
    assert not unplaced, f"packages missing from README's layer order: {unplaced}"


def test_no_package_imports_one_above_it_or_beside_it():
    ranks = rank_of(layer_order())
    wrong = []
    for module, targets in sorted(module_graph().items()):
        for target, line in sorted(targets.items()):
            a, b = top_package(module), top_package(target)
            if a != b and ranks.get(a, 0) <= ranks.get(b, 0):
                where = "beside" if ranks.get(a) == ranks.get(b) else "above"
                wrong.append(f"{module} (line {line}) imports {target}: {b} is {where} {a}")
    assert not wrong, "imports against README's layer order:\n" + "\n".join(wrong)


def server_part(module: str) -> str | None:
    """kimiaudio.server.session.responder -> session; kimiaudio.server.app -> app;
    kimiaudio.server -> server (its docstring); anything outside server/ -> None."""
    parts = module.split(".")
    if parts[:2] != ["kimiaudio", "server"]:
        return None
    return parts[2] if len(parts) > 2 else "server"


def test_every_server_part_has_a_layer():
    ranks = {name: i for i, layer in enumerate(server_layer_order()) for name in layer}
    parts = {server_part(m) for m in module_graph()} - {None, "server"}
    assert not sorted(parts - set(ranks)), (
        f"parts of server/ missing from its layer order: {sorted(parts - set(ranks))}"
    )


def test_no_server_part_imports_one_above_it_or_beside_it():
    ranks = {name: i for i, layer in enumerate(server_layer_order()) for name in layer}
    wrong = []
    for module, targets in sorted(module_graph().items()):
        a = server_part(module)
        for target, line in sorted(targets.items()):
            b = server_part(target)
            if a is None or b is None or a == b or "server" in (a, b):
                continue
            if ranks.get(a, 0) <= ranks.get(b, 0):
                where = "beside" if ranks.get(a) == ranks.get(b) else "above"
                wrong.append(f"{module} (line {line}) imports {target}: {b} is {where} {a} in server/")
    assert not wrong, "imports against server/'s layer order:\n" + "\n".join(wrong)


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_imports_round_a_circle():
    cycles = find_cycles(module_graph())
    assert not cycles, "modules that import each other (directly or round a circle):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}, [["a", "b", "c"]]),
        ({"a": {"b": 1}, "b": {}, "c": {"b": 1}}, []),
    ],
)
def test_the_cycle_finder_finds_circles_and_only_circles(graph, expected):
    assert find_cycles(graph) == expected


def test_relative_and_local_imports_are_seen(tmp_path):
    source = tmp_path / "kimiaudio" / "engine" / "x.py"
    source.parent.mkdir(parents=True)
    source.write_text("from . import scheduler\n\ndef f():\n    from ..server import app\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        targets = {t for _, t in imports_of(source)}
    finally:
        ROOT = saved
    assert {"kimiaudio.engine.scheduler", "kimiaudio.server.app"} <= targets
