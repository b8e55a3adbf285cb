"""The packages' layers, read from their import statements (every one: at the top, inside a
function, under TYPE_CHECKING): no import cycle among the API's modules, and the shared
mallard package imports no application package outside its composition root."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "collector", "mallard", "orchestration")
# Where the applications are put together: the only mallard modules that import them.
# mallard.importer: `mallard import` runs a collector of its own (collector/ pieces) in-process.
COMPOSITION_ROOT = {"mallard.app", "mallard.cli", "mallard.importer", "mallard.up"}


def module_names() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that a module imports by name (a submodule when `from a import b`
    names one, else the module itself)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found |= {
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            }
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_imports() -> None:
    edges = graph()
    assert "api.service.reads" in edges["api.service"]
    assert {"api.index.events", "api.params"} <= edges["api.pages"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_api_has_no_import_cycle() -> None:
    edges = graph()
    api = {m: {t for t in ts if t.split(".")[0] == "api"} for m, ts in edges.items()}
    assert cycles({m: ts for m, ts in api.items() if m.split(".")[0] == "api"}) == []


def test_mallard_imports_no_application_outside_its_composition_root() -> None:
    apps = ("api", "collector", "orchestration")
    wrong = {
        m: sorted(t for t in ts if t.split(".")[0] in apps)
        for m, ts in graph().items()
        if m.split(".")[0] == "mallard" and m not in COMPOSITION_ROOT
    }
    assert {m: ts for m, ts in wrong.items() if ts} == {}
