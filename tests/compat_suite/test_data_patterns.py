"""Input pipelines of public training code, with and without diagnose().

* A ``DataLoader`` with worker processes over a synthetic dataset whose every item is drawn
  from its own index's seed (torchvision's ``FakeData``, as pytorch/examples dcgan
  ``--dataset fake --workers 2`` and imagenet ``--dummy -j N`` load it), shuffled, for two
  epochs: the workers are forked from a process with ampdiag's hooks and patches installed.
  Each batch, the parameters and the losses must be the same bits as without ampdiag.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tests.compat_suite.harness import CONFIGS, same_under_diagnose

params = pytest.mark.parametrize("settings", list(CONFIGS.values()), ids=list(CONFIGS))


class Fake(Dataset[tuple[torch.Tensor, int]]):
    """Images and labels each drawn from the index's own generator (FakeData's recipe)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(1000 + index)
        image = torch.rand(3, 8, 8, generator=g)
        label = int(torch.randint(0, 4, (1,), generator=g))
        return image, label


def worker_loop(block: contextlib.AbstractContextManager[Any]) -> dict[str, Any]:
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
        nn.Linear(4 * 8 * 8, 4),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(
        Fake(), batch_size=6, shuffle=True, num_workers=2,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    seen: list[Any] = []
    with block:
        for _ in range(2):
            for x, y in loader:
                with torch.autocast("cpu", torch.bfloat16):
                    loss = nn.functional.cross_entropy(model(x).float(), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                seen.append((x, y, loss.detach()))
    return {"model": model, "opt": opt.state_dict(), "seen": seen}


@params
def test_dataloader_worker_processes(settings: dict[str, Any], tmp_path: Path) -> None:
    session = same_under_diagnose(worker_loop, settings, tmp_path)
    assert session["run"]["optimizer_steps"] == 2 * 4  # 24 items in batches of 6, two epochs
