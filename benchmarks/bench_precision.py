"""Cost of the precision audit: one audited training step vs one plain step (goal <= 3x).

The two are interleaved in one process on the demo's TinyGPT under CPU bf16 autocast (CUDA
fp16 when present); medians over the repeats. Run: python benchmarks/bench_precision.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ampdiag.demo import GPTConfig, TinyGPT
from ampdiag.sources.live.collectors.dtype_audit import DtypeAudit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    torch.manual_seed(0)
    cfg = GPTConfig(dim=args.dim, layers=args.layers, heads=4, seq=64, vocab=512)
    model = TinyGPT(cfg).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    names = {id(m): (n or "<root>") for n, m in model.named_modules()}
    x = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), device=device)
    y = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), device=device)
    audit: dict[str, DtypeAudit | None] = {"a": None}

    def start(module: torch.nn.Module, inputs: object) -> None:
        if audit["a"] is None and want["audit"]:
            audit["a"] = DtypeAudit(names, {device: True})
            audit["a"].enter(module, inputs)

    want = {"audit": False}
    model.register_forward_pre_hook(start, prepend=True)

    def step(audited: bool) -> float:
        want["audit"] = audited
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=dtype):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if audit["a"] is not None:
            audit["a"].exit()
            audit["a"] = None
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(3):
        step(False)
        step(True)
    plain, audited = [], []
    for i in range(args.repeats):
        order = (False, True) if i % 2 == 0 else (True, False)
        for a in order:
            (audited if a else plain).append(step(a))
    p, a = statistics.median(plain), statistics.median(audited)
    print(f"device={device} dtype={dtype} dim={args.dim} layers={args.layers} batch={args.batch}")
    print(f"plain step   median {p * 1000:8.2f} ms")
    print(f"audited step median {a * 1000:8.2f} ms")
    print(f"ratio audited/plain {a / p:.2f}x (goal <= 3x)")


if __name__ == "__main__":
    main()
