"""matplotlib figures of a session, on demand: ``ampdiag.plot`` and ``--format png|pdf``.

The HTML report draws its charts as inline SVG without a plotting library; a notebook user who
wants a figure for a paper or a slide gets the same charts here as matplotlib ``Figure``s. They
are drawn from the same `charts.Chart` data the report draws (the same numbers, aggregated the
same way), with matplotlib's object API only: a ``matplotlib.figure.Figure`` is made directly,
never through ``pyplot``, so the user's backend, current figure and rcParams are left as they
were (the user's style still applies: the figures read rcParams, they never write them).
matplotlib is an optional extra (``pip install ampdiag[plot]``), imported when a figure is
made: ``import ampdiag`` and ``ampdiag report --format html`` never import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ampdiag.errors import InputError
from ampdiag.render import charts
from ampdiag.schema import NumericsDerived
from ampdiag.session import Session

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: The figures `plot` makes, by name (the file names ``--format png`` writes).
NAMES = ("steps", "underflow", "precision", "memory")


def _matplotlib() -> None:
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        raise InputError(
            "figures need matplotlib: pip install 'ampdiag[plot]' (or matplotlib)"
        ) from None


def session_charts(session: Session) -> dict[str, list[charts.Chart]]:
    """The charts of each figure: the report's own charts where the report draws them."""
    from ampdiag.render.sections import memory, overview, precision_ab, time

    out: dict[str, list[charts.Chart]] = {}
    steps = [
        c
        for c in (overview.figures(session).get("loss"), time.figures(session).get("step-times"))
        if c is not None
    ]
    if steps:
        out["steps"] = steps
    numerics: NumericsDerived = session.section("derived").get("numerics") or {}
    lost = numerics.get("underflow", {}).get("module_lost_fraction") or {}
    if lost:
        ranked = sorted(lost.items(), key=lambda kv: -float(kv[1]))
        out["underflow"] = [
            charts.bars(
                [str(k) for k, _ in ranked],
                {"lost to FP16 (%)": [100 * float(v) for _, v in ranked]},
                "% of nonzero gradient values",
                "Gradient values FP16 holds as zero or subnormal, per module",
                unit="modules",
                horizontal=True,
            )
        ]
    for name, chart in (
        ("precision", precision_ab.figures(session).get("precision-ab")),
        ("memory", memory.figures(session.section("memory")).get("memory-timeline")),
    ):
        if chart is not None:
            out[name] = [chart]
    return out


def _draw(ax: Axes, chart: charts.Chart) -> None:
    ax.set_title(chart.title)
    ax.set_xlabel(chart.xlabel)
    ax.set_ylabel(chart.ylabel)
    if chart.kind in ("bars", "hbars"):
        n = len(chart.labels)
        pos = list(range(n))
        base = [0.0] * n
        for name, values in chart.series:
            if chart.kind == "hbars":
                ax.barh(pos, values, left=base, label=name)
            else:
                ax.bar(pos, values, bottom=base, label=name)
            base = [b + v for b, v in zip(base, values, strict=True)]
        if chart.kind == "hbars":
            ax.set_yticks(pos, chart.labels)
            ax.invert_yaxis()  # the first label on top, as the report draws it
        else:
            ax.set_xticks(pos, chart.labels, rotation=45, ha="right")
    elif chart.kind == "area":
        ax.stackplot(chart.x, *[v for _, v in chart.series], labels=[n for n, _ in chart.series])
    elif chart.kind == "histogram":
        width = 0.8 / max(1, len(chart.series))
        for i, (name, values) in enumerate(chart.series):
            ax.bar([x + i * width for x in chart.x], values, width=width, label=name)
        for x, label in chart.limits:
            ax.axvline(x, linestyle="--", linewidth=0.8)
            ax.annotate(label, (x, 1.0), xycoords=("data", "axes fraction"), fontsize="small")
    else:
        for name, values in chart.series:
            ax.plot(chart.x, values, label=name)
        if chart.logy:
            ax.set_yscale("log")
        if chart.yzero and not chart.logy:
            ax.set_ylim(bottom=0)
        if chart.ymax is not None:
            ax.set_ylim(top=chart.ymax)
    for a, b, label in chart.bands:
        if a == b:
            ax.axvline(a, color="tab:red", linewidth=1, label=label)
        else:
            ax.axvspan(a - 0.5, b + 0.5, alpha=0.15, color="gray")
    for m in chart.marks:
        ax.axvline(m, linestyle=":", linewidth=0.8, color="gray")
    if len(chart.series) > 1 or chart.bands:
        ax.legend(fontsize="small")
    if chart.note:
        ax.annotate(chart.note, (0, -0.22), xycoords="axes fraction", fontsize="x-small")


def figure(found: list[charts.Chart]) -> Figure:
    """One Figure drawing the charts one above the other (object API: no pyplot state)."""
    _matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2 * len(found)), layout="constrained")
    for ax, chart in zip(fig.subplots(len(found), 1, squeeze=False)[:, 0], found, strict=True):
        _draw(ax, chart)
    return fig


def plot(session: Session) -> dict[str, Figure]:
    """The session's figures as matplotlib Figures, by name (`NAMES`; those it measured).

    ``steps`` (loss and wall time per step), ``underflow`` (gradient values FP16 loses, per
    module), ``precision`` (the precision A/B's times) and ``memory`` (the memory timeline by
    category), each present when the run measured it. Public as ``ampdiag.plot``, which also
    takes anything ``ampdiag.load`` opens.
    """
    _matplotlib()
    return {name: figure(found) for name, found in session_charts(session).items()}


class FigureFiles:
    """A renderer writing each figure as ``figures/<name>.<extension>`` (png or pdf)."""

    stdout = False
    setting: str | None = None

    def __init__(self, extension: str) -> None:
        self.name = self.extension = extension

    def write(self, session: Session, out: Path) -> Path:
        """Writes the figures into ``out/figures/``; returns that folder."""
        folder = out / "figures"
        folder.mkdir(parents=True, exist_ok=True)
        for name, fig in plot(session).items():
            fig.savefig(folder / f"{name}.{self.extension}", dpi=100)
        return folder
