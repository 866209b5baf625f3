"""The Session: everything one diagnosed run (or one analyzed trace) produced, as versioned JSON.

A Session is the only thing renderers read. Collectors each contribute one *section* (a JSON
object under a top-level key named after the collector); the core keys below are reserved.
Sections a reader does not know are kept as they are, so a newer collector never breaks an
older reader and an older session still loads in a newer ampdiag.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, overload

from ampdiag import schema
from ampdiag._layout import SESSION_FILE as SESSION_FILE  # re-exported
from ampdiag.errors import InputError
from ampdiag.schema import SCHEMA_VERSION as SCHEMA_VERSION  # re-exported

Severity = Literal["high", "medium", "low", "info"]
SEVERITIES: tuple[Severity, ...] = ("high", "medium", "low", "info")
Status = Literal["ok", "error", "interrupted"]

# Keys of session.json that are not collector sections.
CORE_KEYS = frozenset(
    {
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
)


@dataclass
class Finding:
    """One diagnosis: a stable id, how bad it is, the measured numbers, and what to change.

    Attributes:
        id: Stable kebab-case code (like a linter's rule code) that users filter and gate on.
        severity: "high", "medium", "low" or "info".
        title: One sentence a user reads first.
        evidence: The measured numbers the finding rests on (JSON values).
        fix: Concrete advice; code where code is the fix.
        section: The report section the finding belongs to (e.g. "time", "numerics").
        impact: Expected benefit used for ranking (0..1, larger first).
    """

    id: str
    severity: Severity
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    section: str = "overview"
    impact: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Returns the JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """Builds a finding from its JSON form, ignoring keys it does not know.

        The form is checked first (`schema.check_document`); a non-finite ``impact`` saved as
        text ("nan") is read back as the float it was.
        """
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if isinstance(known.get("impact"), str):
            known["impact"] = float(known["impact"])
        return cls(**known)


@dataclass
class Session:
    """A diagnosed run, ready to analyze and render.

    Attributes:
        status: "ok", "error" (the block raised) or "interrupted" (KeyboardInterrupt).
        error: For status "error": {"type", "message"} of the exception.
        environment: torch version, device and its name, autocast seen, world size, rank.
        config: The settings diagnose() ran with.
        steps: One record per step (`schema.Step`).
        sections: Collector name -> that collector's JSON section.
        findings: The analysis results, ranked.
        path: The folder this session was saved to or loaded from, if any.
    """

    status: Status = "ok"
    error: dict[str, str] | None = None
    environment: schema.Environment = field(default_factory=lambda: schema.Environment())
    config: dict[str, Any] = field(default_factory=dict)
    steps: list[schema.Step] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    created: str = ""
    schema_version: int = SCHEMA_VERSION
    ampdiag_version: str = ""
    path: Path | None = None

    @overload
    def section(self, name: Literal["run"]) -> schema.RunSection: ...
    @overload
    def section(self, name: Literal["profiler"]) -> schema.ProfilerSection: ...
    @overload
    def section(self, name: Literal["speed_probe"]) -> schema.SpeedProbeSection: ...
    @overload
    def section(self, name: Literal["memory"]) -> schema.MemorySection: ...
    @overload
    def section(self, name: Literal["precision"]) -> schema.PrecisionSection: ...
    @overload
    def section(self, name: Literal["scaler"]) -> schema.ScalerSection: ...
    @overload
    def section(self, name: Literal["gradients"]) -> schema.GradientsSection: ...
    @overload
    def section(self, name: Literal["activations"]) -> schema.ActivationsSection: ...
    @overload
    def section(self, name: Literal["sentinel"]) -> schema.SentinelSection: ...
    @overload
    def section(self, name: Literal["fp8_amax"]) -> schema.Fp8AmaxSection: ...
    @overload
    def section(self, name: Literal["accumulation"]) -> schema.AccumulationSection: ...
    @overload
    def section(self, name: Literal["weight_updates"]) -> schema.WeightUpdatesSection: ...
    @overload
    def section(self, name: Literal["ranks"]) -> schema.RanksSection: ...
    @overload
    def section(self, name: Literal["timeline"]) -> schema.TimelineSection: ...
    @overload
    def section(self, name: Literal["derived"]) -> schema.DerivedSection: ...
    @overload
    def section(self, name: str) -> Mapping[str, Any]: ...

    def section(self, name: str) -> Any:
        """Returns a section, typed by `ampdiag.schema`, or an empty dict when the run has none.

        A known name gives its TypedDict, so mypy rejects a key the collector never writes.
        """
        value = self.sections.get(name)
        return value if isinstance(value, dict) else {}

    def all_findings(self) -> list[Finding]:
        """Every finding, including those a recommendation merged (kept in its evidence).

        A recommendation that explains other findings (say ``prefer-bf16`` for an FP16 run
        that underflows and skips steps) lists them under ``evidence["merged"]``; filter or
        gate on an id with this list to see them too.
        """
        out: list[Finding] = []
        for finding in self.findings:
            out.append(finding)
            for merged in finding.evidence.get("merged") or []:
                if isinstance(merged, dict) and "id" in merged:
                    out.append(Finding.from_dict(merged))
        return out

    def __repr__(self) -> str:
        """A short form (a session's fields are too large to print whole).

        The console summary and the inline report are renderers' work: in IPython they are
        registered by type name (`ampdiag.render.notebook.register`), so this module imports
        no renderer.
        """
        ids = ", ".join(f.id for f in self.findings[:5]) + (
            ", ..." if len(self.findings) > 5 else ""
        )
        where = f", path={str(self.path)!r}" if self.path is not None else ""
        return (
            f"Session(status={self.status!r}, steps={len(self.steps)}, "
            f"sections={sorted(self.sections)}, findings=[{ids}]{where})"
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns the session document (what session.json holds)."""
        doc: dict[str, Any] = {
            "schema_version": self.schema_version,
            "ampdiag_version": self.ampdiag_version,
            "created": self.created,
            "status": self.status,
            "error": self.error,
            "environment": self.environment,
            "config": self.config,
            "steps": self.steps,
        }
        for name, value in self.sections.items():
            if name in CORE_KEYS:
                raise ValueError(f"section name {name!r} is reserved")
            doc[name] = value
        doc["findings"] = [f.to_dict() for f in self.findings]
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any], path: Path | None = None) -> Session:
        """Builds a session from its document; unknown top-level keys become sections."""
        version = doc.get("schema_version")
        if not isinstance(version, int):
            raise InputError("not an ampdiag session: no integer 'schema_version'")
        if version > SCHEMA_VERSION:
            raise InputError(
                f"session schema {version} is newer than this ampdiag reads ({SCHEMA_VERSION}); "
                "upgrade ampdiag"
            )
        status = doc.get("status", "ok")
        if status not in ("ok", "error", "interrupted"):
            raise InputError(f"session status {status!r} is not ok, error or interrupted")
        problems = schema.check_document(doc)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise InputError(f"not a well-formed ampdiag session: {problems[0]}{more}")
        return cls(
            status=status,
            error=doc.get("error"),
            environment=cast(schema.Environment, dict(doc.get("environment") or {})),
            config=dict(doc.get("config") or {}),
            steps=list(doc.get("steps") or []),
            sections={k: v for k, v in doc.items() if k not in CORE_KEYS},
            findings=[Finding.from_dict(f) for f in doc.get("findings") or []],
            created=str(doc.get("created", "")),
            schema_version=version,
            ampdiag_version=str(doc.get("ampdiag_version", "")),
            path=path,
        )

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Writes session.json into folder (atomically) and returns its path."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / SESSION_FILE
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(dumps(self.to_dict()), encoding="utf-8")
        tmp.replace(target)
        self.path = folder
        return target


