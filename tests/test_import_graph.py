"""ampdiag's modules import each other without a cycle, function-level imports included.

The graph is read from the source with `ast` (every ``import`` statement anywhere in a module:
at the top, inside a function, under ``TYPE_CHECKING``), so a lazy import inside ``__repr__``
counts as much as one at the top: a cycle that only closes at call time is still a cycle.
An edge goes to the module named (``from ampdiag.a import b`` goes to ``ampdiag.a.b`` when that
is a module, else to ``ampdiag.a``); the packages above it are not counted, so that the lazy
public surface in ``ampdiag/__init__.py`` does not close every path.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ampdiag

ROOT = Path(ampdiag.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the ampdiag modules its source imports (anywhere in the file)."""
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in files else base)
            for target in targets:
                while target and target not in files:  # import a.b.c where c is a name
                    target = target.rpartition(".")[0]
                if target.startswith("ampdiag") and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_level_imports() -> None:
    graph = import_graph()
    # both only inside functions: the lazy notebook display, cli's sources
    assert "ampdiag.render.notebook" in graph["ampdiag"]
    assert "ampdiag.session" in graph["ampdiag.cli"]
    # a module's top-level imports too (relative ones resolved)
    assert "ampdiag.schema" in graph["ampdiag.session"]


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_ampdiag_modules() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
