"""The ranks of a distributed run side by side, and their findings merged.

A merged session (`ampdiag.sources.ranks`) holds each rank's row and findings, from its
session analyzed alone, under ``ranks.summaries`` (older merged sessions held whole sessions
under ``ranks.members``, analyzed here). A finding every rank has is stated once, one only
some ranks have names them. A NaN reaches the other ranks through a collective, so the
inf/NaN findings are merged by which rank made the value first (`_origin_key`; see "Ranks
merged by evidence" in docs/how-it-works.md). The findings about the ranks together
(stragglers, communication) come from the merged timeline.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from ampdiag.schema import PrecisionSection
from ampdiag.session import SEVERITIES, Finding, Session


def members(session: Session) -> list[tuple[int, Session]]:
    """(rank, that rank's Session) of a merged session; empty for any other session."""
    out = []
    for m in session.section("ranks").get("members") or []:
        if isinstance(m, dict) and isinstance(m.get("session"), dict):
            out.append((int(m["rank"]), Session.from_dict(m["session"])))
    return out


def rank_findings(
    session: Session, analyze: Callable[[Session], list[Finding]]
) -> list[tuple[int, list[Finding]]]:
    """(rank, that rank's own findings) of a merged session; empty for any other session.

    A merged session keeps each rank's findings; an older one keeps whole members, which
    ``analyze`` (the caller's, `ampdiag.analysis.analyze`) reads.
    """
    summaries = session.section("ranks").get("summaries")
    if summaries:
        return [
            (int(s["rank"]), [Finding.from_dict(f) for f in s.get("findings") or []])
            for s in summaries
            if isinstance(s, dict)
        ]
    return [(rank, analyze(member)) for rank, member in members(session)]


def rank_row(rank: int, doc: dict[str, Any]) -> dict[str, Any]:
    """One rank's figures for the side-by-side table (from its session document)."""
    from ampdiag.analysis.precision import summarize

    steps = [s for s in doc.get("steps") or [] if isinstance(s, dict)]
    walls = [float(s["wall_s"]) for s in steps if isinstance(s.get("wall_s"), (int, float))]
    losses = [s.get("loss") for s in steps]
    grads = (doc.get("gradients") or {}).get("totals") or {}
    mem = doc.get("memory") or {}
    model_state = mem.get("model_state") or {}
    prec = doc.get("precision") or {}
    low = (
        1.0 - float(summarize(cast(PrecisionSection, prec))["fp32_flops_share"])
        if prec.get("ops")
        else None
    )
    env = doc.get("environment") or {}
    return {
        "rank": rank,
        "status": doc.get("status", "ok"),
        "steps": len(steps),
        "step_times_ms": [w * 1000 for w in walls],
        "step_ms_median": statistics.median(walls) * 1000 if walls else None,
        "last_loss": losses[-1] if losses else None,
        "nonfinite_losses": sum(1 for x in losses if isinstance(x, str)),
        "grad_nonfinite": grads.get("nonfinite"),
        "grad_zero_fraction": grads.get("zero_fraction"),
        "autocast": env.get("autocast"),
        "low_precision_flops_share": low,
        "peak_bytes": (mem.get("peak") or {}).get("bytes"),
        "parameter_bytes": model_state.get("parameters"),
    }


#: Findings about where inf/NaN first appeared: merged by which rank made it (module doc).
ORIGIN_IDS = frozenset({"nonfinite-origin", "diverged", "stalled"})
_PHASES = {"forward": 0, "loss": 1, "backward": 2}


def _origin_key(f: Finding) -> tuple[float, int, int]:
    """How early a rank's first non-finite value was: (step, phase, a parameter gradient)."""
    ev = f.evidence
    step = ev.get("step")
    held = ev.get("held") or []
    if "phase" in ev:
        phase = _PHASES.get(str(ev.get("phase")), 3)
    elif isinstance(held, list) and held:
        phase = 0 if "activation" in held else 1 if "loss" in held else 2
    else:
        phase = 3
    received = int(ev.get("kind") == "parameter gradient")
    return (float(step) if isinstance(step, (int, float)) else float("inf"), phase, received)


def _by_origin(hits: list[tuple[int, Finding]], all_ranks: list[int]) -> Finding:
    """The finding of the rank that made the first non-finite value; the others received it."""
    hits = sorted(hits, key=lambda h: (_origin_key(h[1]), h[0]))
    rank, first = hits[0]
    ranks = sorted({r for r, _ in hits})
    received = [r for r in ranks if r != rank]
    evidence = dict(first.evidence)
    evidence["ranks"] = "all" if ranks == sorted(all_ranks) else ranks
    evidence["origin_rank"] = rank
    evidence["received_ranks"] = received
    through = f" ({_label(received).lower()} received it through a collective)" if received else ""
    return replace(
        first,
        severity=min((h[1].severity for h in hits), key=SEVERITIES.index),
        title=f"Rank {rank} made it{through}: {first.title}",
        evidence=evidence,
        impact=max(h[1].impact for h in hits),
    )


def _label(ranks: list[int]) -> str:
    return ("Rank " if len(ranks) == 1 else "Ranks ") + ", ".join(map(str, ranks))


def merge_findings(
    per_rank: list[tuple[int, list[Finding]]], together: list[Finding]
) -> list[Finding]:
    """Per-rank findings merged by id (see the module doc), then the cross-rank ones; ranked."""
    all_ranks = [r for r, _ in per_rank]
    by_id: dict[str, list[tuple[int, Finding]]] = {}
    for rank, found in per_rank:
        for f in found:
            by_id.setdefault(f.id, []).append((rank, f))
    out = list(together)
    taken = {f.id for f in together}
    for fid, hits in by_id.items():
        if fid in taken:
            continue
        ranks = sorted({r for r, _ in hits})
        if fid in ORIGIN_IDS and len(hits) > 1:
            out.append(_by_origin(hits, all_ranks))
            continue
        worst = min(hits, key=lambda h: (SEVERITIES.index(h[1].severity), -h[1].impact))[1]
        evidence = dict(worst.evidence)
        if ranks == sorted(all_ranks):
            evidence["ranks"] = "all"
            title = worst.title
        else:
            evidence["ranks"] = ranks
            title = f"{_label(ranks)}: {worst.title}"
        out.append(replace(worst, title=title, evidence=evidence))
    out.sort(key=lambda f: (SEVERITIES.index(f.severity), -f.impact))
    return out
