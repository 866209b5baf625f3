"""The overview: the verdict in a sentence (a diverged or stalled run's divergence first).

The report adds the top recommendations and the table of every finding below it (html.py).
"""

from __future__ import annotations

import math

from markupsafe import Markup

from ampdiag import units as humanize
from ampdiag.render import charts, stated, svg, templating
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import join
from ampdiag.session import SEVERITIES, Finding, Session

TITLE = "Overview"


def lead(session: Session) -> Finding | None:
    """The finding the verdict sentence states (None when none is at medium or above).

    The first actionable one of the ranked findings (`ampdiag.analysis.registry.rank`: the most
    severe consequence first); a diverged or stalled run's own finding whatever else ranks high.
    The page states it once there, and the cards below refer to it instead of repeating it.
    """
    actionable = [f for f in session.findings if f.severity in ("high", "medium")]
    broken = [f for f in actionable if f.id == session.section("derived").get("verdict")]
    first = broken or actionable
    return first[0] if first else None


def verdict(session: Session) -> str:
    """One sentence: what is most wrong with this run (or that nothing was found)."""
    if session.status == "error" and session.error:
        head = f"The run stopped with {session.error.get('type', 'an error')}. "
    elif session.status == "interrupted":
        head = "The run was interrupted. "
    else:
        head = ""
    actionable = [f for f in session.findings if f.severity in ("high", "medium")]
    top = lead(session)
    if top is None:
        return head + "No problem above the documented thresholds was found."
    explains = top.evidence.get("explains") if isinstance(top.evidence, dict) else None
    because = (
        f" (this explains {len(explains)} finding{'s' if len(explains) != 1 else ''})"
        if isinstance(explains, list) and explains
        else ""
    )
    more = len(actionable) - 1
    tail = f" {more} more finding{'s' if more != 1 else ''} below." if more else ""
    title = top.title.rstrip(".")
    return f"{head}{title}{because}.{tail}"


def budget_notes(session: Session) -> list[str]:
    """What a budget decided about this run's measurements, one sentence each.

    The precision A/B's ``budget_note`` (its least version run over the budget, a precision
    left untimed, an FP8 readiness skipped): shown beside the verdict on every surface, so a
    measurement the user asked for and did not get is never silent.
    """
    ab = session.section("speed_probe").get("precisions")
    note = ab.get("budget_note") if isinstance(ab, dict) else None
    return [note[:1].upper() + note[1:] + "."] if isinstance(note, str) and note else []


def _window(session: Session) -> str:
    """Where a window's steps lie, as " (steps 41–50, after a loss spike at step 40)"."""
    run = session.sections.get("run")
    window = run.get("window") if isinstance(run, dict) else None
    if not isinstance(window, dict) or window.get("opened_at") is None:
        return ""
    first, last = window["opened_at"], window.get("closed_after")
    seen = window.get("last_step_seen")
    text = f" (steps {first}–{last if last is not None else seen}"
    spike = window.get("spike")
    if isinstance(spike, dict) and isinstance(spike.get("step"), int):
        text += f", after a loss spike at step {spike['step']}"
    return text + ")"


def run_facts(session: Session) -> list[str]:
    """The header's facts, one phrase each: steps, device, precision (every surface's header).

    A live run states its recorded steps and its autocast; a trace its ``ProfilerStep`` count
    and their times, and the precisions its kernels ran in (``environment.profiled_steps`` and
    ``kernel_precisions``, from `ampdiag.analysis.timeline.header_facts`); a snapshot only its
    device.
    """
    env = session.environment
    profiled = env.get("profiled_steps")
    out: list[str] = []
    if isinstance(profiled, dict) and not session.steps:
        n = int(profiled.get("count") or 0)
        text = f"{n} profiled step{'s' if n != 1 else ''}"
        if n == 1:
            text += f" ({humanize.micros(profiled.get('median_us'))})"
        elif n > 1:
            text += (
                f" (median {humanize.micros(profiled.get('median_us'))}, shortest "
                f"{humanize.micros(profiled.get('min_us'))}, longest "
                f"{humanize.micros(profiled.get('max_us'))})"
            )
        out.append(text)
    elif env.get("source") == "trace" or (_snapshot(session) and not session.steps):
        pass  # a snapshot, or a trace without the facts: no step count to state
    else:
        n = len(session.steps)
        out.append(f"{n} step{'s' if n != 1 else ''}" + _window(session))
    # The verdict, never a bare "ok" beside a diverged run; the status where it is not ok.
    category = session.section("derived").get("verdict")
    if isinstance(category, str):
        out.append(f"verdict {category}")
    if session.status != "ok" or not isinstance(category, str):
        out.append(f"status {session.status}")
    if env.get("device_type") == "cuda" and env.get("device_name"):
        out.append(humanize.gpu(env))  # "NVIDIA H800 (sm_90)"
    else:
        name = env.get("device_name")
        out.append(f"{env.get('device_type', '?')}" + (f" ({name})" if name else ""))
    kernels = env.get("kernel_precisions")
    if isinstance(kernels, dict):
        shown = ", ".join(f"{k} {humanize.percent(v)}" for k, v in list(kernels.items())[:4])
        out.append(f"kernels in {shown}" if shown else "no computation kernels")
    elif env.get("source") != "trace" and not _snapshot(session):
        out.append(f"autocast {env.get('autocast') or 'off'}")
    return out