def _json_safe(value: Any) -> Any:
    """Replaces non-finite floats (not valid JSON) with strings that say what they were."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


#: How `dumps` writes a non-finite float, and the float `load` reads back for it.
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _restore_nonfinite(value: Any) -> Any:
    """Turns `_json_safe`'s strings back into the floats they were (keys stay as they are)."""
    if isinstance(value, str):
        return NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {k: _restore_nonfinite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_nonfinite(v) for v in value]
    return value


def dumps(doc: dict[str, Any]) -> str:
    """Serializes a session document as strict JSON (NaN and inf become strings).

    Encoded compactly by the standard library's C encoder, then indented by msgspec's C
    formatter: ``json.dumps(indent=...)`` falls back to the pure-Python encoder, which a merged
    session of a thousand ranks waits seconds for.
    """
    import msgspec

    safe = _json_safe(doc)
    flat = json.dumps(safe, allow_nan=False, default=str)
    try:
        return msgspec.json.format(flat, indent=1)
    except msgspec.DecodeError:  # a lone surrogate's escape (\ud800): msgspec refuses it
        return json.dumps(safe, allow_nan=False, default=str, indent=1)


def load(path: str | os.PathLike[str]) -> Session:
    """Loads a saved session.

    Args:
        path: A session folder (holding session.json) or the session.json file itself.

    Returns:
        The Session, with ``path`` set to its folder.

    Raises:
        InputError: The path does not exist or does not hold a readable session.
    """
    p = Path(path)
    file = p / SESSION_FILE if p.is_dir() else p
    if not file.is_file():
        raise InputError(f"no session at {str(p)!r}: expected a folder with {SESSION_FILE}")
    import msgspec

    try:
        raw = file.read_bytes()
        try:  # msgspec's C decoder (a rank of a thousand-rank merge pays this once)
            doc = msgspec.json.decode(raw)
        except msgspec.DecodeError:  # what it refuses, the standard library reads or explains
            doc = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON, a huge int
        raise InputError(f"cannot read session {str(file)!r}: {str(exc)[:300]}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{str(file)!r} is not an ampdiag session (not a JSON object)")
    # One representation in memory: a NaN loss reads back as the float NaN it was, not "nan".
    # Only a session that holds one pays the walk (a merge of a thousand ranks reads many).
    if any(b'"%s"' % k.encode() in raw for k in NONFINITE):
        doc = _restore_nonfinite(doc)
    return Session.from_dict(doc, path=file.parent)
