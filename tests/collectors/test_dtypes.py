"""The precision audit on a real model under CPU bf16 and fp16 autocast."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

import ampdiag
from ampdiag.sources.live.collectors import dtype_audit
from ampdiag.sources.live.collectors.dtype_audit import REASONS
from tests.precision_model import AuditNet, batch, train_step

QUIET = {"profile": False, "report": False, "tensorboard": False, "console": False}
DTYPES = [torch.bfloat16, torch.float16]


def _run(model: AuditNet, dtype: torch.dtype, steps: int, out: Path | None, **kw: Any) -> list:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if out is None:
        return [train_step(model, opt, dtype, s) for s in range(steps)]
    with ampdiag.diagnose(model, opt, out=out, **QUIET, **kw) as d:
        losses = [train_step(model, opt, dtype, s) for s in range(steps)]
    return [losses, d]


def _pair(dtype: torch.dtype, tmp_path: Path, steps: int = 3) -> tuple[Any, ...]:
    torch.manual_seed(0)
    plain = AuditNet()
    audited = copy.deepcopy(plain)
    losses0 = _run(plain, dtype, steps, None)
    losses1, d = _run(audited, dtype, steps, tmp_path / "run")
    return plain, audited, losses0, losses1, d


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_audit_is_bit_identical_including_custom_ops(dtype: torch.dtype, tmp_path: Path) -> None:
    plain, audited, losses0, losses1, d = _pair(dtype, tmp_path)
    sec = d.session.sections["precision"]
    assert sec["audited"] and sec["step"] == 1 and not sec["errors"]
    assert [x.item() for x in losses0] == [x.item() for x in losses1]
    for (name, p), q in zip(plain.named_parameters(), audited.parameters(), strict=True):
        assert torch.equal(p, q), name
    # The custom op's body ran under autocast, as without the audit: its output is low precision.
    mix = [r for r in sec["ops"] if r["op"] == "ampdiag_test::mix"]
    assert mix and mix[0]["out_dtypes"] == [str(dtype).removeprefix("torch.")]
    assert "ampdiag_test::mix" in sec["reenabled_autocast_ops"]


def test_without_reenabling_autocast_a_custom_op_would_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard is needed: a plain dispatch mode runs the custom op's body in FP32."""
    monkeypatch.setattr(dtype_audit.ac, "op_has_autocast_kernel", lambda op, dev: True)
    plain, audited, _, _, d = _pair(torch.bfloat16, tmp_path)
    mix = [r for r in d.session.sections["precision"]["ops"] if r["op"] == "ampdiag_test::mix"]
    assert mix[0]["out_dtypes"] == ["float32"]
    assert any(
        not torch.equal(p, q) for p, q in zip(plain.parameters(), audited.parameters(), strict=True)
    )


EXPECTED = {
    # (phase, module, op): reason
    ("forward", "stem", "mse_loss"): "autocast-fp32-policy",
    ("forward", "<root>", "add"): "promotion",
    ("forward", "block.ln", "native_layer_norm"): "promotion",
    ("forward", "block", "add"): "promotion",
    ("forward", "<root>", "ampdiag_test::halve"): "unknown-op",
    ("forward", "head", "_log_softmax"): "user-cast",
    ("forward", "<outside>", "nll_loss_forward"): "outside-autocast",
    ("backward", "<outside>", "nll_loss_backward"): "outside-autocast",
    ("backward", "head", "_log_softmax_backward_data"): "user-cast",
    ("backward", "block.ln", "native_layer_norm_backward"): "promotion",
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_fp32_op_has_its_module_and_reason(dtype: torch.dtype, tmp_path: Path) -> None:
    *_, d = _pair(dtype, tmp_path, steps=2)
    ops = d.session.sections["precision"]["ops"]
    low = str(dtype).removeprefix("torch.")
    fp32 = [r for r in ops if r["precision"] == "fp32" and r["phase"] != "other"]
    got = {(r["phase"], r["module"], r["op"]): r["reason"] for r in fp32}
    for key, reason in EXPECTED.items():
        assert got.get(key) == reason, (key, got.get(key))
    for r in fp32:
        assert r["reason"] in REASONS, r
        assert "float32" in r["out_dtypes"] or "float64" in r["out_dtypes"]
        if r["module"] == "<outside>":
            assert r["reason"] == "outside-autocast" and not r["autocast"], r
        if r["module"] == "head":
            assert r["reason"] == "user-cast", r
    # Matmuls and convolutions ran in low precision, under autocast, in their modules.
    for module, op in [
        ("block.attn.qkv", "addmm"),
        ("stem.conv", "convolution"),
        ("block.attn", "bmm"),
        ("head.proj", "addmm"),
    ]:
        rows = [r for r in ops if r["module"] == module and r["op"] == op]
        assert rows and all(r["precision"] == "low" and r["autocast"] for r in rows), module
        assert rows[0]["out_dtypes"] == [low]
    # Backward ops are attributed to the module whose backward they are.
    bw = {(r["module"], r["op"]) for r in ops if r["phase"] == "backward"}
    assert ("stem.conv", "convolution_backward") in bw
    assert ("block.attn.qkv", "mm") in bw
    # The user's .float() is a user cast in the head; autocast's weight casts are its own.
    casts = [r for r in ops if r["precision"] == "cast" and r["phase"] == "forward"]
    assert {(r["module"], r["cast_origin"]) for r in casts} >= {
        ("head", "user"),
        ("block.attn.qkv", "autocast"),
        ("stem.conv", "autocast"),
    }


def test_flops_match_torch_flop_counter(tmp_path: Path) -> None:
    """The audited step's FLOPs equal FlopCounterMode's count of the same step."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = AuditNet()
    twin = copy.deepcopy(model)
    _, d = _run(model, torch.bfloat16, 2, tmp_path / "run")
    audited = sum(
        r["flops"] for r in d.session.sections["precision"]["ops"] if r["phase"] != "other"
    )
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    train_step(twin, opt, torch.bfloat16, 0)
    x, y = batch(1)
    counter = FlopCounterMode(display=False)
    with counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = twin(x)
        F.nll_loss(out, y).backward()
    assert audited == counter.get_total_flops() > 0


def test_nothing_left_behind_and_short_run_not_audited(tmp_path: Path) -> None:
    from torch.nn.modules import module as nn_module

    float_before = torch.Tensor.float
    hooks_before = (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks))
    torch.manual_seed(0)
    _, d = _run(AuditNet(), torch.bfloat16, 1, tmp_path / "run")
    sec = d.session.sections["precision"]
    assert sec["audited"] is False and "precision_step=0" in sec["not_audited_reason"]
    _, d = _run(AuditNet(), torch.bfloat16, 1, tmp_path / "run0", precision_step=0)
    assert d.session.sections["precision"]["audited"] is True
    assert torch.Tensor.float is float_before
    assert torch._C._len_torch_dispatch_stack() == 0
    assert (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks)) == (
        hooks_before
    )


def test_error_in_step_still_leaves_the_mode(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = AuditNet()
    with pytest.raises(RuntimeError, match="boom"):  # noqa: SIM117
        with ampdiag.diagnose(model, out=tmp_path / "run", precision_step=0, **QUIET):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(batch(0)[0])
            raise RuntimeError("boom")
    assert torch._C._len_torch_dispatch_stack() == 0
