"""``ampdiag.integrations.hf.DiagnoseCallback``: a window of a Hugging Face Trainer's steps.

A tiny GPT-2 from a config, bf16 on the CPU, gradient accumulation. Truth from the Trainer
itself, measured without ampdiag: the same run without the callback (its final parameters),
and a callback of the test's own that records, at each ``on_step_begin`` and ``on_step_end``,
``state.global_step``, the loss ``compute_loss`` returned in that step, and torch's global
hook dicts (what ampdiag has installed outside the window).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import ampdiag
from tests.frameworks.conftest import SETTINGS
from tests.test_step_window import installed

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

STEPS = 10
WINDOW = (4, 7)
ACCUM = 2
VOCAB = 64
SEQ = 16


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Record(transformers.TrainerCallback):  # type: ignore[misc]
    """The Trainer's own view: the step counter and what is installed at each step's edges."""

    def __init__(self) -> None:
        self.begin: list[tuple[int, tuple[int, int, int, int, bool]]] = []
        self.end: list[int] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.begin.append((state.global_step, installed()))

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.end.append(state.global_step)


class Losses(transformers.Trainer):  # type: ignore[misc]
    """The Trainer, keeping the loss of each micro-batch by the optimizer step it belongs to."""

    losses: dict[int, list[float]]
    spike_at: int | None = None

    def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
        out = super().compute_loss(*args, **kwargs)
        if self.state.global_step == self.spike_at:  # the injected spike
            out = out * 20.0
        loss = out[0] if isinstance(out, tuple) else out
        self.losses.setdefault(self.state.global_step, []).append(float(loss.detach()))
        return out


def train(
    tmp_path: Path, callbacks: list[Any], steps: int = STEPS, spike_at: int | None = None
) -> tuple[Any, Losses]:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg)  # dropout 0.1: the RNG must be left alone too
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        use_cpu=True,
        bf16=True,
        max_steps=steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=ACCUM,
        learning_rate=1e-3,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Losses(model=model, args=args, train_dataset=Tokens(96), callbacks=callbacks)
    trainer.losses = {}
    trainer.spike_at = spike_at
    trainer.train()
    return model, trainer


def test_callback_diagnoses_the_window_and_leaves_training_bit_identical(tmp_path: Path) -> None:
    from ampdiag.integrations.hf import DiagnoseCallback

    before = installed()
    plain_model, _ = train(tmp_path / "plain", [])
    record = Record()
    callback = DiagnoseCallback(steps=WINDOW, out=tmp_path / "diag", **SETTINGS)
    model, trainer = train(tmp_path / "diag-run", [record, callback])
    assert installed() == before
    # Bit-identical training: every parameter equals the run without the callback.
    plain_params = dict(plain_model.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, plain_params[name]), name
    # The session holds the window's steps, numbered as the Trainer numbers them, with the
    # Trainer's own losses: the sum of the step's micro-batch losses (each one already
    # divided by the step's token count: the Trainer passes num_items_in_batch).
    session = callback.session
    assert session is not None and session.status == "ok"
    assert ampdiag.load(tmp_path / "diag").steps == session.steps
    assert trainer.state.global_step == STEPS and record.end == list(range(1, STEPS + 1))
    assert [s["index"] for s in session.steps] == list(range(*WINDOW))
    assert [s["micro_batches"] for s in session.steps] == [ACCUM] * (WINDOW[1] - WINDOW[0])
    expected = [sum(trainer.losses[i]) for i in range(*WINDOW)]
    assert [s["loss"] for s in session.steps] == pytest.approx(expected, rel=1e-3)
    # The model the Trainer ran, the optimizer it built, the autocast Accelerate entered.
    run = session.sections["run"]
    assert run["models"][0]["class"] == "GPT2LMHeadModel"
    assert run["autocast_seen"] == {"cpu:bfloat16": (WINDOW[1] - WINDOW[0]) * ACCUM}
    assert session.sections["profiler"]["recorded_steps"]
    assert session.findings
    # Before the window only the sentinel watches (the loss's backward patch throughout;
    # torch's module hooks only while the first step finds the model, the root's class call
    # after it); after it nothing of ampdiag's is installed (torch's hook dicts as before).
    early = [hooks for step, hooks in record.begin if step <= WINDOW[0]]
    assert early[0][0] == before[0] + 1 and all(h[4] for h in early)
    assert all(h[:2] == before[:2] for h in early[1:])
    late = [hooks for step, hooks in record.begin if step >= WINDOW[1]]
    assert late == [before] * (STEPS - WINDOW[1])
    assert session.sections["sentinel"]["steps_watched"] == WINDOW[1]  # from step 0
    inside = [hooks for step, hooks in record.begin if WINDOW[0] < step < WINDOW[1]]
    assert all(h[0] > before[0] for h in inside)


def test_loss_spike_trigger_opens_the_window_after_the_injected_spike(tmp_path: Path) -> None:
    from ampdiag.integrations.hf import DiagnoseCallback

    steps, spike_at = 16, 11
    plain_model, _ = train(tmp_path / "plain", [], steps=steps, spike_at=spike_at)
    callback = DiagnoseCallback(
        trigger="loss-spike", trigger_steps=3, out=tmp_path / "diag", **SETTINGS
    )
    model, trainer = train(tmp_path / "run", [callback], steps=steps, spike_at=spike_at)
    plain_params = dict(plain_model.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, plain_params[name]), name
    session = callback.session
    assert session is not None and session.status == "ok"
    spike = session.sections["run"]["window"]["spike"]
    assert spike["step"] == spike_at
    assert spike["loss"] == pytest.approx(sum(trainer.losses[spike_at]), rel=1e-3)
    assert [s["index"] for s in session.steps] == [spike_at + 1, spike_at + 2, spike_at + 3]


SCRIPT = """
import sys, torch, transformers
from ampdiag.integrations.hf import DiagnoseCallback
from tests.frameworks.test_window_hf import Tokens, VOCAB, SEQ

class Failing(transformers.Trainer):
    def compute_loss(self, *args, **kwargs):
        if self.state.global_step == 5:
            raise RuntimeError("boom at step 5")
        return super().compute_loss(*args, **kwargs)

torch.manual_seed(0)
cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2)
args = transformers.TrainingArguments(
    output_dir=sys.argv[1] + "/hf", use_cpu=True, max_steps=8, per_device_train_batch_size=4,
    save_strategy="no", report_to=[], disable_tqdm=True, logging_steps=1000,
)
callback = DiagnoseCallback(steps=(3, 7), out=sys.argv[1] + "/diag", report=False,
                            tensorboard=False, console=False, speed_probe=False)
Failing(model=transformers.GPT2LMHeadModel(cfg), args=args, train_dataset=Tokens(64),
        callbacks=[callback]).train()
"""


def test_a_script_that_dies_inside_the_window_still_leaves_its_session(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and "boom at step 5" in proc.stderr
    session = ampdiag.load(tmp_path / "diag")
    assert session.status == "error" and "boom at step 5" in str(session.error)
    assert [s["index"] for s in session.steps] == [3, 4]
