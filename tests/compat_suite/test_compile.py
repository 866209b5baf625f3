"""torch.compile under diagnose(): no graph break added, the same bits, the probe on the original.

The graph breaks are dynamo's own count (``torch._dynamo.utils.counters``); each scenario
starts from a reset dynamo, so the plain and the diagnosed run each compile from scratch.
Most tests use the ``aot_eager`` backend (dynamo and AOTAutograd, no code generation: fast on
a CPU); one uses inductor.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from tests.compat_suite.harness import CONFIGS, graph_breaks, reset_dynamo, same_under_diagnose

params = pytest.mark.parametrize("settings", list(CONFIGS.values()), ids=list(CONFIGS))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x)))


def compiled_loop(
    block: contextlib.AbstractContextManager[Any],
    backend: str,
    fullgraph: bool,
    in_place: bool = False,
    steps: int = 4,
) -> dict[str, Any]:
    reset_dynamo()
    model = Net()
    if in_place:
        model.compile(backend=backend, fullgraph=fullgraph)
        run = model
    else:
        run = torch.compile(model, backend=backend, fullgraph=fullgraph)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    with block:
        for _ in range(steps):
            x = torch.randn(6, 8)
            with torch.autocast("cpu", torch.bfloat16):
                loss = run(x).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
    return {"model": model, "losses": losses, "graph_breaks": graph_breaks()}


@params
@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph", "fullgraph"])
def test_aot_eager_same_bits_and_graph_breaks(
    settings: dict[str, Any], fullgraph: bool, tmp_path: Path
) -> None:
    session = same_under_diagnose(
        lambda b: compiled_loop(b, "aot_eager", fullgraph), settings, tmp_path
    )
    warnings = " ".join(session["run"]["warnings"])
    assert "inside torch.compile" in warnings  # what it could not see, said


def test_in_place_compile_same_bits(tmp_path: Path) -> None:
    same_under_diagnose(lambda b: compiled_loop(b, "aot_eager", False, True), {}, tmp_path)


def test_graph_breaks_counted_are_real() -> None:
    """The count the tests compare is dynamo's own: a print in forward is one graph break."""

    class Breaks(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            torch._dynamo.graph_break()
            return self.head(self.blocks(h))

    reset_dynamo()
    torch.compile(Breaks(), backend="aot_eager")(torch.randn(2, 8))
    assert graph_breaks() == 1


def test_inductor_same_bits(tmp_path: Path) -> None:
    same_under_diagnose(
        lambda b: compiled_loop(b, "inductor", True, steps=3), {"profile": False}, tmp_path
    )


def test_speed_probe_and_ab_measure_the_original_module(tmp_path: Path) -> None:
    session = same_under_diagnose(
        lambda b: compiled_loop(b, "aot_eager", False, steps=6),
        {"precision_ab_budget_s": 2.0},
        tmp_path,
    )
    probe = session["speed_probe"]
    assert probe["skipped"] is None, probe["skipped"]
    assert "error" not in probe, probe.get("error")
    assert probe["fp32_ms"] > 0 and probe["autocast_ms"] > 0
    assert "error" not in probe["precisions"], probe["precisions"]
    assert "original module" in " ".join(session["run"]["warnings"])


def test_warnings_as_errors_do_not_stop_a_compiled_model(tmp_path: Path) -> None:
    # Truth: the same loop under ``-W error`` runs plainly; the filters are compared entry by
    # entry before and after. torch warns on every call of a compiled module while any global
    # module hook is registered, and only ampdiag's were.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = list(warnings.filters)
        session = same_under_diagnose(
            lambda b: compiled_loop(b, "aot_eager", False, steps=3), {"profile": False}, tmp_path
        )
        assert len(warnings.filters) == len(before)
        assert all(a is b for a, b in zip(warnings.filters, before, strict=True))
    assert session["status"] == "ok"


def test_a_users_own_global_module_hook_keeps_torchs_compile_warning(tmp_path: Path) -> None:
    # The warning is theirs to see when a hook of theirs is registered: recorded as plainly.
    import warnings

    from torch.nn.modules.module import register_module_forward_pre_hook

    def count(name: str) -> int:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            block = ampdiag.diagnose(out=tmp_path / name, profile=False, speed_probe=False,
                                     console=False, report=False, tensorboard=False)  # fmt: skip
            compiled_loop(block, "aot_eager", False, steps=2)
        return sum("global hooks" in str(w.message) for w in seen)

    assert count("ours") == 0
    handle = register_module_forward_pre_hook(lambda m, a: None)
    try:
        assert count("theirs") >= 2  # one per compiled call, as without ampdiag
    finally:
        handle.remove()
