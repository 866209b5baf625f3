"""memory_probe measures activation bytes exactly and changes nothing; the what-if arithmetic."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import ampdiag
from ampdiag.analysis import memory_estimates as estimates


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 64), torch.randint(0, 10, (n,))


def test_probe_matches_a_count_of_what_autograd_saves() -> None:
    # Saved for backward, per sample, in FP32: the input of Linear 1 (64 floats), the ReLU
    # output (256 floats, shared by ReLU and Linear 2), log_softmax's output (10 floats) and
    # the int64 target. Weights are parameters, not activations.
    per_sample = 64 * 4 + 256 * 4 + 10 * 4 + 8
    r = ampdiag.memory_probe(mlp(), make_batch, batch_sizes=(4, 16), loss_fn=F.cross_entropy)
    assert r["per_sample_bytes"] == pytest.approx(per_sample)
    (b1, v1), (b2, v2) = r["points"]
    assert v2 - v1 == per_sample * (b2 - b1)  # grows with the batch as measured


def test_probe_bf16_activations_are_smaller_and_compared_with_fp32() -> None:
    r = ampdiag.memory_probe(
        mlp(),
        make_batch,
        batch_sizes=(4, 16),
        loss_fn=F.cross_entropy,
        autocast_dtype=torch.bfloat16,
    )
    # bf16: input cast (64 x 2 B), ReLU output (256 x 2 B); the loss runs in FP32 (10 x 4 B).
    assert r["per_sample_bytes"] == pytest.approx(64 * 2 + 256 * 2 + 10 * 4 + 8)
    amp = estimates.amp_comparison({"probes": [r]})
    assert amp is not None and amp["batch"] == 16
    assert amp["low_precision_bytes"] < amp["fp32_bytes"]


def test_probe_changes_no_state() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 2))
    model(torch.randn(4, 8)).sum().backward()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    rng = torch.random.get_rng_state()
    ampdiag.memory_probe(model, lambda n: torch.randn(n, 8), batch_sizes=(3, 6))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_probe_needs_two_batch_sizes() -> None:
    with pytest.raises(ValueError):
        ampdiag.memory_probe(mlp(), make_batch, batch_sizes=(4, 4))


def test_fit_and_accumulation_plan() -> None:
    fit = estimates.fit_linear([[2, 1000 + 2 * 300], [6, 1000 + 6 * 300]])
    assert fit == {"per_sample_bytes": 300.0, "fixed_bytes": 1000.0}
    assert estimates.fit_linear([[4, 10], [4, 12]]) is None
    section = {"peak": {"bytes": 10_000}, "observed_batch": 10}
    f = {"per_sample_bytes": 300.0, "fixed_bytes": 1000.0}
    # budget 20_000 -> usable 18_000; base = 10_000 - 3000 = 7000; largest = 36
    plan = estimates.plan_accumulation(section, 100, f, 20_000)
    assert plan is not None
    assert plan["largest_fitting_micro_batch"] == 36
    assert plan["accumulation_steps"] == math.ceil(100 / 36) == 3
    assert plan["micro_batch"] == 34
    assert plan["estimated_peak_bytes"] <= 18_000
    fits = estimates.plan_accumulation(section, 20, f, 20_000)
    assert fits is not None and fits["fits_without"]