def _snapshot(session: Session) -> bool:
    return bool(session.section("memory").get("snapshot_file"))


def counts(session: Session) -> str:
    """The findings counted by severity, e.g. "2 high, 1 medium findings"."""
    parts = []
    for sev in SEVERITIES:
        n = sum(1 for f in session.findings if f.severity == sev)
        if n:
            parts.append(f"{n} {sev}")
    if not parts:
        return "no findings"
    return ", ".join(parts) + " finding" + ("s" if len(session.findings) != 1 else "")


def figures(session: Session) -> dict[str, charts.Chart]:
    """The loss per step, the first thing a person looks at in a training run.

    The steps the GradScaler skipped are dashed, the first non-finite loss a labelled line.
    """
    steps = [s for s in session.steps if isinstance(s.get("index"), int)]
    losses = [(s["index"], s.get("loss")) for s in steps]
    finite = [(i, float(v)) for i, v in losses if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(finite) < 2:
        return {}
    nonfinite = [i for i, v in losses if isinstance(v, (int, float)) and not math.isfinite(v)]
    nonfinite += humanize.ints(session.section("sentinel").get("loss_nonfinite_steps"))
    skipped = humanize.ints(session.section("scaler").get("skipped_steps"))
    notes = []
    if skipped:
        notes.append(f"dashed: {len(skipped)} step{'s' if len(skipped) != 1 else ''} skipped")
    bands = []
    # the first inf/NaN anywhere (module output, gradient or loss) is the finding's step, the
    # one every surface states; the loss may turn non-finite a step later
    origin = next(
        (f.evidence.get("step") for f in session.all_findings() if f.id == "nonfinite-origin"),
        None,
    )
    if isinstance(origin, int):
        bands.append((float(origin), float(origin), f"first inf/NaN (step {origin})"))
    if nonfinite:
        first = min(nonfinite)
        if first != origin:
            bands.append((float(first), float(first), "first non-finite loss"))
        notes.append(f"loss not finite from step {first} (not drawn)")
    return {
        "loss": charts.line(
            [i for i, _ in finite],
            {"loss": [v for _, v in finite]},
            "step",
            "loss",
            "Loss per step",
            marks=skipped,
            bands=bands,
            yzero=False,
            note="; ".join(notes),
        )
    }


@section(TITLE)
def build(session: Session) -> ReportSection:
    """The overview section (always present)."""
    text = verdict(session)
    uris = {name: svg.inline(chart) for name, chart in figures(session).items()}
    step = stated.figures(session).get("step_time")  # the run's one step-time figure
    median_ms = float(step["median_s"]) * 1000 if isinstance(step, dict) else None
    facts = run_facts(session)
    out = [Markup('<p class="verdict">{}</p>\n').format(text)]
    out += [
        Markup('<p class="muted budget">Budget: {}</p>\n').format(n) for n in budget_notes(session)
    ]
    if session.status == "error" and session.error:
        out.append(
            Markup(
                '<p class="error">The block raised <code>{}</code>: <code>{}</code>. What was '
                "collected before it is below.</p>\n"
            ).format(session.error["type"], session.error["message"])
        )
    median = (
        Markup(", median {} per step").format(humanize.micros(median_ms * 1000))
        if median_ms is not None
        else ""
    )
    out.append(
        Markup('<p class="muted">{}{}{} · {}</p>\n').format(
            facts[0], median, join(Markup(" · {}").format(f) for f in facts[1:]), counts(session)
        )
    )
    out.append(templating.figures(uris))
    html = join(out)
    return ReportSection(id="overview", title=TITLE, html=html, summary=text, figures=list(uris))
