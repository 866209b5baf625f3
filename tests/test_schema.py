"""The session schema: what a real run writes matches `ampdiag.schema`, and readers agree with it.

The contract test runs a real diagnose() on the CPU with every collector on and checks each
section, strictly (no key outside the schema). The key check reads the analysis and render code:
every literal key read from a typed section must be one the schema declares (mypy accepts
``TypedDict.get("any-key")`` by design, PEP 589, so this is where a misspelt key is caught).
"""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
import typing
from dataclasses import fields as dataclass_fields
from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag import schema
from ampdiag.analysis.advisors.recommendations import batch_size
from ampdiag.errors import InputError
from ampdiag.session import Session, load

REPO = Path(__file__).resolve().parents[1]
OLD_SESSION = REPO / "tests" / "data" / "sessions" / "main-f6ce857.json"


def diagnosed_run(out: Path, batch: int = 6, steps: int = 5) -> Session:
    """FP16 autocast with a GradScaler on the CPU, every collector on (FP8's too), no rendering."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with ampdiag.diagnose(
        out=out, report=False, tensorboard=False, console=False, speed_probe_repeats=1, fp8=True
    ) as d:
        for _ in range(steps):
            x = torch.randn(batch, 8)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    assert d.session is not None
    return d.session


def test_a_real_run_matches_the_schema_strictly(tmp_path: Path) -> None:
    session = diagnosed_run(tmp_path)
    doc = session.to_dict()
    written = set(doc) - {
        "schema_version",
        "ampdiag_version",
        "created",
        "status",
        "error",
        "environment",
        "config",
        "steps",
        "findings",
    }
    # every collector of the default set wrote its section, and each is a known one (a trace
    # source writes the timeline, a merged distributed run the ranks)
    assert written == set(schema.SECTIONS) - {"timeline", "ranks"}
    assert schema.check_document(doc, strict=True) == []
    # and what was saved loads back through the same check
    assert load(tmp_path).to_dict()["memory"] == json.loads(json.dumps(doc["memory"]))


def test_the_batch_the_memory_collector_observed_reaches_the_advice(tmp_path: Path) -> None:
    session = diagnosed_run(tmp_path, batch=6)
    del session.sections["speed_probe"]  # the memory section is then the only witness
    assert session.section("memory")["observed_batch"] == 6
    assert batch_size(session) == 6


def test_a_session_saved_by_the_previous_release_loads(tmp_path: Path) -> None:
    # session.json written by main at f6ce857 (schema 1), before the schema module existed
    doc = json.loads(OLD_SESSION.read_text())
    assert schema.check_document(doc, strict=True) == []
    (tmp_path / "session.json").write_text(OLD_SESSION.read_text())
    session = load(tmp_path)
    assert session.section("scaler")["present"] is True
    assert session.steps[0]["index"] == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"memory": {"observed_batch": "six"}}, "memory.observed_batch: expected int, got str"),
        ({"steps": [{"index": 0, "wall_s": []}]}, "steps[0].wall_s: expected float"),
        ({"environment": [1, 2]}, "environment: expected an object, got list"),
        ({"scaler": {"history": {"step": 1}}}, "scaler.history: expected a list, got dict"),
        ({"findings": ["x"]}, "findings[0]: expected an object, got str"),
    ],
)
def test_a_wrong_shaped_session_is_refused_with_the_place(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    doc = json.loads(OLD_SESSION.read_text()) | change
    (tmp_path / "session.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(tmp_path)


def test_nonfinite_floats_written_as_text_still_load(tmp_path: Path) -> None:
    doc = json.loads(OLD_SESSION.read_text())
    doc["steps"][0]["loss"] = "nan"  # how `dumps` writes a NaN loss
    (tmp_path / "session.json").write_text(json.dumps(doc))
    loss = load(tmp_path).steps[0]["loss"]
    assert isinstance(loss, float) and math.isnan(loss)  # the float it was, not "nan"


def test_report_of_a_wrong_shaped_session_exits_2_with_one_line(tmp_path: Path) -> None:
    doc = json.loads(OLD_SESSION.read_text()) | {"memory": {"peak": 12}}
    (tmp_path / "session.json").write_text(json.dumps(doc))
    r = subprocess.run(
        [sys.executable, "-m", "ampdiag", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "memory.peak: expected an object, got int" in lines[0]


# --- readers agree with the schema --------------------------------------------------------------

READERS = sorted((REPO / "ampdiag" / "analysis").rglob("*.py")) + sorted(
    (REPO / "ampdiag" / "render").rglob("*.py")
)
TYPED_BY_NAME = {kind.__name__: kind for kind in schema.SECTIONS.values()}


def _section_of(node: ast.expr) -> type | None:
    """The TypedDict of ``session.section("name")``, or None for any other expression."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "section"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        return schema.SECTIONS.get(str(node.args[0].value))
    return None


