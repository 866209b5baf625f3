"""Hugging Face Trainer (GPT-2 and BERT from tiny configs, bf16 on the CPU) under diagnose().

Trainer with ``bf16=True`` enters autocast through Accelerate, which wraps ``model.forward``:
autocast starts after the model's forward pre-hooks. Truth: ``trainer.state.global_step``,
``gradient_accumulation_steps``, and the autocast state a hook on a transformer block reads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

import ampdiag
from tests.frameworks.conftest import SETTINGS, AutocastRecorder, assert_attribution, micro_batches

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

ACCUM = 2
STEPS = 6
#: Every step after the profiler's warm-up step is profiled (the split is summed over them).
PROFILED = STEPS - 1
VOCAB = 64
SEQ = 16


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, classify: bool) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.classify = classify

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        labels = self.labels[i] if self.classify else self.ids[i]
        return {"input_ids": self.ids[i], "labels": labels}


class MicroBatches(transformers.TrainerCallback):  # type: ignore[misc]
    """The Trainer's own record of each optimizer step's micro-batches (its callbacks)."""

    def __init__(self) -> None:
        self.per_step: list[int] = []
        self._pending = 0

    def on_substep_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._pending += 1

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.per_step.append(self._pending + 1)
        self._pending = 0


class Timed(transformers.Trainer):  # type: ignore[misc]
    """The Trainer, with the thread CPU time of each micro-batch's forward (with the loss) and
    backward (the rest of ``training_step``) by optimizer step, measured around its calls."""

    walls: dict[int, list[float]]

    def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        out = super().compute_loss(*args, **kwargs)
        self._forward_s = time.thread_time() - t0
        return out

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        self._forward_s = 0.0
        t0 = time.thread_time()
        out = super().training_step(*args, **kwargs)
        total = time.thread_time() - t0
        wall = self.walls.setdefault(self.state.global_step, [0.0, 0.0])
        wall[0] += self._forward_s
        wall[1] += total - self._forward_s
        return out


def _model(kind: str) -> tuple[Any, torch.nn.Module]:
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=VOCAB,
            n_positions=SEQ,
            n_embd=32,
            n_layer=2,
            n_head=2,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = transformers.GPT2LMHeadModel(cfg)
        return model, model.transformer.h[0]
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        num_labels=2,
    )
    model = transformers.BertForSequenceClassification(cfg)
    return model, model.bert.encoder.layer[0]


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_trainer_bf16(tmp_path: Path, kind: str) -> None:
    model, block = _model(kind)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        use_cpu=True,
        bf16=True,
        max_steps=STEPS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=ACCUM,
        learning_rate=1e-3,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    counted = MicroBatches()
    trainer = Timed(
        model=model,
        args=args,
        train_dataset=Tokens(64, classify=kind == "bert"),
        callbacks=[counted],
    )
    trainer.walls = {}
    truth = AutocastRecorder(block)
    settings = SETTINGS | {"profile_active": PROFILED}
    with ampdiag.diagnose(out=tmp_path / "diag", **settings) as d:
        trainer.train()
        trained = truth.counts()
    probed = truth.states[sum(trained.values()) :]
    truth.close()
    session = d.session
    assert session is not None and session.status == "ok"
    run = session.sections["run"]
    # Discovery: the Trainer's model and the optimizer it built.
    assert run["models"][0]["class"] == type(trainer.model).__name__
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    assert run["optimizers"] == [type(inner).__name__]
    # Steps: one per optimizer update, with the micro-batches the Trainer's callbacks saw.
    assert trainer.state.global_step == STEPS
    assert len(session.steps) == STEPS
    assert counted.per_step == [args.gradient_accumulation_steps] * STEPS
    assert micro_batches(session) == counted.per_step
    # Autocast: the state the block ran in, once per forward, wherever Accelerate entered it.
    assert trained == {"cpu:bfloat16": STEPS * ACCUM}
    assert run["autocast_seen"] == trained
    assert session.environment["autocast"] == "cpu:bfloat16"
    # The speed probe compared FP32 with bf16: its FP32 passes really ran without autocast.
    probe = session.sections["speed_probe"]
    assert probe["skipped"] is None and probe["autocast"] == "cpu:bfloat16"
    # Each precision's forwards, as the recorder saw them, are its observed pass, its timed
    # passes (FP32 more than bf16's one when bf16's first was already 2x FP32's least:
    # `one_round`) and, where bf16 was not measured faster, the per-module forwards: one in
    # FP32, two in bf16. An FP16 the CPU emulates is not run: no forward under FP16 autocast.
    rows = {r["precision"]: r for r in probe["precisions"]["results"]}
    per_module = rows["bf16"]["faster"] is not True
    assert probed.count(None) == 1 + len(rows["fp32"]["times_ms"]) + per_module > 1
    assert probed.count("cpu:bfloat16") == 1 + len(rows["bf16"]["times_ms"]) + 2 * per_module
    if rows["fp16"]["not_run"]:
        assert "cpu:float16" not in probed
    # The audit saw the matmuls run in bf16 with autocast active.
    assert session.sections["precision"]["autocast_dtypes"] == {"cpu": "bfloat16"}
    ids = {f.id for f in session.findings}
    assert not ids & {"low-precision-inactive", "amp-off", "grad-scaler-missing"}
    # The step split: the forward Accelerate wraps counts as forward, accelerator.backward()
    # as backward, in every profiled step (against the CPU time around those calls).
    assert_attribution(session, trainer.walls, PROFILED)
