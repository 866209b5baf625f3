"""How many literal key reads in ``analysis/`` and ``render/`` name a key a TypedDict declares.

Issue 37's measure of typed results: a read like ``row.get("peak")`` or ``row["peak"]`` whose
key no TypedDict in the package declares reads an untyped dict (a typo there is silently None).
Counts ``.get("...")`` calls and ``[...]`` loads with a string literal; a key counts as declared
when any ``TypedDict`` class in ``ampdiag/`` has a field of that name.

    python scripts/key_reads.py          # totals
    python scripts/key_reads.py -v       # and the undeclared keys, most read first
"""

from __future__ import annotations

import ast
import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "ampdiag"


def _declared() -> set[str]:
    """Every field name of every TypedDict class (and subclass) in the package."""
    classes = [
        node
        for path in ROOT.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]
    typed = {"TypedDict"}
    for _ in range(3):  # a subclass may come before its base
        typed |= {c.name for c in classes if any(_name(b) in typed for b in c.bases)}
    return {
        stmt.target.id
        for c in classes
        if c.name in typed and c.name != "TypedDict"
        for stmt in c.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    }


def _name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def _reads() -> list[str]:
    keys: list[str] = []
    for folder in ("analysis", "render"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    keys.append("get:" + node.args[0].value)
                elif (
                    isinstance(node, ast.Subscript)
                    and isinstance(node.ctx, ast.Load)
                    and isinstance(node.slice, ast.Constant)
                    and isinstance(node.slice.value, str)
                ):
                    keys.append("sub:" + node.slice.value)
    return keys


def main() -> None:
    declared = _declared()
    reads = _reads()
    for kind, label in (("get:", '.get("...")'), ("sub:", '["..."]'), ("", "both")):
        mine = [k.split(":", 1)[1] for k in reads if k.startswith(kind)]
        typed = sum(k in declared for k in mine)
        print(f"{label:>12}: {typed} of {len(mine)} declared ({typed / max(len(mine), 1):.0%})")
    if "-v" in sys.argv:
        missing = collections.Counter(k.split(":", 1)[1] for k in reads)
        for key, n in missing.most_common():
            if key not in declared:
                print(f"{n:4d} {key}")


if __name__ == "__main__":
    main()
