"""The one registry: a table of modules whose entries register themselves on import."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ampdiag.analysis.registry import rule, rules
from ampdiag.registry import Registered, Registry, registering


def test_entries_follow_the_table_not_the_import_order(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pkg = tmp_path / "plug_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from ampdiag.registry import Registry\nREG = Registry(__name__, ('b', 'a'))\n"
    )
    for name in ("a", "b"):
        (pkg / f"{name}.py").write_text(
            f"from plug_pkg import REG\n@REG.register\ndef entry_{name}() -> None: ...\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("plug_pkg.a")  # imported first, listed second
        reg = importlib.import_module("plug_pkg").REG
        assert [f.__name__ for f in reg.entries()] == ["entry_b", "entry_a"]
    finally:
        for name in ("plug_pkg", "plug_pkg.a", "plug_pkg.b"):
            sys.modules.pop(name, None)


def test_a_finding_id_is_emitted_by_one_rule_only() -> None:
    taken = rules()[0].ids[0]
    with pytest.raises(ValueError, match=taken):
        rule(taken)(lambda session: [])
    reg: Registry[Registered[Callable[..., object]]] = Registry("x", (), ids=lambda r: r.ids)
    registering(reg, ("x",))(print)
    with pytest.raises(ValueError):
        registering(reg, ("y", "x"))(len)
