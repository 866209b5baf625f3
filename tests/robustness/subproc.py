"""Running a scenario in a fresh Python: a crash (a signal) must fail the test, not pytest."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Shared by the scenarios: a tiny model and a loop, deterministic, a few ms per step on a CPU.
PRELUDE = """
import json, sys, threading, warnings
import torch
from torch import nn
import ampdiag

def make(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)

def steps(n, model, opt, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(8, 16, generator=gen)).float().pow(2).mean()
        loss.backward()
        opt.step()

QUIET = dict(console=False, report=False, tensorboard=False, speed_probe=False)

import torch.nn.utils as nn_utils
import torch.nn.utils.clip_grad as clip_mod
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

PATCHABLE = (
    [(torch.Tensor, n) for n in ("backward", "float", "double", "to", "type")]
    + [(torch.amp.GradScaler, n) for n in ("scale", "update", "step", "unscale_")]
    + [(m, n) for m in (nn_utils, clip_mod) for n in ("clip_grad_norm_", "clip_grad_value_")]
    + [(torch.autograd.profiler.profile, n) for n in ("_prepare_trace", "_start_trace")]
)
ORIGINAL = {(id(o), n): getattr(o, n) for o, n in PATCHABLE}

def leftovers():
    # What a finished block left in the process: patched functions, global hooks, modes.
    out = [f"{getattr(o, '__name__', o)}.{n}" for o, n in PATCHABLE
           if getattr(o, n) is not ORIGINAL[(id(o), n)]]
    hooks = {
        "module_pre": nn_module._global_forward_pre_hooks,
        "module_post": nn_module._global_forward_hooks,
        "optimizer_pre": optim_module._global_optimizer_pre_hooks,
        "optimizer_post": optim_module._global_optimizer_post_hooks,
    }
    out += [f"{len(v)} global {k} hooks" for k, v in hooks.items() if v]
    if torch._C._len_torch_dispatch_stack():
        out.append(f"{torch._C._len_torch_dispatch_stack()} dispatch modes")
    if torch.autograd.profiler._is_profiler_enabled:
        out.append("a profiler still on")
    return out

def model_hooks(model):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())

def report(**values):
    print("RESULT " + json.dumps(values))
"""


def run_python(
    code: str,
    tmp: Path,
    *,
    timeout: float = 120,
    memory_bytes: int | None = None,
    prelude: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` (after `PRELUDE`) in a new interpreter, with ``TMP`` = ``tmp``.

    ``memory_bytes`` caps the address space (RLIMIT_AS), so a runaway allocation fails there.
    """
    source = (PRELUDE if prelude else "") + f"\nTMP = {str(tmp)!r}\n" + textwrap.dedent(code)

    def limit() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", source],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
    )


def result(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The scenario's ``report(...)`` values; fails with its exit status and stderr if none."""
    import json

    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, outcome(proc)
    values: dict[str, object] = json.loads(lines[-1][len("RESULT ") :])
    return values


def outcome(proc: subprocess.CompletedProcess[str]) -> str:
    """The exit status and the last lines of stderr, for assertion messages."""
    return f"exit {proc.returncode}; stderr tail:\n{proc.stderr[-3000:]}"
