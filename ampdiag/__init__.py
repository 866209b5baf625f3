"""ampdiag: diagnose PyTorch mixed-precision training.

Wrap training in ``with ampdiag.diagnose():`` and open the report it writes::

    import ampdiag
    with ampdiag.diagnose(out="reports/my-run") as d:
        for x, y in loader:
            ...
    print(d.out / "report.html")

Importing ampdiag is light: torch, matplotlib, pandas and HTA load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampdiag._version import __version__
from ampdiag.errors import InputError, OutputError

if TYPE_CHECKING:
    from ampdiag.analysis import analyze
    from ampdiag.analysis.diff import diff
    from ampdiag.config import DiagnoseConfig
    from ampdiag.session import Finding, Session, load
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
    "load": "ampdiag.session",
    "memory_probe": "ampdiag.sources.live.memory_probe",
    "run": "ampdiag.sources.live.script",
}


def __getattr__(name: str) -> Any:
    # Lazy so that `import ampdiag` does not import torch (PEP 562).
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ampdiag' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
