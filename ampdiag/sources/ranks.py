"""A Session from a distributed ``diagnose()`` output: one ``rank-N/`` session per rank.

Each rank wrote its own session (steps, numerics, precision, memory, findings) and its own
Kineto trace under ``rank-N/trace/``. The merged session keeps every rank's session under the
``ranks`` section (the analysis compares them: `ampdiag.analysis.ranks`) and the timeline of
all the ranks' traces read together (communication, stragglers). Only the traces each rank's
session names are read, so traces an earlier run left in the same folder are not merged in.
Must not import torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ampdiag.errors import InputError
from ampdiag.schema import Environment

if TYPE_CHECKING:
    from ampdiag.session import Session

RANK_DIR = re.compile(r"^rank-(\d+)$")
MERGED_SOURCES = frozenset({"trace", "ranks"})
"""``environment.source`` of sessions ``ampdiag report`` made from other files: never input."""


def rank_folders(path: Path) -> list[tuple[int, Path]]:
    """The ``rank-N`` folders holding a session directly under ``path``, by rank."""
    from ampdiag._layout import SESSION_FILE

    if not path.is_dir():
        return []
    found = []
    for child in path.iterdir():
        m = RANK_DIR.match(child.name)
        if m and (child / SESSION_FILE).is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def is_derived(path: Path) -> bool:
    """Whether ``path/session.json`` is a report's own output (merged ranks or a trace)."""
    import json

    from ampdiag._layout import SESSION_FILE

    file = path / SESSION_FILE
    try:
        with open(file, encoding="utf-8") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return False
    # the environment comes early in the document; read all of it only when it is not there
    m = re.search(r'"source":\s*"([a-z]+)"', head)
    if m is None:
        try:
            doc = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # load() says what is wrong with it
            return False
        env = doc.get("environment") if isinstance(doc, dict) else None
        return isinstance(env, dict) and env.get("source") in MERGED_SOURCES
    return m.group(1) in MERGED_SOURCES


def session_from_ranks(path: Path, hta: bool = False) -> Session:
    """The merged Session of the ranks' sessions and traces under ``path`` (see module doc).

    Raises:
        InputError: No rank folder, or a rank's session is unreadable.
    """
    from ampdiag.session import load

    folders = rank_folders(path)
    if not folders:
        raise InputError(f"no rank-N/ session folders in {str(path)!r}")
    members: list[dict[str, Any]] = []
    files: list[Path] = []
    warnings: list[str] = []
    for rank, folder in folders:
        member = load(folder)
        doc = member.to_dict()
        doc.pop("findings", None)  # re-analyzed: a newer ampdiag may know more
        members.append({"rank": rank, "folder": folder.name, "session": doc})
        named = member.section("profiler").get("trace_files") or []
        mine = [folder / str(f) for f in named if (folder / str(f)).is_file()]
        if named and not mine:
            warnings.append(f"rank {rank}: its trace files are missing ({', '.join(named)})")
        files.extend(mine)
    world = {m["session"].get("environment", {}).get("world_size") for m in members}
    sizes = sorted(w for w in world if isinstance(w, int))
    if len(sizes) > 1:
        raise InputError(
            f"{str(path)!r} holds ranks of runs with different world sizes {sizes}: "
            "report each run's folder on its own"
        )
    merged = _merged(members, files, hta, path)
    merged.sections["ranks"]["warnings"] = warnings
    return merged


def _merged(members: list[dict[str, Any]], files: list[Path], hta: bool, path: Path) -> Session:
    import datetime as _dt

    from ampdiag._version import __version__
    from ampdiag.analysis.ranks import rank_rows
    from ampdiag.session import Session

    sections: dict[str, Any] = {}
    if files:
        from ampdiag.sources.traces import session_from_traces

        traced = session_from_traces(path, hta=hta, files=files)
        sections.update(traced.sections)
    first = members[0]["session"]
    statuses = [m["session"].get("status", "ok") for m in members]
    status = next((s for s in ("error", "interrupted") if s in statuses), "ok")
    env = cast(Environment, dict(first.get("environment") or {}))
    env["source"] = "ranks"
    env["ranks_merged"] = [m["rank"] for m in members]
    env["world_size"] = env.get("world_size") or len(members)
    sections["ranks"] = {
        "world_size": env["world_size"],
        "rows": rank_rows(members),
        "members": members,
    }
    return Session(
        status=status,  # type: ignore[arg-type]
        error=next((m["session"].get("error") for m in members if m["session"].get("error")), None),
        environment=env,
        config=dict(first.get("config") or {}),
        steps=list(first.get("steps") or []),
        sections=sections,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        ampdiag_version=__version__,
    )
