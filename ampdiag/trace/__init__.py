"""Reading Kineto traces (ours and anyone's) and analysing their timelines."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ampdiag.errors import InputError

if TYPE_CHECKING:
    from ampdiag.session import Session

TRACE_SUFFIXES = (".json", ".json.gz")


def trace_files(path: Path) -> list[Path]:
    """The trace files at a path: the file itself, or the traces in a folder (sorted)."""
    if path.is_file():
        return [path]
    found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    if not found:
        raise InputError(f"no trace files (*.json, *.json.gz) in {str(path)!r}")
    return found


def session_from_traces(path: Path, hta: bool = False) -> Session:
    """A Session analysing existing trace file(s), with the sections a trace supports."""
    import datetime as _dt
    import gzip
    import json

    from ampdiag._version import __version__
    from ampdiag.session import Session
    from ampdiag.trace.step_breakdown import breakdown, load_trace_json

    files = trace_files(path)
    first = files[0]
    try:
        doc = load_trace_json(first)
    except (
        OSError,
        EOFError,
        gzip.BadGzipFile,
        UnicodeDecodeError,
        json.JSONDecodeError,
        ValueError,
    ) as exc:
        raise InputError(f"cannot read trace {str(first)!r}: {exc}") from None
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise InputError(f"{str(first)!r} is not a Kineto trace: no 'traceEvents' list")
    props = doc.get("deviceProperties") or []
    env = {
        "source": "trace",
        "device_type": "cuda" if props else "cpu",
        "device_name": props[0].get("name") if props and isinstance(props[0], dict) else "cpu",
        "rank": (doc.get("distributedInfo") or {}).get("rank", 0),
        "world_size": (doc.get("distributedInfo") or {}).get("world_size", 1),
    }
    return Session(
        environment=env,
        sections={
            "profiler": {
                "trace_files": [str(f) for f in files],
                "breakdown": breakdown([e for e in events if isinstance(e, dict)]),
                "top_ops": [],
            }
        },
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        ampdiag_version=__version__,
        path=None,
    )
