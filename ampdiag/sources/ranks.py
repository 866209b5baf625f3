"""A Session from a distributed ``diagnose()`` output: one ``rank-N/`` session per rank.

Each rank wrote its own session (steps, numerics, precision, memory, findings) and its own
Kineto trace under ``rank-N/trace/``. Each rank is read and analysed once, on its own
(`rank_part`, over a process pool when there are many: a thousand ranks are a thousand
independent jobs), and the merged session keeps only what the report needs of it: its row of
the ranks table and its findings under ``ranks.summaries`` (`ampdiag.analysis.ranks` merges
them), and its traces' per-rank timeline entries, from which the cross-rank figures
(communication, stragglers) are computed. Only the traces each rank's session names are read,
so traces an earlier run left in the same folder are not merged in.
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


def is_derived(session: Session) -> bool:
    """Whether a loaded session is a report's own output (merged ranks or a trace), not input.

    Read off the loaded session's top-level environment (a nested ``source`` key is no
    evidence), so the folder's session is read once, by the caller.
    """
    return session.environment.get("source") in MERGED_SOURCES


def rank_part(job: tuple[int, Path]) -> dict[str, Any]:
    """One rank's share of the merge, in whichever process: its summary and its traces'.

    ``job`` is (rank, its folder). Its session is read once and analysed alone, as if reported
    alone (re-analysed: a newer ampdiag may know more), and its own trace files are read once
    (`analyze_trace`): what the merge keeps of a rank is the table row, its findings and the
    traces' per-rank timeline entries, never the whole session.
    """
    from ampdiag.analysis import analyze
    from ampdiag.analysis.ranks import rank_row
    from ampdiag.session import load
    from ampdiag.sources.traces import analyze_trace

    rank, folder = job
    member = load(folder)
    member.findings = []  # re-analyzed below
    doc = member.to_dict()
    row = rank_row(rank, doc)  # before the analysis adds its derived figures
    found = analyze(member)
    named = (doc.get("profiler") or {}).get("trace_files") or []
    mine = [folder / str(f) for f in named if (folder / str(f)).is_file()]
    warnings = []
    if named and not mine:
        warnings.append(f"rank {rank}: its trace files are missing ({', '.join(named)})")
    env = doc.get("environment") or {}
    return {
        "summary": {
            "rank": rank,
            "folder": folder.name,
            "findings": [f.to_dict() for f in found],
        },
        "row": row,
        "status": doc.get("status", "ok"),
        "error": doc.get("error"),
        "world_size": env.get("world_size"),
        "files": mine,
        # each trace's rank of last resort is its folder's rank
        "traces": [analyze_trace((f, rank)) for f in mine],
        "warnings": warnings,
    }


def session_from_ranks(path: Path, hta: bool = False) -> Session:
    """The merged Session of the ranks' sessions and traces under ``path`` (see module doc).

    Raises:
        InputError: No rank folder, or a rank's session is unreadable.
    """
    from ampdiag.sources.traces import pooled

    folders = rank_folders(path)
    if not folders:
        raise InputError(f"no rank-N/ session folders in {str(path)!r}")
    parts = pooled(rank_part, folders)
    sizes = sorted({p["world_size"] for p in parts if isinstance(p["world_size"], int)})
    if len(sizes) > 1:
        raise InputError(
            f"{str(path)!r} holds ranks of runs with different world sizes {sizes}: "
            "report each run's folder on its own"
        )
    merged = _merged(folders[0][1], parts, hta, path)
    merged.sections["ranks"]["warnings"] = [w for p in parts for w in p["warnings"]]
    return merged


def _merged(first_folder: Path, parts: list[dict[str, Any]], hta: bool, path: Path) -> Session:
    import datetime as _dt

    from ampdiag._version import __version__
    from ampdiag.session import Session, load

    sections: dict[str, Any] = {}
    files = [f for p in parts for f in p["files"]]
    if files:
        from ampdiag.sources.traces import timeline_session

        traced = [t for p in parts for t in p["traces"]]
        sections.update(timeline_session(path, files, traced, [], hta).sections)
    first = load(first_folder).to_dict()  # the run's environment, config, steps: rank 0's
    statuses = [p["status"] for p in parts]
    status = next((s for s in ("error", "interrupted") if s in statuses), "ok")
    env = cast(Environment, dict(first.get("environment") or {}))
    env["source"] = "ranks"
    env["ranks_merged"] = [p["summary"]["rank"] for p in parts]
    env["world_size"] = env.get("world_size") or len(parts)
    sections["ranks"] = {
        "world_size": env["world_size"],
        "rows": [p["row"] for p in parts],
        "summaries": [p["summary"] for p in parts],
    }
    return Session(
        status=status,  # type: ignore[arg-type]
        error=next((p["error"] for p in parts if p["error"]), None),
        environment=env,
        config=dict(first.get("config") or {}),
        steps=list(first.get("steps") or []),
        sections=sections,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        ampdiag_version=__version__,
    )
