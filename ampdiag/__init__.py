"""ampdiag: diagnose PyTorch mixed-precision training.

Wrap training in ``with ampdiag.diagnose():`` and open the report it writes::

    import ampdiag
    with ampdiag.diagnose(out="reports/my-run") as d:
        for x, y in loader:
            ...
    print(d.out / "report.html")

Importing ampdiag is light: torch, pandas, HTA and matplotlib load only when used
(matplotlib only for ``ampdiag.plot``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ampdiag._version import __version__
from ampdiag.errors import InputError, OutputError

if TYPE_CHECKING:
    import os

    from matplotlib.figure import Figure

    from ampdiag.analysis import analyze
    from ampdiag.analysis.diff import diff
    from ampdiag.config import DiagnoseConfig
    from ampdiag.session import Finding, Session
    from ampdiag.sources import load
    from ampdiag.sources.live.collectors.base import Collector, RunContext
    from ampdiag.sources.live.compare import compare
    from ampdiag.sources.live.diagnosis import Diagnosis, diagnose
    from ampdiag.sources.live.memory_probe import memory_probe
    from ampdiag.sources.live.script import run

__all__ = [
    "Collector",
    "DiagnoseConfig",
    "Diagnosis",
    "Finding",
    "InputError",
    "OutputError",
    "RunContext",
    "Session",
    "__version__",
    "analyze",
    "compare",
    "diagnose",
    "diff",
    "load",
    "memory_probe",
    "plot",
    "run",
]

_LAZY = {
    "analyze": "ampdiag.analysis",
    "Collector": "ampdiag.sources.live.collectors.base",
    "RunContext": "ampdiag.sources.live.collectors.base",
    "diff": "ampdiag.analysis.diff",
    "compare": "ampdiag.sources.live.compare",
    "DiagnoseConfig": "ampdiag.config",
    "diagnose": "ampdiag.sources.live.diagnosis",
    "Diagnosis": "ampdiag.sources.live.diagnosis",
    "Session": "ampdiag.session",
    "Finding": "ampdiag.session",
    "load": "ampdiag.sources",
    "memory_probe": "ampdiag.sources.live.memory_probe",
    "run": "ampdiag.sources.live.script",
}


def _register_notebook_display() -> None:
    """In IPython, shows a Session, a diff and a Diagnosis as their reports (by type name).

    The data classes import no renderer; IPython's formatters look the types up by name, so
    nothing here is imported until a value is displayed.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", None)
    if not formatters:
        return

    def lazily(index: int, module: str, name: str) -> Any:
        def show(obj: Any, *args: Any) -> Any:
            from ampdiag.render import notebook

            fn = notebook.DISPLAYS[(module, name)][index]
            assert fn is not None
            if args:  # text/plain: (obj, printer, cycle)
                args[0].text(fn(obj))
                return None
            return fn(obj)

        return show

    # the keys of `ampdiag.render.notebook.DISPLAYS` (with whether it has a text form)
    for module, name, text in (
        ("ampdiag.session", "Session", True),
        ("ampdiag.analysis.diff", "SessionDiff", True),
        ("ampdiag.sources.live.diagnosis", "Diagnosis", False),
        ("ampdiag.sources.live.windowed", "WindowedDiagnosis", False),
    ):
        formatters["text/html"].for_type_by_name(module, name, lazily(0, module, name))
        if text:
            formatters["text/plain"].for_type_by_name(module, name, lazily(1, module, name))


_register_notebook_display()


def plot(source: Session | str | os.PathLike[str]) -> dict[str, Figure]:
    """The run's figures as matplotlib Figures: ``steps``, ``underflow``, ``precision``, ``memory``.

    ``source`` is a Session or anything `load` opens. Made with matplotlib's object API: the
    backend and rcParams are left as they were. Needs matplotlib (``ampdiag[plot]``).
    """
    from pathlib import Path

    from ampdiag.render import plot as figures
    from ampdiag.session import Session
    from ampdiag.sources import load

    return figures.plot(source if isinstance(source, Session) else load(Path(source)))


def __getattr__(name: str) -> Any:
    # Lazy so that `import ampdiag` does not import torch (PEP 562).
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ampdiag' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
