"""A minGPT-style loop with a generate-every-N callback under ampdiag: what it must not cost.

The script is benchmarks/realscripts/mingpt_like.py (written here in minGPT's style); the model
is its tinygpt. Truth is measured apart from ampdiag: the native lines are looked for in the
process's own stderr; the training step's ops are counted by a TorchDispatchMode of the test
around a replay of the audited step's forward and backward on an identical model.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ampdiag

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "realscripts"))

from tinygpt import GPT, CharData  # noqa: E402

NATIVE = ("CPUAllocator", "USDT:", "STAGE:", "SyncActivityProfilerHandler", "Memory block")


def test_no_native_profiler_line_reaches_stderr(tmp_path: Path) -> None:
    script = ROOT / "benchmarks" / "realscripts" / "mingpt_like.py"
    cmd = [sys.executable, "-m", "ampdiag", "run", "--out", str(tmp_path / "run"),
           "--no-report", "--no-tensorboard", "--no-speed-probe", str(script),
           "--iters", "8", "--gen-every", "2", "--gen-tokens", "20", "--workers", "0"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final loss" in proc.stdout  # the script ran to its end
    native = [ln for ln in proc.stderr.splitlines() if any(n in ln for n in NATIVE)]
    assert native == []


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _step(model: GPT, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    _, loss = model(x, y)
    assert loss is not None
    model.zero_grad(set_to_none=True)
    loss.backward()


def _generate(model: GPT) -> None:
    model.eval()
    with torch.no_grad():
        model.generate(torch.zeros(1, 1, dtype=torch.long), 12)
    model.train()


def test_the_audit_counts_the_training_steps_ops_not_generation(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = GPT(n_layer=1)
    twin = copy.deepcopy(model)
    data = CharData(n=64)
    batches = [torch.stack(t) for t in zip(*(data[i] for i in range(8)), strict=True)]
    x, y = batches
    quiet = dict.fromkeys(
        ("profile", "memory", "numerics", "sentinel", "speed_probe", "report", "tensorboard"),
        False,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ampdiag.diagnose(
        model, opt, out=tmp_path / "run", console=False, precision_step=1, **quiet
    ) as d:
        for _ in range(3):
            _generate(model)  # the callback of the step before, as minGPT's on_batch_end
            _step(model, opt, x, y)
            opt.step()
    # truth: the same step replayed on an identical model, its forward and backward counted
    opt2 = torch.optim.SGD(twin.parameters(), lr=0.1)
    for i in range(2):
        _generate(twin)
        if i == 1:
            with _Count() as count:
                _step(twin, opt2, x, y)
        else:
            _step(twin, opt2, x, y)
        opt2.step()
    sec = d.session.sections["precision"]
    assert sec["audited"] and sec["step"] == 1
    audited: Counter[str] = Counter()
    for row in sec["ops"]:
        audited[row["op"]] += row["count"]
    assert audited == count.ops


FREES_IN_WINDOW = """
import torch, ampdiag
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = [torch.ones(4) for _ in range(3000)]  # the callback's cache, made before the window
with ampdiag.diagnose(out={out!r}, report=False, tensorboard=False, console=False,
                      speed_probe=False, numerics=False, sentinel=False, precision=False):
    for step in range(6):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        if step == 2:  # inside the profiled window: 3000 frees the allocator cannot size
            kept.clear()
print("done")
"""


def test_frees_of_blocks_made_before_the_window_log_nothing(tmp_path: Path) -> None:
    """The CPU allocator logs one line per 1000 such frees, from inside the user's step."""
    code = FREES_IN_WINDOW.format(out=str(tmp_path / "run"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, check=False)  # fmt: skip
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-2000:]
    assert [ln for ln in proc.stderr.splitlines() if any(n in ln for n in NATIVE)] == []
