"""Collectors: each watches one thing in a live run and hands back its Session section.

A collector is one file here and one line in `REGISTERED`: its class names its section
(``name``, typed by the return annotation of ``section()``), the `DiagnoseConfig` flag that
turns it on (``enabled_by``) and how it is built (``from_config``). The registry is checked
against `ampdiag.schema.SECTIONS` and the typed `ampdiag.session.Session.section` by
tests/test_schema.py.
"""

from __future__ import annotations

import importlib

from ampdiag.config import DiagnoseConfig
from ampdiag.sources.live.collectors.base import Collector, RunContext

#: Every collector diagnose() attaches by default, as ``module:Class`` (the order does not
#: matter: collectors share facts only through `RunContext`).
REGISTERED: tuple[str, ...] = (
    "speed_probe:SpeedProbe",
    "profiler:ProfilerCollector",
    "memory:MemoryCollector",
    "precision:PrecisionCollector",
    "sentinel:Sentinel",
    "scaler:ScalerCollector",
    "gradients:GradientsCollector",
    "activations:ActivationsCollector",
    "accumulation:AccumulationCollector",
    "fp8_amax:Fp8AmaxCollector",
    "weight_updates:WeightUpdatesCollector",
)


def registered() -> list[type[Collector]]:
    """The registered collector classes (importing each module: they import torch)."""
    classes = []
    for entry in REGISTERED:
        module, name = entry.split(":")
        classes.append(getattr(importlib.import_module(f"{__name__}.{module}"), name))
    return classes


def default_collectors(config: DiagnoseConfig) -> list[Collector]:
    """The collectors diagnose() attaches for ``config``: those whose flag is on."""
    return [
        cls.from_config(config)
        for cls in registered()
        if cls.enabled_by is None or getattr(config, cls.enabled_by)
    ]


__all__ = ["REGISTERED", "Collector", "DiagnoseConfig", "RunContext", "default_collectors"]
