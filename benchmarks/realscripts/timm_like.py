"""A training loop in the style of timm's ``train.py`` (written here, not timm's code).

``--amp --amp-dtype bfloat16 --model-ema --grad-accum-steps 2`` in shape: a small ResNet-like
net in channels-last memory format, SGD with Nesterov momentum, label-smoothed cross entropy
under ``torch.autocast("cpu", bfloat16)``, gradients accumulated over 2 micro-batches with the
loss divided by the group's size, a ragged last group (the epoch's batch count is odd and its
last batch is short), and an EMA copy updated after each optimizer step.

    python timm_like.py [--epochs 1] [--batches 31] [--accum 2]

Prints ``BLOCK_START``/``LOOP_START``/``STEP i``/``BLOCK_END <time.time()> <process CPU>``
and a digest of the EMA weights.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import time

import torch
from torch import nn


def block(cin: int, cout: int, stride: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


def make_model(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        block(3, 16, 1),
        block(16, 32, 2),
        block(32, 64, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batches", type=int, default=31)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    args = p.parse_args()
    print(f"BLOCK_START {time.time():.6f}", flush=True)
    torch.manual_seed(42)
    n = args.batches * args.batch - args.batch // 2  # the last batch is half a batch
    images, labels = torch.randn(n, 3, 16, 16), torch.randint(10, (n,))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels),
        batch_size=args.batch,
        shuffle=True,
        drop_last=False,
    )
    model = make_model().to(memory_format=torch.channels_last)
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=2e-5
    )
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    amp = torch.autocast("cpu", dtype=torch.bfloat16)
    print(f"LOOP_START {time.time():.6f}", flush=True)
    updates = 0
    for _epoch in range(args.epochs):
        last_idx = len(loader) - 1
        last_accum = len(loader) % args.accum or args.accum
        first_of_last_group = len(loader) - last_accum
        for i, (x, y) in enumerate(loader):
            x = x.contiguous(memory_format=torch.channels_last)
            accum = last_accum if i >= first_of_last_group else args.accum
            need_update = i == last_idx or (i + 1) % args.accum == 0
            with amp:
                loss = loss_fn(model(x), y) / accum
            loss.backward()
            if not need_update:
                continue
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                pairs = zip(ema.state_dict().values(), model.state_dict().values(), strict=True)
                for pe, pm in pairs:
                    if pe.is_floating_point():
                        pe.lerp_(pm, 1 - 0.9998)
                    else:
                        pe.copy_(pm)
            print(f"STEP {updates} {time.time():.6f} loss {loss.item() * accum:.6f}", flush=True)
            updates += 1
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in ema.state_dict().values()))
    print(f"DIGEST {digest.hexdigest()[:16]}")
    print(f"BLOCK_END {time.time():.6f} {time.process_time():.6f}", flush=True)


if __name__ == "__main__":
    main()
