"""The README stays a front page, and the findings reference lists every registered finding."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ampdiag.analysis.advisors import advisors
from ampdiag.analysis.registry import rules
from scripts import findings_reference as ref

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_readme_is_a_front_page_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "bash scripts/setup_env.sh && .venv/bin/ampdiag demo\n" in text
    assert "bash scripts/test.sh\n" in text


def test_readme_links_point_at_files_that_exist() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert missing == []


def _ids_from_registries() -> set[str]:
    # read the registries directly, not through the generator under test
    return {i for r in rules() for i in r.ids} | {i for a in advisors() for i in a.ids}


def test_every_registered_finding_is_in_the_reference_with_severity_and_fix() -> None:
    page = ref.generate()
    headed = set(re.findall(r"^#+ .*?$", page, flags=re.M))
    heading_ids = {i for h in headed for i in re.findall(r"`([a-z0-9-]+)`", h)}
    registered = _ids_from_registries()
    assert registered - heading_ids == set()
    assert registered - set(ref.NOTES) == set(), "add the new id's severity and fix to NOTES"
    assert set(ref.NOTES) - registered == set(), "NOTES names an id no rule emits"
    assert "(undocumented)" not in page


@pytest.mark.parametrize("kind", ["rule", "advisor"])
def test_each_entry_states_the_rule_docstring_and_the_thresholds_it_reads(kind: str) -> None:
    page = ref.generate()
    funcs = [r.func for r in rules()] if kind == "rule" else [a.func for a in advisors()]
    for func in funcs:
        first_line = (func.__doc__ or "").strip().splitlines()[0]
        assert first_line in page, func.__name__
    # every threshold of every registered rule's (advisor's) module is on the page
    import dataclasses
    import sys

    for func in funcs:
        record = getattr(sys.modules[func.__module__], "THRESHOLDS", None)
        for key in dataclasses.asdict(record) if record is not None else {}:
            assert f"| `{key}` |" in page, (func.__module__, key)
