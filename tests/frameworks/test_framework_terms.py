"""Fixes in the user's own terms: runs in the style of public training scripts.

HF ``run_clm.py`` (``HfArgumentParser`` + the Trainer, ``--fp16`` on a CPU), Accelerate asked
for fp16 on a CPU, Lightning with ``precision="32-true"``, and a timm ``train.py``-style loop
(``--amp --amp-dtype``, ``--grad-accum-steps``, a frozen EMA copy held by the called module),
all written from scratch. Each asserts the finding against the framework's own record (its
arguments, the autocast a hook on the first layer saw, the parameters its optimizer holds)
and that the fix names the framework's setting first, then the plain loop's code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.session import Session
from tests.advice_scan import native_bf16_cpu
from tests.frameworks import timm_style
from tests.frameworks.conftest import SETTINGS, AutocastRecorder

pytestmark = pytest.mark.slow

#: No timing finding may decide what these tests read: the A/B and the speed probe are off.
QUIET = SETTINGS | {"speed_probe": False}
PLAIN = "# In a plain training loop:"


def one(session: Session, fid: str) -> Any:
    found = [f for f in session.all_findings() if f.id == fid]
    assert len(found) == 1, [f.id for f in session.all_findings()]
    return found[0]


def setting_then_loop(fix: str, setting: str) -> None:
    """The framework's setting comes first; the plain loop's code after it."""
    assert setting in fix and PLAIN in fix, fix
    assert fix.index(setting) < fix.index(PLAIN) < fix.index("torch.autocast"), fix


def test_trainer_fp16_flag_on_a_cpu_is_told_bf16(
    tmp_path: Path, accelerate_state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers = pytest.importorskip("transformers")
    argv = ["run_clm.py", "--output_dir", str(tmp_path / "o"), "--fp16", "--max_steps", "3",
            "--per_device_train_batch_size", "4", "--report_to", "none", "--use_cpu",
            "--save_strategy", "no"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    (args,) = transformers.HfArgumentParser(
        transformers.TrainingArguments
    ).parse_args_into_dataclasses()
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                                  bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (16, 16), generator=g)
    data = [{"input_ids": row, "labels": row} for row in ids]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    truth = AutocastRecorder(model.transformer.h[0])
    with ampdiag.diagnose(out=tmp_path / "diag", **QUIET) as d:
        trainer.train()
    truth.close()
    session = d.session
    assert session is not None
    # the Trainer's truth: asked for fp16, and on a CPU no forward ran under autocast
    assert args.fp16 and truth.counts() == {"none": 3}
    assert session.environment["framework"] == {
        "name": "hf-trainer",
        "precision": "fp16",
        "flags": ["--fp16"],
    }
    f = one(session, "low-precision-inactive")
    assert "Trainer" in f.title and "FP16" in f.title and "no autocast" in f.title
    # the lever is the Trainer's flag, not Accelerate's constructor it never wrote: BF16 where
    # this CPU runs it natively; where it emulates BF16 (slower than FP32), FP32 is kept
    assert "Accelerator(" not in f.fix
    if native_bf16_cpu():
        assert f.severity == "high"
        setting_then_loop(f.fix, "TrainingArguments(..., bf16=True, fp16=False)")
        assert "--bf16 (instead of --fp16)" in f.fix
    else:
        assert f.severity == "low"
        setting_then_loop(f.fix, "TrainingArguments(..., bf16=False, fp16=False)")


def test_accelerate_fp16_on_a_cpu_is_told_mixed_precision_bf16(
    tmp_path: Path, accelerate_state: Any
) -> None:
    acc = accelerate_state.Accelerator(mixed_precision="fp16", cpu=True)
    assert not acc.native_amp and acc.scaler is None  # Accelerate's truth: no autocast
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    with ampdiag.diagnose(out=tmp_path / "diag", **(QUIET | {"profile": False})) as d:
        for _ in range(3):
            acc.backward(model(torch.randn(8, 32)).pow(2).mean())
            opt.step()
            opt.zero_grad()
    session = d.session
    assert session is not None
    assert session.environment["framework"]["name"] == "accelerate"
    f = one(session, "low-precision-inactive")
    assert f.title.startswith("Accelerate was asked for FP16, which on a CPU enters no autocast")
    want = "bf16" if native_bf16_cpu() else "no"  # FP32 where this CPU emulates BF16
    setting_then_loop(f.fix, f'Accelerator(mixed_precision="{want}")')


def test_lightning_32_true_is_told_bf16_mixed(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")

    class Classifier(L.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    data = torch.utils.data.TensorDataset(torch.randn(32, 32), torch.randint(0, 4, (32,)))
    module = Classifier()
    trainer = L.Trainer(
        accelerator="cpu",
        precision="32-true",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path / "pl"),
    )
    truth = AutocastRecorder(module.net[0])
    with ampdiag.diagnose(out=tmp_path / "diag", **QUIET) as d:
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    truth.close()
    session = d.session
    assert session is not None
    assert trainer.precision == "32-true" and truth.counts() == {"none": 3}
    assert session.environment["framework"] == {"name": "lightning", "precision": "32-true"}
    f = one(session, "amp-off")
    setting_then_loop(f.fix, 'Trainer(..., precision="bf16-mixed")')


def _below_fp16_normal(loss_mult: float, scale: float) -> float:
    """Truth without ampdiag: the share of the first micro-batch's parameter-gradient elements,
    computed in FP32 with the scaler's initial scale, below FP16's normal range (2^-14)."""
    torch.manual_seed(0)
    net = timm_style.Net()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 8, 8, generator=g)
    y = torch.randint(0, 10, (8,), generator=g)
    (nn.functional.cross_entropy(net(x), y) * loss_mult * scale / 2).backward()
    grads = torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None])
    return float((grads.abs() < 2.0**-14).float().mean())


def test_timm_style_fp16_underflow_is_told_amp_dtype_bfloat16(tmp_path: Path) -> None:
    argv = ["--amp", "--amp-dtype", "float16", "--grad-accum-steps", "2", "--loss-mult", "1e-7"]
    record = timm_style.train(argv, tmp_path / "diag", **QUIET)
    session = record["session"]
    truth = _below_fp16_normal(1e-7, 2.0**16)
    assert truth > 0.5  # most gradients fall out of FP16's normal range
    assert session.environment["framework"] == {
        "name": "script",
        "flags": ["--amp", "--amp-dtype", "float16"],
    }
    under = one(session, "fp16-grad-underflow")
    assert under.evidence["param_grad_subnormal_fraction"] == pytest.approx(truth, abs=0.05)
    f = one(session, "prefer-bf16")
    setting_then_loop(f.fix, "--amp --amp-dtype bfloat16")


def test_timm_style_ema_wrapper_healthy_bf16(tmp_path: Path) -> None:
    # the healthy control: BF16, accumulation over 2 micro-batches, a frozen EMA copy held
    # by the module the loop calls
    argv = ["--amp", "--amp-dtype", "bfloat16", "--grad-accum-steps", "2", "--model-ema"]
    record = timm_style.train(argv, tmp_path / "diag", **QUIET)
    session = record["session"]
    updated, held = record["updated_parameters"], record["held_parameters"]
    assert held == 2 * updated  # the script's truth: the EMA copy doubles what the module holds
    (model,) = session.sections["run"]["models"]
    assert model["parameters"] == updated
    assert model["frozen_parameters"] == held - updated and model["frozen_in"] == ["ema"]
    state = session.sections["memory"]["model_state"]
    assert state["parameter_count"] == updated
    assert state["frozen_parameter_count"] == held - updated
    # forwards per step: counted from the step's first forward (step 0's included)
    steps = session.sections["accumulation"]["steps"]
    assert steps and steps[0]["step"] == 0
    assert [s["forwards"] for s in steps] == [record["micro_per_step"][s["step"]] for s in steps]
    alarms = [(f.id, f.severity) for f in session.findings if f.severity in ("high", "medium")]
    assert alarms == []


def test_hf_gpt2_attention_dropout_on_a_cpu_is_sdpas_math_fallback(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2, n_head=2,
                                  attn_pdrop=0.1, resid_pdrop=0.0, embd_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).train()
    assert model.config._attn_implementation == "sdpa"  # the model is already on SDPA
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with ampdiag.diagnose(out=tmp_path / "diag", **QUIET) as d:
        for _ in range(3):
            ids = torch.randint(0, 64, (4, 32), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    session = d.session
    assert session is not None
    sec = session.sections["precision"]
    (call,) = sec["sdpa"]
    assert call["dropout_p"] == 0.1 and call["math"] and not call["fused"]
    bmm = [r for r in sec["ops"] if r["op"] == "bmm" and r["precision"] == "fp32"]
    assert bmm and {r["reason"] for r in bmm} == {"sdpa-math-fallback"}
    texts = [f.fix for f in session.all_findings()]
    texts += list(session.sections["derived"]["precision"]["reason_fixes"].values())
    assert not any("F.scaled_dot_product_attention instead" in t for t in texts)
    assert any("dropout_p=0.1 on the CPU" in t and "attn_pdrop=0.0" in t for t in texts)


def test_run_clm_from_scratch_is_told_its_own_config_override(
    tmp_path: Path, accelerate_state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_clm.py builds its model from ``--config_overrides``: SDPA's fix is one more there."""
    transformers = pytest.importorskip("transformers")
    from dataclasses import dataclass

    @dataclass
    class ModelArguments:  # run_clm.py's, the two fields a from-scratch run sets
        model_type: str | None = None
        config_overrides: str | None = None

    given = "n_embd=32,n_layer=1,n_head=2,n_positions=64,vocab_size=64,attn_pdrop=0.1"
    argv = ["run_clm.py", "--model_type", "gpt2", "--config_overrides", given,
            "--output_dir", str(tmp_path / "o"), "--bf16", "--max_steps", "2",
            "--per_device_train_batch_size", "4", "--report_to", "none", "--use_cpu",
            "--save_strategy", "no"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    model_args, args = transformers.HfArgumentParser(
        (ModelArguments, transformers.TrainingArguments)
    ).parse_args_into_dataclasses()
    cfg = transformers.CONFIG_MAPPING[model_args.model_type]()
    cfg.update_from_string(model_args.config_overrides)  # as run_clm.py does
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (8, 64), generator=g)
    data = [{"input_ids": row, "labels": row} for row in ids]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    with ampdiag.diagnose(out=tmp_path / "diag", **QUIET) as d:
        trainer.train()
    assert d.session is not None
    f = one(d.session, "fp32-ops-in-autocast")
    assert "sdpa-math-fallback" in f.evidence["reasons"], f.evidence["reasons"]
    (line,) = [ln for ln in f.fix.splitlines() if ln.startswith("--config_overrides ")]
    # the fix, applied as run_clm.py applies it: dropout 0, the user's other settings kept
    fixed = transformers.CONFIG_MAPPING["gpt2"]()
    fixed.update_from_string(line.split()[1])
    assert fixed.attn_pdrop == 0.0
    assert (fixed.n_embd, fixed.n_layer, fixed.n_positions) == (32, 1, 64)
