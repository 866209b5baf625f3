"""Collectors: each watches one thing in a live run and hands back its Session section."""

from __future__ import annotations

from ampdiag.config import DiagnoseConfig
from ampdiag.sources.live.collectors.base import Collector, RunContext


def default_collectors(config: DiagnoseConfig) -> list[Collector]:
    """The collectors diagnose() attaches by default (their order does not matter)."""
    from ampdiag.sources.live.collectors.profiler import ProfilerCollector
    from ampdiag.sources.live.collectors.speed_probe import SpeedProbe

    collectors: list[Collector] = []
    collectors.append(SpeedProbe(config.speed_probe_repeats, config.speed_probe_budget_s))
    if config.profile:
        collectors.append(ProfilerCollector())
    if config.memory:
        from ampdiag.sources.live.collectors.memory import MemoryCollector

        collectors.append(MemoryCollector())
    if config.precision:
        from ampdiag.sources.live.collectors.precision import PrecisionCollector

        collectors.append(PrecisionCollector())
    if config.sentinel:
        from ampdiag.sources.live.collectors.sentinel import Sentinel

        collectors.append(Sentinel())
    if config.numerics:
        from ampdiag.sources.live.collectors.accumulation import AccumulationCollector
        from ampdiag.sources.live.collectors.activations import ActivationsCollector
        from ampdiag.sources.live.collectors.gradients import GradientsCollector
        from ampdiag.sources.live.collectors.scaler import ScalerCollector

        collectors += [
            ScalerCollector(),
            GradientsCollector(),
            ActivationsCollector(),
            AccumulationCollector(),
        ]
    return collectors


__all__ = ["Collector", "DiagnoseConfig", "RunContext", "default_collectors"]
