"""Collectors: each watches one thing in a live run and hands back its Session section.

A collector is one file here, its class registered with ``@COLLECTORS.register``, and one line
in `REGISTERED` (an `ampdiag.registry.Registry`): its class names its section
(``name``, typed by the return annotation of ``section()``), the `DiagnoseConfig` flag that
turns it on (``enabled_by``) and how it is built (``from_config``). The registry is checked
against `ampdiag.schema.SECTIONS` and the typed `ampdiag.session.Session.section` by
tests/test_schema.py.
"""

from __future__ import annotations

from ampdiag.config import DiagnoseConfig
from ampdiag.registry import Registry
from ampdiag.sources.live.collectors.base import Collector, RunContext

#: The modules of every collector diagnose() attaches by default (the order does not matter:
#: collectors share facts only through `RunContext`).
REGISTERED: tuple[str, ...] = (
    "speed_probe",
    "profiler",
    "memory",
    "precision",
    "sentinel",
    "scaler",
    "gradients",
    "activations",
    "accumulation",
    "fp8_amax",
    "weight_updates",
)


COLLECTORS: Registry[type[Collector]] = Registry(__name__, REGISTERED)


def registered() -> list[type[Collector]]:
    """The registered collector classes (importing each module: they import torch)."""
    return COLLECTORS.entries()


def default_collectors(config: DiagnoseConfig) -> list[Collector]:
    """The collectors diagnose() attaches for ``config``: those whose flag is on."""
    return [
        cls.from_config(config)
        for cls in registered()
        if cls.enabled_by is None or getattr(config, cls.enabled_by)
    ]


__all__ = [
    "COLLECTORS",
    "REGISTERED",
    "Collector",
    "DiagnoseConfig",
    "RunContext",
    "default_collectors",
]
