"""What the run's GPU can do, from its CUDA compute capability: the predicates advice rests on.

The capability comes from the session's environment (``device_capability``, "major.minor"):
a live run reads it from torch, a trace from its ``deviceProperties``. Each predicate answers
True, False, or None where the session does not say (a CPU run, a trace without
``deviceProperties``), so advice can tell "not on this GPU" from "unknown". Advice goes by
`advisable`: no BF16 below 8.0 because torch emulates it there, slower than FP32, while
``torch.cuda.is_bf16_supported()`` still says True.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TENSOR_CORES = (7, 0)
BF16 = (8, 0)
TF32 = (8, 0)
FP8 = (8, 9)


def parse_capability(value: Any) -> tuple[int, int] | None:
    """``"8.6"`` (or ``(8, 6)``) as ``(8, 6)``; None for anything else."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        major, minor = value
    elif isinstance(value, str) and value.count(".") == 1:
        major, _, minor = value.partition(".")
    else:
        return None
    try:
        out = (int(major), int(minor))
    except (TypeError, ValueError):
        return None
    return out if 0 <= out[0] < 100 and 0 <= out[1] < 100 else None


def capability(environment: Mapping[str, Any]) -> tuple[int, int] | None:
    """The CUDA compute capability of a session's GPU, or None (CPU run, or not recorded)."""
    if environment.get("device_type") not in (None, "cuda"):
        return None
    return parse_capability(environment.get("device_capability"))


def _at_least(environment: Mapping[str, Any], needed: tuple[int, int]) -> bool | None:
    cap = capability(environment)
    return None if cap is None else cap >= needed


def has_tensor_cores(environment: Mapping[str, Any]) -> bool | None:
    """Whether the GPU has tensor cores (compute capability >= 7.0)."""
    return _at_least(environment, TENSOR_CORES)


def runs_bf16(environment: Mapping[str, Any]) -> bool | None:
    """Whether the GPU runs BF16 on tensor cores (compute capability >= 8.0)."""
    return _at_least(environment, BF16)


def runs_tf32(environment: Mapping[str, Any]) -> bool | None:
    """Whether the GPU has TF32 tensor cores (compute capability >= 8.0)."""
    return _at_least(environment, TF32)


def runs_fp8(environment: Mapping[str, Any]) -> bool | None:
    """Whether the GPU has FP8 tensor cores (compute capability >= 8.9)."""
    return _at_least(environment, FP8)


def advisable(environment: Mapping[str, Any], precision: str) -> bool:
    """Whether advice may tell this run to train in ``precision`` ("bf16", "tf32", "fp8"...).

    BF16: not on a GPU below compute capability 8.0 (nor where the session says BF16 is
    unsupported and gives no capability); any CPU. TF32: a CUDA setting, not below 8.0. FP8:
    only on a GPU known to have FP8 tensor cores. FP32 and FP16: everywhere.
    """
    if precision == "bf16":
        known = runs_bf16(environment)
        return known if known is not None else environment.get("bf16_supported") is not False
    if precision == "tf32":
        return device_type(environment) == "cuda" and runs_tf32(environment) is not False
    if precision == "fp8":
        return runs_fp8(environment) is True
    return True


def device_type(environment: Mapping[str, Any]) -> str:
    """The run's device type for the code in a fix ("cuda" when the session does not say)."""
    return str(environment.get("device_type") or "cuda")
