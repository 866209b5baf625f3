"""Patterns of public training scripts, rewritten small (none of their code is copied).

- pytorch/examples word_language_model: an LSTM language model whose hidden state is carried
  from batch to batch (detached: "repackaged"), hand-written SGD (``p.data.add_``, no
  optimizer), ``clip_grad_norm_``, evaluation under ``no_grad``, and a whole-model
  ``torch.save`` at the end; here under bf16 autocast, so the carried state is bf16.
- pytorch/examples mnist: a conv net with dropout, Adadelta and StepLR, a test loop under
  ``no_grad`` each epoch, ``state_dict`` saved.
- nanoGPT: a GPT with tied embedding/head weights, AdamW with decay/no-decay groups, a
  GradScaler, gradient accumulation, clipping after ``unscale_``, ``estimate_loss`` in eval
  mode under ``no_grad`` inside the loop, and ``generate`` at the end.
- minGPT: a trainer whose per-iteration callback generates tokens every few iterations.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.compat_suite.harness import CONFIGS, same_under_diagnose

params = pytest.mark.parametrize("settings", list(CONFIGS.values()), ids=list(CONFIGS))


class RNNModel(nn.Module):
    def __init__(self, ntoken: int = 40, ninp: int = 12, nhid: int = 12) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 2, dropout=0.2)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x: torch.Tensor, hidden: Any) -> tuple[torch.Tensor, Any]:
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return F.log_softmax(self.decoder(self.drop(out)), dim=-1), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = next(self.parameters())
        return w.new_zeros(2, bsz, 12), w.new_zeros(2, bsz, 12)


def repackage(h: Any) -> Any:
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage(v) for v in h)


def word_language_model(block: contextlib.AbstractContextManager[Any]) -> Any:
    model = RNNModel()
    data = torch.randint(0, 40, (60, 4))
    bptt, lr = 6, 2.0
    hidden: Any = model.init_hidden(4)
    losses, evals = [], []
    with block:
        model.train()
        for i in range(0, data.size(0) - 1 - bptt, bptt):
            x, y = data[i : i + bptt], data[i + 1 : i + 1 + bptt].reshape(-1)
            model.zero_grad()
            hidden = repackage(hidden)  # carried: bf16 after the first batch under autocast
            with torch.autocast("cpu", torch.bfloat16):
                out, hidden = model(x, hidden)
            loss = F.nll_loss(out.float().view(-1, 40), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            losses.append(loss.detach())
            if i % (3 * bptt) == 0:
                model.eval()
                with torch.no_grad():
                    h = model.init_hidden(4)
                    out, h = model(data[:bptt], h)
                    evals.append(out)
                model.train()
        buf = io.BytesIO()
        torch.save(model, buf)
    buf.seek(0)
    return model, losses, evals, torch.load(buf, weights_only=False)


@params
def test_word_language_model(settings: dict[str, Any], tmp_path: Path) -> None:
    session = same_under_diagnose(word_language_model, settings, tmp_path)
    # no optimizer: the loop's steps come from elsewhere, but nothing may fail
    probe = session["speed_probe"]
    assert "error" not in probe, probe.get("error")
    assert "error" not in (probe.get("precisions") or {}), probe["precisions"]