def keys_read(tree: ast.AST) -> list[tuple[int, type, str]]:
    """(line, section type, key) of every literal key read from a typed section.

    Typed expressions: ``session.section("name")``, a local name assigned from one, and a
    parameter annotated with a section type.
    """
    out: list[tuple[int, type, str]] = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names: dict[str, type] = {}
        for arg in func.args.args + func.args.kwonlyargs:
            ann = ast.unparse(arg.annotation) if arg.annotation else ""
            if ann.split(".")[-1] in TYPED_BY_NAME:
                names[arg.arg] = TYPED_BY_NAME[ann.split(".")[-1]]
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, kind = node.targets[0], _section_of(node.value)
                if isinstance(target, ast.Name) and kind is not None:
                    names[target.id] = kind

        def typed(expr: ast.expr, names: dict[str, type] = names) -> type | None:
            if isinstance(expr, ast.Name):
                return names.get(expr.id)
            return _section_of(expr)

        for node in ast.walk(func):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and (kind := typed(node.func.value)) is not None
            ):
                out.append((node.lineno, kind, str(node.args[0].value)))
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.slice, ast.Constant)
                and (kind := typed(node.value)) is not None
            ):
                out.append((node.lineno, kind, str(node.slice.value)))
    return out


def test_every_key_analysis_and_renderers_read_is_in_the_schema() -> None:
    unknown = []
    seen = 0
    for path in READERS:
        for line, kind, key in keys_read(ast.parse(path.read_text(encoding="utf-8"))):
            seen += 1
            if key not in typing.get_type_hints(kind):
                unknown.append(f"{path.relative_to(REPO)}:{line}: {kind.__name__} has no {key!r}")
    assert seen > 50  # the scan does find the readers' keys
    assert unknown == []


def test_the_key_check_catches_the_old_batch_size_read() -> None:
    old = 'def f(session):\n    return session.section("memory").get("batch_size")\n'
    assert [(k.__name__, key) for _, k, key in keys_read(ast.parse(old))] == [
        ("MemorySection", "batch_size")
    ]
    assert "batch_size" not in typing.get_type_hints(schema.MemorySection)


def _overloads() -> dict[str, object]:
    """Section name -> the type `Session.section` declares for it (its typed overloads)."""
    out: dict[str, object] = {}
    import ampdiag.session

    for fn in typing.get_overloads(Session.section):
        hints = typing.get_type_hints(fn, globalns=vars(ampdiag.session))
        (name,) = typing.get_args(hints["name"]) or (None,)
        if isinstance(name, str):
            out[name] = hints["return"]
    return out


def test_every_registered_collector_section_is_typed_in_one_place() -> None:
    from ampdiag.config import DiagnoseConfig
    from ampdiag.sources.live.collectors import REGISTERED, default_collectors, registered

    classes = registered()
    assert len(classes) == len(REGISTERED) and len({c.name for c in classes}) == len(classes)
    typed = _overloads()
    flags = {f.name: f.type for f in dataclass_fields(DiagnoseConfig)}
    for cls in classes:
        # the type its section() returns, as written in its file
        returned = typing.get_type_hints(cls.section)["return"]
        (kind,) = [a for a in typing.get_args(returned) if a is not type(None)]
        assert typing.is_typeddict(kind), cls
        assert schema.SECTIONS.get(cls.name) is kind, cls.name
        assert typed.get(cls.name) is kind, f"Session.section({cls.name!r}) is not typed"
        assert cls.enabled_by is None or flags[cls.enabled_by] in (bool, "bool"), cls
    # the flags decide: all on gives every collector, one off removes exactly its own
    assert {type(c) for c in default_collectors(DiagnoseConfig())} == set(classes)
    off = {type(c) for c in default_collectors(DiagnoseConfig(sentinel=False))}
    assert set(classes) - off == {c for c in classes if c.enabled_by == "sentinel"} != set()
    numerics = {type(c).name for c in default_collectors(DiagnoseConfig())} - {
        type(c).name for c in default_collectors(DiagnoseConfig(numerics=False))
    }
    assert numerics == {"scaler", "gradients", "activations", "accumulation", "weight_updates"}


def test_every_schema_section_is_typed_on_the_session() -> None:
    typed = _overloads()
    assert {name: typed.get(name) for name in schema.SECTIONS} == schema.SECTIONS
