"""Shared fixtures for the renderer tests: real diagnosed runs, small and fast."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.session import Finding, Session

EVIL_MODULE = "<img src=x onerror=alert(1)>"


def without_our_script(html: str) -> str:
    """The page without the report's own script (templates/report.js), which must be there
    exactly once and unchanged: what is left holds no script at all when escaping works."""
    from importlib import resources

    ours = resources.files("ampdiag.render").joinpath("templates/report.js").read_text("utf-8")
    element = f"<script>{ours}</script>"
    assert html.count(element) == 1
    return html.replace(element, "")


EVIL_MESSAGE = "<script>alert(2)</script> & <img src=y onerror=alert(3)>"


def evil_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("inp", nn.Linear(32, 64))
    model.add_module(EVIL_MODULE, nn.Linear(64, 64))
    model.add_module("out", nn.Linear(64, 8))
    return model


def train_steps(model: nn.Module, steps: int, dtype: torch.dtype = torch.bfloat16) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(steps):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(i))
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()


@pytest.fixture(scope="session")
def evil_run(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """A real run (profiled, speed-probed) of a model with a module named like an XSS."""
    out = tmp_path_factory.mktemp("evil") / "run"
    settings = {"profile_skip": 0, "profile_warmup": 0, "profile_active": 1, "console": False}
    with ampdiag.diagnose(out=out, **settings) as d:
        train_steps(evil_model(), 3)
    assert d.session is not None
    # A finding as issue-3's rules write it, naming the module (trace/user strings in evidence).
    d.session.findings.append(
        Finding(
            "activation-overflow",
            "high",
            f"Module {EVIL_MODULE} overflows FP16.",
            {"module": EVIL_MODULE, "max_abs": 7.1e4},
            fix=f"with torch.autocast('cpu', enabled=False):  # around {EVIL_MODULE}",
            section="numerics",
        )
    )
    from ampdiag.render.html import write_html

    write_html(d.session, out)
    return d.session


@pytest.fixture(scope="session")
def error_run(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """A run whose block raised with a hostile exception message."""
    out = tmp_path_factory.mktemp("err") / "run"
    model = evil_model()
    with pytest.raises(RuntimeError), ampdiag.diagnose(out=out, profile=False, console=False) as d:
        train_steps(model, 1)
        raise RuntimeError(EVIL_MESSAGE)
    assert d.session is not None
    return d.session


@pytest.fixture()
def report_of():
    def path(session: Session) -> Path:
        assert session.path is not None
        return session.path / "report.html"

    return path
