"""The trace package's shape: no import circles, and a report of a trace that imports no torch."""

import ast
import subprocess
import sys

import pytest

from tests.trace.conftest import REPO, kernel, launch, step, write_trace

TRACE_PKG = REPO / "ampdiag" / "trace"


def _imports(path):
    """The ampdiag.trace modules a module imports (anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("ampdiag.trace."):
                found.add(node.module.rsplit(".", 1)[1])
            elif node.module == "ampdiag.trace":
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(
                a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("ampdiag.trace.")
            )
    return found


def test_trace_modules_have_no_import_circle():
    graph = {p.stem: _imports(p) for p in TRACE_PKG.glob("*.py") if p.stem != "__init__"}
    assert set().union(*graph.values()) <= set(graph)  # every import is a module of the package
    state = {}

    def visit(node, path):
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import circle: {' -> '.join([*path, node])}"
        state[node] = "open"
        for dep in sorted(graph[node]):
            visit(dep, [*path, node])
        state[node] = "done"

    for module in sorted(graph):
        visit(module, [])


def test_no_function_level_imports_in_the_reader():
    # imports at module top: the reader has no layer to keep importable by hiding imports
    for path in TRACE_PKG.glob("*.py"):
        if path.stem == "hta_extra":  # HTA is optional and heavy: imported when asked for
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not inner, f"{path.name}:{fn.name} imports inside a function"


@pytest.mark.parametrize("fmt", ["json", "html"])
def test_report_of_a_trace_imports_no_torch(tmp_path, fmt):
    trace = write_trace(
        tmp_path / "t.json", [launch(1, 1), kernel(2, 3, "sm80_gemm", 1), step(1, 0, 10)]
    )
    code = (
        "import sys\n"
        "from ampdiag.cli import main\n"
        f"args = ['report', {str(trace)!r}, '--format', {fmt!r}, '--out', {str(tmp_path)!r}]\n"
        "code = main(args)\n"
        "print(code, 'torch' in sys.modules)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert r.stdout.split()[-2:] == ["0", "False"], r.stdout + r.stderr
