"""Private torch APIs only in ampdiag/compat/: what ruff's banned-api rule cannot see.

Ruff (TID251, pyproject.toml) rejects ``torch._C``, ``torch._foreach_*`` and the other private
modules and functions by name. It cannot know that ``scaler._device`` or ``func._schema`` is
torch's private state, so this test reads the code: outside compat/, a private attribute
(``obj._name``, or ``getattr(obj, "_name")``) may only be one that ampdiag itself defines.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ampdiag"
COMPAT = PACKAGE / "compat"
# Underscore names the standard library documents as public.
PUBLIC = {"_exit", "_asdict", "_replace", "_fields", "_make"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def defined_private_names(files: list[Path]) -> set[str]:
    """Private names ampdiag defines: its functions, classes, attributes, slots and globals."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
            elif (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)
                and isinstance(node.value, (ast.Tuple, ast.List))
            ):
                names.update(str(e.value) for e in node.value.elts if isinstance(e, ast.Constant))
    return {n for n in names if _private(n)} | PUBLIC


def private_uses(path: Path, own: set[str]) -> list[str]:
    """``file:line: expression`` of each private attribute ampdiag does not define."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        name = None
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id == "torch":
                name = node.attr  # torch._anything, even if ampdiag has a name like it
            elif node.attr not in own:
                name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and node.args[1].value not in own
        ):
            name = node.args[1].value
        if name is not None:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}")
    return found


def test_private_torch_state_is_read_only_in_compat() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    outside = [f for f in files if COMPAT not in f.parents]
    own = defined_private_names(outside)
    assert [u for f in outside for u in private_uses(f, own)] == []


def test_the_check_sees_private_torch_access() -> None:
    own = {"_mine"}
    code = (
        "def f(scaler, func, x):\n"
        "    a = scaler._device\n"
        "    b = func._schema.name\n"
        "    c = getattr(scaler, '_scale', None)\n"
        "    d = torch._foreach_norm(x)\n"
        "    e = getattr(scaler, '_device', None)\n"
        "    return x._mine\n"
    )
    tmp = PACKAGE.parent / "tests" / "_private_probe.py"
    tmp.write_text(code, encoding="utf-8")
    try:
        got = [u.split(": ")[1] for u in private_uses(tmp, own)]
    finally:
        tmp.unlink()
    assert sorted(got) == ["_device", "_device", "_foreach_norm", "_scale", "_schema"]
