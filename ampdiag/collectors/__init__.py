"""Collectors: each watches one thing in a live run and hands back its Session section."""

from __future__ import annotations

from ampdiag.collectors.base import Collector, DiagnoseConfig, RunContext


def default_collectors(config: DiagnoseConfig) -> list[Collector]:
    """The collectors diagnose() attaches by default, in callback order."""
    from ampdiag.collectors.dtypes import DtypeAuditCollector
    from ampdiag.collectors.profiler import ProfilerCollector

    collectors: list[Collector] = []
    if config.profile:
        collectors.append(ProfilerCollector())
    if config.precision:
        collectors.append(DtypeAuditCollector())
    return collectors


__all__ = ["Collector", "DiagnoseConfig", "RunContext", "default_collectors"]
