"""What the run's device can execute, so that no fix advises a precision it cannot run.

One place for the capability checks: advice for a live run and for a trace both ask here.
BF16 and TF32 tensor cores arrived with compute capability 8.0 (Ampere); below it BF16 is
emulated or refused and TF32 does not exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

AMPERE = 8.0


def capability(cc: object) -> float | None:
    """A compute capability ("8.0", 8.0, (8, 0)) as a number, or None when unreadable."""
    if isinstance(cc, (tuple, list)) and len(cc) == 2:
        cc = f"{cc[0]}.{cc[1]}"
    if isinstance(cc, (int, float)) and not isinstance(cc, bool):
        return float(cc)
    if isinstance(cc, str) and cc.replace(".", "", 1).isdigit():
        return float(cc)
    return None


def supports_bf16(cc: object) -> bool | None:
    """Whether a CUDA device of that capability runs BF16 natively (None: unknown)."""
    value = capability(cc)
    return None if value is None else value >= AMPERE


def supports_tf32(cc: object) -> bool | None:
    """Whether a CUDA device of that capability has TF32 tensor cores (None: unknown)."""
    return supports_bf16(cc)


def device_type(environment: Mapping[str, Any]) -> str:
    """The run's device type for fix code ("cuda" when the session does not say)."""
    return str(environment.get("device_type") or "cuda")
