"""The compatibility suite's one check: a training pattern runs the same with and without ampdiag.

A *scenario* is a function that builds its model, enters the context manager it is given around
its training loop, and returns what it computed (parameters, outputs, losses, anything
picklable it made). `same_under_diagnose` runs it once plain (``nullcontext``) and once under
``diagnose()`` from the same seed, and holds the two results to bit-identical equality: the
truth is the plain run itself, not anything ampdiag reports.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import ampdiag
from tests.conftest import QUIET

Scenario = Callable[[contextlib.AbstractContextManager[Any]], Any]

# The settings every scenario runs under: the defaults; every collector on every step (the
# profiler recording from the first step, every statistic sampled, the audit on its default
# step); and the profiler off (copies failed differently with it off).
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "every-collector-every-step": {
        "sample_every": 1,
        "profile_skip": 0,
        "profile_warmup": 0,
        "profile_active": 2,
        "activation_every": 0,
        "precision_ab_budget_s": 0.2,
        "fp8": True,  # the FP8 amax collector too (on by default only on an FP8 GPU)
    },
    "profiler-off": {"profile": False},
}


def seed(value: int = 0) -> None:
    """Seeds every generator a scenario may draw from."""
    torch.manual_seed(value)
    random.seed(value)


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs of nested dicts, lists, tuples and modules (their state_dict)."""
    if isinstance(value, torch.nn.Module):
        value = value.state_dict()
    if isinstance(value, dict):
        for k in sorted(value, key=str):
            yield from flatten(value[k], f"{prefix}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


def assert_identical(expected: Any, got: Any) -> None:
    """Every leaf equal: tensors bit for bit (dtype, layout, shape, values), others by ==."""
    a, b = dict(flatten(expected)), dict(flatten(got))
    assert a.keys() == b.keys()
    for key, x in a.items():
        y = b[key]
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor), key
            assert (x.dtype, x.layout, x.shape) == (y.dtype, y.layout, y.shape), key
            if x.layout != torch.strided:
                x, y = x.to_dense(), y.to_dense()
            assert torch.equal(x.nan_to_num(), y.nan_to_num()), key
            assert torch.equal(x.isnan(), y.isnan()), key
        else:
            assert x == y, key


def same_under_diagnose(
    scenario: Scenario, settings: dict[str, Any], out: Path, **plain_kwargs: Any
) -> dict[str, Any]:
    """Runs the scenario plain and under diagnose(**settings); returns the session (JSON)."""
    seed()
    expected = scenario(contextlib.nullcontext())
    seed()
    got = scenario(ampdiag.diagnose(out=out, **QUIET, **settings))
    assert_identical(expected, got)
    session: dict[str, Any] = json.loads((out / "session.json").read_text())
    assert session["status"] == "ok", session.get("error")
    return session


def graph_breaks() -> int:
    """Graph breaks dynamo counted since the last `reset_dynamo` (its own counter)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def reset_dynamo() -> None:
    """Forgets every compiled graph and dynamo's counters."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
