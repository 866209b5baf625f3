"""Shared fixtures: tiny models and training loops that run in milliseconds on a CPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]

#: The settings that keep a test's diagnose() quiet: session.json only, no report, TensorBoard
#: or console output.
QUIET: dict[str, Any] = {"report": False, "tensorboard": False, "console": False}


@pytest.fixture
def quiet_diagnose(tmp_path: Path) -> Callable[..., Any]:
    """``with quiet_diagnose(model, **settings) as d:``: diagnose() into tmp_path, with `QUIET`."""
    from ampdiag import diagnose

    def start(*given: Any, **settings: Any) -> Any:
        return diagnose(*given, **{"out": tmp_path, **QUIET, **settings})

    return start


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


class TinyNet(nn.Module):
    def __init__(self, dim: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


TrainFn = Callable[..., nn.Module]


def train(
    steps: int = 5,
    dtype: torch.dtype | None = None,
    use_scaler: bool = False,
    seed: int = 0,
    wrap: Callable[[], object] | None = None,
    fail_at: int | None = None,
    exc: BaseException | None = None,
) -> nn.Module:
    """Trains TinyNet on CPU; under `wrap()` (a context manager) when given."""
    import contextlib

    torch.manual_seed(seed)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)
    gen = torch.Generator().manual_seed(seed)
    data = [
        (torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen))
        for _ in range(steps)
    ]
    ctx = wrap() if wrap is not None else contextlib.nullcontext()
    with ctx:  # type: ignore[attr-defined]
        for i, (x, y) in enumerate(data):
            if fail_at is not None and i == fail_at:
                assert exc is not None
                raise exc
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(x), y)
            if use_scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
    return model
