"""Numerics collectors in live CPU runs: observe-only, figures against direct measurements."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.analysis import fp16range
from tests.collectors.helpers import raw_histogram, raw_histograms

QUIET = {"profile": False, "report": False, "tensorboard": False, "console": False}


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def train(
    model: nn.Module,
    steps: int,
    *,
    dtype: torch.dtype | None = None,
    scaler: Any = None,
    loss_mul: float = 1.0,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    hook: Any = None,
) -> torch.optim.Optimizer:
    gen = torch.Generator().manual_seed(seed)
    opt = optimizer or torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(steps):
        x = torch.randn(4, 8, generator=gen)
        y = torch.randn(4, 4, generator=gen)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = ((model(x).float() - y) ** 2).mean() * loss_mul
        if scaler is not None:
            scaler.scale(loss).backward()
            if hook:
                hook(i, model, opt, scaler)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if hook:
                hook(i, model, opt, scaler)
            opt.step()
    return opt


def params_after(dtype: torch.dtype | None, use_scaler: bool, diag: Path | None) -> list[Any]:
    torch.manual_seed(0)
    model = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if use_scaler else None
    if diag is None:
        train(model, 3, dtype=dtype, scaler=scaler)
    else:
        with ampdiag.diagnose(out=diag, **QUIET):
            train(model, 3, dtype=dtype, scaler=scaler)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("dtype", "use_scaler"),
    [(None, False), (torch.bfloat16, False), (torch.float16, True)],
    ids=["fp32", "bf16", "fp16-scaler"],
)
def test_parameters_bit_identical_with_and_without_diagnose(
    tmp_path: Path, dtype: torch.dtype | None, use_scaler: bool
) -> None:
    plain = params_after(dtype, use_scaler, None)
    watched = params_after(dtype, use_scaler, tmp_path / "d")
    for a, b in zip(plain, watched, strict=True):
        assert torch.equal(a, b)
    # and the diagnosis really ran
    session = ampdiag.load(tmp_path / "d")
    assert session.section("gradients")["steps"]
    assert session.section("activations")["modules"]


def wide_values(n: int, seed: int = 0, avoid: tuple[int, ...] = (-25,)) -> torch.Tensor:
    """Magnitudes 2^e·m, e in [-50, 20] except `avoid`, m in [1.1, 1.9]: once scaled, no fp16
    rounding crosses the flush/subnormal/overflow boundaries, so a cast is a clean reference
    (2^-25 <= |x| < 2^-24 rounds up to 2^-24 in fp16 and is the one binade to avoid)."""
    gen = torch.Generator().manual_seed(seed)
    exps = torch.randint(-50, 21, (n,), generator=gen)
    for a in avoid:
        exps = torch.where(exps == a, torch.full_like(exps, a - 1), exps)
    mant = 1.1 + 0.8 * torch.rand(n, generator=gen)
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    v = sign * mant * torch.pow(2.0, exps.double()).float()
    v[:7] = 0.0
    return v


def direct_fp16(values: torch.Tensor, scale_log2: int) -> dict[str, int]:
    h = (values.double() * 2.0**scale_log2).half()
    nonzero = values != 0
    return {
        "zero": int((~nonzero).sum()),
        "flush": int((nonzero & (h == 0)).sum()),
        "subnormal": int((nonzero & (h.abs() < 2.0**-14)).sum()),
        "overflow": int((nonzero & h.isinf()).sum()),
    }


@pytest.mark.parametrize("scale_log2", [0, 8, 16, 24])
def test_histogram_counts_match_a_direct_fp16_cast(scale_log2: int) -> None:
    values = wide_values(5000, avoid=(-25 - scale_log2,))
    hist = raw_histogram(values, 0).tolist()
    counts = fp16range.range_counts(hist, scale_log2)
    direct = direct_fp16(values, scale_log2)
    for key in ("zero", "flush", "subnormal", "overflow"):
        assert counts[key] == direct[key], key
    # predictions from the unscaled exponents agree with the same cast
    pred = fp16range.predict(fp16range.exponent_counts(hist), scale_log2)
    nz = int((values != 0).sum())
    assert pred["flush"] == pytest.approx(direct["flush"] / nz)
    assert pred["subnormal"] == pytest.approx(direct["subnormal"] / nz)


def test_batched_histograms_equal_one_by_one_and_nonfinite_counted() -> None:
    a, b = wide_values(300, 1), wide_values(1000, 2).view(10, 100)
    b[3, 4] = float("inf")
    b[5, 5] = float("nan")
    together = raw_histograms([a, b], 0, {})
    assert torch.equal(together[0], raw_histogram(a, 0))
    assert torch.equal(together[1], raw_histogram(b, 0))
    assert fp16range.range_counts(together[1].tolist())["nonfinite"] == 2


def test_gradient_stats_match_the_gradients_counted_directly(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = mlp()
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        train(model, 1, loss_mul=1e-5)
    assert d.session is not None
    params = {p["name"]: p for p in d.session.section("gradients")["params"]}
    for name, p in model.named_parameters():
        g = p.grad.detach().double().abs()
        nz = g != 0
        rec = params[name]
        assert rec["n"] == g.numel()
        assert rec["zero"] == int((~nz).sum())
        assert rec["flush"] == int((nz & (g < 2.0**-24)).sum())
        assert rec["subnormal"] == int((nz & (g < 2.0**-14)).sum())
        assert rec["norm_last"] == pytest.approx(float(p.grad.norm()), rel=1e-5)


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


def test_activation_gradient_figures_match_the_known_incoming_gradient(tmp_path: Path) -> None:
    # The gradient entering `head` is exactly `w` (loss = sum(out * w)), in float32.
    w = wide_values(64, 3, avoid=(-25, -37, -49)).view(4, 16)
    model = nn.Sequential(nn.Linear(16, 16), Scale())
    x = torch.randn(4, 16)
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        out = model(x)
        (out * w).sum().backward()
        d.step()
    assert d.session is not None
    acts = {m["module"]: m for m in d.session.section("activations")["modules"]}
    row = acts["1"]
    direct = direct_fp16(w, 0)
    for key in ("zero", "flush", "subnormal", "overflow"):
        assert row["counts"][key] == direct[key], key
    nz = int((w != 0).sum())
    for k in (0, 12, 24):
        pred = fp16range.predict({int(e): c for e, c in row["exponents"].items()}, k)
        assert pred["subnormal"] == pytest.approx(direct_fp16(w, k)["subnormal"] / nz)
    # forward range: the module's |output| max, measured directly
    assert row["max_abs"] == pytest.approx(float(out.detach().abs().max()))


def run_fp16(tmp_path: Path, scaler: Any, loss_mul: float, **kw: Any) -> ampdiag.Session:
    torch.manual_seed(0)
    model = mlp()
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        train(model, 3, dtype=torch.float16, scaler=scaler, loss_mul=loss_mul, **kw)
    assert d.session is not None
    return d.session


def ids(session: ampdiag.Session) -> set[str]:
    return {f.id for f in session.all_findings()}


def test_tiny_gradients_without_scaler_flag_underflow_and_missing_scaler(tmp_path: Path) -> None:
    s = run_fp16(tmp_path / "a", None, 1e-4)
    assert {"fp16-grad-underflow", "grad-scaler-missing"} <= ids(s)
    f = next(f for f in s.all_findings() if f.id == "fp16-grad-underflow")
    assert f.evidence["underflow_fraction"] > 0.2
    assert f.evidence["recommended_init_scale"] >= 2.0**8
    s2 = run_fp16(tmp_path / "b", torch.amp.GradScaler("cpu", init_scale=2.0**16), 1e-4)
    assert not {"fp16-grad-underflow", "grad-scaler-missing"} & ids(s2)


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_an_inf_injected_into_one_step_is_one_skipped_step(tmp_path: Path, fused: bool) -> None:
    def inject(i: int, model: nn.Module, opt: Any, scaler: Any) -> None:
        if i == 1:
            model[0].weight.grad[0, 0] = float("inf")

    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        train(
            model,
            4,
            dtype=torch.float16,
            scaler=torch.amp.GradScaler("cpu", init_scale=2.0**8),
            optimizer=opt,
            hook=inject,
        )
    assert d.session is not None
    sc = d.session.section("scaler")
    assert sc["skipped_steps"] == [1]
    assert sc["backoff_steps"] == [1]
    assert [h["scale"] for h in sc["history"]] == [256.0, 256.0, 128.0, 128.0]
    f = next(f for f in d.session.all_findings() if f.id == "skipped-steps")
    assert (f.evidence["skipped"], f.evidence["steps"]) == (1, 4)
    assert d.session.section("gradients")["totals"]["nonfinite"] == 1


def test_disabled_scaler_is_flagged(tmp_path: Path) -> None:
    with pytest.warns(UserWarning):
        scaler = torch.amp.GradScaler()  # "cuda" by default: disables itself on a CPU run
    s = run_fp16(tmp_path, scaler, 1.0)
    f = next(f for f in s.all_findings() if f.id == "grad-scaler-disabled")
    assert f.evidence["enabled"] is False
    assert "grad-scaler-missing" not in ids(s)


def test_clip_before_unscale_is_flagged_and_after_is_not(tmp_path: Path) -> None:
    def clip_first(i: int, model: nn.Module, opt: Any, scaler: Any) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    def clip_after(i: int, model: nn.Module, opt: Any, scaler: Any) -> None:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    original = torch.nn.utils.clip_grad_norm_
    s = run_fp16(tmp_path / "a", torch.amp.GradScaler("cpu"), 1.0, hook=clip_first)
    f = next(f for f in s.all_findings() if f.id == "clip-before-unscale")
    assert f.evidence["clips_on_scaled_grads"] == 3
    assert f.evidence["scale"] == 2.0**16
    s2 = run_fp16(tmp_path / "b", torch.amp.GradScaler("cpu"), 1.0, hook=clip_after)
    assert "clip-before-unscale" not in ids(s2)
    assert s2.section("scaler")["clip_events"]
    # the patch is gone after the block
    assert torch.nn.utils.clip_grad_norm_ is original


class NaNAt(nn.Module):
    def __init__(self, step: int) -> None:
        super().__init__()
        self.calls = 0
        self.step = step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls - 1 == self.step:
            return x * float("nan")
        return x


def test_nan_produced_in_a_known_module_is_located_there(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), NaNAt(2), nn.Linear(16, 4))
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        train(model, 4, dtype=torch.float16, scaler=torch.amp.GradScaler("cpu"))
    assert d.session is not None
    origin = d.session.section("activations")["nonfinite_origin"]
    assert origin == {"step": 2, "phase": "forward", "module": "2", "kind": "output"}
    f = next(f for f in d.session.all_findings() if f.id == "nonfinite-origin")
    assert (f.evidence["module"], f.evidence["step"]) == ("2", 2)


def test_optimizer_step_bypassing_the_scaler_is_flagged(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        for _ in range(2):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(4, 8)).float().pow(2).mean()
            scaler.scale(loss).backward()
            opt.step()
            d.step()
    assert d.session is not None
    f = next(f for f in d.session.all_findings() if f.id == "scaler-step-bypassed")
    assert f.evidence["bypassed"] == 2


def test_fp16_parameters_are_flagged(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = mlp().half()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(4, 8).half()).float().pow(2).mean().backward()
            opt.step()
    assert d.session is not None
    f = next(f for f in d.session.all_findings() if f.id == "low-precision-params")
    assert f.evidence["low_precision_params"] == 4
    assert f.evidence["low_precision_numel"] == sum(p.numel() for p in model.parameters())
    assert f.evidence["dtypes"] == {"float16": 4}


def test_patches_and_hooks_are_removed_on_error(tmp_path: Path) -> None:
    step, unscale = torch.amp.GradScaler.step, torch.amp.GradScaler.unscale_
    model = mlp()
    with pytest.raises(RuntimeError, match="boom"), ampdiag.diagnose(out=tmp_path, **QUIET):
        model(torch.randn(2, 8)).sum().backward()
        raise RuntimeError("boom")
    assert torch.amp.GradScaler.step is step and torch.amp.GradScaler.unscale_ is unscale
    assert all(not m._forward_hooks for m in model.modules())
    assert math.isfinite(float(model(torch.randn(2, 8)).sum().detach()))


def test_fp32_computed_names_the_parameters_autocast_leaves_in_fp32() -> None:
    """Truth: autocast casts a Linear's weight and bias, and runs an embedding in FP32."""
    from ampdiag.sources.live.collectors.gradients import fp32_computed

    emb, lin = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2)
    idx = torch.tensor([1, 2, 3])
    with torch.autocast("cpu", dtype=torch.float16):
        loss = lin(emb(idx)).float().sum()
    assert fp32_computed(loss.grad_fn) == {id(emb.weight)}
    plain = lin(emb(idx)).sum()  # no autocast: nothing to tell apart
    assert fp32_computed(plain.grad_fn) == set()
