"""The environment a run happened in: versions, device, autocast, distributed rank."""

from __future__ import annotations

import os
import platform
import sys
from typing import TYPE_CHECKING, Any

import torch

from ampdiag.analysis.device import BF16
from ampdiag.compat.frameworks import accelerate_mixed_precision, accelerate_prepared
from ampdiag.schema import Environment
from ampdiag.sources.live.discovery import dominant_autocast

if TYPE_CHECKING:
    from ampdiag.sources.live.collectors.base import RunContext


def cpu_flags() -> list[str]:
    """CPU feature flags that matter for low precision (from /proc/cpuinfo where it exists)."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [f for f in wanted if f in present]
    except OSError:
        pass
    return []


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` runs BF16 kernels natively (CPU: AVX512_BF16/AMX; CUDA: sm80+).

    Elsewhere BF16 is emulated: slower than FP32, which is why it loses a measured tie
    (`ampdiag.analysis.precision_choice.choose`).
    """
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= BF16
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def fp16_native(device: torch.device) -> bool:
    """Whether ``device`` runs FP16 kernels natively (CPU: AVX512_FP16/AMX_FP16; any GPU).

    A CPU without them converts and emulates FP16: many times slower than FP32 (an emulated
    FP16 backward costs several FP32 ones), so FP16 is never the fast choice there, and the
    precision A/B does not spend the exit measuring it unless the run itself is in FP16
    (`compare.compare`'s ``droppable``).
    """
    if device.type != "cpu":
        return True
    flags = cpu_flags()
    return "avx512_fp16" in flags or "amx_fp16" in flags


def distributed_info() -> dict[str, int]:
    """Rank and world size when torch.distributed is initialized, else rank 0 of 1."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size()}
    return {
        "rank": int(os.environ.get("RANK", 0)),
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
    }


def framework_precision(run: RunContext) -> dict[str, str]:
    """The mixed precision a framework was asked for, where torch alone cannot tell.

    ``Accelerator(mixed_precision="fp16")`` on a CPU enters no autocast and makes no GradScaler:
    the run trains in FP32 although mixed precision was asked for, which is not the same as a
    deliberate FP32 run. Accelerate keeps that request in process-wide state that outlives its
    Accelerator (a notebook, a test suite), so it counts only when this run's models or
    optimizers (given or found) were prepared by Accelerate (`accelerate_prepared`): the verdict
    rests on what this run did, never on what the process did before it.
    """
    found: dict[str, str] = {}
    mode = accelerate_mixed_precision()
    if mode is not None and mode != "no" and accelerate_prepared(run.models, run.optimizers):
        found["accelerate"] = mode
    return found


#: Command-line flags that set a script's mixed precision (timm's ``train.py``, HF example
#: scripts, ...); their values follow them.
AMP_FLAGS = frozenset(
    {
        "--amp",
        "--no-amp",
        "--amp-dtype",
        "--amp-impl",
        "--apex-amp",
        "--native-amp",
        "--bf16",
        "--fp16",
        "--half",
        "--precision",
        "--mixed-precision",
        "--mixed_precision",
    }
)
_VALUED = frozenset({"--amp-dtype", "--amp-impl", "--precision", "--mixed-precision",
                     "--mixed_precision"})  # fmt: skip


def amp_flags(argv: list[str]) -> list[str]:
    """The mixed-precision flags of a command line, with their values (nothing else of it).

    ``["--amp", "--amp-dtype", "float16"]`` from ``train.py --amp --amp-dtype float16 --lr 3``;
    ``--flag=value`` is split the same way.
    """
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        name, eq, value = str(args[i]).partition("=")
        if name in AMP_FLAGS:
            out.append(name)
            if eq:
                out.append(value)
            elif name in _VALUED and i + 1 < len(args):
                out.append(str(args[i + 1]))
                i += 1
        i += 1
    return out


def framework(run: RunContext, precision: dict[str, str]) -> dict[str, Any]:
    """The framework the run came through, in the terms its fixes are written in.

    ``{"name": "hf-trainer" | "lightning" | "accelerate" | "script", "precision": what it asked
    for, "flags": the command line's mixed-precision flags}``: a framework found on the stack
    (`calling_framework`), else Accelerate where it prepared this run's objects, else a script
    whose command line carries mixed-precision flags (`amp_flags`). Empty when none: a plain
    loop. The fixes name the framework's setting first (`ampdiag.analysis.advisors.terms`).
    """
    found: dict[str, Any] = dict(run.framework or {})
    flags = amp_flags(sys.argv[1:])
    if not found:
        mode = accelerate_mixed_precision()
        if "accelerate" in precision or (
            mode is not None and accelerate_prepared(run.models, run.optimizers)
        ):
            found = {"name": "accelerate", "precision": precision.get("accelerate", mode)}
        elif flags:
            found = {"name": "script"}
    if found and flags:
        found["flags"] = flags
    if found.get("name") == "hf-trainer":  # run_clm.py's model settings (from scratch)
        overrides = _flag_value(sys.argv[1:], "--config_overrides")
        if overrides is not None:
            found["config_overrides"] = overrides
    return found


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` on a command line (``--flag v`` or ``--flag=v``), or None."""
    for i, arg in enumerate(argv):
        name, eq, value = str(arg).partition("=")
        if name == flag:
            return value if eq else (str(argv[i + 1]) if i + 1 < len(argv) else None)
    return None


def describe_environment(run: RunContext | None = None) -> Environment:
    """Returns the session's ``environment`` section."""
    env: Environment = {
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_flags": cpu_flags(),
        "cuda_available": torch.cuda.is_available(),
    }
    ranks = distributed_info()
    env["rank"], env["world_size"] = ranks["rank"], ranks["world_size"]
    device_type = run.device_type if run is not None else "cpu"
    env["device_type"] = device_type
    if device_type == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        env["device_name"] = props.name
        env["device_memory_bytes"] = int(props.total_memory)
        env["device_capability"] = f"{props.major}.{props.minor}"
        # BF16 tensor cores from 8.0 (`runs_bf16`): torch.cuda.is_bf16_supported() also says
        # True on older GPUs, where it emulates BF16 (slower than FP32)
        env["bf16_supported"] = (props.major, props.minor) >= BF16
    else:
        env["device_name"] = env["cpu"]
        env["bf16_native"] = bf16_native(torch.device("cpu"))
        env["bf16_supported"] = True  # CPU autocast runs bf16 everywhere, natively or not
    if run is not None:
        env["autocast"] = dominant_autocast(run.autocast)
        env["autocast_seen"] = dict(run.autocast)
        env["framework_precision"] = framework_precision(run)
        env["framework"] = framework(run, env["framework_precision"])
    return env
