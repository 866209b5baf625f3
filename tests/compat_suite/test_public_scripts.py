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
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.compat_suite.harness import CONFIGS, same_under_diagnose

params = pytest.mark.parametrize("settings", list(CONFIGS.values()), ids=list(CONFIGS))
# The GPTs' every-step run is the suite's slowest (the audit and statistics on every step).
heavy = pytest.mark.parametrize(
    "settings",
    [
        pytest.param(v, id=k, marks=[pytest.mark.slow] if k != "defaults" else [])
        for k, v in CONFIGS.items()
    ],
)


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


def _runs_plain(scenario: Any) -> str | None:
    """Why the script fails on this CPU without ampdiag (None: it runs): the premise.

    A BF16 LSTM under CPU autocast goes to oneDNN, which on a CPU without native BF16 (an AVX2
    EPYC) may have no LSTM primitive for it ("could not create a primitive descriptor").
    """
    try:
        scenario(contextlib.nullcontext())
    except RuntimeError as exc:
        return str(exc).splitlines()[0][:200]
    return None


@params
def test_word_language_model(settings: dict[str, Any], tmp_path: Path) -> None:
    failed = _runs_plain(word_language_model)
    if failed is not None:
        pytest.skip(f"the script fails on this CPU without ampdiag: {failed}")
    session = same_under_diagnose(word_language_model, settings, tmp_path)
    # no optimizer: the loop's steps come from elsewhere, but nothing may fail
    probe = session["speed_probe"]
    assert "error" not in probe, probe.get("error")
    assert "error" not in (probe.get("precisions") or {}), probe["precisions"]


class MnistNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(8 * 3 * 3, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = self.dropout1(F.max_pool2d(x, 2))
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


def mnist(block: contextlib.AbstractContextManager[Any]) -> Any:
    model = MnistNet()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    train = [(torch.randn(8, 1, 10, 10), torch.randint(0, 10, (8,))) for _ in range(3)]
    test = [(torch.randn(8, 1, 10, 10), torch.randint(0, 10, (8,))) for _ in range(2)]
    made = []
    with block:
        for _epoch in range(2):
            model.train()
            for x, y in train:
                opt.zero_grad()
                with torch.autocast("cpu", torch.bfloat16):
                    loss = F.nll_loss(model(x).float(), y)
                loss.backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                made.append(sum(F.nll_loss(model(x), y, reduction="sum") for x, y in test))
            sched.step()
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
    return model, made, opt.state_dict()


@params
def test_mnist(settings: dict[str, Any], tmp_path: Path) -> None:
    same_under_diagnose(mnist, settings, tmp_path)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 32, block_size: int = 8, d: int = 16) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block_size, d)
        self.h = nn.ModuleList(Block(d, 2) for _ in range(2))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(4))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> Any:
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits[:, [-1], :], None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new: int) -> torch.Tensor:
        for _ in range(new):
            logits, _ = self(idx[:, -self.block_size :])
            probs = F.softmax(logits[:, -1, :], dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, 1)), dim=1)
        return idx

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95))


def nanogpt(block: contextlib.AbstractContextManager[Any]) -> Any:
    model = GPT()
    opt = model.configure_optimizers()
    scaler = torch.amp.GradScaler("cpu")
    data = torch.randint(0, 32, (200,))
    ctx = torch.autocast("cpu", torch.bfloat16)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - 9, (4,))
        return (
            torch.stack([data[i : i + 8] for i in ix]),
            torch.stack([data[i + 1 : i + 9] for i in ix]),
        )

    @torch.no_grad()
    def estimate_loss() -> torch.Tensor:
        model.eval()
        losses = torch.stack([model(*batch())[1] for _ in range(2)])
        model.train()
        return losses.mean()

    made = []
    with block:
        x, y = batch()
        for it in range(3):
            for g in opt.param_groups:
                g["lr"] = 1e-3 * min(1.0, (it + 1) / 3)
            if it % 2 == 0:
                with ctx:
                    made.append(estimate_loss())
            for _micro in range(2):  # gradient accumulation
                with ctx:
                    _, loss = model(x, y)
                    loss = loss / 2
                x, y = batch()  # prefetch, as nanoGPT does
                scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            made.append(loss.detach())
        with ctx:
            made.append(model.generate(torch.zeros(1, 1, dtype=torch.long), 6))
    return model, made


@heavy
def test_nanogpt(settings: dict[str, Any], tmp_path: Path) -> None:
    session = same_under_diagnose(nanogpt, settings, tmp_path)
    assert [m["class"] for m in session["run"]["models"]] == ["GPT"]


def mingpt(block: contextlib.AbstractContextManager[Any]) -> Any:
    """minGPT's Trainer: callbacks per batch; the user's one generates every few iterations."""
    model = GPT()
    opt = model.configure_optimizers()
    generated: list[torch.Tensor] = []

    def on_batch_end(it: int) -> None:
        if it % 2 == 0:
            model.eval()
            with torch.no_grad():
                generated.append(model.generate(torch.zeros(1, 1, dtype=torch.long), 12))
            model.train()

    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randint(0, 32, (24, 9))), batch_size=4, shuffle=True
    )
    losses = []
    with block:
        for it, (seq,) in enumerate(loader):
            _, loss = model(seq[:, :-1], seq[:, 1:])
            model.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.detach())
            on_batch_end(it)
    return model, losses, generated


@heavy
def test_mingpt_generate_callback(settings: dict[str, Any], tmp_path: Path) -> None:
    session = same_under_diagnose(mingpt, settings, tmp_path)
    # The dtype audit holds the training step's own ops: the forward of a (4, 8) batch, not
    # the 12 one-token generation forwards the callback ran in the same step. Counted here:
    # the embedding lookup runs once per forward, so once in the audited step's forward.
    assert session["precision"]["audited"]
    emb = [
        r
        for r in session["precision"]["ops"]
        if r.get("op") == "embedding" and r.get("phase", "forward") == "forward"
    ]
    assert sum(r.get("count", 1) for r in emb) == 2  # wte and wpe, one forward
